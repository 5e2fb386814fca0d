"""boundjax.io.vnnlib: every VNNLIB file of the shared folder, hand-written expectations, the
and/or/not semantics against direct evaluation, and error messages with line numbers."""

from __future__ import annotations

import csv
import functools
import re
from pathlib import Path

import numpy as np
import pytest

from boundjax.io import load_onnx
from boundjax.io import (Disjunct, VnnlibError, crown_spec, unsafe_rows_lower, parse_vnnlib,
                         read_vnnlib)

SHARED = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "vnncomp2021"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(),
                                  reason=f"the shared benchmark folder {SHARED} is absent")
FILES = sorted(SHARED.glob("*/*.vnnlib")) if SHARED.is_dir() else []


def declare(n_in: int, n_out: int) -> str:
  return "".join(f"(declare-const X_{i} Real)\n" for i in range(n_in)) + \
      "".join(f"(declare-const Y_{j} Real)\n" for j in range(n_out))


def unit_box(n_in: int) -> str:
  return "".join(f"(assert (>= X_{i} 0.0))\n(assert (<= X_{i} 1.0))\n" for i in range(n_in))


# ----------------------------------------------------------------------------------------------
# The shared files
# ----------------------------------------------------------------------------------------------

def _networks_of(path: Path) -> list[Path]:
  """The networks `instances.csv` pairs with one VNNLIB file (a file can serve several); a file
  no listed instance uses (ACAS Xu prop_9/10 belong to networks not in the folder) is checked
  against every network of its category."""
  rows = csv.DictReader((SHARED / "instances.csv").open())
  rel = path.relative_to(SHARED).as_posix()
  listed = sorted({SHARED / r["onnx"] for r in rows if r["vnnlib"] == rel})
  return listed or sorted(path.parent.glob("*.onnx"))


@functools.lru_cache(maxsize=None)
def _counts(onnx_path: Path) -> tuple[int, int]:
  """(inputs, outputs) of a network, from the loaded model itself (its traced output shape)."""
  model = load_onnx(onnx_path)
  return model.n_inputs, model.n_outputs


@needs_shared
def test_the_shared_folder_has_the_expected_files():
  assert len([f for f in FILES if f.parent.name == "acasxu"]) == 10
  assert len([f for f in FILES if f.parent.name == "mnistfc"]) == 29
  rows = list(csv.DictReader((SHARED / "instances.csv").open()))
  for r in rows:  # every instance names files that are there
    assert (SHARED / r["onnx"]).is_file() and (SHARED / r["vnnlib"]).is_file(), r
  assert {r["vnnlib"] for r in rows} <= {p.relative_to(SHARED).as_posix() for p in FILES}


def _robustness_label(region, n_out: int) -> int:
  """The class every row of a "some other class wins" property compares against: each row is
  `±(Y_a - Y_b) <= 0` with one +1 and one -1; returns the index common to all rows."""
  common = None
  for dj in region.disjuncts:
    for row, d in zip(dj.C, dj.d):
      assert d == 0.0 and row.sum() == 0.0
      assert sorted(row[row != 0].tolist()) == [-1.0, 1.0]
      pair = set(np.flatnonzero(row).tolist())
      common = pair if common is None else common & pair
  (label,) = common
  return label


@needs_shared
@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.stem}" for p in FILES])
def test_every_shared_file_parses(path):
  """Every shared file parses with the input and output counts of the network it is paired with
  (taken from the loaded network, not assumed), and its box holds the numbers as written."""
  networks = _networks_of(path)
  assert networks, f"no network for {path}"
  counts = {_counts(n) for n in networks}
  assert len(counts) == 1, f"{path} serves networks of different sizes: {counts}"
  ((n_in, n_out),) = counts
  prop = read_vnnlib(path, n_inputs=n_in, n_outputs=n_out)
  assert (prop.n_inputs, prop.n_outputs) == (n_in, n_out)
  text = path.read_text()
  assert prop.regions
  for r in prop.regions:
    assert r.lower.shape == r.upper.shape == (prop.n_inputs,)
    assert r.lower.dtype == np.float64 and np.all(r.lower <= r.upper)
    assert r.disjuncts
    for dj in r.disjuncts:
      assert dj.C.shape == (dj.d.size, prop.n_outputs) and dj.C.dtype == np.float64
  # every number of the box appears in the text as written (exact float64 parsing)
  numbers = {float(t) for t in re.findall(r"(?<![\w.])-?\d+\.?\d*(?:e-?\d+)?(?![\w.])", text)}
  for r in prop.regions:
    assert set(r.lower.tolist()) <= numbers and set(r.upper.tolist()) <= numbers
  category = path.parent.name
  if category == "acasxu":
    return
  # The image categories are L-inf robustness properties of a 10-class network: one box.
  (region,) = prop.regions
  label = _robustness_label(region, n_out)
  stated = re.search(r"label:? (\d+)", text)
  if category == "marabou-cifar10":
    # "the target class beats every other": one conjunction of 9 rows Y_j - Y_target <= 0
    (dj,) = region.disjuncts
    assert dj.C.shape == (9, 10) and np.all(dj.C[:, label] == -1.0)
    assert label == int(re.search(r"target(\d+)", path.stem).group(1))
  else:
    # "some other class scores at least as high": 9 disjuncts of one row Y_label - Y_j <= 0
    assert len(region.disjuncts) == 9
    assert all(dj.C.shape == (1, 10) and dj.C[0, label] == 1.0 for dj in region.disjuncts)
    if stated is not None:
      assert label == int(stated.group(1))
  named = re.search(r"eps_?(\d+(?:\.\d+)?)", path.stem)
  eps = float(named.group(1)) if named else float(path.stem.split("_")[-1])
  half_widths = (region.upper - region.lower) / 2
  if category in ("mnistfc", "eran", "verivital", "marabou-cifar10"):
    # pixels in [0, 1]; the box is the eps-ball clipped to it
    assert np.all(region.lower >= 0) and np.all(region.upper <= 1)
    assert np.all(half_widths <= eps + 1e-7) and np.any(half_widths > eps - 1e-7)
  else:
    # normalised CIFAR inputs: the half-width is eps over a per-channel std (CIFAR-10's are
    # about 0.2-0.26), at most clipped at the edges of the pixel range
    assert np.all(half_widths > 0) and np.all(half_widths <= eps / 0.2 + 1e-6)
    assert np.any(half_widths > eps / 0.27)


@needs_shared
def test_acasxu_property_1_by_hand():
  prop = read_vnnlib(SHARED / "acasxu" / "prop_1.vnnlib")
  (region,) = prop.regions
  assert region.lower.tolist() == [0.6, -0.5, -0.5, 0.45, -0.5]
  assert region.upper.tolist() == [0.679857769, 0.5, 0.5, 0.5, -0.45]
  (dj,) = region.disjuncts  # (assert (>= Y_0 3.991125645861615)): -Y_0 <= -3.99...
  assert dj.C.tolist() == [[-1.0, 0.0, 0.0, 0.0, 0.0]]
  assert dj.d.tolist() == [-3.991125645861615]


@needs_shared
def test_acasxu_property_2_is_one_conjunction_of_four_rows():
  (region,) = read_vnnlib(SHARED / "acasxu" / "prop_2.vnnlib").regions
  (dj,) = region.disjuncts  # Y_j <= Y_0 for j = 1..4, i.e. "COC is maximal"
  expected = np.zeros((4, 5))
  expected[:, 0] = -1.0
  expected[np.arange(4), np.arange(1, 5)] = 1.0
  assert np.array_equal(dj.C, expected) and np.array_equal(dj.d, np.zeros(4))


@needs_shared
def test_acasxu_property_6_has_two_input_regions_of_four_disjuncts():
  prop = read_vnnlib(SHARED / "acasxu" / "prop_6.vnnlib")
  assert len(prop.regions) == 2
  a, b = prop.regions
  assert a.lower.tolist() == [-0.129289109, 0.11140846, -0.499999896, -0.5, -0.5]
  assert a.upper.tolist() == [0.700434925, 0.499999896, -0.499204121, 0.5, 0.5]
  assert b.lower.tolist() == [-0.129289109, -0.499999896, -0.499999896, -0.5, -0.5]
  assert b.upper.tolist() == [0.700434925, -0.11140846, -0.499204121, 0.5, 0.5]
  for r in prop.regions:
    assert [dj.C.tolist() for dj in r.disjuncts] == \
        [[[-1.0] + [1.0 if k == j else 0.0 for k in range(1, 5)]] for j in range(1, 5)]


@needs_shared
def test_acasxu_property_7_two_disjuncts_of_three_rows():
  (region,) = read_vnnlib(SHARED / "acasxu" / "prop_7.vnnlib").regions
  assert [dj.C.shape for dj in region.disjuncts] == [(3, 5), (3, 5)]
  # (and (<= Y_3 Y_0) (<= Y_3 Y_1) (<= Y_3 Y_2)): Y_3 - Y_j <= 0
  assert region.disjuncts[0].C.tolist() == [[-1, 0, 0, 1, 0], [0, -1, 0, 1, 0], [0, 0, -1, 1, 0]]
  assert region.disjuncts[1].C[:, 4].tolist() == [1, 1, 1]


# ----------------------------------------------------------------------------------------------
# Hand-written properties
# ----------------------------------------------------------------------------------------------

def test_bounds_conjunctions_and_exact_numbers():
  text = declare(2, 2) + """
  ; comment (with parentheses) and ; more
  (assert (and (>= X_0 -0.1) (<= X_0 0.30000000000000004)))
  (assert (<= X_1 1e-3))
  (assert (>= X_1 -2.5E-1))
  (assert (<= X_1 0.5)) ; a looser second bound
  (assert (<= Y_0 Y_1))
  (assert (>= Y_0 0.1))
  """
  prop = parse_vnnlib(text)
  (r,) = prop.regions
  assert r.lower.tolist() == [-0.1, -0.25] and r.upper.tolist() == [0.30000000000000004, 0.001]
  (dj,) = r.disjuncts
  assert dj.C.tolist() == [[1.0, -1.0], [-1.0, 0.0]] and dj.d.tolist() == [0.0, -0.1]


def test_linear_arithmetic_in_the_outputs():
  text = declare(1, 3) + unit_box(1) + """
  (assert (<= (+ Y_0 (* 2 Y_1) (- Y_2) 0.5) (* 3.0 Y_2)))
  (assert (>= (- Y_0 Y_1 Y_2 1) (/ Y_1 4)))
  (assert (< (* Y_0 -1.5) (- 2)))
  (assert (= Y_1 0.25))
  """
  (dj,) = parse_vnnlib(text).regions[0].disjuncts
  assert dj.C.tolist() == [[1, 2, -4], [-1, 1.25, 1], [-1.5, 0, 0], [0, 1, 0], [0, -1, 0]]
  assert dj.d.tolist() == [-0.5, -1.0, -2.0, 0.25, -0.25]


def test_disjunction_of_conjunctions_is_one_region_with_several_disjuncts():
  text = declare(1, 3) + unit_box(1) + """
  (assert (or
      (and (<= Y_0 Y_1) (<= Y_0 Y_2))
      (and (<= Y_1 Y_2))
      (<= Y_2 -1)
  ))
  """
  (r,) = parse_vnnlib(text).regions
  assert [dj.C.tolist() for dj in r.disjuncts] == [[[1, -1, 0], [1, 0, -1]], [[0, 1, -1]],
                                                  [[0, 0, 1]]]
  assert [dj.d.tolist() for dj in r.disjuncts] == [[0, 0], [0], [-1]]


def test_several_input_regions_each_with_its_own_output_condition():
  text = declare(2, 2) + """
  (assert (or
      (and (>= X_0 0) (<= X_0 1) (>= X_1 0) (<= X_1 1) (<= Y_0 Y_1))
      (and (>= X_0 2) (<= X_0 3) (>= X_1 0) (<= X_1 1) (>= Y_0 5))
      (and (>= X_0 0) (<= X_0 1) (>= X_1 0) (<= X_1 1) (>= Y_1 7))
  ))
  """
  prop = parse_vnnlib(text)
  assert len(prop.regions) == 2  # the first and third share a box
  first, second = prop.regions
  assert first.lower.tolist() == [0, 0] and first.upper.tolist() == [1, 1]
  assert [dj.C.tolist() for dj in first.disjuncts] == [[[1, -1]], [[0, -1]]]
  assert second.lower.tolist() == [2, 0] and [dj.d.tolist() for dj in second.disjuncts] == [[-5]]


def test_disjunction_of_boxes_times_disjunction_of_outputs():
  text = declare(1, 2) + """
  (assert (or (and (>= X_0 0) (<= X_0 1)) (and (>= X_0 -3) (<= X_0 -2))))
  (assert (or (and (<= Y_0 0)) (and (<= Y_1 0))))
  """
  prop = parse_vnnlib(text)
  assert [(r.lower.tolist(), r.upper.tolist(), len(r.disjuncts)) for r in prop.regions] == \
      [([0], [1], 2), ([-3], [-2], 2)]


def test_no_output_condition_and_empty_or_infeasible_terms():
  prop = parse_vnnlib(declare(1, 2) + unit_box(1))
  (r,) = prop.regions
  (dj,) = r.disjuncts
  assert dj.C.shape == (0, 2) and dj.holds(np.array([3.0, 4.0]))
  text = declare(1, 1) + """
  (assert (or (and (>= X_0 0) (<= X_0 1) (<= Y_0 0)) (and (>= X_0 2) (<= X_0 1))
              (and (>= X_0 0) (<= X_0 1) (<= 1 0))))
  """
  (r,) = parse_vnnlib(text).regions  # an empty box and a false constant atom are dropped
  assert len(r.disjuncts) == 1


def _random_formula(rng, depth):
  if depth == 0 or rng.random() < 0.3:
    a, b = rng.integers(-2, 3, size=3), rng.integers(-2, 3)
    terms = " ".join(f"(* {c} Y_{j})" for j, c in enumerate(a))
    op = rng.choice(["<=", ">=", "<", ">"])
    return f"({op} (+ {terms}) {b})", lambda y, a=a, b=b, op=op: {
        "<=": a @ y <= b, ">=": a @ y >= b, "<": a @ y < b, ">": a @ y > b}[op]
  kind = rng.choice(["and", "or", "not"])
  if kind == "not":
    text, fn = _random_formula(rng, depth - 1)
    return f"(not {text})", lambda y, fn=fn: not fn(y)
  parts = [_random_formula(rng, depth - 1) for _ in range(rng.integers(1, 4))]
  text = f"({kind} " + " ".join(p[0] for p in parts) + ")"
  if kind == "and":
    return text, lambda y, fs=[p[1] for p in parts]: all(f(y) for f in fs)
  return text, lambda y, fs=[p[1] for p in parts]: any(f(y) for f in fs)


def test_and_or_not_agree_with_direct_evaluation():
  rng = np.random.default_rng(0)
  for _ in range(40):
    text, fn = _random_formula(rng, 3)
    prop = parse_vnnlib(declare(1, 3) + unit_box(1) + f"(assert {text})\n")
    disjuncts = [dj for r in prop.regions for dj in r.disjuncts]
    for y in rng.normal(scale=2.0, size=(50, 3)) + 0.01:  # off the integer boundaries
      assert fn(y) == any(dj.holds(y) for dj in disjuncts), text


def test_crown_spec_and_unsafe_rows():
  dj = Disjunct(np.array([[1.0, -1.0, 0.0], [0.0, 2.0, 1.0]]), np.array([0.5, -1.0]))
  spec = crown_spec(dj)
  assert spec.dtype == np.float32 and spec.tolist() == [[1, -1, 0], [0, 2, 1]]
  rng = np.random.default_rng(0)
  for y in rng.normal(scale=2.0, size=(200, 3)):
    rows = unsafe_rows_lower(dj, spec @ y)  # exact bounds at one point: C y - d, rounded down
    np.testing.assert_allclose(rows, dj.C @ y - dj.d)
    # a positive row (violated) means the point is safe: the recipe can never prove an unsafe point
    assert dj.holds(y) == (not bool(np.any(rows > 0)))
  with pytest.raises(ValueError, match="float32"):
    crown_spec(Disjunct(np.array([[0.1, 1.0]]), np.array([0.0])))
  C, d = dj
  assert C is dj.C and d is dj.d


def test_is_counterexample():
  text = declare(2, 2) + unit_box(2) + "(assert (>= Y_0 Y_1))\n"
  prop = parse_vnnlib(text)
  assert prop.is_counterexample([0.5, 0.5], [2.0, 1.0])
  assert not prop.is_counterexample([0.5, 0.5], [1.0, 2.0])
  assert not prop.is_counterexample([1.5, 0.5], [2.0, 1.0])


def test_read_vnnlib_checks_the_counts(tmp_path):
  path = tmp_path / "p.vnnlib"
  path.write_text(declare(2, 3) + unit_box(2))
  assert read_vnnlib(path).n_outputs == 3
  with pytest.raises(VnnlibError, match="3 Y variables declared, expected 4"):
    read_vnnlib(path, n_outputs=4)
  with pytest.raises(VnnlibError, match="2 X variables declared, expected 5"):
    read_vnnlib(path, n_inputs=5)


@pytest.mark.parametrize("body, message", [
    ("(assert (<= Z_0 1))", r"line 4: 'Z_0' is neither a number nor a declared variable"),
    ("(assert (<= (* Y_0 Y_0) 1))", "line 4: a product of two variables is not linear"),
    ("(assert (<= X_0 Y_0))", "line 4: a constraint mixing inputs and outputs"),
    ("(assert (<= (+ X_0 X_0) 1))\n(assert (<= (+ X_0 (* 0 Y_0)) 1))\n"
     "(assert (<= (+ X_0 (- 0 X_1)) 1))", "line 6: an input constraint must bound one input"),
    ("(define-fun f () Real 1.0)", "line 4: unsupported command 'define-fun'"),
    ("(assert (<= X_0 1)", "line 4: '\\(' is never closed"),
    ("(assert (<= X_0 1)))", "line 4: unbalanced"),
    ("(assert (=> (<= X_0 1) (<= Y_0 0)))", "line 4: unsupported operator '=>'"),
    ("(assert (<= X_0 1.0.0))", "line 4: '1.0.0' is neither"),
    ("(assert (not (= Y_0 1)))", "line 4: a negated equality"),
    ("(assert (>= X_0 0))\n(assert (<= X_0 1))\n(assert (<= X_1 1))",
     "line 2: input X_1 \\(declared there\\) has no finite lower"),
])
def test_errors_name_the_line(body, message):
  text = declare(2, 1) + body + "\n"
  with pytest.raises(VnnlibError, match=message):
    parse_vnnlib(text)


def test_an_exploding_normal_form_is_refused():
  many = "".join(f"(assert (or (<= Y_0 {k}) (>= Y_0 {k + 0.5})))\n" for k in range(18))
  with pytest.raises(VnnlibError, match="262144 terms"):
    parse_vnnlib(declare(1, 1) + unit_box(1) + many)
  nested = "(assert (and " + "(or (<= Y_0 0) (>= Y_0 1)) " * 18 + "))\n"
  with pytest.raises(VnnlibError, match="line 5: the disjunctive normal form"):
    parse_vnnlib(declare(1, 1) + unit_box(1) + nested)


def test_bad_declarations():
  with pytest.raises(VnnlibError, match="line 1: sort 'Int'"):
    parse_vnnlib("(declare-const X_0 Int)")
  with pytest.raises(VnnlibError, match="line 1: variable 'x0' is not named"):
    parse_vnnlib("(declare-const x0 Real)")
  with pytest.raises(VnnlibError, match="not X_0 .. X_1"):
    parse_vnnlib("(declare-const X_0 Real)\n(declare-const X_2 Real)")
  with pytest.raises(VnnlibError, match="no input variables"):
    parse_vnnlib("(declare-const Y_0 Real)")


def test_error_from_a_file_names_the_file(tmp_path):
  path = tmp_path / "bad.vnnlib"
  path.write_text(declare(1, 1) + "(assert (<= X_0 (* Y_0 Y_0)))\n")
  with pytest.raises(VnnlibError, match=r"bad\.vnnlib: line 3"):
    read_vnnlib(path)


def test_region_interval_is_rounded_outward_to_float32():
  text = declare(3, 1) + """
  (assert (>= X_0 0.1)) (assert (<= X_0 0.2))
  (assert (>= X_1 -0.30000000000000004)) (assert (<= X_1 0.7))
  (assert (>= X_2 0.5)) (assert (<= X_2 0.5))
  """
  (r,) = parse_vnnlib(text).regions
  box = r.interval()
  lo, hi = np.asarray(box.lower), np.asarray(box.upper)
  assert lo.dtype == np.float32 and lo.shape == (3,)
  assert np.all(lo.astype(np.float64) <= r.lower) and np.all(hi.astype(np.float64) >= r.upper)
  # the tightest such box: one float32 step inward would cut the exact box
  assert np.all(np.nextafter(lo, np.float32(np.inf)).astype(np.float64) > r.lower)
  assert np.all(np.nextafter(hi, np.float32(-np.inf)).astype(np.float64) < r.upper)
  assert lo[2] == hi[2] == 0.5  # exactly representable: unchanged
  assert r.interval((1, 3, 1)).lower.shape == (1, 3, 1)

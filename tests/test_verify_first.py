"""The verifier's first stages and its time limit (`boundjax.verify.api.verify`).

- CROWN first: a property that the engine's CROWN proves on the whole box is answered ``unsat``
  by that stage, after a quick attack and before any extraction or branch and bound (no BaB
  node, no method);
- α-CROWN next: a property CROWN misses and α-CROWN proves is answered by α-CROWN;
- the time limit, compilation included: a CNN instance whose bounds cannot finish in a short
  limit is answered ``timeout`` within 5 % of the limit, measured by the verifier itself (the
  process start, importing JAX, is not the verifier's time).

The properties are built so that the right answer is known without the verifier (sampled
margins far from the boundary); stage names are the contract of `Outcome.stats`.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from boundjax.verify import api as mc
from tests.test_verify import _cnn, _f64_outputs, _margin_property, _samples


def _holds_on_samples(apply_fn, params, prop, rng, n=5000) -> bool:
  """No sample (uniform points, corners, the centre) of the box satisfies a disjunct."""
  (lo, hi), disjuncts = prop[0]
  y = _f64_outputs(apply_fn, params, _samples(lo, hi, n, rng))
  return not any(np.any(np.all(y @ C.T - d <= 0, axis=1)) for C, d in disjuncts)


def test_crown_first_answers_a_cnn_property_without_branch_and_bound():
  """A robustness property of a small CNN at a small radius (margins far above 0): ``unsat``
  by the CROWN stage, with 0 branch-and-bound nodes, no dense path (neither planned nor
  extracted, no ``method``), no attack but the quick one before CROWN, and a positive
  certified margin not above the sampled margins."""
  apply_fn, params = _cnn(1)
  rng = np.random.default_rng(1)
  x0 = rng.uniform(0, 1, 64)
  prop = _margin_property(apply_fn, params, x0, 0.002)
  assert _holds_on_samples(apply_fn, params, prop, rng)
  out = mc.verify(apply_fn, params, (1, 8, 8), prop, timeout=60.0, attack_restarts=4,
                  attack_steps=5)
  assert out.status == "unsat", out
  assert out.stats["stage"] == "crown" and out.stats["nodes"] == 0, out.stats
  assert "method" not in out.stats and "dense_batch" not in out.stats, out.stats
  assert set(out.stats["seconds"]) == {"quick attack", "crown"}, out.stats
  (lo, hi), disjuncts = prop[0]
  y = _f64_outputs(apply_fn, params, _samples(lo, hi, 2000, rng))
  sampled = min(float(np.max(y @ C.T - d, axis=1).min()) for C, d in disjuncts)
  assert 0 < out.stats["margin"] <= sampled + 1e-9, (out.stats["margin"], sampled)


@pytest.mark.slow
def test_alpha_crown_proves_what_crown_misses():
  """A property built between CROWN's and α-CROWN's bound of the CNN's hardest row (shift
  ``s`` with ``CROWN < s < α-CROWN``): CROWN leaves it open, α-CROWN proves it, and the
  verifier says so (stage ``alpha-crown``, no node). The dense path is off (no memory for it),
  so the engine's α-CROWN is the only α-CROWN that runs."""
  from boundjax.verify import engine
  from boundjax.verify.spec import as_regions
  apply_fn, params = _cnn(4)
  rng = np.random.default_rng(4)
  x0 = rng.uniform(0, 1, 64)
  base = _margin_property(apply_fn, params, x0, 0.05)
  region = as_regions(base)[0]
  key = engine.fingerprint(apply_fn, params, (1, 8, 8))
  low = {m: engine.region_lower(apply_fn, params, (1, 8, 8), key, region, sound=True, mode=m,
                                memory_bytes=1 << 28) for m in ("crown", "alpha")}
  gap = low["alpha"] - low["crown"]
  j = int(np.argmax(gap))
  assert gap[j] > 1e-3, gap  # α-CROWN is tighter somewhere
  shift = float(low["crown"][j] + gap[j] / 2)
  (lo, hi), disjuncts = base[0]
  C, d = disjuncts[j]
  prop = [((lo, hi), [(C, d + shift)])]  # y_c - y_j - shift <= 0 is unsafe
  assert _holds_on_samples(apply_fn, params, prop, rng)
  out = mc.verify(apply_fn, params, (1, 8, 8), prop, timeout=120.0, dense_memory_bytes=0)
  assert out.status == "unsat", out
  assert out.stats["engine"]["crown"] == "open", out.stats
  assert out.stats["stage"] == "alpha-crown" and out.stats["nodes"] == 0, out.stats


THRESHOLD = 12.0
"""Unsafe: output 1 at least this (reaching it is beyond PGD; CROWN bounds it by about 18 on
the box, non-sound, measured)."""


def _cnn_onnx(path: Path, seed: int = 0) -> np.ndarray:
  """A PyTorch-style MNIST CNN (conv 4x4 stride 2 with 8 and 16 channels, ReLU, dense 64,
  ReLU, dense 10) as ONNX, and an input point in [0, 1]^784."""
  import onnx
  from onnx import TensorProto, helper, numpy_helper
  rng = np.random.default_rng(seed)
  he = lambda *s, fan: (rng.normal(size=s) * np.sqrt(2.0 / fan)).astype(np.float32)
  small = lambda n: (0.05 * rng.normal(size=n)).astype(np.float32)
  arrays = {"k1": he(8, 1, 4, 4, fan=16), "b1": small(8), "k2": he(16, 8, 4, 4, fan=128),
            "b2": small(16), "w3": he(784, 64, fan=784), "b3": small(64),
            "w4": he(64, 10, fan=64), "b4": small(10)}
  conv = dict(kernel_shape=[4, 4], strides=[2, 2], pads=[1, 1, 1, 1])
  nodes = [helper.make_node("Conv", ["x", "k1", "b1"], ["c1"], **conv),
           helper.make_node("Relu", ["c1"], ["r1"]),
           helper.make_node("Conv", ["r1", "k2", "b2"], ["c2"], **conv),
           helper.make_node("Relu", ["c2"], ["r2"]),
           helper.make_node("Flatten", ["r2"], ["f"], axis=1),
           helper.make_node("MatMul", ["f", "w3"], ["m3"]),
           helper.make_node("Add", ["m3", "b3"], ["a3"]), helper.make_node("Relu", ["a3"], ["r3"]),
           helper.make_node("MatMul", ["r3", "w4"], ["m4"]), helper.make_node("Add", ["m4", "b4"], ["y"])]
  graph = helper.make_graph(
      nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 28, 28])],
      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
      [numpy_helper.from_array(a, n) for n, a in arrays.items()])
  onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
  return rng.uniform(0, 1, 784)


def test_a_short_limit_is_kept_within_five_percent(tmp_path):
  """`boundjax verify --timeout 6` on an MNIST CNN and a property nothing decides in 6 s (an
  output gap of 10^3 between two classes, unreachable, around a wide box that CROWN cannot
  bound that tightly; the engine's first compilation alone takes longer on a 2-core machine):
  the answer is ``timeout`` and the verifier's own elapsed time, printed in its summary (from
  loading the network to the answer, as VNN-COMP counts; the interpreter's start and JAX's
  import before it are not counted) is within 1.05 x the limit plus 0.25 s (a thread join's
  wake-up and the summary). Run in a subprocess: the work left behind at the deadline ends
  with the process, as with the command."""
  limit = 6.0
  x0 = _cnn_onnx(tmp_path / "cnn.onnx")
  lines = [f"(declare-const X_{i} Real)" for i in range(784)] + \
          [f"(declare-const Y_{j} Real)" for j in range(10)]
  for i, v in enumerate(x0):
    lines += [f"(assert (>= X_{i} {max(float(v) - 0.1, 0.0)!r}))",
              f"(assert (<= X_{i} {min(float(v) + 0.1, 1.0)!r}))"]
  lines.append(f"(assert (>= Y_1 {THRESHOLD!r}))")
  (tmp_path / "prop.vnnlib").write_text("\n".join(lines) + "\n")
  command = [sys.executable, "-m", "boundjax.cli", "verify", str(tmp_path / "cnn.onnx"),
             str(tmp_path / "prop.vnnlib"), "--timeout", str(limit), "--no-compile-cache"]
  proc = subprocess.run(command, capture_output=True, text=True, timeout=120,
                        cwd=Path(__file__).resolve().parents[1],
                        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin",
                             "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
  assert proc.returncode == 0, proc.stderr[-2000:]
  m = re.match(r"(\w+) after ([0-9.]+) s \(limit ([0-9.]+) s\)", proc.stdout)
  assert m, proc.stdout
  status, seconds = m.group(1), float(m.group(2))
  assert status == "timeout", proc.stdout
  assert seconds <= 1.05 * limit + 0.25, proc.stdout
  assert "stage: " in proc.stdout, proc.stdout


# ------------------------------------------------------------------------------------------------
# the memory budget's shares do not overlap: bounds left running past their time are waited for
# ------------------------------------------------------------------------------------------------

def test_a_bound_left_behind_is_returned_and_no_other_mode_starts_beside_it(monkeypatch):
  """`engine.prove_with_engine` with a bound that outlives its budget: the mode is marked
  ``budget``, the still-running bound comes back as ``pending`` (its buffers are live), and no
  later mode (α-CROWN) is started beside it."""
  import threading
  import time
  from boundjax.verify import engine
  from boundjax.verify.outcome import Deadline
  from boundjax.verify.spec import as_regions
  calls = []
  release = threading.Event()

  def slow(*args, mode, **kw):
    calls.append(mode)
    release.wait(5.0)
    return np.full(1, -1.0)

  monkeypatch.setattr(engine, "region_lower", slow)
  monkeypatch.setattr(engine, "fingerprint", lambda *a: "key")
  regions = as_regions([((np.zeros(12), np.ones(12)), [(np.ones((1, 2)), np.zeros(1))])])
  t0 = time.monotonic()
  eng = engine.prove_with_engine(None, {}, (12,), regions, Deadline(10.0), 0.3)
  assert time.monotonic() - t0 < 2.0
  assert eng.modes["crown"] == "budget" and eng.pending is not None and not eng.pending.done()
  assert calls == ["crown"]
  release.set()
  assert eng.pending.wait(5.0)[0]


def test_branch_and_bound_waits_for_a_bound_left_behind(monkeypatch):
  """The verifier does not start branch and bound (here the generic path, the network being a
  sigmoid MLP) while a whole-property bound left behind by its stage is still running: the
  search starts after that bound ends, so the two never hold their memory shares at once."""
  import threading
  import time
  import jax
  import jax.numpy as jnp
  from boundjax.verify import engine, generic
  seen = {}
  release = threading.Event()

  def leftover():
    release.wait(1.0)
    seen["left_ended"] = time.monotonic()

  def fake_engine(apply_fn, params, input_shape, regions, deadline, budget, **kw):
    job = engine.start(leftover)
    return engine.EngineResult([np.zeros(len(r.disjuncts), bool) for r in regions],
                               {"crown": "budget"},
                               [np.full(len(r.disjuncts), -np.inf) for r in regions], job)

  def fake_generic(*args, **kw):
    seen["search_started"] = time.monotonic()
    return "unknown", None, 0

  monkeypatch.setattr(engine, "prove_with_engine", fake_engine)
  monkeypatch.setattr(generic, "input_split_generic", fake_generic)
  rng = np.random.default_rng(0)
  params = (rng.normal(size=(6, 12)).astype(np.float32), np.zeros(6, np.float32),
            rng.normal(size=(2, 6)).astype(np.float32), np.zeros(2, np.float32))

  def apply_fn(p, x):
    return p[2] @ jax.nn.sigmoid(p[0] @ jnp.reshape(x, (-1,)) + p[1]) + p[3]

  prop = [((np.zeros(12), np.ones(12)), [(np.array([[1.0, 0.0]]), np.array([-100.0]))])]
  out = mc.verify(apply_fn, params, (12,), prop, timeout=60.0, attack_restarts=2,
                  attack_steps=2)
  assert out.status == "unknown", out
  assert seen["search_started"] >= seen["left_ended"], seen


def test_a_bound_that_proves_after_its_budget_still_answers(monkeypatch):
  """α-CROWN left behind at its budget (its compilation outlived its share on a loaded
  machine) and finishing later with every row above 0: the verifier waits for it, as before,
  and then answers ``unsat`` from its bounds (stage ``alpha-crown``) instead of throwing them
  away and searching until the deadline; the search is never started. A late bound that
  proves nothing leaves the search to run."""
  import threading
  import jax
  import jax.numpy as jnp
  from boundjax.verify import engine, generic
  seen = {"search": 0}
  rng = np.random.default_rng(0)
  params = (rng.normal(size=(6, 12)).astype(np.float32), np.zeros(6, np.float32),
            rng.normal(size=(2, 6)).astype(np.float32), np.zeros(2, np.float32))

  def apply_fn(p, x):
    return p[2] @ jax.nn.sigmoid(p[0] @ jnp.reshape(x, (-1,)) + p[1]) + p[3]

  def run(late_value):
    release = threading.Event()

    def late():
      release.wait(0.5)
      return np.full(1, late_value)

    def fake_engine(apply_fn, params, input_shape, regions, deadline, budget, modes=(),
                    **kw):
      closed = [np.zeros(len(r.disjuncts), bool) for r in regions]
      lows = [np.full(len(r.disjuncts), -1.0) for r in regions]
      if "alpha" in modes:
        return engine.EngineResult(closed, {"alpha": "budget"}, lows, engine.start(late),
                                   regions[0])
      return engine.EngineResult(closed, {"crown": "open"}, lows)

    def fake_generic(*args, **kw):
      seen["search"] += 1
      return "unknown", None, 0

    monkeypatch.setattr(engine, "prove_with_engine", fake_engine)
    monkeypatch.setattr(generic, "input_split_generic", fake_generic)
    prop = [((np.zeros(12), np.ones(12)), [(np.array([[1.0, 0.0]]), np.array([-100.0]))])]
    return mc.verify(apply_fn, params, (12,), prop, timeout=60.0, attack_restarts=2,
                     attack_steps=2)

  out = run(3.0)
  assert out.status == "unsat" and out.stats["stage"] == "alpha-crown", out
  assert out.stats["margin"] == 3.0 and seen["search"] == 0, (out.stats, seen)
  out = run(-2.0)
  assert out.status == "unknown" and seen["search"] == 1, (out, seen)


def test_run_instances_waits_until_the_previous_instance_s_work_ends(monkeypatch):
  """`run_instances` starts an instance only once the work the previous one left running has
  ended, even when that outlasts the time limit (a wait capped at the limit let OVAL21
  instances run beside the previous one's buffers)."""
  import threading
  import time
  from boundjax.verify.outcome import Outcome

  def fake(onnx, vnnlib, timeout, **kw):
    if str(onnx) == "first":
      threading.Thread(target=time.sleep, args=(1.2,), name="boundjax-worker").start()
    return Outcome("timeout", None, 0.01, {"nodes": 0, "phase": None})

  monkeypatch.setattr(mc, "verify_instance", fake)
  results = mc.run_instances([("first", "a"), ("second", "b")], 0.2, progress=False)
  assert results[1]["settled"] >= 1.0, results


def test_run_instances_reports_each_row_at_once_with_its_own_peak_memory(monkeypatch):
  """``on_row`` sees each row as soon as it ends (a batch killed later keeps it), and each
  row's ``peak_rss`` covers that row alone: a row allocating 300 MB reports it, the row after
  it (allocating nothing) reports less."""
  import sys
  from boundjax.verify import memory
  from boundjax.verify.outcome import Outcome
  if not sys.platform.startswith("linux"):
    pytest.skip("peak resident memory is read from /proc (Linux)")

  def fake(onnx, vnnlib, timeout, **kw):
    if str(onnx) == "big":
      a = np.ones(300 * 2**20 // 8)  # touched: resident
      assert a.sum() > 0
    return Outcome("timeout", None, 0.01, {"nodes": 0, "phase": None})

  monkeypatch.setattr(mc, "verify_instance", fake)
  seen = []
  results = mc.run_instances([("big", "a"), ("small", "b")], 0.2, progress=False,
                             on_row=lambda r: seen.append(dict(r)))
  assert [r["onnx"] for r in seen] == ["big", "small"]
  big, small = (r["peak_rss"] for r in results)
  assert big is not None and small is not None
  assert big >= small + 250 * 2**20, (big, small)
  assert memory.peak_rss() is not None


def test_relu_split_reports_the_smallest_bound_left_as_its_margin():
  """ReLU splitting's certified margin at a stop (`relu_bab._global_lower`): the smallest
  bound of the domains on the frontier and of the last domains popped (a leaf's, whose
  children were never bounded), never a bound of a part only; ``inf`` once proved."""
  from boundjax.verify import bab, relu_bab
  front = bab.Heap()
  front.push({"bound": np.array([0.5, -0.2])}, np.array([0.5, -0.2]))
  popped = {"bound": np.array([-0.4, 0.1])}
  stop = lambda reason, popped: bab.SearchOutcome(reason, None, front, [], popped, 4, 2, 1, 2,
                                                  0.0)
  assert relu_bab._global_lower(stop(bab.LEAF, popped)) == -0.4
  assert relu_bab._global_lower(stop(bab.DEADLINE, None)) == -0.2
  assert relu_bab._global_lower(stop(bab.PROVED, None)) == float("inf")


def test_a_late_alpha_crown_unsat_is_right_on_samples(monkeypatch):
  """End to end, with the real engine: a property between CROWN's and α-CROWN's bound of a
  sigmoid network's hardest row, with α-CROWN's share of the time so short that it is left
  behind at its budget (it is still compiling). The verifier waits for it, answers ``unsat``
  from its late bound (stage ``alpha-crown``, engine ``"alpha": "proved late"``), and 10⁴
  uniform samples of the box, 64 corners and the centre all satisfy the property in float64,
  with the certified margin not above the sampled one."""
  import jax
  import jax.numpy as jnp
  from boundjax.verify import engine
  from boundjax.verify.spec import as_regions
  rng = np.random.default_rng(7)
  params = ((rng.normal(size=(16, 6)) / 1.5).astype(np.float32),
            (0.3 * rng.normal(size=16)).astype(np.float32),
            (rng.normal(size=(16, 16)) / 2).astype(np.float32),
            (0.3 * rng.normal(size=16)).astype(np.float32),
            (rng.normal(size=(4, 16)) / 2).astype(np.float32), np.zeros(4, np.float32))

  def apply_fn(p, x):
    h = jax.nn.sigmoid(p[0] @ jnp.reshape(x, (-1,)) + p[1])
    h = jnp.tanh(p[2] @ h + p[3])
    return p[4] @ h + p[5]

  x0 = rng.uniform(-1, 1, 6)
  base = _margin_property(apply_fn, params, x0, 0.8)
  region = as_regions(base)[0]
  key = engine.fingerprint(apply_fn, params, (6,))
  low = {m: engine.region_lower(apply_fn, params, (6,), key, region, sound=True, mode=m,
                                memory_bytes=1 << 30) for m in ("crown", "alpha")}  # the verifier's
  gap = low["alpha"] - low["crown"]
  j = int(np.argmax(gap))
  assert gap[j] > 1e-2, (low, gap)  # α-CROWN is tighter on some row
  shift = float(low["crown"][j] + gap[j] / 2)
  (lo, hi), disjuncts = base[0]
  C, d = disjuncts[j]
  prop = [((lo, hi), [(C, d + shift)])]  # y_c - y_j <= shift is unsafe
  y = _f64_outputs(apply_fn, params, _samples(lo, hi, 10_000, rng))
  sampled = float((y @ C.T - d - shift).min())
  assert sampled > 0, sampled  # the property holds on every sample
  import time
  real_budget, real_lower = engine.prove_with_engine, engine.region_lower

  def short_alpha_budget(apply_fn, params, input_shape, regions, deadline, budget, modes=(),
                         **kw):  # the real engine, with α-CROWN's budget cut to 0.2 s
    if tuple(modes) == ("alpha",):
      budget = 0.2
    return real_budget(apply_fn, params, input_shape, regions, deadline, budget, modes=modes,
                       **kw)

  def slow_alpha(*args, mode, **kw):  # α-CROWN's real bound, delivered 1 s late
    if mode == "alpha":
      time.sleep(1.0)
    return real_lower(*args, mode=mode, **kw)

  monkeypatch.setattr(engine, "prove_with_engine", short_alpha_budget)
  monkeypatch.setattr(engine, "region_lower", slow_alpha)
  out = mc.verify(apply_fn, params, (6,), prop, timeout=120.0, engine_bounds=True,
                  attack_restarts=4, attack_steps=10)
  assert out.status == "unsat", out
  assert out.stats["engine"].get("alpha") == "proved late", out.stats
  assert out.stats["stage"] == "alpha-crown" and out.stats["nodes"] == 0, out.stats
  assert 0 < out.stats["margin"] <= sampled + 1e-9, (out.stats["margin"], sampled)

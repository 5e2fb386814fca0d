"""boundjax.verify: the complete verifier against exhaustive ground truth, MILP and VNN-COMP verdicts.

Small random ReLU networks (2-3 inputs) with random linear properties: a dense grid of the box
is evaluated in float64; if a grid point violates the property the verifier must not say
``unsat``, and every ``sat`` counterexample must replay. Also: the dense chain's engine bounds
(`chain`) vs sampling (sound and not), a sigmoid network (generic path), the time limit, the result text, and the shared
instances (a few in CI, the rest under ``slow``).
"""

from __future__ import annotations

import csv
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boundjax.verify as mc
from boundjax.verify import attack, chain
from tests.helpers import chain_apply
from boundjax.verify.spec import Disjunct, Region
from milp.network import AffineLayer, Network

SHARED = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "vnncomp2021"


def _mlp(seed: int, sizes=(2, 12, 12, 3)):
  rng = np.random.default_rng(seed)
  ws = [rng.normal(size=(o, i)) / np.sqrt(i) for i, o in zip(sizes[:-1], sizes[1:])]
  bs = [0.3 * rng.normal(size=o) for o in sizes[1:]]
  params = {"w": [w.astype(np.float32) for w in ws], "b": [b.astype(np.float32) for b in bs]}

  apply_fn = chain_apply

  net = Network(tuple(AffineLayer.point(np.asarray(w, np.float64), np.asarray(b, np.float64))
                      for w, b in zip(params["w"], params["b"])), (sizes[0],))
  return apply_fn, params, net


def _grid(lo, hi, n):
  axes = [np.linspace(a, b, n) for a, b in zip(lo, hi)]
  return np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(lo))


def _fwd(net, x):
  from milp.network import forward_batch
  return forward_batch(net, x)


def _random_property(rng, n_in, n_out, y_grid_fn):
  lo = rng.uniform(-1, 0, n_in)
  hi = lo + rng.uniform(0.2, 1.5, n_in)
  disjuncts = []
  for _ in range(rng.integers(1, 3)):
    k = rng.integers(1, 3)
    C = rng.normal(size=(k, n_out))
    y = y_grid_fn(lo, hi)
    vals = y @ C.T
    # thresholds around the grid's range: a mix of sat and unsat instances
    d = np.quantile(vals, rng.uniform(-0.02, 0.08), axis=0) if rng.random() < 0.5 else \
        vals.min(0) - rng.uniform(0.0, 0.3)
    disjuncts.append((C, np.asarray(d).reshape(-1)))
  return [((lo, hi), disjuncts)]


@pytest.mark.parametrize("seed", range(8))
def test_random_networks_vs_grid(seed):
  rng = np.random.default_rng(100 + seed)
  n_in = 2 + seed % 2
  apply_fn, params, net = _mlp(seed, (n_in, 10, 10, 3))
  grid_n = 81 if n_in == 2 else 25
  prop = _random_property(rng, n_in, 3, lambda lo, hi: _fwd(net, _grid(lo, hi, grid_n)))
  (lo, hi), disjuncts = prop[0]
  y = _fwd(net, _grid(lo, hi, grid_n))
  grid_sat = any(np.any(np.all(y @ C.T - d <= 0, axis=1)) for C, d in disjuncts)
  out = mc.verify(apply_fn, params, (n_in,), prop, timeout=60.0, key=seed)
  assert out.status != "unknown", out
  if grid_sat:
    assert out.status == "sat"
  if out.status == "sat":
    x, yx = out.counterexample
    assert np.all(x >= lo) and np.all(x <= hi)
    np.testing.assert_allclose(yx, _fwd(net, x[None])[0], rtol=1e-12, atol=1e-12)
    assert any(np.all(C @ yx - d <= 0) for C, d in disjuncts)


def test_chain_bounds_are_sound_and_splits_tighten():
  """`chain.crown_batch` (the engine on the dense chain): CROWN (CROWN and CROWN-IBP
  intermediate bounds) and α-CROWN below the sampled minimum, sound mode and not; α-CROWN at
  least as tight as CROWN; with a neuron split either way, the split clips its bounds and each
  half's bound is below the minimum over its own half of the domain."""
  apply_fn, params, net = _mlp(3, (2, 16, 16, 4))
  rng = np.random.default_rng(0)
  C = rng.normal(size=(3, 4))
  d = rng.normal(size=3)
  lo, hi = np.array([-1.0, -0.5]), np.array([0.5, 1.0])
  x = _grid(lo, hi, 201)
  true_min = (_fwd(net, x) @ C.T - d).min(0)
  with jax.enable_x64(True):
    lay = chain.from_network(net)
    for sound in (False, True):
      for inter in ("crown", "ibp"):
        b, lam0, inf, lbs, ubs = chain.crown_batch(lay, C, d, lo[None], hi[None], sound, inter)
        assert not inf[0]
        assert np.all(b[0] <= true_min + 1e-12)
      b, _, _, lbs, ubs = chain.crown_batch(lay, C, d, lo[None], hi[None], sound)
      best, *_ = chain.crown_batch(lay, C, d, lo[None], hi[None], sound, alpha_steps=20)
      assert np.all(best[0] >= b[0] - 1e-9)
      assert np.all(best[0] <= true_min + 1e-12)
    # split the first unstable neuron of layer 1 both ways: each child's bound is below the true
    # minimum over its own half of the domain
    l1, u1 = lbs[0][0], ubs[0][0]
    j = int(np.nonzero((l1 < 0) & (u1 > 0))[0][0])
    z1 = x @ np.asarray(net.layers[0].w_lower).T + net.layers[0].b_lower
    for sign in (1, -1):
      spl = [np.zeros((1, n), np.int8) for n in lay.hidden]
      spl[0][0, j] = sign
      best_c, _, inf_c, lbs_c, ubs_c = chain.crown_batch(lay, C, d, lo[None], hi[None], True,
                                                         alpha_steps=20, splits=spl)
      assert (lbs_c[0][0, j] >= 0) if sign > 0 else (ubs_c[0][0, j] <= 0)
      mask = sign * z1[:, j] >= 0
      if mask.any():
        half_min = (_fwd(net, x[mask]) @ C.T - d).min(0)
        assert not inf_c[0]
        assert np.all(best_c[0] <= half_min + 1e-9)


def test_parent_bounds_and_combined_rows_are_sound():
  """Input splitting's reuse of the parent box's intermediate bounds (intersected with the
  child's, every ``intermediate`` mode) and the row sums it bounds for conjunctions: sound
  against a grid of the child box, at least as tight as without, and exact sums only."""
  from boundjax.verify import input_bab
  apply_fn, params, net = _mlp(5, (2, 16, 16, 4))
  rng = np.random.default_rng(1)
  C = rng.normal(size=(3, 4))
  d = rng.normal(size=3)
  Cx, dx = input_bab.combined_rows(Disjunct(C, d))
  np.testing.assert_array_equal(Cx[:3], C)  # original rows first; inexact sums are dropped
  assert Cx.shape[0] <= 3 + 4
  Ci, di = input_bab.combined_rows(Disjunct(np.array([[1.0, -1, 0, 0], [1, 0, -1, 0]]),
                                            np.zeros(2)))
  np.testing.assert_array_equal(Ci[2], [2.0, -1, -1, 0])
  lo, hi = np.array([-1.0, -0.5]), np.array([0.5, 1.0])
  clo, chi = np.array([-1.0, 0.2]), np.array([-0.3, 1.0])  # a child box
  x = _grid(clo, chi, 121)
  yv = _fwd(net, x)
  true_min = (yv @ Cx.T - dx).min(0)
  z = [x @ np.asarray(net.layers[0].w_lower).T + net.layers[0].b_lower]
  z.append(np.maximum(z[0], 0) @ np.asarray(net.layers[1].w_lower).T + net.layers[1].b_lower)
  with jax.enable_x64(True):
    lay = chain.from_network(net)
    for sound in (False, True):
      for inter in ("crown", "ibp"):
        args = (lay, Cx, dx)
        _, _, _, pl, pu = chain.crown_batch(*args, lo[None], hi[None], sound, inter)
        b0, lam_own, *_ = chain.crown_batch(*args, clo[None], chi[None], sound, inter)
        for mode in ("layer", "post"):
          b, lam, inf, lbs, ubs = chain.crown_batch(*args, clo[None], chi[None], sound, inter,
                                                    (pl, pu), mode)
          assert not bool(np.asarray(inf)[0])
          assert np.all(np.asarray(b)[0] <= true_min + 1e-12)
          assert np.all(np.asarray(b)[0] >= np.asarray(b0)[0] - 1e-9)
          if mode == "post":  # branching coefficients are the prior-less ones
            np.testing.assert_array_equal(np.asarray(lam), np.asarray(lam_own))
          for k in range(2):
            assert np.all(np.asarray(lbs[k])[0] <= z[k].min(0) + 1e-12)
            assert np.all(np.asarray(ubs[k])[0] >= z[k].max(0) - 1e-12)
            assert np.all(np.asarray(lbs[k])[0] >= np.asarray(pl[k])[0] - 1e-12)
            assert np.all(np.asarray(ubs[k])[0] <= np.asarray(pu[k])[0] + 1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_input_split_post_prior_is_a_subtree(seed):
  """Input splitting with the parent's bounds in "post" mode explores a sub-tree of the
  prior-less search (same branching, bounds at least as tight): never more boxes, and the
  verdict agrees with a dense grid (the property's margin is 2% of the output range, so the
  search must split). A bad ``reuse_bounds`` is refused."""
  from boundjax.verify import input_bab
  from boundjax.verify.outcome import Deadline
  apply_fn, params, net = _mlp(20 + seed, (2, 16, 16, 3))
  rng = np.random.default_rng(seed)
  lo, hi = np.array([-1.0, -1.0]), np.array([1.0, 1.0])
  y = _fwd(net, _grid(lo, hi, 301))
  c = rng.normal(size=(1, 3))
  vals = y @ c[0]
  d = np.array([vals.min() - 0.02 * (vals.max() - vals.min())])
  region = Region(lo, hi, (Disjunct(c, d),))
  replay = attack.Replayer(apply_fn, params, (2,))
  with jax.enable_x64(True):
    lay = chain.from_network(net)
    runs = {mode: input_bab.input_split(lay, region, region.disjuncts, replay, Deadline(60.0),
                                        batch=64, reuse_bounds=mode)
            for mode in (False, "post")}
    with pytest.raises(ValueError, match="reuse_bounds"):
      input_bab.input_split(lay, region, region.disjuncts, replay, Deadline(60.0),
                            reuse_bounds="sometimes")
  assert runs[False][0] == runs["post"][0] == "unsat"
  assert runs[False][2] > 1  # the bound on the whole box did not suffice
  assert runs["post"][2] <= runs[False][2]


@pytest.mark.parametrize("seed", range(3))
def test_lookahead_branching_scores_are_the_product_of_gains(seed):
  """The look-ahead score is strong branching's product of the two halves' estimated gains over
  the box's own estimate: recomputed here child by child (`chain.estimate_batch` on one box
  at a time), the scores match and the best input wins; a box where no input gains keeps
  the smear coefficients."""
  from boundjax.verify import input_bab
  from boundjax.verify.outcome import Deadline
  apply_fn, params, net = _mlp(40 + seed, (3, 12, 12, 2))
  rng = np.random.default_rng(seed)
  B = 5
  lo = rng.uniform(-1, 0, (B, 3))
  hi = lo + rng.uniform(0.2, 1.5, (B, 3))
  C = np.array([[1.0, -1.0], [0.5, 1.0], [0.0, 0.0], [0.0, 0.0]])
  d = np.array([0.1, -0.2, 0.0, 0.0])
  groups = [(0, 2)] * B
  with jax.enable_x64(True):
    lay = chain.from_network(net)
    bl = [np.full((B, n), -np.inf) for n in lay.hidden]
    bu = [np.full((B, n), np.inf) for n in lay.hidden]
    lam = rng.normal(size=(B, 3))
    parent = np.full(B, -np.inf)
    score = input_bab._lookahead_scores(lay, jnp.asarray(C), jnp.asarray(d), lo, hi, bl, bu,
                                        lam, groups, parent, np.full(3, 2.0), 64,
                                        Deadline(60.0),
                                        max_aspect=1e9) * (hi - lo)
    # out of time: no estimate is computed and the smear coefficients come back unchanged
    late = input_bab._lookahead_scores(lay, jnp.asarray(C), jnp.asarray(d), lo, hi, bl, bu,
                                       lam, groups, parent, np.full(3, 2.0), 64, Deadline(0.0))
    np.testing.assert_array_equal(late, lam)
    prior = (tuple(jnp.full((1, n), -1e300) for n in lay.hidden),
             tuple(jnp.full((1, n), 1e300) for n in lay.hidden))
    est = lambda a, b: np.asarray(chain.estimate_batch(
        lay, jnp.asarray(C), jnp.asarray(d), jnp.asarray(a[None]), jnp.asarray(b[None]),
        prior))[0, :2].max()
    for i in range(B):
      own = est(lo[i], hi[i])
      eps = 1e-9 * (1 + abs(own))
      gains = []
      for j in range(3):
        mid = (lo[i, j] + hi[i, j]) / 2
        halves = []
        for a, b in ((lo[i, j], mid), (mid, hi[i, j])):
          clo, chi = lo[i].copy(), hi[i].copy()
          clo[j], chi[j] = a, b
          halves.append(max(est(clo, chi) - own, 0.0))
        gains.append(halves)
      gains = np.array(gains)
      useful = np.any(gains > eps, axis=1)
      product = np.where(useful, np.prod(np.maximum(gains, eps), axis=1), 0.0)
      if np.any(useful):
        assert np.argmax(score[i]) == np.argmax(product), (score[i], gains)
        np.testing.assert_allclose(score[i], product, rtol=1e-6, atol=1e-18)
      else:  # no input helps: the given sensitivities (smear heuristic) decide
        np.testing.assert_array_equal(score[i], lam[i] * (hi[i] - lo[i]))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mode", ["layer", "post"])
def test_input_split_lookahead_vs_grid(seed, mode):
  """Input splitting with look-ahead branching decides small properties like a dense grid:
  ``unsat`` only where no grid point violates (margin 2% of the output range, so the search
  must split), ``sat`` with a float64-replayed counterexample where the threshold cuts into the
  outputs; and it needs no more than 4x the smear heuristic's boxes (+64) here. A bad
  ``branching`` is refused."""
  from boundjax.verify import input_bab
  from boundjax.verify.outcome import Deadline
  apply_fn, params, net = _mlp(60 + seed, (2, 16, 16, 3))
  rng = np.random.default_rng(seed)
  lo, hi = np.array([-1.0, -1.0]), np.array([1.0, 1.0])
  y = _fwd(net, _grid(lo, hi, 301))
  c = rng.normal(size=(2, 3))
  vals = y @ c.T
  spread = vals.max(0) - vals.min(0)
  replay = attack.Replayer(apply_fn, params, (2,))
  with jax.enable_x64(True):
    lay = chain.from_network(net)
    for sat in (False, True):
      d = vals.min(0) + (0.02 if sat else -0.02) * spread
      region = Region(lo, hi, (Disjunct(c[:1], d[:1]), Disjunct(c[1:], d[1:])))
      runs = {b: input_bab.input_split(lay, region, region.disjuncts, replay, Deadline(60.0),
                                       batch=64, reuse_bounds=mode, branching=b)
              for b in ("smear", "lookahead")}
      status, cex, nodes = runs["lookahead"]
      assert status == ("sat" if sat else "unsat"), (sat, runs)
      if sat:
        x, yx = cex
        assert np.all(x >= lo) and np.all(x <= hi)
        np.testing.assert_allclose(yx, _fwd(net, x[None])[0], rtol=1e-12, atol=1e-12)
        assert np.any(yx @ c.T - d <= 0)
      else:
        assert runs["smear"][0] == "unsat" and runs["smear"][2] > 1
        assert nodes <= 4 * runs["smear"][2] + 64  # no runaway splitting of one input
    with pytest.raises(ValueError, match="branching"):
      input_bab.input_split(lay, region, region.disjuncts, replay, Deadline(60.0),
                            branching="best")


def test_relu_split_vs_milp():
  """High-dimensional path (ReLU splitting, forced by input_split_dims=0) agrees with MILP."""
  from milp.property import check_property
  apply_fn, params, net = _mlp(7, (3, 12, 12, 2))
  rng = np.random.default_rng(7)
  lo, hi = -np.ones(3) * 0.5, np.ones(3) * 0.5
  for t in range(3):
    C = rng.normal(size=(1, 2))
    y = _fwd(net, _grid(lo, hi, 21)) @ C.T
    d = np.array([y.min() + (0.05 if t == 0 else -0.05 * (t + 1))])
    ref = check_property(net, lo, hi, C, d, time_limit=30.0)
    out = mc.verify(apply_fn, params, (3,), [((lo, hi), [(C, d)])], timeout=60.0,
                    input_split_dims=0, attack_restarts=4, attack_steps=2)
    assert out.status == ref.status, (out, ref.status)


def test_sigmoid_network_generic_path():
  rng = np.random.default_rng(1)
  w1, b1 = rng.normal(size=(8, 2)).astype(np.float32), rng.normal(size=8).astype(np.float32)
  w2, b2 = rng.normal(size=(2, 8)).astype(np.float32), rng.normal(size=2).astype(np.float32)
  params = (w1, b1, w2, b2)

  def apply_fn(p, x):
    return p[2] @ jax.nn.sigmoid(p[0] @ jnp.reshape(x, (-1,)) + p[1]) + p[3]

  lo, hi = np.array([-1.0, -1.0]), np.array([1.0, 1.0])
  with jax.enable_x64(True):
    g = _grid(lo, hi, 101)
    y = np.asarray(jax.vmap(lambda x: apply_fn(jax.tree_util.tree_map(
        lambda a: jnp.asarray(a, jnp.float64), params), x))(jnp.asarray(g)))
  C = np.array([[1.0, -1.0]])
  unsat = mc.verify(apply_fn, params, (2,), [((lo, hi), [(C, np.array([(y @ C.T).min() - 0.3]))])],
                    timeout=60.0)
  assert unsat.status == "unsat" and unsat.stats["method"] == "generic"
  sat = mc.verify(apply_fn, params, (2,), [((lo, hi), [(C, np.array([(y @ C.T).min() + 0.05]))])],
                  timeout=60.0)
  assert sat.status == "sat"
  x, yx = sat.counterexample
  assert (C @ yx)[0] <= (y @ C.T).min() + 0.05


def test_timeout():
  """A deep network, a wide box and a property unsat by a margin the root bounds cannot see:
  with a 1 s limit the answer is ``timeout`` (the attack finds nothing: it is unsat)."""
  apply_fn, params, net = _mlp(5, (2, 40, 40, 40, 2))
  lo, hi = np.array([-3.0, -3.0]), np.array([3.0, 3.0])
  with jax.enable_x64(True):
    lay = chain.from_network(net)
    C = np.array([[1.0, -1.0]])
    b, *_ = chain.crown_batch(lay, C, np.zeros(1), lo[None], hi[None], True, "crown")
  y = _fwd(net, _grid(lo, hi, 201))
  d = np.array([float(np.asarray(b)[0, 0]) + 0.05])  # far below the true minimum: unsat
  assert (y @ C.T).min() > d[0]
  out = mc.verify(apply_fn, params, (2,), [((lo, hi), [(C, d)])], timeout=1.0)
  assert out.status in ("timeout", "unsat")
  assert out.seconds < 1.0 + 15.0  # a batch (and its compilation) may finish after the limit
  if out.status == "timeout":
    assert out.counterexample is None


def test_format_result_round_trip():
  x = np.array([0.1, -1.0 / 3.0, 2.0 ** -40])
  y = np.array([1e-17, -5.5])
  out = mc.Outcome("sat", (x, y), 1.0, {"nodes": 0, "phase": "attack"})
  text = mc.format_result(out)
  assert text.startswith("sat\n(") and "(X_1 " in text and "(Y_1 -5.5)" in text
  status, x2, y2 = mc.parse_result(text)
  assert status == "sat"
  np.testing.assert_array_equal(x2, x)
  np.testing.assert_array_equal(y2, y)
  for s in ("unsat", "timeout", "unknown"):
    assert mc.format_result(mc.Outcome(s)) == s + "\n"
  with pytest.raises(ValueError):
    mc.Outcome("sat")
  # the counterexample, written as VNNLIB-style assignments, satisfies the property text
  from boundjax.io import vnnlib
  text_prop = ("(declare-const X_0 Real)\n(declare-const X_1 Real)\n(declare-const X_2 Real)\n"
               "(declare-const Y_0 Real)\n(declare-const Y_1 Real)\n"
               "(assert (>= X_0 0.0))\n(assert (<= X_0 1.0))\n(assert (>= X_1 -1.0))\n"
               "(assert (<= X_1 0.0))\n(assert (>= X_2 0.0))\n(assert (<= X_2 1.0))\n"
               "(assert (<= Y_1 Y_0))\n")
  prop = vnnlib.parse_vnnlib(text_prop)
  assert prop.is_counterexample(x2, y2)


def _rows(category=None):
  path = SHARED / "instances.csv"
  if not path.exists():
    return []
  rows = list(csv.DictReader(open(path)))
  return [r for r in rows if category is None or r["category"] == category]


def _check_instance(row, timeout):
  out = mc.verify_instance(SHARED / row["onnx"], SHARED / row["vnnlib"], timeout=timeout)
  assert {out.status, row["verdict"]} != {"sat", "unsat"}, (row, out)
  if out.status == "sat":
    from boundjax.io.vnnlib import read_vnnlib
    prop = read_vnnlib(SHARED / row["vnnlib"])
    x, y = out.counterexample
    assert prop.is_counterexample(x, y)
  return out


FAST = [("acasxu/ACASXU_run2a_1_2_batch_2000.onnx", "acasxu/prop_2.vnnlib"),
        ("mnistfc/mnist-net_256x2.onnx", "mnistfc/prop_10_0.03.vnnlib"),
        ("acasxu/ACASXU_run2a_1_1_batch_2000.onnx", "acasxu/prop_1.vnnlib")]


@pytest.mark.parametrize("onnx_path,vnnlib_path", FAST)
def test_shared_instances_fast(onnx_path, vnnlib_path):
  rows = [r for r in _rows() if r["onnx"] == onnx_path and r["vnnlib"] == vnnlib_path]
  if not rows:
    pytest.skip("shared instances absent")
  out = _check_instance(rows[0], timeout=60.0)
  assert out.status == rows[0]["verdict"]


@pytest.mark.slow
@pytest.mark.parametrize("row", _rows(), ids=lambda r: f"{r['onnx']}-{r['vnnlib']}")
def test_shared_instances_all(row):
  _check_instance(row, timeout=60.0 if row["category"] == "acasxu" else 120.0)


def test_jacobians_match_the_network():
  """`attack.jacobians`: outputs equal the float64 forward pass, and on the linear piece the
  Jacobian predicts the output at a nearby point (central differences, float64)."""
  _, _, net = _mlp(11, (3, 16, 16, 4))
  Ws = [np.asarray(l.w_lower, np.float64) for l in net.layers]
  bs = [np.asarray(l.b_lower, np.float64) for l in net.layers]
  xs = np.random.default_rng(0).uniform(-1, 1, size=(200, 3))
  y, J = attack.jacobians(Ws, bs, xs)
  np.testing.assert_allclose(y, _fwd(net, xs), rtol=1e-12, atol=1e-12)
  def pattern(x):
    h, pat = x, []
    for w, b in zip(Ws[:-1], bs[:-1]):
      h = h @ w.T + b
      pat.append(h > 0)
      h = np.maximum(h, 0.0)
    return np.concatenate(pat, axis=1)

  step = 1e-6
  for k in range(3):
    e = np.zeros(3)
    e[k] = step
    fd = (_fwd(net, xs + e) - _fwd(net, xs - e)) / (2 * step)
    inside = np.all(pattern(xs + e) == pattern(xs), 1) & np.all(pattern(xs - e) == pattern(xs), 1)
    assert inside.mean() > 0.9
    np.testing.assert_allclose(fd[inside], J[inside, :, k], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("seed", range(3))
def test_sample_and_local_search_find_thin_violations(seed):
  """The sampling + LP falsifier on properties violated only on a thin sliver (threshold just
  above the true minimum of a dense grid): whatever it returns lies in the box and violates the
  property in float64; with a threshold below the grid minimum minus the grid's resolution
  error it returns None (nothing to find); and it finds the sliver of the first kind."""
  from boundjax.verify.outcome import Deadline
  apply_fn, params, net = _mlp(30 + seed, (2, 16, 16, 3))
  Ws = [np.asarray(l.w_lower, np.float64) for l in net.layers]
  bs = [np.asarray(l.b_lower, np.float64) for l in net.layers]
  rng = np.random.default_rng(seed)
  lo, hi = np.array([-1.0, -1.0]), np.array([1.0, 1.0])
  g = _grid(lo, hi, 1001)
  c = rng.normal(size=(2, 3))
  vals = (_fwd(net, g) @ c.T).max(1)
  replay = attack.Replayer(apply_fn, params, (2,))
  found = 0
  for d0, expect in ((vals.min() + 1e-4, True), (vals.min() - 0.05, False)):
    region = Region(lo, hi, (Disjunct(c, np.full(2, d0)),))
    hit = attack.sample_search(Ws, bs, region, replay, Deadline(30.0), samples=20_000,
                               chunk=10_000, top=8, key=seed)
    if hit is not None:
      x, y = hit
      assert np.all(x >= lo) and np.all(x <= hi)
      np.testing.assert_allclose(y, _fwd(net, x[None])[0], rtol=1e-12, atol=1e-12)
      assert np.all(c @ y - d0 <= 0)
      found += expect
    if not expect:
      # the grid's minimum is within (Lipschitz x spacing) of the true minimum; 0.05 is far more
      assert hit is None
  assert found == 1


def test_milp_fallback_with_a_sparse_last_layer():
  """The exact MILP of ReLU splitting on a network whose last layer is a scipy.sparse matrix
  (as the ONNX import builds for some layers): once a crash (``np.maximum`` of a sparse matrix)
  that ended a whole batch; now the same answer as the MILP on the dense network."""
  import scipy.sparse as sp
  from boundjax.verify import relu_bab
  from boundjax.verify.outcome import Deadline
  from milp.property import check_property
  apply_fn, params, net = _mlp(3, (3, 8, 8, 2))
  last = net.layers[-1]
  sparse_net = Network(net.layers[:-1] + (AffineLayer.point(sp.csr_matrix(last.w_lower),
                                                            last.b_lower),), net.input_shape)
  lo, hi = -np.ones(3) * 0.5, np.ones(3) * 0.5
  lbs, ubs, l_in, u_in = [], [], lo, hi  # interval bounds of every hidden pre-activation
  for layer in net.layers[:-1]:
    w, b = layer.w_lower, layer.b_lower
    wp, wn = np.maximum(w, 0), np.minimum(w, 0)
    l, u = wp @ l_in + wn @ u_in + b, wp @ u_in + wn @ l_in + b
    lbs.append(l)
    ubs.append(u)
    l_in, u_in = np.maximum(l, 0), np.maximum(u, 0)
  replay = attack.Replayer(apply_fn, params, (3,))
  y = _fwd(net, _grid(lo, hi, 21))
  C = np.array([[1.0, -1.0]])
  for margin in (-0.2, 0.05):
    d = np.array([(y @ C.T).min() + margin])
    region = Region(lo, hi, (Disjunct(C, d),))
    status, _ = relu_bab._milp(sparse_net, region, region.disjuncts[0], lbs, ubs,
                               Deadline(30.0), replay)
    assert status == check_property(net, lo, hi, C, d, time_limit=30.0).status


# ------------------------------------------------------------------------------------------------
# engine bounds first (boundjax.verify.engine): a CNN with average pooling
# ------------------------------------------------------------------------------------------------

def _cnn(seed: int, channels: int = 4, side: int = 8, n_out: int = 5):
  """A small CNN: conv 3x3 (``channels``) -> ReLU -> 2x2 average pooling (``reduce_window``,
  as the ONNX importer's AveragePool) -> dense; float32 weights; input (1, side, side)."""
  from jax import lax
  rng = np.random.default_rng(seed)
  k = (rng.normal(size=(channels, 1, 3, 3)) / 3).astype(np.float32)
  kb = (0.1 * rng.normal(size=channels)).astype(np.float32)
  pooled = channels * ((side - 2) // 2) ** 2
  w = (rng.normal(size=(n_out, pooled)) / np.sqrt(pooled)).astype(np.float32)
  b = (0.1 * rng.normal(size=n_out)).astype(np.float32)
  params = {"k": k, "kb": kb, "w": w, "b": b}

  def apply_fn(p, x):
    h = lax.conv_general_dilated(jnp.reshape(x, (1, 1, side, side)), p["k"], (1, 1), "VALID")
    h = jax.nn.relu(h + p["kb"][None, :, None, None])
    h = lax.reduce_window(h, np.array(0, h.dtype), lax.add, (1, 1, 2, 2), (1, 1, 2, 2),
                          "VALID") / 4.0
    return p["w"] @ jnp.reshape(h, (-1,)) + p["b"]

  return apply_fn, params


def _f64_outputs(apply_fn, params, xs):
  """Outputs of ``apply_fn`` in float64 (the float32 weights cast exactly) for points ``xs``."""
  with jax.enable_x64(True):
    p64 = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), params)
    return np.asarray(jax.vmap(lambda x: apply_fn(p64, x))(jnp.asarray(xs, jnp.float64)))


def _samples(lo, hi, n, rng):
  """``n`` uniform points of the box, its centre, and 64 random corners."""
  u = rng.uniform(lo, hi, size=(n, lo.size))
  corners = np.where(rng.random((64, lo.size)) < 0.5, lo, hi)
  return np.concatenate([u, corners, ((lo + hi) / 2)[None]])


def _margin_property(apply_fn, params, x0, eps, shift=0.0):
  """Region ``[x0 - eps, x0 + eps]`` with one unsafe disjunct per other class ``j``:
  ``y_j - y_c >= -shift`` (``c`` the class at ``x0``), written ``(y_c - y_j) <= shift``."""
  y0 = _f64_outputs(apply_fn, params, x0[None])[0]
  c = int(np.argmax(y0))
  disjuncts = []
  for j in range(y0.size):
    if j != c:
      row = np.zeros((1, y0.size))
      row[0, c], row[0, j] = 1.0, -1.0
      disjuncts.append((row, np.array([shift])))
  return [((x0 - eps, x0 + eps), disjuncts)]


def test_engine_rounding_helpers_are_sound():
  """``box_f32`` contains the float64 box; ``spec_f32``'s rows never exceed ``C y - d``."""
  from boundjax.verify import engine
  rng = np.random.default_rng(3)
  lo = rng.normal(size=5000) * 10.0 ** rng.integers(-8, 3, 5000)
  hi = lo + np.abs(rng.normal(size=5000)) * 10.0 ** rng.integers(-12, 1, 5000)
  l32, h32 = engine.box_f32(lo, hi)
  assert l32.dtype == np.float32 and np.all(l32 <= lo) and np.all(h32 >= hi)
  C = rng.integers(-2, 3, size=(7, 4)).astype(np.float64)
  d = rng.normal(size=7) / 3.0  # not float32 numbers
  C32, d32 = engine.spec_f32(C, d)
  assert np.array_equal(C32.astype(np.float64), C) and np.all(d32.astype(np.float64) >= d)
  assert np.any(d32.astype(np.float64) > d)  # rounded up where d is not a float32
  assert engine.spec_f32(np.array([[0.1, -1.0]]), np.zeros(1)) is None  # 0.1 is not exact


@pytest.mark.parametrize("sound", [True, False])
def test_engine_region_bounds_are_sound_on_a_cnn(sound):
  """Every engine mode's row bounds of ``C y - d`` (composed spec) on an average-pooling CNN
  lie below the float64 minimum over 10^4 samples and corners of the box; α never looser than
  CROWN, and the bound is not vacuous (within a bounded gap of the sampled minimum)."""
  from boundjax.verify import engine
  from boundjax.verify.spec import as_regions
  apply_fn, params = _cnn(0)
  rng = np.random.default_rng(0)
  x0 = rng.uniform(0, 1, 64)
  # 5 rows, as many as outputs: both paths share one compiled bound per mode
  C = rng.normal(size=(5, 5)).round(2) * 4  # not float32 numbers: the outputs' path
  Cexact = rng.integers(-2, 3, size=(5, 5)).astype(np.float64)
  d = rng.normal(size=5) / 3.0
  xs = _samples(x0 - 0.05, x0 + 0.05, 10_000, rng)
  y = _f64_outputs(apply_fn, params, xs)
  key = engine.fingerprint(apply_fn, params, (1, 8, 8))
  for CC in (C, Cexact):
    region = as_regions([((x0 - 0.05, x0 + 0.05), [(CC[:2], d[:2]), (CC[2:], d[2:])])])[0]
    true_min = (y @ CC.T - d).min(axis=0)
    lows = {}
    for mode in ("ibp", "crown", "alpha", "alpha-ibp"):
      low = engine.region_lower(apply_fn, params, (1, 8, 8), key, region, sound=sound,
                                mode=mode, memory_bytes=1 << 28)
      assert not np.any(np.isnan(low)) and low.shape == (5,)
      assert np.all(low <= true_min), (mode, low - true_min)
      assert np.all(true_min - low < 10.0), (mode, true_min - low)
      lows[mode] = low
    assert np.all(lows["crown"] >= lows["ibp"] - 1e-4)
    assert np.all(lows["alpha"] >= lows["crown"] - 1e-4)
    assert np.all(lows["alpha-ibp"] >= lows["ibp"] - 1e-4)


def test_cnn_with_average_pooling_unsat_by_engine_bounds():
  """A robustness property of an average-pooling CNN that the engine proves on the whole box:
  ``unsat`` in the "bounds" phase, before any dense extraction (the dense path is also
  disabled by a zero memory budget, so no other phase could have answered), and the property
  really holds on 10^4 float64 samples."""
  apply_fn, params = _cnn(1)
  rng = np.random.default_rng(1)
  x0 = rng.uniform(0, 1, 64)
  prop = _margin_property(apply_fn, params, x0, 0.002)
  (lo, hi), disjuncts = prop[0]
  y = _f64_outputs(apply_fn, params, _samples(lo, hi, 10_000, rng))
  assert not any(np.any(np.all(y @ C.T - d <= 0, axis=1)) for C, d in disjuncts)
  out = mc.verify(apply_fn, params, (1, 8, 8), prop, timeout=120.0, dense_memory_bytes=0)
  assert out.status == "unsat" and out.stats["phase"] == "bounds", out
  # CROWN first: answered before the dense path is even planned
  assert out.stats["stage"] == "crown" and "dense_batch" not in out.stats, out.stats
  assert "method" not in out.stats
  assert "proved" in out.stats["engine"].values()


def test_cnn_sat_found_by_the_attack_where_bounds_cannot_prove():
  """A violated property of the CNN: the engine's sound bounds cannot prove any disjunct the
  samples violate, and the verifier answers ``sat`` with a counterexample inside the box that
  satisfies the unsafe condition when replayed in float64."""
  from boundjax.verify import engine
  from boundjax.verify.spec import as_regions, violates
  apply_fn, params = _cnn(2)
  rng = np.random.default_rng(2)
  x0 = rng.uniform(0, 1, 64)
  prop = _margin_property(apply_fn, params, x0, 0.3)
  (lo, hi), disjuncts = prop[0]
  y = _f64_outputs(apply_fn, params, _samples(lo, hi, 10_000, rng))
  hit = [bool(np.any(np.all(y @ C.T - d <= 0, axis=1))) for C, d in disjuncts]
  assert any(hit)  # the instance is sat (a sample crosses the decision boundary)
  region = as_regions(prop)[0]
  low = engine.region_lower(apply_fn, params, (1, 8, 8), engine.fingerprint(
      apply_fn, params, (1, 8, 8)), region, sound=True, mode="crown", memory_bytes=1 << 28)
  assert not np.any(low[np.array(hit)] > 0)
  out = mc.verify(apply_fn, params, (1, 8, 8), prop, timeout=120.0)
  assert out.status == "sat", out
  x, yx = out.counterexample
  assert np.all(x >= lo) and np.all(x <= hi)
  np.testing.assert_allclose(yx, _f64_outputs(apply_fn, params, x[None])[0], rtol=1e-12,
                             atol=1e-12)
  assert violates(as_regions(prop), x, yx)


def test_engine_bounds_keep_the_deadline():
  """A CNN too wide for the dense path (estimate over the budget), a property the whole-box
  bounds cannot prove and the attack cannot falsify (unsat by a margin CROWN does not see):
  with a 4 s limit the verifier answers ``timeout`` (or ``unsat``) within a few seconds of it,
  although the engine's compilation alone takes longer (the worker thread is left behind)."""
  apply_fn, params = _cnn(3, channels=16, side=16)
  rng = np.random.default_rng(3)
  x0 = rng.uniform(0, 1, 256)
  y0 = _f64_outputs(apply_fn, params, x0[None])[0]
  c = int(np.argmax(y0))
  j = int(np.argsort(y0)[-2])
  row = np.zeros((1, y0.size))
  row[0, c], row[0, j] = 1.0, -1.0
  prop = [((x0 - 0.2, x0 + 0.2), [(row, np.array([-50.0]))])]  # y_c - y_j <= -50: far away
  out = mc.verify(apply_fn, params, (1, 16, 16), prop, timeout=4.0, attack_restarts=4,
                  attack_steps=5, dense_memory_bytes=0)
  assert out.status in ("timeout", "unsat"), out
  assert out.seconds < 4.0 + 5.0, out.seconds


def test_dense_plan_estimates_and_skips():
  """`engine.layer_widths` reads the CNN's widths from the traced program; `dense_plan` halves
  the batch until the estimate fits and gives 0 (skip) when nothing fits."""
  from boundjax.verify import engine
  apply_fn, params = _cnn(0)
  widths = engine.layer_widths(apply_fn, params, (1, 8, 8))
  assert widths == (64, 4 * 6 * 6, 5)
  full = engine.dense_bytes(widths, 256, 20_000)
  assert engine.dense_plan(widths, full) == 256
  assert engine.dense_plan(widths, full - 1) == 128
  assert engine.dense_plan(widths, 0) == 0
  assert engine.dense_bytes(widths, 64, 0) == 8 * (2 * (64 * 144 + 144 * 5) + 64 * 2 * 64 * 144)


def test_engine_float32_refuses_parameters_that_are_not_float32_numbers():
  """Without ``sound`` the engine bounds float32 weights: float64 parameters that are not
  float32 numbers would be a different network, so no bound of the engine is used (nothing
  proven, generic path ``unknown``), while float64 arrays holding float32 numbers are accepted.
  With ``sound`` the engine runs in float64 and takes them as they are."""
  from boundjax.verify import engine, generic
  from boundjax.verify.outcome import Deadline
  from boundjax.verify.spec import as_regions
  apply_fn, params = _cnn(0)
  assert engine.params_exact_f32(params)
  p64 = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
  assert engine.params_exact_f32(p64)
  p64["b"] = p64["b"] + 1e-12  # no longer float32 numbers
  assert not engine.params_exact_f32(p64)
  x0 = np.full(64, 0.5)
  regions = as_regions([((x0 - 1e-3, x0 + 1e-3), [(np.eye(5)[:1], np.array([-1e6]))])])
  res = engine.prove_with_engine(apply_fn, p64, (1, 8, 8), regions, Deadline(60.0), 60.0,
                                 sound=False)
  assert not res.all_proven and set(res.modes.values()) == {"params not float32"}
  status, _, _ = generic.input_split_generic(apply_fn, p64, (1, 8, 8), regions, None,
                                             Deadline(60.0), sound=False)
  assert status == "unknown"
  res = engine.prove_with_engine(apply_fn, p64, (1, 8, 8), regions, Deadline(60.0), 60.0)
  assert res.all_proven and res.modes["crown"] == "proved"
  status, _, _ = generic.input_split_generic(apply_fn, p64, (1, 8, 8), regions, None,
                                             Deadline(60.0))
  assert status == "unsat"


@pytest.mark.parametrize("mode", ["crown", "alpha"])
def test_sound_engine_bound_holds_on_the_float64_network_it_is_given(mode):
  """Sound mode bounds in float64 (`engine.bound_precision`): parameters that are not float32
  numbers and a specification row not exact in float32 (1/3) are taken as they are, and every
  bound `engine.region_lower` returns is below ``C y - d`` of the float64 network at 10⁴
  sampled points plus the box's centre, with zero tolerance; the box is wide enough that the
  bound is not vacuous (within 10 of the sampled minimum)."""
  from boundjax.verify import engine
  from boundjax.verify.spec import as_regions
  apply_fn, params = _cnn(4)
  p64 = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64) * (1 + 1e-9), params)
  assert not engine.params_exact_f32(p64)
  C = np.array([[1 / 3, -1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0, -0.7]])
  d = np.array([0.1, -0.2])
  x0 = np.random.default_rng(5).uniform(0.2, 0.8, 64)
  lo, hi = x0 - 0.05, x0 + 0.05
  region = as_regions([((lo, hi), [(C, d)])])[0]
  got = engine.region_lower(apply_fn, p64, (1, 8, 8), engine.fingerprint(apply_fn, p64, (1, 8, 8)),
                            region, sound=True, mode=mode, memory_bytes=1 << 28)
  xs = lo + (hi - lo) * np.random.default_rng(6).random((10_000, 64))
  xs = np.concatenate([xs, x0[None]])
  ys = _f64_outputs(apply_fn, p64, xs) @ C.T - d
  assert got.shape == (2,) and np.all(np.isfinite(got))
  assert np.all(got <= ys.min(axis=0)), (got, ys.min(axis=0))
  assert np.all(ys.min(axis=0) - got < 10.0)


# ------------------------------------------------------------------------------------------------
# the memory budget (`boundjax.verify.memory`, ``verify(memory=)``)
# ------------------------------------------------------------------------------------------------

def test_memory_shares_and_chunk_estimates():
  """`memory.shares` splits the total (a quarter to the engine, half to the dense path, explicit
  overrides kept); `split_chunk` is the largest power of two up to 64 whose estimate fits, and
  `fit_chunk` raises `MemoryBudgetError` naming the size one box needs and the budget."""
  from boundjax.verify import MemoryBudgetError, memory
  assert memory.shares(4 << 30) == (1 << 30, 2 << 30)  # the former defaults
  assert memory.shares(4 << 30, memory_bytes=5, dense_memory_bytes=0) == (5, 0)
  with pytest.raises(ValueError, match="memory must be a positive"):
    memory.shares(0)
  widths, rows = (3, 64, 64, 2), 16
  fixed = memory.chain_fixed_bytes(widths, rows)
  per = memory.chain_box_bytes(widths, rows)
  # S = max(64 * 3, 64 * 64, 16 * 64) = 4096 numbers of 8 bytes, six copies per box
  assert per == 8 * (6 * 4096 + 2 * 3 + 4 * 128 + 16 * 4 + 1)
  assert memory.chain_box_bytes(widths, rows, alpha=True) > per
  assert memory.split_chunk(widths, rows, 1 << 30) == 64
  for c in (1, 2, 8, 32):
    assert memory.split_chunk(widths, rows, fixed + c * per) == c
    assert memory.split_chunk(widths, rows, fixed + c * per + per - 1) == c
  with pytest.raises(MemoryBudgetError, match=rf"needs about .*\({fixed + per} bytes\), more "
                                              rf"than its memory budget of 1000 bytes"):
    memory.split_chunk(widths, rows, 1000)
  err = memory.against_total(MemoryBudgetError("x", 300, 100), 1000)
  assert (err.needed, err.budget) == (3000, 1000) and "3000 bytes" in str(err)


def _unsat_by_lipschitz(seed: int, sizes=(3, 64, 64, 2)):
  """A random ReLU chain and the property ``y_0 >= t`` on ``[-1, 1]^n`` with ``t`` the maximum of
  ``y_0`` on a grid plus the grid's Lipschitz allowance (``Π ||W_k||_2`` times the largest
  distance to a grid point): unsat by construction, though close enough to the maximum that
  the whole box's bound does not prove it."""
  apply_fn, params, net = _mlp(seed, sizes)
  n, k = sizes[0], 21
  lo, hi = -np.ones(n), np.ones(n)
  y = _fwd(net, _grid(lo, hi, k))
  lip = np.prod([np.linalg.norm(np.asarray(w, np.float64), 2) for w in params["w"]])
  t = y[:, 0].max() + lip * np.sqrt(n) * (1.0 / (k - 1)) + 1e-3
  return apply_fn, params, [((lo, hi), [(np.array([[-1.0, 0.0]]), np.array([-t]))])]


def test_a_small_memory_budget_chooses_smaller_chunks_and_keeps_the_verdict():
  """With 3 MiB (a dense share of 1.5 MiB) input splitting bounds 4 boxes per call instead of
  64 (the estimate of 8 is over the share), and the verdict of an instance that needs
  branching is still unsat."""
  from boundjax.verify import memory
  apply_fn, params, prop = _unsat_by_lipschitz(0)
  out = mc.verify(apply_fn, params, (3,), prop, timeout=120.0, memory=3 << 20)
  assert out.status == "unsat", out
  assert out.stats["method"] == "input-split" and out.stats["nodes"] > 1
  chunk, dense = out.stats["chunk"], out.stats["memory"]["dense"]
  assert dense == 3 << 19 and chunk == 4
  widths, rows = (3, 64, 64, 2), 16
  fixed, per = memory.chain_fixed_bytes(widths, rows), memory.chain_box_bytes(widths, rows)
  assert fixed + chunk * per <= dense < fixed + 2 * chunk * per


def test_a_budget_too_small_for_one_subproblem_raises_naming_the_size():
  """Under 1 KiB neither the dense path (one box of input splitting) nor the engine (one box's
  backward state, CROWN-IBP included) fits: `MemoryBudgetError` with the size needed and the
  budget, not a verdict."""
  from boundjax.verify import MemoryBudgetError
  apply_fn, params, prop = _unsat_by_lipschitz(0)
  with pytest.raises(MemoryBudgetError, match=r"memory budget is 512 bytes.*a budget of at "
                                              r"least .* \(--memory / memory=\) fits it") as e:
    mc.verify(apply_fn, params, (3,), prop, timeout=60.0, memory=512)
  assert e.value.budget == 512 and e.value.needed > 512


def test_region_lower_compiles_once_for_any_number_of_open_rows():
  """The verifier bounds only the disjuncts still open, whose number varies between instances:
  `engine.padded_rows` pads the rows with zero rows to a multiple of the output count, so a
  region with 2 open rows after one with 4 (same network and mode) compiles nothing new, and
  each row's bound is the one the unpadded region gets row by row (within 1e-9)."""
  from jax import monitoring
  from boundjax.verify import engine
  from boundjax.verify.spec import as_regions
  apply_fn, params = _cnn(5)
  rng = np.random.default_rng(5)
  x0 = rng.uniform(0, 1, 64)
  base = _margin_property(apply_fn, params, x0, 0.02)
  (lo, hi), disjuncts = base[0]
  key = engine.fingerprint(apply_fn, params, (1, 8, 8))
  region = lambda djs: as_regions([((lo, hi), djs)])[0]  # noqa: E731

  def low(djs):
    return engine.region_lower(apply_fn, params, (1, 8, 8), key, region(djs), sound=True,
                               mode="crown", memory_bytes=1 << 28)

  assert len(disjuncts) == 4
  C = np.eye(3, 5)
  Cp, dp = engine.padded_rows(C, np.ones(3))
  assert Cp.shape == (5, 5) and np.array_equal(Cp[:3], C) and not Cp[3:].any() and dp[3:].sum() == 0
  assert engine.padded_rows(np.ones((7, 5)), np.ones(7))[0].shape == (10, 5)
  # many outputs: a power of two, not the output count
  assert engine.padded_rows(np.ones((3, 1000)), np.ones(3))[0].shape == (4, 1000)
  assert engine.padded_rows(np.ones((1, 1000)), np.ones(1))[0].shape == (1, 1000)
  all_rows = low(disjuncts)
  compiled = []

  def listener(name, *_, **__):
    if "backend_compile" in name:
      compiled.append(name)

  monitoring.register_event_duration_secs_listener(listener)
  try:
    two = low(disjuncts[1:3])
  finally:
    monitoring.unregister_event_duration_listener(listener)
  assert compiled == [], compiled
  np.testing.assert_allclose(two, all_rows[1:3], rtol=1e-9, atol=1e-9)
  for j, dj in enumerate(disjuncts):
    np.testing.assert_allclose(low([dj]), all_rows[j:j + 1], rtol=1e-9, atol=1e-9)

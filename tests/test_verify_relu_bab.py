"""ReLU-splitting branch and bound on the engine (`boundjax.verify.relu_bab`), with the MILP
fallback off so that only the engine's split bounds decide: against a dense float64 grid of the
box (a property violated on the grid must not be ``unsat``; one that holds with a margin the
root bound cannot see must be ``unsat``; a ``sat`` answer replays)."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boundjax.verify import attack, chain, relu_bab
from boundjax.verify.outcome import Deadline
from tests.helpers import chain_apply
from boundjax.verify.spec import Disjunct, Region


def _net(seed, sizes):
  rng = np.random.default_rng(seed)
  ws = [rng.normal(size=(o, i)) / np.sqrt(i) for i, o in zip(sizes[:-1], sizes[1:])]
  bs = [0.3 * rng.normal(size=o) for o in sizes[1:]]

  apply_fn = chain_apply
  return ws, bs, apply_fn, {"w": ws, "b": bs}


def _fwd(ws, bs, x):
  h = x
  for k, (w, b) in enumerate(zip(ws, bs)):
    h = h @ w.T + b
    if k < len(ws) - 1:
      h = np.maximum(h, 0.0)
  return h


@pytest.mark.parametrize("seed", [0, 1])
def test_relu_split_on_the_engine_without_milp(seed):
  ws, bs, apply_fn, params = _net(30 + seed, (3, 20, 20, 2))
  lo, hi = -0.6 * np.ones(3), 0.6 * np.ones(3)
  axes = [np.linspace(a, b, 41) for a, b in zip(lo, hi)]
  grid = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)
  C = np.array([[1.0, -1.0]])
  vals = _fwd(ws, bs, grid) @ C.T
  true_min = vals.min()
  replay = attack.Replayer(apply_fn, params, (3,))
  with jax.enable_x64(True):
    lay = chain.Layers(tuple(jnp.asarray(w) for w in ws), tuple(jnp.asarray(b) for b in bs),
                         tuple(jnp.abs(jnp.asarray(w)) for w in ws))
    from boundjax.domains.linear import crown
    from boundjax.core.interval import Interval
    root = crown(relu_bab._chain, splits=True)(
        relu_bab._params(lay, C, np.zeros(1)),
        Interval(jnp.asarray(lo[None]), jnp.asarray(hi[None])))
    root_lb = float(root.lower[0, 0])
    assert root_lb < true_min - 0.05  # there is something for branch and bound to do
    for want in ("unsat", "sat"):
      if want == "unsat":  # holds by a margin far below the root bound's gap
        d = np.array([true_min - 0.02 * (true_min - root_lb) - 0.01])
      else:  # violated at a grid point
        d = np.array([true_min + 0.01])
      dj = Disjunct(C, d)
      region = Region(lo, hi, (dj,))
      status, cex, nodes, how = relu_bab.relu_split(
          lay, None, region, dj, replay, Deadline(120.0), sound=True, batch=32,
          use_milp=False, root_steps=20, steps=10)
      if want == "sat":
        assert status == "sat", (status, nodes, how)
        x, y = cex
        assert np.all(C @ y - d <= 0) and np.all(x >= lo) and np.all(x <= hi)
      else:
        assert status == "unsat", (status, nodes, how)
        assert how == "bab" and nodes > 1


@pytest.mark.slow
def test_root_alpha_on_intermediate_layers_proves_at_the_root():
  """The root's α-CROWN with every hidden layer's bounds optimised (``root_alpha_intermediate``,
  the default) proves a property whose threshold ``d`` lies between the root bound with
  CROWN's intermediate bounds and the bound with optimised ones, without branching; with
  CROWN's intermediate bounds the root does not prove it. The property holds: ``d`` is below
  the minimum of ``C y`` on a dense grid of the box."""
  ws, bs, apply_fn, params = _net(7, (3, 16, 16, 16, 16, 2))
  lo, hi = -0.5 * np.ones(3), 0.5 * np.ones(3)
  axes = [np.linspace(a, b, 41) for a, b in zip(lo, hi)]
  grid = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)
  C = np.array([[1.0, -1.0]])
  true_min = float((_fwd(ws, bs, grid) @ C.T).min())
  replay = attack.Replayer(apply_fn, params, (3,))
  with jax.enable_x64(True):
    lay = chain.Layers(tuple(jnp.asarray(w) for w in ws), tuple(jnp.asarray(b) for b in bs),
                       tuple(jnp.abs(jnp.asarray(w)) for w in ws))
    from boundjax.core.interval import Interval
    box = Interval(jnp.asarray(lo[None]), jnp.asarray(hi[None]))
    p = relu_bab._params(lay, C, np.zeros(1))
    roots = [float(relu_bab._bounder(True, "crown", 20, 0.1, ai)(p, box)[0].lower[0, 0])
             for ai in (False, True)]
    assert roots[0] < roots[1] - 0.02 and roots[1] < true_min, (roots, true_min)
    d = np.array([(roots[0] + roots[1]) / 2])
    dj = Disjunct(C, d)
    region = Region(lo, hi, (dj,))
    runs = {ai: relu_bab.relu_split(lay, None, region, dj, replay, Deadline(120.0), sound=True,
                                    batch=32, use_milp=False, root_steps=20, steps=10,
                                    root_alpha_intermediate=ai) for ai in (False, True)}
  assert runs[True][0] == "unsat" and runs[True][2:] == (1, "bounds"), runs[True]
  assert runs[False][0] != "unsat" or runs[False][3] == "bab", runs[False]


def _cnn_apply(p, x):
  """A small convolutional network on one (6, 6, 1) image: two 3x3 convolutions with ReLU, a
  dense layer with ReLU, two outputs."""
  dn = ("NHWC", "HWIO", "NHWC")
  h = x[None]
  for k in ("c1", "c2"):
    h = jax.lax.conv_general_dilated(h, p[k], (1, 1), "VALID", dimension_numbers=dn)
    h = jax.nn.relu(h + p[k + "b"])
  h = jax.nn.relu(h.reshape(-1) @ p["d1"] + p["d1b"])
  return h @ p["d2"] + p["d2b"]


def _cnn_params(seed):
  rng = np.random.default_rng(seed)
  f32 = lambda a: np.asarray(a, np.float32)
  return {"c1": f32(rng.normal(size=(3, 3, 1, 4)) / 3), "c1b": f32(0.2 * rng.normal(size=4)),
          "c2": f32(rng.normal(size=(3, 3, 4, 4)) / 6), "c2b": f32(0.2 * rng.normal(size=4)),
          "d1": f32(rng.normal(size=(16, 12)) / 4), "d1b": f32(0.2 * rng.normal(size=12)),
          "d2": f32(rng.normal(size=(12, 2)) / 3.5), "d2b": f32(0.2 * rng.normal(size=2))}


def _three_pixel_box(seed):
  """The CNN of `_cnn_params(seed)` on a fixed image whose three pixels 7, 14, 21 range over
  ±0.6, and the true minimum of ``y0 - y1`` there from a 41³ float64 grid:
  ``(params, shape, lo, hi, replay, C, true_min)``."""
  params = _cnn_params(seed)
  shape = (6, 6, 1)
  centre = np.random.default_rng(seed + 100).uniform(0, 1, size=36)
  free = np.array([7, 14, 21])
  lo, hi = centre.copy(), centre.copy()
  lo[free] -= 0.6
  hi[free] += 0.6
  axes = [np.linspace(lo[i], hi[i], 41) for i in free]
  grid = np.repeat(centre[None], 41 ** 3, 0)
  grid[:, free] = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)
  replay = attack.Replayer(_cnn_apply, params, shape)
  C = np.array([[1.0, -1.0]])
  return params, shape, lo, hi, replay, C, float((replay(grid) @ C.T).min())


@pytest.mark.parametrize("seed", [3, pytest.param(6, marks=pytest.mark.slow)])
def test_relu_split_on_the_network_itself(seed):
  """`relu_bab.engine_problem`: ReLU splitting with the engine's bounds through the
  convolutions (float32, sound), no dense chain and no MILP. Three pixels of a fixed image
  range over ±0.6 (the other 33 are fixed), so a dense float64 grid of the 3-dimensional box
  gives the true minimum of ``y0 - y1`` up to the grid's spacing: a threshold violated on the
  grid is never ``unsat`` (``sat`` with a replayed counterexample, or no answer: the search
  finds counterexamples only at its bounds' minimising corners, the attack before it is the
  verifier's falsifier), one below the minimum by a margin far smaller than the root bound's
  gap is ``unsat`` after branching."""
  params, shape, lo, hi, replay, C, true_min = _three_pixel_box(seed)
  probe = relu_bab.engine_problem(_cnn_apply, params, shape, f"cnn{seed}", C, np.zeros(1),
                                  sound=True, root_steps=20, steps=10, lr=0.1)
  out, info = probe.root(probe.params, probe.box(lo[None], hi[None]))
  root_lb = float(out.lower[0, 0])
  assert [np.asarray(l).shape[-1] for l, _ in info.pre] == [64, 16, 12]  # three ReLU nodes
  assert root_lb < true_min - 0.05, (root_lb, true_min)  # something for branching to do
  for want in ("unsat", "sat"):
    d = (np.array([true_min - 0.03 * (true_min - root_lb) - 0.005]) if want == "unsat"
         else np.array([true_min + 0.01]))
    dj = Disjunct(C, d)
    region = Region(lo, hi, (dj,))
    problem = relu_bab.engine_problem(_cnn_apply, params, shape, f"cnn{seed}", C, d,
                                      sound=True, root_steps=20, steps=10, lr=0.1)
    status, cex, nodes, how = relu_bab.split_search(
        problem, region, dj, replay, Deadline(120.0 if want == "unsat" else 20.0), batch=32)
    if want == "sat":
      assert status in ("sat", "unknown", "timeout"), (status, nodes, how)
      if status != "sat":
        continue
      x, y = cex
      assert np.all(C @ y - d <= 0) and np.all(x >= lo) and np.all(x <= hi)
      np.testing.assert_allclose(replay(x[None])[0], y)
    else:
      assert status == "unsat", (status, nodes, how)
      assert how == "bab" and nodes > 1


def test_search_goes_on_when_the_milp_fallback_cannot_run(monkeypatch):
  """A MILP fallback that returns ``unknown`` (its own bounds of a large network do not fit the
  memory) does not end the disjunct: ReLU splitting resumes from its frontier for the time
  left and proves what it proves without the fallback (the CNN and threshold of
  `test_relu_split_on_the_network_itself`, whose branching proves it)."""
  seed = 3
  params, shape, lo, hi, replay, C, true_min = _three_pixel_box(seed)
  probe = relu_bab.engine_problem(_cnn_apply, params, shape, f"cnn{seed}", C, np.zeros(1),
                                  sound=True, root_steps=20, steps=10, lr=0.1)
  root_lb = float(probe.root(probe.params, probe.box(lo[None], hi[None]))[0].lower[0, 0])
  assert root_lb < true_min - 0.05  # the root does not prove it: branching must
  d = np.array([true_min - 0.03 * (true_min - root_lb) - 0.005])
  dj = Disjunct(C, d)
  problem = relu_bab.engine_problem(_cnn_apply, params, shape, f"cnn{seed}", C, d, sound=True,
                                    root_steps=20, steps=10, lr=0.1)
  calls = []

  class Gone:  # the first search's share of the time is over at once
    def __init__(self, *a):
      pass

    def remaining(self):
      return -1.0

  monkeypatch.setattr(relu_bab, "_Until", Gone)
  status, _, nodes, how = relu_bab.split_search(
      problem, Region(lo, hi, (dj,)), dj, replay, Deadline(120.0), batch=32,
      milp=lambda *a: calls.append(1) or ("unknown", None), milp_unstable=-1)
  assert calls == [1]
  assert (status, how) == ("unsat", "bab") and nodes > 1


def test_a_frontier_over_its_byte_cap_ends_the_search_unknown():
  """The frontier's arrays (splits, α, β of the open domains) are capped in bytes: with a cap
  smaller than one domain the search stops at once with ``"unknown"`` (neither a verdict nor a
  timeout, long before its deadline), where without the cap it proves the property (the
  instance of `test_search_goes_on_when_the_milp_fallback_cannot_run`, which proves it). The
  verifier gives its searches an eighth of ``memory``."""
  seed = 3
  params, shape, lo, hi, replay, C, true_min = _three_pixel_box(seed)
  probe = relu_bab.engine_problem(_cnn_apply, params, shape, f"cnn{seed}", C, np.zeros(1),
                                  sound=True, root_steps=20, steps=10, lr=0.1)
  root_lb = float(probe.root(probe.params, probe.box(lo[None], hi[None]))[0].lower[0, 0])
  d = np.array([true_min - 0.03 * (true_min - root_lb) - 0.005])
  dj = Disjunct(C, d)
  problem = relu_bab.engine_problem(_cnn_apply, params, shape, f"cnn{seed}", C, d, sound=True,
                                    root_steps=20, steps=10, lr=0.1)
  t0 = time.perf_counter()
  capped = relu_bab.split_search(problem, Region(lo, hi, (dj,)), dj, replay, Deadline(120.0),
                                 batch=32, frontier_bytes=64)
  assert capped[0] == "unknown" and time.perf_counter() - t0 < 60, capped
  from boundjax.verify import memory
  assert memory.frontier_bytes(4 << 30) == 512 << 20


def test_engine_problem_float32_needs_exact_inputs_float64_takes_any():
  """Without ``sound`` the engine's problem runs in float32: parameters or a specification not
  exact there would make it bound another network or property, so no problem is made and the
  verifier's other paths go on. With ``sound`` it runs in float64, where they are exact: a
  problem is made, its parameters and boxes are float64, and its root bound holds on the
  float64 network (sampled)."""
  params = _cnn_params(3)
  C = np.array([[1.0, -1.0]])
  p64 = dict(params, d2b=params["d2b"].astype(np.float64) + 1e-12)
  C01 = np.array([[0.1, -1.0]])
  for p, c in ((params, C), (p64, C), (params, C01)):
    fast = relu_bab.engine_problem(_cnn_apply, p, (6, 6, 1), "x", c, np.zeros(1), sound=False,
                                   root_steps=5, steps=5, lr=0.1)
    assert (fast is not None) == (p is params and c is C)
    sound = relu_bab.engine_problem(_cnn_apply, p, (6, 6, 1), "y", c, np.zeros(1), sound=True,
                                    root_steps=5, steps=5, lr=0.1)
    assert sound is not None
    assert all(a.dtype == np.float64 for a in jax.tree_util.tree_leaves(sound.params))
    lo = np.random.default_rng(0).uniform(0, 1, 36)
    box = sound.box(lo[None], (lo + 0.05)[None])
    assert box.lower.dtype == np.float64
    out, _ = sound.root(sound.params, box)
    pts = lo + 0.05 * np.random.default_rng(1).uniform(0, 1, (10_000, 36))
    pts = np.concatenate([pts, lo[None], (lo + 0.05)[None]])
    with jax.enable_x64(True):
      pj = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), p)
      ys = jax.vmap(lambda x: _cnn_apply(pj, x.reshape(6, 6, 1)))(jnp.asarray(pts))
    margins = np.asarray(ys) @ c.T
    assert float(out.lower[0, 0]) <= margins.min()


@pytest.mark.parametrize("seed", [11, pytest.param(12, marks=pytest.mark.slow)])
def test_milp_refined_bounds_hold_and_never_prove_a_violated_property(seed, monkeypatch):
  """`relu_bab.MilpRefiner` (MILP per neuron of hidden layer 1, `milp.tighten`), run at once
  (the first search's share of the time set to 0), on a 3-16-16-16-16-2 chain over a box whose
  dense float64 grid gives the true minimum of ``y0 - y1``: the refined node bounds contain
  every grid point's pre-activations, the root bound on them is at least the unrefined one, a
  threshold below the minimum is ``unsat``, and a threshold violated on the grid is never
  ``unsat`` (``sat`` replays), the MILP fallback on the refined bounds included."""
  from milp.network import AffineLayer, Network
  monkeypatch.setattr(relu_bab, "REFINE_AFTER", 0.0)
  ws, bs, apply_fn, params = _net(seed, (3, 16, 16, 16, 16, 2))
  net = Network(tuple(AffineLayer(w, w.copy(), b, b.copy()) for w, b in zip(ws, bs)), (3,))
  lo, hi = -0.5 * np.ones(3), 0.5 * np.ones(3)
  axes = [np.linspace(a, b, 41) for a, b in zip(lo, hi)]
  grid = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)
  C = np.array([[1.0, -1.0]])
  true_min = float((_fwd(ws, bs, grid) @ C.T).min())
  pre, h = [], grid
  for w, b in zip(ws[:-1], bs[:-1]):
    pre.append(h @ w.T + b)
    h = np.maximum(pre[-1], 0.0)
  replay = attack.Replayer(apply_fn, params, (3,))
  with jax.enable_x64(True):
    lay = chain.Layers(tuple(jnp.asarray(w) for w in ws), tuple(jnp.asarray(b) for b in bs),
                       tuple(jnp.abs(jnp.asarray(w)) for w in ws))
    probe = relu_bab.chain_problem(lay, C, np.zeros(1), sound=True, root_steps=20, steps=10,
                                   lr=0.1, root_alpha_intermediate=True)
    root_lb = float(relu_bab._root(probe, lo[None], hi[None], None)[0].max())
    assert root_lb < true_min - 0.05, (root_lb, true_min)
    for want in ("unsat", "sat"):
      d = (np.array([true_min - 0.03 * (true_min - root_lb) - 0.005]) if want == "unsat"
           else np.array([true_min + 0.01]))
      dj = Disjunct(C, d)
      region = Region(lo, hi, (dj,))
      refiner = relu_bab.MilpRefiner(net, region)
      # with the MILP fallback on its refined bounds, as the verifier runs it (a domain left
      # with no unstable neuron, e.g. after refinement made most of them stable, ends the
      # search; the MILP decides)
      status, cex, nodes, how = relu_bab.relu_split(
          lay, net, region, dj, replay, Deadline(120.0), sound=True, batch=32,
          use_milp=True, milp_unstable=0, root_steps=20, steps=10, refine=refiner)
      if want == "sat":
        assert status != "unsat", (status, nodes, how)
        if status == "sat":
          x, y = cex
          assert np.all(C @ y - d <= 0) and np.all(x >= lo) and np.all(x <= hi)
        continue
      assert status == "unsat", (status, nodes, how)
      assert refiner.tried and refiner.solves > 0 and refiner.known is not None
      lbs, ubs = refiner.known
      for z, l, u in zip(pre, lbs, ubs):
        assert np.all(z >= l - 1e-9) and np.all(z <= u + 1e-9)
      refined_lb = float(relu_bab._root(probe, lo[None], hi[None], refiner.known)[0].max())
      assert refined_lb >= root_lb - 1e-9, (refined_lb, root_lb)


@pytest.mark.parametrize("seed", [2, 3])
def test_leaves_are_decided_by_their_lps_without_the_milp(seed, monkeypatch):
  """Thresholds within 1e-6 of the minimum of a 2-8-8-2 chain: the search reaches domains with
  no unstable neuron (counted), where β-CROWN's steps stop short of the LP's value; their LPs
  (`boundjax.verify.leaf`) decide them, with no MILP. The minimum is that of the LPs of every
  activation region met on an 801² grid (an independent linprog per region): a threshold just
  below it is ``unsat`` or a replayed ``sat`` (a region the grid missed), and one just above
  it is ``sat``."""
  from boundjax.verify import leaf as leaf_mod
  from tests.test_crown_splits import _lp_min
  calls = []
  solve = leaf_mod.solve_leaf
  monkeypatch.setattr(leaf_mod, "solve_leaf", lambda *a: calls.append(1) or solve(*a))
  ws, bs, apply_fn, params = _net(seed, (2, 8, 8, 2))
  lo, hi = -np.ones(2), np.ones(2)
  axes = [np.linspace(a, b, 801) for a, b in zip(lo, hi)]
  grid = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 2)
  C = np.array([[1.0, -1.0]])
  h, signs = grid, []
  for w, b in zip(ws[:-1], bs[:-1]):
    z = h @ w.T + b
    signs.append(z >= 0)
    h = np.maximum(z, 0.0)
  patterns = np.unique(np.concatenate(signs, 1), axis=0)
  region_min = min(m for p in patterns
                   if (m := _lp_min(ws, bs, C[0], lo, hi, [np.where(p[:8], 1, -1),
                                                           np.where(p[8:], 1, -1)])) is not None)
  grid_min = float((_fwd(ws, bs, grid) @ C.T).min())
  assert region_min <= grid_min + 1e-12
  replay = attack.Replayer(apply_fn, params, (2,))
  with jax.enable_x64(True):
    lay = chain.Layers(tuple(jnp.asarray(w) for w in ws), tuple(jnp.asarray(b) for b in bs),
                       tuple(jnp.abs(jnp.asarray(w)) for w in ws))
    for want, d in (("unsat", region_min - 1e-6), ("sat", region_min + 1e-6)):
      dj = Disjunct(C, np.array([d]))
      status, cex, nodes, how = relu_bab.relu_split(
          lay, None, Region(lo, hi, (dj,)), dj, replay, Deadline(60.0), sound=True, batch=16,
          use_milp=False, root_steps=20, steps=10)
      assert status in ("unsat", "sat"), (want, status, nodes, how)
      if status == "sat":
        x, y = cex
        assert np.all(C @ y - d <= 0) and np.all(x >= lo) and np.all(x <= hi)
      assert status == want or want == "unsat", (want, status)
  assert calls, "no leaf was reached"


def test_stored_warm_start_keeps_the_root_unstable_entries_and_zeros_the_rest():
  """The frontier's compressed α/β (`_stored`) put back by `_warm`: the lower rows of the kept
  neurons exactly (float32), zeros elsewhere, as one side (the engine's lower-only passes); the
  other entries are dropped. Engine results of one side (lower_only) or two are stored alike."""
  from boundjax.verify.relu_bab import _stored, _warm
  rng = np.random.default_rng(0)
  full = [rng.random((3, 2, 1, 7)), rng.random((3, 2, 1, 4))]
  keep = [np.array([1, 4, 6]), np.array([], np.int64)]
  stored = _stored(full, keep, 2)
  assert [s.shape for s in stored] == [(2, 1, 3), (2, 1, 0)]
  one_side = _stored([full[0][:, :1]], keep[:1], 2)
  np.testing.assert_array_equal(one_side[0], stored[0])
  back = _warm(stored[0], np.float64, keep[0], 7)
  assert back.shape == (2, 1, 1, 7)
  np.testing.assert_array_equal(back[:, 0, 0, keep[0]], full[0][:2, 0, 0, keep[0]].astype(np.float32))
  assert np.all(np.delete(back, keep[0], axis=-1) == 0)
  assert np.all(_warm(stored[1], np.float64, keep[1], 4) == 0)

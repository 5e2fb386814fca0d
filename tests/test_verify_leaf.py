"""Leaf domains decided by LP (`boundjax.verify.leaf`): the LP's duals, given to the engine as β,
make its sound bound the LP's value; the bound holds on points sampled in the leaf's polytope
(rejection sampling in the box, at least 10^4 candidates plus corners); an empty leaf is
closed through its Farkas multipliers; a candidate lies in the polytope and violates."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boundjax.core.interval import Interval
from boundjax.verify import chain
from boundjax.verify.leaf import affine_pattern, solve_leaf
from tests.test_crown_splits import _pre_np as _pre


def _net(seed: int, sizes=(3, 10, 10, 2)):
  rng = np.random.default_rng(seed)
  ws = [rng.normal(size=(o, i)) / np.sqrt(i) for i, o in zip(sizes[:-1], sizes[1:])]
  bs = [0.3 * rng.normal(size=o) for o in sizes[1:]]
  return ws, bs


def _feasible(ws, bs, splits, x):
  zs, y = _pre(ws, bs, x)
  ok = np.ones(len(x), bool)
  for z, s in zip(zs, splits):
    ok &= np.all((s * z >= 0) | (s == 0), axis=1)
  return x[ok], y[ok]


def _engine(ws, bs, C, d, lo, hi, splits, beta):
  """The verifier's sound bound of a domain (`chain.bounder`, one step: the warm start is the
  only iterate) with multipliers ``beta`` (per layer (R, n)) on the lower rows."""
  lay = chain.Layers(tuple(jnp.asarray(w) for w in ws), tuple(jnp.asarray(b) for b in bs),
                     tuple(jnp.abs(jnp.asarray(w)) for w in ws))
  f = chain.bounder(True, "ibp", 1, 0.1, beta=True)
  R = C.shape[0]
  pre = [(jnp.full((1, len(s)), -jnp.inf), jnp.full((1, len(s)), jnp.inf)) for s in splits]
  alpha = [jnp.ones((1, 2, R, len(s))) for s in splits]
  warm_b = [jnp.asarray(np.stack([b, np.zeros_like(b)])[None]) for b in beta]
  out, info = f(chain.chain_params(lay, C, d), Interval(jnp.asarray(lo[None]), jnp.asarray(hi[None])),
                pre=pre, splits=[jnp.asarray(s[None]) for s in splits], warm=(alpha, warm_b))
  return np.asarray(out.lower[0]), bool(np.asarray(info.infeasible)[0])


def _samples(lo, hi, x0, n, seed):
  rng = np.random.default_rng(seed)
  corners = np.array(list(itertools.product(*zip(lo, hi))))
  near = np.clip(x0 + 0.05 * (hi - lo) * rng.normal(size=(n // 2, len(lo))), lo, hi)
  return np.concatenate([rng.uniform(lo, hi, (n // 2, len(lo))), near, corners, x0[None]])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_lp_duals_make_the_engine_bound_the_lp_value(seed):
  with jax.enable_x64(True):
    ws, bs = _net(seed)
    rng = np.random.default_rng(100 + seed)
    lo = rng.uniform(-1.0, -0.2, 3)
    hi = lo + rng.uniform(0.4, 1.2, 3)
    x0 = rng.uniform(lo, hi)
    zs, y0 = _pre(ws, bs, x0[None])
    splits = [np.where(z[0] >= 0, 1, -1).astype(np.int8) for z in zs]
    C, d = rng.normal(size=(2, 2)), np.zeros(2)
    free = [np.full(len(s), -np.inf) for s in splits], [np.full(len(s), np.inf) for s in splits]
    leaf = solve_leaf(ws, bs, C, d, lo, hi, splits, *free)
    assert np.all(np.isfinite(leaf.value))
    xs, ys = _feasible(ws, bs, splits, _samples(lo, hi, x0, 20_000, seed))
    assert len(xs) >= 100, len(xs)
    g = ys @ C.T - d
    assert np.all(leaf.value <= g.min(0) + 1e-9), (leaf.value, g.min(0))  # an LP's minimum
    bound, empty = _engine(ws, bs, C, d, lo, hi, splits, leaf.beta)
    plain, _ = _engine(ws, bs, C, d, lo, hi, splits, [np.zeros_like(b) for b in leaf.beta])
    assert not empty
    assert np.all(g >= bound), (g.min(0), bound)  # sound, tolerance 0
    assert np.all(bound >= leaf.value - 1e-7 * (1 + np.abs(leaf.value))), (bound, leaf.value)
    assert np.all(bound >= plain - 1e-9) and np.any(bound > plain + 1e-3), (bound, plain)
    # thresholds violated on the leaf: a candidate in its polytope where every row is <= 0
    d2 = leaf.value + 0.05 * (1 + np.abs(leaf.value))
    cand = solve_leaf(ws, bs, C, d2, lo, hi, splits, *free).candidate
    if cand is not None:
      assert np.all(cand >= lo) and np.all(cand <= hi)
      zc, yc = _pre(ws, bs, cand[None])
      assert all(np.all(s * z[0] >= -1e-9) for s, z in zip(splits, zc))
      assert np.all(yc[0] @ C.T - d2 <= 1e-9)


def test_an_empty_leaf_is_closed_by_its_farkas_multipliers():
  """Random sign patterns of every neuron: those the engine does not see as empty (its
  clipped bounds meet) but whose LP is infeasible get multipliers that lift the engine's
  bound above 0, and rejection sampling finds no point in them."""
  with jax.enable_x64(True):
    ws, bs = _net(7, (3, 6, 6, 1))
    lo, hi = -np.ones(3), np.ones(3)
    C, d = np.ones((1, 1)), np.zeros(1)
    rng = np.random.default_rng(7)
    xs = _samples(lo, hi, np.zeros(3), 20_000, 7)
    free = [np.full(6, -np.inf)] * 2, [np.full(6, np.inf)] * 2
    closed = 0
    for _ in range(60):
      splits = [rng.choice(np.array([-1, 1], np.int8), 6) for _ in range(2)]
      leaf = solve_leaf(ws, bs, C, d, lo, hi, splits, *free)
      if not np.all(np.isinf(leaf.value) & (leaf.value > 0)):
        continue
      assert len(_feasible(ws, bs, splits, xs)[0]) == 0
      plain, empty = _engine(ws, bs, C, d, lo, hi, splits, [np.zeros((1, 6))] * 2)
      if empty or plain[0] > 0:
        continue
      bound, _ = _engine(ws, bs, C, d, lo, hi, splits, leaf.beta)
      assert bound[0] > 0, (plain, bound)
      closed += 1
    assert closed >= 3, closed


def test_affine_pattern_is_the_network_on_its_pattern_and_refuses_a_non_leaf():
  ws, bs = _net(3)
  rng = np.random.default_rng(3)
  x = rng.uniform(-1, 1, (50, 3))
  zs, y = _pre(ws, bs, x)
  C, d = rng.normal(size=(2, 2)), rng.normal(size=2)
  for i in range(5):
    # split the first layer, leave the second free but stable on given bounds
    splits = [np.where(zs[0][i] >= 0, 1, -1).astype(np.int8), np.zeros(10, np.int8)]
    act = zs[1][i] >= 0
    lbs = [np.full(10, -np.inf), np.where(act, 0.0, -1.0)]
    ubs = [np.full(10, np.inf), np.where(act, 1.0, 0.0)]
    _, _, where, G, h = affine_pattern(ws, bs, C, d, splits, lbs, ubs)
    assert len(where) == 10
    same = np.all((zs[0] >= 0) == (zs[0][i] >= 0), axis=1) & np.all((zs[1] >= 0) == act, axis=1)
    assert same[i]
    np.testing.assert_allclose(x[same] @ G.T + h, y[same] @ C.T - d, rtol=1e-12, atol=1e-12)
  with pytest.raises(ValueError, match="not a leaf"):
    affine_pattern(ws, bs, C, d, [np.zeros(10, np.int8)] * 2,
                   [np.full(10, -1.0)] * 2, [np.full(10, 1.0)] * 2)

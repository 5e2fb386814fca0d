"""Per-neuron MILP/LP tightening of pre-activation bounds (`milp.tighten`): the tightened bounds
hold at 10^4 sampled points and every corner of the box (float64 forward pass), are never
looser than the bounds given, are tighter than interval bounds where those are loose, and a
past deadline solves nothing."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from milp import bounds as bounds_lib
from milp.network import AffineLayer, Network
from milp.tighten import tighten_layer


def _net(seed: int, sizes=(6, 12, 12, 12, 2)) -> Network:
  rng = np.random.default_rng(seed)
  layers = []
  for i, o in zip(sizes[:-1], sizes[1:]):
    w = rng.normal(size=(o, i)) / np.sqrt(i)
    b = 0.3 * rng.normal(size=o)
    layers.append(AffineLayer(w, w.copy(), b, b.copy()))
  return Network(tuple(layers), (sizes[0],))


def _pre_activations(net: Network, xs: np.ndarray) -> list[np.ndarray]:
  out, h = [], xs
  for k, layer in enumerate(net.layers):
    z = h @ layer.w_lower.T + layer.b_lower
    out.append(z)
    h = np.maximum(z, 0.0)
  return out


def _points(lo, hi, seed):
  rng = np.random.default_rng(seed)
  corners = np.array(list(itertools.product(*zip(lo, hi))))
  return np.concatenate([rng.uniform(lo, hi, size=(10_000, lo.size)), corners])


@pytest.mark.parametrize("seed,mode", [(0, "milp"), (1, "milp"), (2, "lp")])
def test_tightened_bounds_hold_at_samples_and_corners(seed, mode):
  net = _net(seed)
  lo, hi = -np.ones(6), np.ones(6)
  start = bounds_lib.compute(net, lo, hi, "ibp")
  zs = _pre_activations(net, _points(lo, hi, seed))
  bounds = [(l.copy(), u.copy()) for l, u in start]
  tighter = 0
  for m in (1, 2):
    L, U, n = tighten_layer(net, lo, hi, bounds, m, mode=mode, time_limit=10.0, threads=2)
    L0, U0 = bounds[m]
    assert n > 0
    assert np.all(L >= L0) and np.all(U <= U0)  # never looser
    assert np.all(zs[m] >= L[None] - 1e-12) and np.all(zs[m] <= U[None] + 1e-12), (
        float(np.min(zs[m] - L)), float(np.min(U - zs[m])))
    tighter += int(np.sum(U < U0 - 1e-6) + np.sum(L > L0 + 1e-6))
    bounds[m] = (L, U)
  assert tighter > 0  # interval bounds of a 3-layer chain are loose: the solves must help


def test_milp_is_at_least_as_tight_as_the_lp_and_threads_agree():
  net = _net(5)
  lo, hi = -np.ones(6), np.ones(6)
  start = bounds_lib.compute(net, lo, hi, "ibp")
  lp = tighten_layer(net, lo, hi, start, 1, mode="lp", time_limit=10.0, threads=1)
  # solved to optimality (the default gap of 1 % lets the order of solves matter)
  one = tighten_layer(net, lo, hi, start, 1, mode="milp", time_limit=10.0, threads=1,
                      relative_gap=1e-9)
  two = tighten_layer(net, lo, hi, start, 1, mode="milp", time_limit=10.0, threads=2,
                      relative_gap=1e-9)
  assert np.all(one[1] <= lp[1] + 1e-6) and np.all(one[0] >= lp[0] - 1e-6)
  assert np.sum(one[1] < lp[1] - 1e-4) + np.sum(one[0] > lp[0] + 1e-4) > 0
  # the outward margin scales with the interval's width when the solve ends, which depends on
  # whether the other direction's solve (on the other thread) has ended: 1e-5 relative
  np.testing.assert_allclose(one[0], two[0], atol=1e-4)
  np.testing.assert_allclose(one[1], two[1], atol=1e-4)


def test_a_past_deadline_solves_nothing_and_bad_arguments_raise():
  net = _net(3)
  lo, hi = -np.ones(6), np.ones(6)
  start = bounds_lib.compute(net, lo, hi, "ibp")
  L, U, n = tighten_layer(net, lo, hi, start, 1, deadline=time.monotonic() - 1.0)
  assert n == 0
  np.testing.assert_array_equal(L, start[1][0])
  np.testing.assert_array_equal(U, start[1][1])
  with pytest.raises(ValueError, match="mode"):
    tighten_layer(net, lo, hi, start, 1, mode="exact")
  with pytest.raises(ValueError, match="layer 9"):
    tighten_layer(net, lo, hi, start, 9)

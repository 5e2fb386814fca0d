"""ReLU-splitting branch and bound on the engine (`boundjax.verify.relu_bab`), with the MILP
fallback off so that only the engine's split bounds decide: against a dense float64 grid of the
box (a property violated on the grid must not be ``unsat``; one that holds with a margin the
root bound cannot see must be ``unsat``; a ``sat`` answer replays)."""

from __future__ import annotations

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

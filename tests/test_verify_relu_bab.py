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

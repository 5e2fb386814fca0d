"""Safe LP bounds from dual vectors (`milp.safe_dual`): the bound lies below every feasible point
(10^4 samples plus the feasible box corners), for the solver's duals and for arbitrary ones; it
is never above the exact rational value of the same weak-duality bound (Fractions), also with
coefficients spanning 16 orders of magnitude; it is within 1e-7 of HiGHS's optimum; maximising
mirrors minimising; and LP-mode tightening keeps the safe bound with no margin."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from milp.encode import Encoding
from milp.safe_dual import LinearProgram
from milp.solve import SolveConfig, solve


def _lp(seed: int, n: int = 5, m: int = 4, scale: float = 1.0):
  """``min c x`` over ``lo <= x <= hi`` and ``l <= A x <= u`` with a known interior point."""
  rng = np.random.default_rng(seed)
  lo, hi = -rng.uniform(0.5, 2, n), rng.uniform(0.5, 2, n)
  A = rng.normal(size=(m, n)) * scale ** rng.uniform(-1, 1, size=(m, n))
  x0 = rng.uniform(lo / 2, hi / 2)
  ax = A @ x0
  l = ax - rng.uniform(0.1, 1.0, m) * np.abs(A).sum(1)
  u = ax + rng.uniform(0.1, 1.0, m) * np.abs(A).sum(1)
  l[0] = -np.inf  # a one-sided row
  c = rng.normal(size=n)
  return lo, hi, A, l, u, c


def _encode(lo, hi, A, l, u, c, maximize=False):
  enc = Encoding("safe-dual-test")
  x = enc.add_variables(lo, hi)
  rows, cols = np.nonzero(A)
  enc.add_rows(rows, x[cols], A[rows, cols], l, u)
  enc.set_objective(x, c, maximize=maximize)
  return enc, x


def _feasible_points(lo, hi, A, l, u, seed):
  rng = np.random.default_rng(seed)
  pts = np.concatenate([rng.uniform(lo, hi, size=(10_000, lo.size)),
                        np.array(list(itertools.product(*zip(lo, hi))))])
  ax = pts @ A.T
  return pts[np.all((ax >= l) & (ax <= u), axis=1)]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("maximize", [False, True])
def test_the_bound_from_the_solvers_duals_holds_at_feasible_points_and_is_tight(seed, maximize):
  lo, hi, A, l, u, c = _lp(seed)
  enc, x = _encode(lo, hi, A, l, u, c, maximize)
  out = solve(enc, SolveConfig(solver="highs"))
  assert out.reason == "OPTIMAL" and out.duals is not None
  lp = LinearProgram.from_proto(enc.model.export_model())
  b = lp.bound(x, c, 0.0, *out.duals, maximize=maximize)
  pts = _feasible_points(lo, hi, A, l, u, seed)
  assert len(pts) > 500
  vals = pts @ c
  if maximize:
    assert b >= vals.max() and b >= out.dual_bound - 1e-7 * (1 + abs(b))
  else:
    assert b <= vals.min() and b <= out.dual_bound + 1e-7 * (1 + abs(b))
  assert abs(b - out.dual_bound) <= 1e-7 * (1 + abs(b)), (b, out.dual_bound)


@pytest.mark.parametrize("seed", range(4))
def test_any_dual_vector_gives_a_bound_below_every_feasible_point(seed):
  lo, hi, A, l, u, c = _lp(seed)
  enc, x = _encode(lo, hi, A, l, u, c)
  lp = LinearProgram.from_proto(enc.model.export_model())
  pts = _feasible_points(lo, hi, A, l, u, seed)
  rng = np.random.default_rng(100 + seed)
  for _ in range(50):
    y = rng.normal(size=A.shape[0]) * 3
    b = lp.bound(x, c, 0.25, lp.con_ids, y, maximize=False)
    assert b <= (pts @ c + 0.25).min()
    assert np.isfinite(b)  # every variable lies in a box: any y gives a finite bound


def _exact_bound(lo, hi, A, l, u, c, y) -> Fraction:
  """The weak-duality bound of `milp.safe_dual` in rational arithmetic (rows with an infinite
  needed side get y = 0, as in the module)."""
  F = Fraction
  y = [0.0 if (yr > 0 and not np.isfinite(lr)) or (yr < 0 and not np.isfinite(ur)) else yr
       for yr, lr, ur in zip(y, l, u)]
  total = F(0)
  for r, yr in enumerate(y):
    if yr > 0:
      total += F(yr) * F(l[r])
    elif yr < 0:
      total += F(yr) * F(u[r])
  for j in range(len(c)):
    rj = F(c[j]) - sum(F(A[r, j]) * F(y[r]) for r in range(len(y)))
    total += min(rj * F(lo[j]), rj * F(hi[j]))
  return total


@pytest.mark.parametrize("seed", range(6))
def test_the_float_bound_is_never_above_the_exact_rational_bound(seed):
  # coefficients from 1e-8 to 1e8 and duals from the solver and perturbed: the rounding of
  # c - A^T y and of the final sum is what the bound's slack must cover
  lo, hi, A, l, u, c = _lp(seed, n=6, m=5, scale=1e8)
  enc, x = _encode(lo, hi, A, l, u, c)
  out = solve(enc, SolveConfig(solver="highs"))
  lp = LinearProgram.from_proto(enc.model.export_model())
  rng = np.random.default_rng(seed)
  duals = [out.duals] if out.duals is not None else []
  duals += [(lp.con_ids, rng.normal(size=5) * 10.0 ** rng.uniform(-8, 8, 5)) for _ in range(5)]
  for ids, vals in duals:
    y = np.zeros(5)
    y[np.searchsorted(lp.con_ids, ids)] = vals
    b = lp.bound(x, c, 0.0, ids, vals, maximize=False)
    exact = _exact_bound(lo, hi, A, l, u, c, y)
    assert Fraction(b) <= exact, (b, float(exact))
    assert float(exact) - b <= 1e-9 * (1 + abs(float(exact))) + 1e-6 * max(
        1.0, float(np.abs(A).max() * np.abs(y).max()))


def test_lp_mode_tightening_keeps_the_safe_bound_without_a_margin():
  from milp import bounds as bounds_lib
  from milp.network import AffineLayer, Network
  from milp.tighten import MARGIN, tighten_layer
  rng = np.random.default_rng(0)
  layers = []
  for i, o in [(4, 10), (10, 10)]:
    w = rng.normal(size=(o, i)) / np.sqrt(i)
    b = 0.3 * rng.normal(size=o)
    layers.append(AffineLayer(w, w.copy(), b, b.copy()))
  net = Network(tuple(layers), (4,))
  lo, hi = -np.ones(4), np.ones(4)
  start = bounds_lib.compute(net, lo, hi, "ibp")
  L, U, n = tighten_layer(net, lo, hi, start, 1, mode="lp", threads=1, time_limit=10.0)
  assert n > 0
  # the same LPs solved once more: the kept bound is HiGHS's optimum to 1e-9, well inside the
  # MILP margin (4e-7 relative) that LP solves no longer pay
  enc = Encoding("check")
  x = enc.add_variables(lo, hi)
  from milp.tighten import prefix, relax_integers
  nv = enc.add_network(prefix(net, 1), x, lo, hi, bounds=start)
  relax_integers(enc, nv.binaries)
  moved = 0
  for j in np.flatnonzero((start[1][0] < 0) & (start[1][1] > 0)):
    enc.set_objective([nv.pre[1][j]], [1.0], maximize=True)
    v = solve(enc, SolveConfig(solver="highs")).dual_bound
    if v < start[1][1][j]:
      assert abs(U[j] - v) <= 1e-9 * (1 + abs(v)), (U[j], v)
      assert U[j] < v + MARGIN[0] * (abs(v) + U[j] - L[j])
      moved += 1
  assert moved > 0

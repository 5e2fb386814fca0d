"""Leaf domains of ReLU splitting: every neuron fixed, decided by one LP per row.

A domain of `relu_bab` is a *leaf* when none of its neurons is unstable: each is split (``s_j =
+1``: ``z_j >= 0``, active; ``-1``: ``z_j <= 0``, inactive) or stable on the root's bounds. On
it the chain is affine, ``g(x) = G x + h``, and the domain is the polytope

    P = {x in [lo, hi] : s_j z_j(x) >= 0 for every split neuron j},   z_j(x) = a_j x + c_j,

with ``a_j, c_j`` the pre-activation's affine map under the fixed pattern (the neurons stable on
the root's bounds need no constraint: those bounds hold on the whole box). ``min_{x in P} g_r``
is an LP (solved by HiGHS through `scipy.optimize.linprog`). Its value is a float, not a
proof, so it is never used as a bound: its duals ``β_j >= 0`` are. For every ``β >= 0``,

    min_{x in P} g_r(x) >= min_{x in [lo, hi]} g_r(x) - Σ_j β_j s_j z_j(x),

which is β-CROWN's bound of the domain (Wang et al. 2021, §3.1; exact at a leaf, where every
ReLU is linear), and by LP duality the LP's optimal duals make it equal to the LP's value. So
the duals go to the engine as β (a warm start that its optimisation keeps unless it finds
better), and the engine's bound, in its own sound arithmetic, is the certificate. A branch and
bound whose β-CROWN steps (10-15 of Adam) stop short of that optimum would otherwise end at the
leaf with an unknown. An LP value <= 0 gives its minimiser as a counterexample candidate
(replayed; for several rows, the minimiser of ``max_r g_r`` over ``P``). An infeasible LP gives
the duals ``μ`` (``Σ μ = 1``) of ``max t : s_j z_j(x) >= t``; with ``max_x Σ μ_j s_j z_j(x) =
t* < 0``, ``β = K μ`` for a large enough ``K`` proves the domain empty through the same bound.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.optimize import linprog


class Leaf(NamedTuple):
  """One leaf's LP outcome.

  Attributes:
    beta: per hidden layer, (R, n_i) multipliers ``β >= 0`` of the split constraints for each
      of the ``R`` rows' lower bounds (0 on unsplit neurons); None when no LP was solved.
    value: per row the LP's value (``+inf``: the polytope is empty), floats, not bounds.
    candidate: a point of the box minimising ``max_r g_r`` over the polytope when that minimum
      is <= 0 (to replay), else None.
  """

  beta: list | None
  value: np.ndarray
  candidate: np.ndarray | None


def affine_pattern(Ws, bs, C, d, splits, lbs, ubs):
  """The chain under a fixed pattern: the split constraints as ``A x <= b`` (one row per split
  neuron, ``-s_j (a_j x + c_j) <= 0``, with its ``(layer, index)``) and the rows ``g = G x + h``.

  ``splits``, ``lbs``, ``ubs``: per hidden layer (n_i,) signs and the node's bounds (the root's,
  clipped by the splits). Raises `ValueError` if a neuron is neither split nor stable."""
  A = np.eye(np.asarray(Ws[0]).shape[1])
  c = np.zeros(A.shape[0])
  rows, rhs, where = [], [], []
  for i, (w, b) in enumerate(zip(Ws[:-1], bs[:-1])):
    w = np.asarray(w, np.float64)
    az, cz = w @ A, w @ c + np.asarray(b, np.float64)
    s = np.asarray(splits[i])
    free = s == 0
    active = (s > 0) | (free & (np.asarray(lbs[i]) >= 0))
    if np.any(free & (np.asarray(lbs[i]) < 0) & (np.asarray(ubs[i]) > 0)):
      raise ValueError("affine_pattern: a neuron is neither split nor stable (not a leaf).")
    sel = np.flatnonzero(~free)
    rows.append(-s[sel, None] * az[sel])
    rhs.append(s[sel] * cz[sel])
    where += [(i, int(j)) for j in sel]
    A, c = az * active[:, None], cz * active
  w, b = np.asarray(Ws[-1], np.float64), np.asarray(bs[-1], np.float64)
  C = np.asarray(C, np.float64)
  G, h = C @ (w @ A), C @ (w @ c + b) - np.asarray(d, np.float64)
  n = A.shape[1]
  return (np.concatenate(rows) if rows else np.zeros((0, n)),
          np.concatenate(rhs) if rhs else np.zeros(0), where, G, h)


def solve_leaf(Ws, bs, C, d, lo, hi, splits, lbs, ubs) -> Leaf:
  """The LPs of one leaf (see the module): per row ``min g_r`` over the polytope, its duals as
  β, and a counterexample candidate when the rows' joint minimum is <= 0."""
  A, b, where, G, h = affine_pattern(Ws, bs, C, d, splits, lbs, ubs)
  lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
  box = np.stack([lo, hi], 1)
  widths = [len(np.asarray(s)) for s in splits]
  R = G.shape[0]

  def as_beta(duals_per_row):
    out = [np.zeros((R, n)) for n in widths]
    for r, duals in enumerate(duals_per_row):
      for (i, j), y in zip(where, duals):
        out[i][r, j] = max(float(y), 0.0)
    return out

  A_ub = A if len(b) else None
  b_ub = b if len(b) else None
  values, duals, xs = np.full(R, np.inf), [], []
  for r in range(R):
    res = linprog(G[r], A_ub=A_ub, b_ub=b_ub, bounds=box, method="highs")
    if res.status == 2:  # infeasible: a certificate of emptiness instead
      return _empty(A, b, G, h, box, as_beta)
    if res.status != 0:
      return Leaf(None, np.full(R, -np.inf), None)
    values[r] = res.fun + h[r]
    duals.append(-res.ineqlin.marginals if len(b) else np.zeros(0))
    xs.append(np.clip(res.x, lo, hi))
  candidate = None
  if np.all(values <= 0):
    candidate = xs[0]
    if R > 1:  # min over P of max_r g_r: min t s.t. G x + h <= t
      n = G.shape[1]
      A2 = np.block([[A, np.zeros((len(b), 1))], [G, -np.ones((R, 1))]])
      res = linprog(np.r_[np.zeros(n), 1.0], A_ub=A2, b_ub=np.r_[b, -h],
                    bounds=np.vstack([box, [[None, None]]]), method="highs")
      candidate = np.clip(res.x[:n], lo, hi) if res.status == 0 and res.fun <= 0 else None
  return Leaf(as_beta(duals), values, candidate)


def _empty(A, b, G, h, box, as_beta) -> Leaf:
  """An infeasible leaf: ``μ`` from ``max t s.t. A x + t <= b, t <= 1`` (``A x <= b`` is
  ``s z(x) >= 0``), then ``β = K μ`` with ``K`` such that ``K |t*|`` exceeds twice each row's
  range over the box (the engine's bound then exceeds it; any K gives a sound bound)."""
  n = A.shape[1]
  R = G.shape[0]
  res = linprog(np.r_[np.zeros(n), -1.0], A_ub=np.hstack([A, np.ones((len(b), 1))]), b_ub=b,
                bounds=np.vstack([box, [[None, 1.0]]]), method="highs")
  if res.status != 0 or -res.fun >= 0:
    return Leaf(None, np.full(R, -np.inf), None)
  mu = np.maximum(-res.ineqlin.marginals, 0.0)
  t = -res.fun
  lo, hi = box[:, 0], box[:, 1]
  low = np.minimum(G * lo, G * hi).sum(1) + h  # each row's minimum over the box
  K = 2.0 * (np.max(np.abs(low)) + 1.0) / abs(t)
  return Leaf(as_beta([K * mu] * R), np.full(R, np.inf), None)

"""The exact local Lipschitz constant of a ReLU network over an L∞ box, as a MILP (LipMIP).

The PTR test (PTR, App. B, Algorithm 1, and App. C) needs ``L(f, N(z, r))`` in the ∞→1 norm:

    L = max_{z' in box, c in [-1, 1]^m} ||J(z')^T c||_1

(Jordan & Dimakis 2020, "LipMIP"; the maximum over ``c`` of a convex function is at a vertex, a
sign vector, so the continuous box for ``c`` is exact). The formulation, for
``ẑ_i = W_i a_{i-1} + b_i``, ``a_i = relu(ẑ_i)``, ``a_0 = z``, ``f = W_L a_{L-1} + b_L``:

* forward: every unstable ReLU (pre-activation bounds ``l < 0 < u`` from CROWN) gets a binary
  ``δ`` and ``a >= ẑ, a <= ẑ - l (1 - δ), a <= u δ`` (`milp.encode.Encoding.add_network`);
* backward, with the same ``δ``: ``g_L = c``; ``q_i = W_{i+1}^T g_{i+1}``; ``g_i = δ_i ⊙ q_i``,
  linearised per unstable unit with interval bounds ``[lq, uq]`` of ``q_i``:
  ``g <= q - lq (1 - δ), g >= q - uq (1 - δ), g >= lq δ, g <= uq δ`` (stable units: ``g = q`` or
  ``0``); ``γ = W_1^T g_1 = J(z')^T c``;
* ``|γ_j|``: ``γ_j = γ⁺_j - γ⁻_j``, ``0 <= γ⁺_j <= Uγ_j s_j``, ``0 <= γ⁻_j <= -Lγ_j (1 - s_j)``,
  ``s_j`` binary; maximise ``sum_j γ⁺_j + γ⁻_j``.

What makes it fast (every step keeps the optimum and the dual bound exact):

* ``c_0 = 1`` rather than ``c_0 in [0, 1]`` (the optimum is at a sign vector, up to ``±c``);
* the big-M constants ``[lq, uq]`` and ``[Lγ, Uγ]`` are the hull of per-vertex interval passes
  (`backward_bounds`): every backward quantity is linear in ``c`` at a fixed point, so its range
  is spanned by the ``2^(m-1)`` sign vectors; on the 8→10→8 obfuscator this halves the width of
  ``[Lγ, Uγ]`` and the solve time (HiGHS; SCIP is about 2x slower on these models);
* stable ReLUs get no ``δ`` (CROWN pre-activation bounds), and when every ReLU is stable the
  Jacobian is one matrix on the box and its norm is enumerated without a solve.

The solver's proven dual bound, padded by ``1e-6`` relative for the solver's feasibility
tolerances (`SOLVER_PAD`), is the sound ``upper`` (as LipMIP's ``ObjBound``); the incumbent's
point ``z*`` gives ``lower`` as the Jacobian norm recomputed there, and ``argmax`` is that point
(``lower`` is always the Jacobian norm at ``argmax``: a value the constant attains). A time limit
gives a sound answer (and an inclusion-monotone oracle only when solved to optimality).

``exact`` keeps the meaning of `boundjax.ptr.lipschitz.LipschitzBound`: the returned ``upper`` and
``lower`` agree to ``1e-9`` relative (`EXACT_RTOL`). A solve, even to optimality, brackets the
constant only to the pad (``upper - lower`` about ``1e-6`` relative), so it is not exact; a box on
which every ReLU is stable is (one Jacobian, its norm computed in float64 with a bound on the
rounding, no solver).

The PTR authors' code calls LipMIP with ``c`` in the ℓ1 unit ball, which maximises the ∞→∞ norm
``max_i ||J_{i,:}||_1`` — up to ``m`` times below the ∞→1 constant the ℓ1 Laplace release needs;
here ``c in [-1, 1]^m`` is the default and the ℓ1 ball is ``out_norm="linf_as_code"`` (paper
reproduction only).

`local_lipschitz` also offers ``method="auto"`` (pattern enumeration for one hidden layer, else
the MILP) and the `boundjax.ptr.lipschitz` oracles; `milp_oracle` returns ``(x, radius) -> upper`` for
`boundjax.ptr.release`. The radius search only compares ``U`` with the proposal ``Δp``;
`lipschitz_decide` (``milp_oracle(..., proposal=Δp)``) lets the interval bound or sampled Jacobian
norms settle that comparison when they can and solves the MILP only otherwise.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

import boundjax as bj
from boundjax.core import rounding
from boundjax.core.interval import Interval
from boundjax.ptr import lipschitz as bj_lip
from boundjax.ptr.lipschitz import LipschitzBound
from milp import bounds as bounds_lib
from milp.encode import Encoding
from milp.network import Network, from_function
from milp.solve import SolveConfig, solve

_DEFAULT_CFG = SolveConfig(solver="highs", time_limit=60.0, threads=1, relative_gap=1e-9,
                           absolute_gap=1e-9)

#: ``exact`` means ``upper - lower <= EXACT_RTOL * max(1, |upper|)`` (the tolerance documented by
#: `boundjax.ptr.lipschitz.LipschitzBound`, and used by `boundjax.ptr.lipschitz.local_lipschitz`).
EXACT_RTOL = 1e-9

#: Relative pad of a solver's dual bound (its feasibility tolerances, ~1e-6 for HiGHS' MIP).
SOLVER_PAD = 1e-6


def _agree(upper: float, lower: float) -> bool:
  """``upper`` and ``lower`` agree to `EXACT_RTOL` (the meaning of ``exact``)."""
  return bool(upper - lower <= EXACT_RTOL * max(1.0, abs(upper)))


def _dense(m: Any) -> np.ndarray:
  return m.toarray() if sp.issparse(m) else np.asarray(m, np.float64)


def _check_point_network(net: Network) -> list[tuple[np.ndarray, np.ndarray]]:
  if not net.is_point:
    raise ValueError("lipschitz_milp: the network has interval parameters; take a member first.")
  return [(_dense(l.w_lower), np.asarray(l.b_lower, np.float64)) for l in net.layers]


def _jacobian_backward(weights: list, c: Any, gates: list) -> tuple[list, Any]:
  """The backward pass of the Jacobian as a plain function: ``g = c``; per hidden layer ``i``
  (last first) ``q_i = g W_{i+1}`` and ``g = gate_i ⊙ q_i``; ``γ = g W_1 = J^T c``. Rows of ``c``
  are separate directions."""
  g, qs = c, []
  for i in range(len(weights) - 2, -1, -1):
    q = g @ weights[i + 1]
    qs.append(q)
    g = gates[i] * q
  return qs[::-1], g @ weights[0]


@functools.lru_cache(maxsize=None)
def _bounded_backward() -> Callable:
  """`_jacobian_backward` bounded by the engine (``bj.ibp``, sound mode: every product rounded
  outward by its a-priori float64 error, Higham §3.1), over boxes of ``c`` and of the gates."""
  return jax.jit(bj.ibp(_jacobian_backward, sound=True, matmul="signsplit"))


def backward_image(weights: list[np.ndarray], c_lo: np.ndarray, c_hi: np.ndarray,
                   gate_bounds: list[tuple[np.ndarray, np.ndarray]]
                   ) -> tuple[list[tuple[np.ndarray, np.ndarray]], tuple[np.ndarray, np.ndarray]]:
  """Sound float64 bounds of the backward pass (`_jacobian_backward`) for every direction ``c``
  in the box ``[c_lo, c_hi]`` (rows are separate boxes; a point is a box of width 0) and every
  ReLU derivative in ``[gate_lo, gate_hi]`` per hidden layer (FastLip, Weng et al. 2018: an
  unstable ReLU's derivative lies in ``[0, 1]``): per hidden layer the bounds of ``q_i`` and the
  bounds of ``γ``, each with one row per row of ``c``. Computed by the engine."""
  with jax.enable_x64(True):
    ws = [jnp.asarray(w, jnp.float64) for w in weights]
    c = Interval(jnp.asarray(c_lo, jnp.float64), jnp.asarray(c_hi, jnp.float64), validate=False)
    gates = [Interval(jnp.asarray(lo, jnp.float64), jnp.asarray(hi, jnp.float64), validate=False)
             for lo, hi in gate_bounds]
    qs, gamma = _bounded_backward()(ws, c, gates)
    ends = lambda v: (np.asarray(v.lower), np.asarray(v.upper))  # noqa: E731
    return [ends(q) for q in qs], ends(gamma)


@dataclasses.dataclass
class _Backward:
  """Variable ids of the backward pass and the bounds of ``γ``."""

  c: np.ndarray
  gamma: np.ndarray
  gamma_lo: np.ndarray
  gamma_hi: np.ndarray


MAX_VERTEX_OUTPUTS = 16   # c-vertex bounds up to 2^15 vertices; interval bounds beyond


def direction_vertices(m: int, out_norm: str) -> np.ndarray | None:
  """The vertices of the domain of ``c`` in the MILP, or ``None`` when there are too many.

  ``"l1"``: ``c_0 = 1``, ``c_{1:} in [-1, 1]^{m-1}`` (the maximum of the convex ``||J^T c||_1``
  is at a vertex of ``[-1, 1]^m``, and ``c -> -c`` leaves it unchanged, so ``c_0 = 1`` loses
  nothing; LipMIP, Jordan & Dimakis 2020), ``2^(m-1)`` vertices. ``"linf_as_code"``:
  ``{||c||_1 <= 1, c_0 >= 0}`` = conv ``{e_0, ±e_i (i >= 1)}``.
  """
  if out_norm == "linf_as_code":
    eye = np.eye(m)
    return np.concatenate([eye[:1], eye[1:], -eye[1:]])
  if m > MAX_VERTEX_OUTPUTS:
    return None
  bits = (np.arange(2 ** (m - 1))[:, None] >> np.arange(m - 1)[None, :]) & 1
  return np.concatenate([np.ones((2 ** (m - 1), 1)), 1.0 - 2.0 * bits], axis=1)


def backward_bounds(weights: list[np.ndarray], pre_bounds: list,
                    out_norm: str) -> tuple[list[tuple[np.ndarray, np.ndarray]],
                                            tuple[np.ndarray, np.ndarray]]:
  """Bounds on the backward quantities over the box: per hidden layer ``i`` the bounds
  ``[lq_i, uq_i]`` of ``q_i = W_{i+1}^T g_{i+1}``, and the bounds of ``γ = W_1^T g_1``.

  For a fixed point ``z`` (and any activation pattern allowed by the pre-activation bounds) every
  backward quantity is linear in ``c``, so its range over the ``c`` domain is the hull of its
  ranges at the domain's vertices (`direction_vertices`). Each vertex gets the interval backward
  pass of FastLip (Weng et al. 2018: derivative of an unstable ReLU in ``[0, 1]``), all
  vertices in one numpy batch; the hull is intersected with one interval pass over the whole
  ``c`` box. Tighter bounds are tighter big-M constants for the McCormick rows of ``g = δ q`` and
  the sign split of ``|γ_j|``, which is what the solve time depends on. Every layer's image is
  bounded by the engine in sound mode (`backward_image`), so the bounds hold for the exact
  products.
  """
  m = weights[-1].shape[0]
  c_lo = np.r_[1.0 if out_norm == "l1" else 0.0, -np.ones(m - 1)]
  verts = direction_vertices(m, out_norm)
  # rows: [the whole box (as an interval)] + [each vertex (a point)]
  g_lo = np.concatenate([c_lo[None], verts]) if verts is not None else c_lo[None]
  g_hi = np.concatenate([np.ones((1, m)), verts]) if verts is not None else np.ones((1, m))
  gates = [((L >= 0).astype(np.float64), (U > 0).astype(np.float64)) for L, U in pre_bounds[:len(weights) - 1]]
  qs, gamma = backward_image(weights, g_lo, g_hi, gates)

  def hull(lo, hi):   # the vertex hull, intersected with the box pass
    if lo.shape[0] == 1:
      return lo[0], hi[0]
    return np.maximum(lo[0], lo[1:].min(0)), np.minimum(hi[0], hi[1:].max(0))
  return [hull(*q) for q in qs], hull(*gamma)


def _add_backward(enc: Encoding, weights: list[np.ndarray], pre_bounds: list, deltas: list,
                  out_norm: str) -> _Backward:
  """``c``, the gated backward pass ``g_i = δ_i ⊙ W_{i+1}^T g_{i+1}`` and ``γ = W_1^T g_1``,
  with the big-M constants of `backward_bounds`."""
  m = weights[-1].shape[0]
  q_bounds, (glo, ghi) = backward_bounds(weights, pre_bounds, out_norm)
  c = enc.add_variables(np.r_[1.0 if out_norm == "l1" else 0.0, -np.ones(m - 1)], np.ones(m))
  if out_norm == "linf_as_code":  # ||c||_1 <= 1 (the authors' l1Ball1): |c| <= a, sum a <= 1
    a = enc.add_variables(np.zeros(m), np.ones(m))
    r = np.arange(m)
    enc.add_rows(np.r_[r, r], np.r_[c, a], np.r_[np.ones(m), -np.ones(m)], np.full(m, -np.inf),
                 np.zeros(m))
    enc.add_rows(np.r_[r, r], np.r_[c, a], np.r_[np.ones(m), np.ones(m)], np.zeros(m),
                 np.full(m, np.inf))
    enc.add_rows(np.zeros(m), a, np.ones(m), [-np.inf], [1.0])
  g_ids = c
  for i in range(len(weights) - 2, -1, -1):       # hidden layer i: output of weights[i]
    W = weights[i + 1]                              # (out, k_i)
    lq, uq = q_bounds[i]
    q = _linear_image(enc, W.T, g_ids, lq, uq)
    L, U = pre_bounds[i]
    act, dead = L >= 0, U <= 0
    unst = ~act & ~dead
    g_ids = np.where(act, q, -1)
    if unst.any():
      g = enc.add_variables(np.minimum(lq[unst], 0.0), np.maximum(uq[unst], 0.0))
      _gate(enc, g, q[unst], deltas[i][unst], lq[unst], uq[unst])
      g_ids[unst] = g
  gamma = _linear_image(enc, weights[0].T, g_ids, glo, ghi)
  return _Backward(c, gamma, glo, ghi)


def _linear_image(enc: Encoding, A: np.ndarray, ids: np.ndarray, lo: np.ndarray,
                  hi: np.ndarray) -> np.ndarray:
  """New variables ``y = A x[ids]`` in ``[lo, hi]`` (entries with id ``-1`` are the constant 0)."""
  y = enc.add_variables(lo, hi)
  live = ids >= 0
  n = A.shape[0]
  block = sp.hstack([sp.identity(n, format="csr"), -sp.csr_array(A[:, live])], format="coo")
  cols = np.concatenate([y, ids[live]])
  enc.add_rows(block.row, cols[block.col], block.data, np.zeros(n), np.zeros(n))
  return y


def _gate(enc: Encoding, g, q, d, lq, uq) -> None:
  """``g = δ q`` for binary ``δ`` and ``q in [lq, uq]`` (exact linearisation)."""
  n = len(g)
  r = np.arange(n)
  one, inf = np.ones(n), np.full(n, np.inf)
  # g - q - lq δ <= -lq ;  g - q - uq δ >= -uq
  enc.add_rows(np.r_[r, r, r], np.r_[g, q, d], np.r_[one, -one, -lq], -inf, -lq)
  enc.add_rows(np.r_[r, r, r], np.r_[g, q, d], np.r_[one, -one, -uq], -uq, inf)
  # g - lq δ >= 0 ;  g - uq δ <= 0
  enc.add_rows(np.r_[r, r], np.r_[g, d], np.r_[one, -lq], np.zeros(n), inf)
  enc.add_rows(np.r_[r, r], np.r_[g, d], np.r_[one, -uq], -inf, np.zeros(n))


def _abs_objective(enc: Encoding, gamma, lo, hi) -> tuple[np.ndarray, np.ndarray]:
  """``(ids, coeffs)`` of ``sum_j |γ_j|`` (a binary split where the sign of ``γ_j`` is open)."""
  ids, coeffs = [], []
  pos, neg = lo >= 0, hi <= 0
  ids += [gamma[pos], gamma[neg]]
  coeffs += [np.ones(pos.sum()), -np.ones(neg.sum())]
  split = ~pos & ~neg
  n = int(split.sum())
  if n:
    gp = enc.add_variables(np.zeros(n), hi[split])
    gn = enc.add_variables(np.zeros(n), -lo[split])
    s = enc.add_binaries(n)
    r = np.arange(n)
    one = np.ones(n)
    enc.add_rows(np.r_[r, r, r], np.r_[gamma[split], gp, gn], np.r_[one, -one, one],
                 np.zeros(n), np.zeros(n))                                 # γ = γ⁺ - γ⁻
    enc.add_rows(np.r_[r, r], np.r_[gp, s], np.r_[one, -hi[split]], -np.full(n, np.inf),
                 np.zeros(n))                                              # γ⁺ <= Uγ s
    enc.add_rows(np.r_[r, r], np.r_[gn, s], np.r_[one, -lo[split]], -np.full(n, np.inf),
                 -lo[split])                                               # γ⁻ <= -Lγ (1 - s)
    ids += [gp, gn]
    coeffs += [one, one]
  return np.concatenate(ids), np.concatenate(coeffs)


def _deltas(nv, pre_bounds) -> list[np.ndarray]:
  """Per hidden layer, the id of each unit's binary (``-1`` for stable units), in the order
  `Encoding.add_network` created them (layer by layer, unstable units in index order)."""
  out, start = [], 0
  for L, U in pre_bounds[:-1]:
    unst = (L < 0) & (U > 0)
    d = np.full(L.shape, -1, np.int64)
    d[unst] = nv.binaries[start:start + int(unst.sum())]
    start += int(unst.sum())
    out.append(d)
  return out


def jacobian_norm_at(weights: list[tuple[np.ndarray, np.ndarray]], z: np.ndarray,
                     out_norm: str = "l1") -> tuple[float, float]:
  """``(||J(z)||, smallest |pre-activation|)`` of the network at ``z`` (float64; a smallest
  value near 0 means ``z`` sits on a kink, where this Jacobian need not be a Clarke one)."""
  h, gate, tie = np.asarray(z, np.float64), [], math.inf
  for W, b in weights[:-1]:
    pre = W @ h + b
    tie = min(tie, float(np.min(np.abs(pre)))) if pre.size else tie
    gate.append(pre > 0)
    h = np.maximum(pre, 0.0)
  J = weights[-1][0]
  for (W, _), d in zip(reversed(weights[:-1]), reversed(gate)):
    J = (J * d[None, :]) @ W
  return operator_norm(J, out_norm), tie


def operator_norm(J: np.ndarray, out_norm: str = "l1") -> float:
  """``||J||_{inf->1} = max_{c in {±1}^m} ||J^T c||_1`` (or ``||J||_{inf->inf}``, the largest
  row ℓ1 norm) in float64 numpy, exactly (PTR, App. C; the sign vectors of `direction_vertices`)."""
  J = np.asarray(J, np.float64)
  if out_norm == "linf_as_code":
    return float(np.max(np.abs(J).sum(axis=1)))
  cs = direction_vertices(J.shape[0], out_norm)
  if cs is None:
    raise ValueError(f"the inf->1 norm enumerates 2^(m-1) sign vectors; m = {J.shape[0]} outputs "
                     f"is more than {MAX_VERTEX_OUTPUTS}.")
  return float(np.max(np.abs(cs @ J).sum(axis=1)))


def _constant_jacobian(weights, pre) -> np.ndarray | None:
  """The Jacobian when every hidden ReLU is stable over the box (then it is one matrix on the
  whole box), else ``None``."""
  J = weights[-1][0]
  for (W, _), (L, U) in zip(reversed(weights[:-1]), reversed(pre[:-1])):
    if np.any((L < 0) & (U > 0)):
      return None
  for (W, _), (L, _) in zip(reversed(weights[:-1]), reversed(pre[:-1])):
    J = (J * (L >= 0)[None, :]) @ W
  return J


def _rounding_bound(weights, pre) -> float:
  """An upper bound on ``sum |J~ - J|`` for the Jacobian ``J~`` that `_constant_jacobian`
  computes in float64 (Higham, "Accuracy and Stability of Numerical Algorithms", §3.5: a product
  of inner dimension ``k`` is off by at most ``gamma_k |A| |B|``, so a chain of ``L`` products by
  at most ``((1 + gamma)^L - 1) |W_L| D |W_(L-1)| ... |W_1|``), doubled for the rounding of this
  bound itself. ``sum |E|`` bounds ``max_c ||E^T c||_1`` and the largest row sum of ``|E|``."""
  u = float(np.finfo(np.float64).eps) / 2
  A = np.abs(weights[-1][0])
  ks = []
  for (W, _), (L, _) in zip(reversed(weights[:-1]), reversed(pre[:-1])):
    A = (A * (L >= 0)[None, :]) @ np.abs(W)
    ks.append(W.shape[0])
  if not ks:
    return 0.0
  gamma = max(ks) * u / (1 - max(ks) * u)
  return 2.0 * float(np.sum(A)) * ((1 + gamma) ** len(ks) - 1)


def _pattern_point(weights, gates: list[np.ndarray], lo, hi) -> tuple[float, np.ndarray]:
  """``max t`` s.t. every hidden pre-activation has the sign of ``gates`` with margin ``t``
  (normalised), over the box; with the pattern fixed each pre-activation is affine in ``z``."""
  from scipy.optimize import linprog

  A, a = np.eye(lo.size), np.zeros(lo.size)
  rows, rhs = [], []
  for (W, b), d in zip(weights[:-1], gates):
    A, a = W @ A, W @ a + b                       # pre-activation = A z + a
    s = np.where(d, 1.0, -1.0)
    nrm = np.maximum(np.linalg.norm(A, axis=1), 1e-300)
    rows.append(np.concatenate([-(s / nrm)[:, None] * A, np.ones((len(A), 1))], axis=1))
    rhs.append(s * a / nrm)
    A, a = A * d[:, None], a * d
  cost = np.zeros(lo.size + 1)
  cost[-1] = -1.0
  span = float(np.max(hi - lo)) + 1.0
  res = linprog(cost, A_ub=np.concatenate(rows), b_ub=np.concatenate(rhs),
                bounds=list(zip(lo, hi)) + [(-10 * span, span)], method="highs")
  if res.status != 0:
    return -math.inf, lo
  return float(res.x[-1]), np.asarray(res.x[:-1])


def _attained_lower(weights, z_star, gates, lo, hi, out_norm) -> tuple[float, np.ndarray]:
  """A value the constant attains: the Jacobian norm at ``z*`` if it is off every kink; else at
  a point strictly inside the incumbent's activation pattern (an LP), if that region is open."""
  z_star = np.clip(z_star, lo, hi)
  v, tie = jacobian_norm_at(weights, z_star, out_norm)
  best, point = (v, z_star) if tie > 1e-9 else (-math.inf, None)
  if weights[:-1]:
    t, z = _pattern_point(weights, gates, lo, hi)
    if t > 1e-9:
      v2, tie2 = jacobian_norm_at(weights, z, out_norm)
      if tie2 > 0 and v2 > best:
        best, point = v2, z
  return best, point


def _incumbent_gates(enc: Encoding, out, pre, deltas) -> list[np.ndarray]:
  """The incumbent's activation pattern: the binaries, and the stable units' known phase."""
  gates = []
  for (L, _), d in zip(pre[:-1], deltas):
    g = L >= 0
    live = d >= 0
    if live.any():
      g[live] = enc.values(out.result, d[live]) > 0.5
    gates.append(g)
  return gates


def lipschitz_milp(net: Network, center: Any, radius: float, *, out_norm: str = "l1",
                   config: SolveConfig = _DEFAULT_CFG, bounds: str = "crown") -> LipschitzBound:
  """The LipMIP bound of ``net`` over ``N(center, radius)`` (module docstring).

  Returns a `LipschitzBound` with ``upper`` the proven dual bound (padded by `SOLVER_PAD`
  relative for the solver's tolerances), ``lower`` the Jacobian norm at ``argmax`` (the
  incumbent's point, or a point inside its activation pattern), ``exact`` when the two agree to
  `EXACT_RTOL` (never after a solve, whose pad is larger; see the module docstring).
  """
  return _lipschitz_milp(net, center, radius, out_norm, config, bounds)[0]


def _lipschitz_milp(net: Network, center: Any, radius: float, out_norm: str,
                    config: SolveConfig, bounds: str) -> tuple[LipschitzBound, bool]:
  """`lipschitz_milp` and whether the bracket is as tight as the solver can make it: no solve
  was needed, or the solve is optimal and its witness meets the dual bound (``1e-5`` relative,
  before the pad). Then intersecting with other bounds cannot improve it."""
  t0 = time.perf_counter()
  bj_lip.check_out_norm(out_norm)
  bj_lip.check_radius(radius)
  weights = _check_point_network(net)
  z = np.asarray(center, np.float64).reshape(-1)
  if z.size != net.input_size:
    raise ValueError(f"lipschitz_milp: centre has {z.size} entries, network takes "
                     f"{net.input_size}.")
  lo, hi = z - radius, z + radius
  pre = bounds_lib.compute(net, lo, hi, bounds)
  J = _constant_jacobian(weights, pre)
  if J is not None:   # no unstable ReLU: one linear piece, its norm by enumeration (no solve)
    value = operator_norm(J, out_norm)
    factor = bj_lip.outward_sum_factor(J.size, np.float64)
    upper = float((value + _rounding_bound(weights, pre)) * factor)
    return LipschitzBound(upper=upper, lower=value, method="milp", exact=_agree(upper, value),
                          argmax=z, out_norm=out_norm, seconds=time.perf_counter() - t0), True
  enc = Encoding("lipschitz")
  x = enc.add_variables(lo, hi)
  nv = enc.add_network(net, x, lo, hi, bounds=pre)
  deltas = _deltas(nv, pre)
  back = _add_backward(enc, [W for W, _ in weights], pre, deltas, out_norm)
  ids, coeffs = _abs_objective(enc, back.gamma, back.gamma_lo, back.gamma_hi)
  enc.set_objective(ids, coeffs, maximize=True)
  out = solve(enc, config)
  lower, point = -math.inf, None
  if out.has_solution:
    lower, point = _attained_lower(weights, enc.values(out.result, x),
                                   _incumbent_gates(enc, out, pre, deltas), lo, hi, out_norm)
  if point is None:
    lower, point = jacobian_norm_at(weights, z, out_norm)[0], z
  upper, tol = out.dual_bound, 1e-5 * max(1.0, abs(lower))
  trusted = math.isfinite(upper) and upper >= lower - tol and out.reason in (
      "OPTIMAL", "FEASIBLE", "NO_SOLUTION_FOUND")   # solved, or stopped by a limit
  if not trusted:       # numerical trouble: the interval bound of the same pre-activations
    upper = _interval_bound(weights, pre, out_norm)
  elif out.reason != "OPTIMAL":    # a time limit: the interval bound may be the better one
    upper = min(upper, _interval_bound(weights, pre, out_norm))
  solved = out.reason == "OPTIMAL" and trusted and lower >= upper - tol
  upper = float(upper + SOLVER_PAD * max(1.0, abs(upper)))
  return LipschitzBound(upper=upper, lower=float(lower), method="milp",
                        exact=_agree(upper, float(lower)), argmax=point, out_norm=out_norm,
                        seconds=time.perf_counter() - t0), bool(solved)


def _interval_bound(weights, pre, out_norm) -> float:
  """The interval (FastLip) bound from the MILP's own pre-activation bounds: the engine's bounds
  of ``γ = J^T c`` per output direction ``c`` (`backward_image`; a ReLU with ``l <= 0`` may have
  derivative 0, one with ``u > 0`` derivative 1), the largest ``Σ_j max |γ_j|``, and that sum
  rounded up by its own a-priori error (Higham, §3.1)."""
  m = weights[-1][0].shape[0]
  cs = np.asarray(bj_lip.output_directions(m, out_norm), np.float64)
  gates = [((L > 0).astype(np.float64), (U > 0).astype(np.float64)) for L, U in
           pre[:len(weights) - 1]]
  _, (glo, ghi) = backward_image([w for w, _ in weights], cs, cs, gates)
  sums = np.maximum(np.abs(glo), np.abs(ghi)).sum(axis=1)
  best = float(sums.max())
  return float(np.nextafter(best + rounding.sum_error(glo.shape[1], best, np.float64), np.inf))


# ------------------------------------------------------------------------------------------------
# Function-level entry points
# ------------------------------------------------------------------------------------------------

def network_of(apply_fn: Callable, params: Any, center: Any) -> Network:
  """The ReLU chain of ``z -> apply_fn(params, z)`` (`milp.network.from_function`).

  Raises:
    ValueError: the function is not a chain of affine maps and ReLUs (e.g. ``tanh``), naming
      the primitive.
  """
  shape = np.shape(center)
  try:
    return from_function(apply_fn, params, shape)
  except ValueError as e:
    raise ValueError(f"the MILP Lipschitz oracle needs a ReLU network: {e}") from None


def _config(solver: str, time_limit: float | None, threads: int) -> SolveConfig:
  return dataclasses.replace(_DEFAULT_CFG, solver=solver, time_limit=time_limit, threads=threads)


def local_lipschitz(apply_fn: Callable, params: Any, center: Any, radius: float, *,
                    method: str = "milp", out_norm: str = "l1", solver: str = "highs",
                    time_limit: float | None = 60.0, threads: int = 1,
                    network: Network | None = None, **kwargs: Any) -> LipschitzBound:
  """`boundjax.ptr.lipschitz.local_lipschitz` plus the MILP: ``method="milp"`` (LipMIP, the constant
  to the solver's tolerance when solved) or ``"auto"`` (exact pattern enumeration for a
  one-hidden-layer Dense network when its unstable units are few, else the MILP; a MILP answer
  that is not solved to optimality is intersected with the IBP bound and its sampled lower
  bound). Other methods are passed to `boundjax.ptr.lipschitz.local_lipschitz` with ``kwargs``.

  The result's ``lower`` is always the Jacobian norm at its ``argmax`` (from whichever of the
  MILP's point and the sampled point is larger), and ``exact`` means ``upper`` and ``lower``
  agree to `EXACT_RTOL`.

  ``network``: the `Network` of ``apply_fn`` if already extracted (skips `network_of`).
  """
  if method not in ("milp", "auto"):
    return bj_lip.local_lipschitz(apply_fn, params, center, radius, method=method,
                                  out_norm=out_norm, **kwargs)
  bj_lip.check_radius(radius)
  if method == "auto":
    try:
      res = bj_lip.local_lipschitz(apply_fn, params, center, radius, method="enumerate",
                                   out_norm=out_norm, **kwargs)
      if res.exact:
        return dataclasses.replace(res, method="auto:enumerate")
    except ValueError:
      pass
  net = network if network is not None else network_of(apply_fn, params, center)
  res, solved = _lipschitz_milp(net, center, radius, out_norm,
                                _config(solver, time_limit, threads), "crown")
  if method == "auto":
    if not solved:
      ibp_res = bj_lip.local_lipschitz(apply_fn, params, center, radius, method="ibp",
                                       out_norm=out_norm, **kwargs)
      upper = min(res.upper, ibp_res.upper)
      if ibp_res.lower > res.lower and ibp_res.argmax is not None:   # lower and its point
        res = dataclasses.replace(res, lower=ibp_res.lower, argmax=ibp_res.argmax)
      res = dataclasses.replace(res, upper=upper, exact=_agree(upper, res.lower))
    res = dataclasses.replace(res, method="auto:milp")
  return res


def sampled_lower(weights: list[tuple[np.ndarray, np.ndarray]], center: np.ndarray,
                  radius: float, n: int = 256, seed: int = 0,
                  out_norm: str = "l1") -> float:
  """The largest Jacobian norm at the centre, ``n`` uniform points and (for ``q <= 10``) the
  corners of the box, in float64 numpy (one norm per distinct activation pattern). Points within
  ``1e-9`` of a kink are skipped, so every value is attained by the Lipschitz constant (PTR,
  App. A: ``L = sup`` of the Jacobian norm over the differentiable points of the box)."""
  z = np.asarray(center, np.float64).reshape(-1)
  pts = [z[None], z + radius * np.random.default_rng(seed).uniform(-1.0, 1.0, (n, z.size))]
  if z.size <= 10:
    pts.append(z + radius * (1.0 - 2.0 * ((np.arange(2 ** z.size)[:, None]
                                            >> np.arange(z.size)) & 1)))
  h = np.concatenate(pts)
  gates, tie = [], np.full(len(h), np.inf)
  for W, b in weights[:-1]:
    pre = h @ W.T + b
    tie = np.minimum(tie, np.abs(pre).min(axis=1)) if pre.shape[1] else tie
    gates.append(pre > 0)
    h = np.maximum(pre, 0.0)
  if not weights[:-1]:
    return operator_norm(weights[-1][0], out_norm)
  keep = tie > 1e-9
  best = -math.inf
  for pattern in np.unique(np.concatenate(gates, axis=1)[keep], axis=0):
    J, start = weights[-1][0], pattern.size
    for W, _ in reversed(weights[:-1]):
      start -= W.shape[0]
      J = (J * pattern[start:start + W.shape[0]][None, :]) @ W
    best = max(best, operator_norm(J, out_norm))
  return best


def lipschitz_decide(net: Network, center: Any, radius: float, threshold: float, *,
                     out_norm: str = "l1", config: SolveConfig = _DEFAULT_CFG,
                     bounds: str = "crown") -> LipschitzBound:
  """A sound upper bound on ``L(f, N(center, radius))`` that decides ``L <= threshold`` as
  ``min(IBP, MILP)`` does, solving the MILP only when cheaper bounds leave it open.

  The PTR radius search (PTR, App. B, Algorithm 1) only compares ``U`` with the proposal ``Δp``.
  With ``I`` the interval (FastLip) bound of the MILP's own pre-activation bounds and ``ℓ`` the
  largest Jacobian norm at sampled points (`sampled_lower`): ``I < threshold`` returns ``I``;
  ``ℓ > threshold`` returns ``I`` (``>= L >= ℓ > threshold``); otherwise ``min(MILP, I)``. In
  every case the returned value is on the same side of ``threshold`` (for ``<=`` and ``<``) as
  ``min(I, MILP)``, which is inclusion-monotone when the MILP is solved to optimality, so the
  search's decisions and result are those of that oracle. ``method`` says which bound decided:
  ``"milp:ibp"``, ``"milp:sampled"`` or ``"milp"``; ``exact`` (``upper`` and ``lower`` agree to
  `EXACT_RTOL`) only in the last case, as in `lipschitz_milp`.
  """
  t0 = time.perf_counter()
  bj_lip.check_out_norm(out_norm)
  bj_lip.check_radius(radius)
  if not (isinstance(threshold, (int, float, np.floating)) and math.isfinite(threshold)):
    raise ValueError(f"lipschitz_decide: threshold must be a finite number, got {threshold!r}.")
  weights = _check_point_network(net)
  z = np.asarray(center, np.float64).reshape(-1)
  if z.size != net.input_size:
    raise ValueError(f"lipschitz_decide: centre has {z.size} entries, network takes "
                     f"{net.input_size}.")
  pre = bounds_lib.compute(net, z - radius, z + radius, bounds)
  ibp = _interval_bound(weights, pre, out_norm)
  if ibp < threshold:
    return LipschitzBound(upper=float(ibp), lower=-math.inf, method="milp:ibp", exact=False,
                          out_norm=out_norm, seconds=time.perf_counter() - t0)
  low = sampled_lower(weights, z, float(radius), out_norm=out_norm)
  if low > threshold:
    return LipschitzBound(upper=float(ibp), lower=float(low), method="milp:sampled",
                          exact=False, out_norm=out_norm, seconds=time.perf_counter() - t0)
  res = lipschitz_milp(net, z, radius, out_norm=out_norm, config=config, bounds=bounds)
  upper = float(min(res.upper, ibp))
  return dataclasses.replace(res, upper=upper, exact=_agree(upper, res.lower),
                             seconds=time.perf_counter() - t0)


def milp_oracle(apply_fn: Callable, params: Any, example: Any, *, out_norm: str = "l1",
                solver: str = "highs", time_limit: float | None = None,
                threads: int = 1, proposal: float | None = None) -> Callable[[Any, float], float]:
  """``(x, radius) -> upper`` for `boundjax.ptr.release` (the network extracted once).

  ``time_limit=None`` (default) solves to optimality, which keeps the oracle exact and hence
  inclusion-monotone, as the privacy argument of the PTR test needs (a stopped solve is sound
  but its bound need not be monotone).

  ``proposal``: the ``Δp`` the radius search will compare with; the oracle is then
  `lipschitz_decide` (the MILP only when the interval bound and sampled Jacobians leave
  ``U <= Δp`` open), whose comparisons with ``Δp`` are those of ``min(IBP, exact MILP)``. Its
  values are sound upper bounds, but not the exact constant: use it only with that ``Δp``.
  """
  net = network_of(apply_fn, params, example)
  cfg = _config(solver, time_limit, threads)
  if proposal is not None:
    if not (isinstance(proposal, (int, float, np.floating)) and math.isfinite(proposal)
            and proposal > 0):
      raise ValueError(f"milp_oracle: proposal must be a finite number > 0, got {proposal!r}.")

    def decide(x: Any, radius: float) -> float:
      return lipschitz_decide(net, x, float(radius), float(proposal), out_norm=out_norm,
                              config=cfg).upper

    return decide

  def oracle(x: Any, radius: float) -> float:
    return lipschitz_milp(net, x, float(radius), out_norm=out_norm, config=cfg).upper

  return oracle

"""The backward pass of CROWN: per-equation transposes, the example-independent prefix, the
per-example pass through ReLUs, relaxations and interval fallbacks, specifications and
α-CROWN, and the forward pass that computes every intermediate bound (`run_backward`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from boundjax.core import rounding
from boundjax.core.program import Var as _Var
from boundjax.domains import interval as interval_domain
from boundjax.core.interval import Interval

from boundjax.domains.linear.rules import (
    CrownEqn, Lines, CrownProgram, bind1, endpoint_check, finite_or_constant, is_float,
    leaky_lines, low_precision, mccormick, read_value, reciprocal_lines, relu_argument,
    relu_lines,
    relu_parts, s_shaped_default_t, s_shaped_far_points, s_shaped_lines_at, sound_unary_lines,
    unary_fn,
    unary_relaxation)
from boundjax.domains.linear import windows as _windows
from boundjax.domains.linear.prefix import (  # noqa: F401  (names used by the windowed pass too)
    Prefix, abs_linear, add_to, affine_vjp, center_radius, coefficient_slack, has_offset, is_zero,
    magnitude, prefix_slack, rowdot, transpose_rows, transpose_terms)


@dataclasses.dataclass
class Ctx:
  prog: CrownProgram
  cenv: dict
  sound: bool
  intermediate: str
  prefixes: dict  # target var -> _Prefix
  ancestors: dict  # target var -> [eqn index]
  plans: dict = dataclasses.field(default_factory=dict)  # target var -> _PatchPlan
  spec_var: Any = None  # the output bounded through a specification matrix, if any
  spec_batched: bool = False  # results get a leading batch axis of size 1
  alpha_steps: int = 0  # α-CROWN: Adam steps on the ReLU lower slopes of the outputs' bounds
  alpha_lr: float = 0.1
  beta: bool = False  # β-CROWN: optimise the split constraints' multipliers with α
  nodes: tuple = ()  # ReLU nodes (distinct box-dependent inputs of max/min with a constant)
  info: bool = False  # also return `run_backward`'s per-example details of the bounded output
  row_caps: dict = dataclasses.field(default_factory=dict)  # ReLU input var -> rows bounded
  alpha_intermediate: bool = False  # α-CROWN also on the ReLU layers' own bounds
  s_nodes: tuple = ()  # (input var, eqn index) of logistic/tanh equations: α tangent points
  alpha_objective: str = "both"  # α minimises upper - lower, or -lower, or upper alone
  exact: frozenset = frozenset()  # targets the interval pass bounds exactly (`interval_exact`)


def _gather_mu(lam: dict, pending: dict, y, m: int, sides: int = 2):
  """``Λ`` at ``y`` for the pass's bounds, (sides, m, *y.shape): the example's own rows plus
  the shared prefix rows; None when neither reaches ``y``."""
  own, shared = lam.pop(y, None), pending.get(y)
  if own is None and shared is None:
    return None
  if own is None:
    return jnp.broadcast_to(shared[None], (sides, *shared.shape))
  return own if shared is None else own + shared[None]


def _apply_map(t, rows):
  """``Lᵀ`` of one side of a relaxation applied to rows (leading axis): slopes, a map or None."""
  if t is None:
    return None
  if callable(t):
    return jax.vmap(t)(rows)
  return rows * t


def _safe_rowdot(rows, b):
  """``Σ rows · b`` per row with ``0 · ±inf = 0`` (interval bounds may be infinite)."""
  prod = jnp.where(rows == 0, 0.0, rows * b).astype(rows.dtype)
  return jnp.sum(prod.reshape((rows.shape[0], -1)), axis=1)


def _relaxed_step(ln: Lines, e: CrownEqn, mu, m: int, lam: dict, bias, sound_terms=None):
  """One nonlinear equation of the backward pass: for the lower bound positive entries of
  ``Λ_y`` take the lower line and negative ones the upper line, for the upper bound the other
  way round (CROWN, Zhang et al. 2018, Theorem 3.2): ``Λ_x += L_loᵀ Λ⁺ + L_upᵀ Λ⁻`` and
  ``bias += Λ⁺·b_lo + Λ⁻·b_up`` (lower; swapped for the upper bound).

  Sound mode (``sound_terms = (ivs, uses, n_eq, dtype)``): also returns the rounding slack of
  this step, (2, m): ``γ_{n_y + k + 1} Σ |Λ̃_x|·|x|_max`` per operand (the products and
  sums forming ``Λ_x``, which receives ``k`` contributions) plus ``γ_{2 n_y + n_eq}
  Σ (|Λ⁺|·|b_lo| + |Λ⁻|·|b_up|)`` (the bias sums), as for the ReLU step."""
  lo_rows = jnp.concatenate([jnp.maximum(mu[0], 0), jnp.minimum(mu[1], 0)])  # (2m, ...)
  up_rows = jnp.concatenate([jnp.minimum(mu[0], 0), jnp.maximum(mu[1], 0)])
  bias = bias + (_safe_rowdot(lo_rows, ln.b_lo) + _safe_rowdot(up_rows, ln.b_up)).reshape((2, m))
  slack = None
  if sound_terms is not None:
    ivs, uses, n_eq, dtype = sound_terms
    n_y = e.outvars[0].size
    absb = (_safe_rowdot(jnp.abs(lo_rows), jnp.abs(ln.b_lo))
            + _safe_rowdot(jnp.abs(up_rows), jnp.abs(ln.b_up))).reshape((2, m))
    n = 2 * n_y + n_eq
    slack = rounding.gamma(n, dtype) * absb + rounding.flush_error(n, dtype)
  for x, t_lo, t_up in zip(e.relax_in, ln.lo, ln.up):
    parts = [q for q in (_apply_map(t_lo, lo_rows), _apply_map(t_up, up_rows)) if q is not None]
    if parts:
      contrib = sum(parts[1:], parts[0]).reshape((2, m, *x.shape))
      add_to(lam, x, contrib)
      if slack is not None:
        absdot = _safe_rowdot(jnp.abs(contrib).reshape((2 * m, -1)),
                              magnitude(ivs[x]).reshape(-1)).reshape((2, m))
        slack = slack + coefficient_slack(e.outvars[0].size + uses.get(x, 1) + 2, dtype,
                                           absdot, ivs[x])
  return bias if sound_terms is None else (bias, slack)


# ----------------------------------------------------------------------------------------------
# Products of two box-dependent operands: dot_general and convolution (McCormick planes)
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _DotPlanes:
  """The McCormick planes of ``y = P ⋆ Q`` (a dot_general or convolution of two boxes) on one
  example, see `_dot_planes`. Arrays of ``P``'s shape: ``t`` (plane weights), ``z`` (``Q``'s
  slope); of ``Q``'s shape: its bounds, centre and radius; of ``y``'s shape: the offsets, ``ok``
  (every term finite) and the sound mode's magnitudes ``w_pq = |P|⋆|Q|``, ``w_zq = |z|⋆|Q|``,
  ``w_zc = |z|⋆(|c_Q| + r_Q)``."""
  roles: Any
  t: Any
  z: Any
  lq: Any
  uq: Any
  cq: Any
  rq: Any
  b_lo: Any
  b_up: Any
  ok: Any
  w_pq: Any = None
  w_zq: Any = None
  w_zc: Any = None


def _dot_fwd(e: CrownEqn, pivot: int, p_arr, q_arr):
  """The equation's own product with ``p_arr`` in the pivot's position and ``q_arr`` in the
  other one."""
  return bind1(e, [p_arr, q_arr] if pivot == 0 else [q_arr, p_arr])


def _dot_transpose(e: CrownEqn, pos: int, other, rows):
  """``L_posᵀ`` applied to each row (leading axis) of ``rows``, where ``L_pos`` is the linear map
  ``v -> op(v, other)`` with ``v`` in operand position ``pos``."""
  x = e.invars[pos]
  f = (lambda v: bind1(e, [v, other])) if pos == 0 else (lambda v: bind1(e, [other, v]))
  _, vjp = jax.vjp(f, jnp.zeros(x.shape, x.aval.dtype))
  return jax.vmap(lambda r: vjp(r)[0])(rows)


def _dot_terms(e: CrownEqn) -> int:
  """Scalar products summed into one output entry (the contraction length; for a convolution
  every kernel entry of one output feature)."""
  a, b = e.invars
  count = interval_domain.dot_count if e.name == "dot_general" else interval_domain.conv_count
  return count(a.shape, b.shape, e.params)


def _dot_planes(e: CrownEqn, p_iv: Interval, q_iv: Interval, sound: bool) -> _DotPlanes:
  """Linear bounds of ``y = Σ_k P_k Q_k`` (each output entry a sum of scalar products of two
  boxes; a dot_general or a convolution) from the McCormick planes of every product
  (McCormick 1976, "Computability of global solutions to factorable nonconvex programs", §3):

    ``P Q >= l_Q P + l_P Q - l_P l_Q``,   ``P Q >= u_Q P + u_P Q - u_P u_Q``   (lower),
    ``P Q <= u_Q P + l_P Q - l_P u_Q``,   ``P Q <= l_Q P + u_P Q - u_P l_Q``   (upper).

  Plane choice: per entry of the pivot ``P`` the convex combination with weight ``t`` on the
  second plane of each side, ``t = (z - l_P) / (u_P - l_P)`` with ``z`` the point of
  ``[l_P, u_P]`` nearest to 0. Both sides then give ``Q`` the slope ``z`` and ``P`` the slopes
  ``l_Q + t(u_Q - l_Q)`` (lower) and ``u_Q - t(u_Q - l_Q)`` (upper), offsets
  ``-[(1-t) l_P l_Q + t u_P u_Q]`` and ``-[(1-t) l_P u_Q + t u_P l_Q]``. Why: at the box centre
  all four planes are equally far from ``P Q`` (``r_P r_Q``), so the centre does not decide;
  this choice makes every term's bound exact once ``Q`` is concretised on its own box — for
  ``P >= 0`` (a post-ReLU activation) it is the first plane and ``min_Q P Q = l_Q P`` exactly,
  for ``P <= 0`` the second, and for a pivot straddling 0 it is the chord of the concave
  ``P -> min_Q P Q`` through ``(l_P, l_P u_Q)`` and ``(u_P, u_P l_Q)``, with no ``Q`` term. With
  ``Q`` a parameter box this is the "concretise the parameter term at once" bound of AGT's
  CROWN (the sign of ``P`` picks the worst weight), and with both operands fresh boxes it is
  the exact interval of every output entry. Every array is a product with ``P``'s or ``Q``'s
  indices only, so the coefficient maps stay dot_generals / convolutions (`_dot_step`).

  Sound mode: ``t ∈ {0, 1}`` (a single plane, so the slopes ``l_Q``, ``u_Q``, ``z`` are exact
  floats; ``z`` is the end of ``P``'s box nearer to 0) and the offsets are rounded outward by
  ``2(γ_{K+2} Σ|terms| + 2(K+2)λ)`` (K terms per output). Output entries with a non-finite
  term get the constant lines of their interval ``[y_lo, y_hi]`` (set by the caller through
  ``ok``).
  """
  lp, up, lq, uq = p_iv.lower, p_iv.upper, q_iv.lower, q_iv.upper
  nf_p = ~(jnp.isfinite(lp) & jnp.isfinite(up))
  nf_q = ~(jnp.isfinite(lq) & jnp.isfinite(uq))
  zero = lambda a, bad: jnp.where(bad, jnp.zeros_like(a), a)  # noqa: E731
  lp, up, lq, uq = zero(lp, nf_p), zero(up, nf_p), zero(lq, nf_q), zero(uq, nf_q)
  piv = _dot_roles_of(e).pivot
  fwd = lambda a, b: _dot_fwd(e, piv, a, b)  # noqa: E731
  bad = fwd(nf_p.astype(lp.dtype), jnp.ones_like(lq)) + fwd(jnp.ones_like(lp),
                                                            nf_q.astype(lq.dtype))
  ok = bad == 0
  if sound:
    t = jnp.abs(up) < jnp.abs(lp)
    z = jnp.where(t, up, lp)
    lp_t, up_t = jnp.where(t, 0.0, lp).astype(lp.dtype), jnp.where(t, up, 0.0).astype(lp.dtype)
    t = t.astype(lp.dtype)
  else:
    d = up - lp
    z = jnp.clip(jnp.zeros_like(lp), lp, up)
    t = jnp.where(d > 0, (z - lp) / jnp.where(d > 0, d, 1.0), 0.0).astype(lp.dtype)
    lp_t, up_t = (1 - t) * lp, t * up
  b_lo = -(fwd(lp_t, lq) + fwd(up_t, uq))
  b_up = -(fwd(lp_t, uq) + fwd(up_t, lq))
  c, r = center_radius(Interval(lq, uq, validate=False), sound)
  pl = _DotPlanes(_dot_roles_of(e), t, z, lq, uq, c, r, b_lo, b_up, ok)
  if sound:
    dtype = b_lo.dtype
    n = _dot_terms(e) + 2
    a_lp, a_up, a_lq, a_uq = jnp.abs(lp_t), jnp.abs(up_t), jnp.abs(lq), jnp.abs(uq)
    e_lo = fwd(a_lp, a_lq) + fwd(a_up, a_uq)
    e_up = fwd(a_lp, a_uq) + fwd(a_up, a_lq)
    g, fl = rounding.gamma(n, dtype), rounding.flush_error(n, dtype)
    pl.b_lo = rounding.round_down(b_lo - 2 * (g * e_lo + fl))
    pl.b_up = rounding.round_up(b_up + 2 * (g * e_up + fl))
    mag_q = jnp.maximum(a_lq, a_uq)
    pl.w_pq = fwd(jnp.maximum(jnp.abs(lp), jnp.abs(up)), mag_q)
    pl.w_zq = fwd(jnp.abs(z), mag_q)
    pl.w_zc = fwd(jnp.abs(z), jnp.abs(c) + r)
  return pl


def _dot_roles_of(e: CrownEqn):
  return e.aux


def _dot_step(pl: _DotPlanes, e: CrownEqn, mu, m: int, lam: dict, bias, y_iv: Interval,
              sound_terms=None):
  """The backward step through ``y = P ⋆ Q`` with the planes of `_dot_planes` (CROWN, Zhang et
  al. 2018, Theorem 3.2: positive entries of ``Λ_y`` take the lower planes for the lower bound
  and the upper planes for the upper bound, negative ones the other side):

    ``Λ_P = Λ_y ⋆ᵀ c_Q ∓ (1 - 2t) ⊙ (|Λ_y| ⋆ᵀ r_Q)``  (− for lower-bound rows, + for upper),
    ``Λ_Q = Λ_y ⋆ᵀ z``,   ``bias += Λ⁺·b_lo + Λ⁻·b_up`` (lower; swapped for the upper bound),

  where ``⋆ᵀ`` is the transpose of the product in one operand (a dot_general / convolution
  with the other operand's array). With ``t ∈ {0, 1}`` (sound mode) ``Λ_P`` is formed from the
  exact slopes ``l_Q``, ``u_Q`` instead of the centre and radius. A parameter box ``Q``
  (``roles.concretise``) is concretised at once: ``Λ_Q·c_Q ∓ |Λ_Q|·r_Q``, with
  ``|Λ_Q|·r_Q = |Λ_y|·(|z| ⋆ r_Q)`` when ``roles.rank1``. Entries of ``y`` with a non-finite
  term (``~ok``) take the constant lines ``[y_lo, y_hi]``.

  Sound mode (``sound_terms = (ivs, uses, n_eq, dtype)``): returns also the rounding slack,
  (2, m): the bias sums (γ_{2n_y + n_eq}), the coefficients ``Λ_P``, ``Λ_Q`` (γ of their
  transposes' term counts, weighted by the operands' magnitudes through ``w_pq``, ``w_zq``) and
  the at-once concretisation (``w_zc``)."""
  roles = pl.roles
  y = e.outvars[0]
  P, Q = e.invars[roles.pivot], e.invars[1 - roles.pivot]
  dtype = mu.dtype
  lo_rows = jnp.concatenate([jnp.maximum(mu[0], 0), jnp.minimum(mu[1], 0)])  # (2m, ...)
  up_rows = jnp.concatenate([jnp.minimum(mu[0], 0), jnp.maximum(mu[1], 0)])
  b_lo = jnp.where(pl.ok, pl.b_lo, y_iv.lower)
  b_up = jnp.where(pl.ok, pl.b_up, y_iv.upper)
  bias = bias + (_safe_rowdot(lo_rows, b_lo) + _safe_rowdot(up_rows, b_up)).reshape((2, m))
  okf = pl.ok.astype(dtype)
  rows = (mu * okf).reshape((2 * m, *y.shape))
  tr_p = lambda r, q_arr: _dot_transpose(e, roles.pivot, q_arr, r)  # noqa: E731
  tr_q = lambda r, p_arr: _dot_transpose(e, 1 - roles.pivot, p_arr, r)  # noqa: E731
  if sound_terms is not None:
    lo_ok, up_ok = lo_rows * okf, up_rows * okf
    first = tr_p(lo_ok, pl.lq) + tr_p(up_ok, pl.uq)  # t = 0: slopes l_Q (lower), u_Q (upper)
    second = tr_p(lo_ok, pl.uq) + tr_p(up_ok, pl.lq)  # t = 1
    lam_p = jnp.where(pl.t[None] > 0, second, first)
  else:
    sgn = jnp.concatenate([-jnp.ones((m,), dtype), jnp.ones((m,), dtype)])
    sgn = sgn.reshape((2 * m,) + (1,) * len(y.shape))
    lam_p = tr_p(rows, pl.cq) + (1 - 2 * pl.t)[None] * tr_p(sgn * jnp.abs(rows), pl.rq)
  add_to(lam, P, lam_p.reshape((2, m, *P.shape)))
  abs_rows = jnp.abs(rows)
  if roles.concretise:
    if roles.rank1:
      lin = rowdot(rows, _dot_fwd(e, roles.pivot, pl.z, pl.cq))
      spread = rowdot(abs_rows, _dot_fwd(e, roles.pivot, jnp.abs(pl.z), pl.rq))
    else:
      lam_q = tr_q(rows, pl.z)
      lin, spread = rowdot(lam_q, pl.cq), rowdot(jnp.abs(lam_q), pl.rq)
    lin, spread = lin.reshape((2, m)), spread.reshape((2, m))
    bias = bias + jnp.stack([lin[0] - spread[0], lin[1] + spread[1]])
  else:
    add_to(lam, Q, tr_q(rows, pl.z).reshape((2, m, *Q.shape)))
  if sound_terms is None:
    return bias
  ivs, uses, n_eq, sdtype = sound_terms
  n_y = y.size
  n = 2 * n_y + n_eq
  absb = (_safe_rowdot(jnp.abs(lo_rows), jnp.abs(b_lo))
          + _safe_rowdot(jnp.abs(up_rows), jnp.abs(b_up))).reshape((2, m))
  slack = rounding.gamma(n, sdtype) * absb + rounding.flush_error(n, sdtype)
  absdot = rowdot(abs_rows, pl.w_pq).reshape((2, m))
  slack = slack + coefficient_slack(transpose_terms(e, roles.pivot) + uses.get(P, 1) + 3,
                                     sdtype, absdot, ivs[P])
  if roles.concretise:
    n = _dot_terms(e) + n_y + 4
    if not roles.rank1:
      n += transpose_terms(e, 1 - roles.pivot) + Q.size
    slack = slack + rounding.gamma(n, sdtype) * rowdot(abs_rows, pl.w_zc).reshape((2, m)) \
        + rounding.flush_error(n, sdtype)
  else:
    absdot = rowdot(abs_rows, pl.w_zq).reshape((2, m))
    slack = slack + coefficient_slack(transpose_terms(e, 1 - roles.pivot) + uses.get(Q, 1)
                                       + 2, sdtype, absdot, ivs[Q])
  return bias, slack


def _fallback_terms(iv: Interval, mu, m: int):
  """A fallback output ``y ∈ [l, u]`` is a box variable: the lower bound gains
  ``Σ Λ⁺ l + Λ⁻ u``, the upper bound ``Σ Λ⁺ u + Λ⁻ l``; also returns ``Σ |Λ|·max(|l|, |u|)``
  (sound mode error terms)."""
  lo, hi = iv.lower, iv.upper
  sides = mu.shape[0]  # 1: a lower-only pass
  ends = [_safe_rowdot(jnp.maximum(mu[0], 0), lo) + _safe_rowdot(jnp.minimum(mu[0], 0), hi)]
  if sides == 2:
    ends.append(_safe_rowdot(jnp.maximum(mu[1], 0), hi) + _safe_rowdot(jnp.minimum(mu[1], 0), lo))
  mag = _safe_rowdot(jnp.abs(mu.reshape((sides * m, -1))),
                     magnitude(iv).reshape(-1)).reshape((sides, m))
  return jnp.stack(ends), mag


def _spec_prefix(px: Prefix, spec) -> Prefix:
  """The prefix of ``C @ target`` (start ``Λ = C`` instead of ``I``): every shared row block is
  mapped by ``C`` (k, m), which is exact linear algebra on the example-independent part."""
  k = spec.shape[0]
  mapc = lambda a: jnp.tensordot(spec.astype(a.dtype), a, axes=1)  # noqa: E731
  return Prefix(k, {v: mapc(a) for v, a in px.pending.items()},
                 {v: mapc(a) for v, a in px.at_input.items()}, spec.astype(px.bias.dtype) @ px.bias,
                 jnp.zeros((k,), px.bias.dtype), [])


# ----------------------------------------------------------------------------------------------
# One backward step per kind of equation (the kind is set by `rules.classify_program`)
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Pass:
  """The state of one backward pass (`_backward`): ``lam`` (var -> (2, m, *shape) coefficients,
  [0] for the lower bound and [1] for the upper), ``bias`` and ``slack`` (2, m), and the
  magnitude and size of the interval fallbacks, with the pass's fixed arguments."""
  ctx: Ctx
  px: Prefix
  m: int
  n_eq: int
  dtype: Any
  ivs: dict
  pre: dict
  rel: dict
  alphas: dict | None
  betas: dict | None
  splits: dict | None
  record: dict | None
  lam: dict
  bias: Any
  slack: Any
  fb_abs: Any
  n_fb: int
  sides: int = 2  # 1: the lower-bound rows alone (`ONE_SIDED_KINDS`)


ONE_SIDED_KINDS = frozenset({"affine", "relu", "fallback", "concrete"})
"""The kinds of equation whose backward steps run on the lower-bound rows alone (a pass of
``sides = 1``): each side of a step reads only its own rows (``Λ⁺``/``Λ⁻`` of its side take
that side's lines), so the lower rows are the same with or without the upper ones."""


def one_sided(ctx: "Ctx", target: _Var) -> bool:
  """Whether ``target``'s pass may run on its lower rows alone: ``alpha_objective`` is
  ``"lower_only"`` and every equation behind it is of `ONE_SIDED_KINDS`."""
  return ctx.alpha_objective == "lower_only" and all(
      ctx.prog.eqns[i].kind in ONE_SIDED_KINDS for i in ctx.ancestors[target])


def _nonlinear_step(st: _Pass, i: int, e: CrownEqn) -> None:
  """A relaxed nonlinear equation: its `Lines` (``rel[i]``) replace it; a product of two boxes
  (``mode == "dot"``) takes its McCormick planes (`_dot_step`)."""
  y, sound, m = e.outvars[0], st.ctx.sound, st.m
  mu = _gather_mu(st.lam, st.px.pending, y, m)
  if mu is None:
    return
  if e.mode == "dot":
    if sound:
      st.bias, extra = _dot_step(st.rel[i], e, mu, m, st.lam, st.bias, st.ivs[y],
                                 (st.ivs, st.ctx.prog.uses, st.n_eq, st.dtype))
      st.slack = st.slack + extra
    else:
      st.bias = _dot_step(st.rel[i], e, mu, m, st.lam, st.bias, st.ivs[y])
  else:
    t = None if st.alphas is None or e.mode != "unary" else st.alphas.get(e.relax_in[0])
    ln = st.rel[i] if t is None else _s_shaped_rows(st, i, e, t)
    if sound:
      st.bias, extra = _relaxed_step(ln, e, mu, m, st.lam, st.bias,
                                     (st.ivs, st.ctx.prog.uses, st.n_eq, st.dtype))
      st.slack = st.slack + extra
    else:
      st.bias = _relaxed_step(ln, e, mu, m, st.lam, st.bias)


def _s_shaped_rows(st: _Pass, i: int, e: CrownEqn, t) -> Lines:
  """α-CROWN's lines of a logistic/tanh equation, one pair per row of the pass:
  ``t`` (2, 2, m, n) holds the tangent fractions of `s_shaped_lines_at` (lower line, upper
  line) × (lower-bound rows, upper-bound rows). The rows come out in `_relaxed_step`'s order:
  its lower-line rows are the lower bound's positive and the upper bound's negative
  coefficients, so the lower line of the lower-bound rows comes first, then of the upper-bound
  rows (and the same for the upper line)."""
  x, y = e.relax_in[0], e.outvars[0]
  n = x.size
  l, u = (a.reshape(-1) for a in st.pre[x])
  y_lo, y_hi = st.ivs[y].lower.reshape(-1), st.ivs[y].upper.reshape(-1)
  rows = lambda a: jnp.broadcast_to(a, (2, st.m, n)).reshape((2 * st.m, n))  # noqa: E731
  lines = s_shaped_lines_at(e.name, l, u, rows(t[0]), rows(t[1]), st.ctx.sound,
                            st.rel.get(("far", i)))
  check = endpoint_check(unary_fn(e.name, e.params))(l, u)
  a_lo, b_lo, a_up, b_up = finite_or_constant(*lines, l, u, y_lo, y_hi, check)
  shape = lambda a: a.reshape((2 * st.m, *x.shape))  # noqa: E731
  return Lines([shape(a_lo)], shape(b_lo), [shape(a_up)], shape(b_up))


def _fallback_step(st: _Pass, i: int, e: CrownEqn) -> None:
  """An equation CROWN cannot relax: its results are concretised at their interval bounds."""
  for y2 in e.outvars:
    mu = _gather_mu(st.lam, st.px.pending, y2, st.m, st.sides)
    if mu is not None:
      add, mag = _fallback_terms(st.ivs[y2], mu, st.m)
      st.bias, st.fb_abs, st.n_fb = st.bias + add, st.fb_abs + mag, st.n_fb + y2.size


def _affine_step(st: _Pass, i: int, e: CrownEqn) -> None:
  """An affine equation: the coefficients move to its box-dependent operands through its
  transpose (`transpose_rows`), its concrete offset goes into the bias."""
  y, sound, m, cenv = e.outvars[0], st.ctx.sound, st.m, st.ctx.cenv
  if y not in st.lam:
    return
  lam_y = st.lam.pop(y)
  y0, vjp = affine_vjp(e, cenv)
  contribs = transpose_rows(e, cenv, vjp, lam_y.reshape((st.sides * m, *y.shape)))
  if has_offset(e):
    st.bias = st.bias + rowdot(lam_y, y0, 2)
  if sound and has_offset(e):
    n = y.size + st.n_eq
    st.slack = st.slack + rounding.gamma(n, st.dtype) * rowdot(
        jnp.abs(lam_y), jnp.abs(y0), 2) + rounding.flush_error(n, st.dtype)
  for p, cb in zip(e.abstract_pos, contribs):
    x = e.invars[p]
    add_to(st.lam, x, cb.reshape((st.sides, m, *x.shape)))
    if sound:
      absdot = rowdot(jnp.abs(lam_y), abs_linear(e, cenv, p, magnitude(st.ivs[x])), 2)
      st.slack = st.slack + coefficient_slack(
          transpose_terms(e, p) + st.ctx.prog.uses.get(x, 1) + 1, st.dtype, absdot, st.ivs[x])


def _relu_step(st: _Pass, i: int, e: CrownEqn) -> None:
  """``max(x, c)`` / ``min(x, c)`` with a concrete ``c``: CROWN's lines (Zhang et al. 2018,
  §3.2; `relu_lines`), α-CROWN's optimised lower slopes (Xu et al. 2021) and β-CROWN's split
  multipliers (Wang et al. 2021, §3.1)."""
  y, sound, m = e.outvars[0], st.ctx.sound, st.m
  own = st.lam.pop(y, None)  # (2, m, ...) from pass 2, or None
  shared = st.px.pending.get(y)  # (m, ...) from the prefix, or None
  if own is None and shared is None:
    return
  x, c, sigma = relu_parts(e, st.ctx.cenv)
  c_zero = is_zero(e.invars[1 - e.abstract_pos[0]])
  l, u = st.pre[x]
  if c_zero:  # t = ±x is exact: no rounding (rounding a split's clipped 0 to -tiny would
    # make the split neuron unstable, relaxed by its α instead of exactly)
    lt, ut = (l, u) if sigma > 0 else (-u, -l)
  else:
    lt, ut, c, pinned = relu_argument(l, u, c, sigma, sound)
  a_lo, a_up, b_up = relu_lines(lt, ut, sound)
  n = x.size
  flat = lambda a: a.reshape(a.shape[:a.ndim - len(x.shape)] + (n,))  # noqa: E731
  a_lo, a_up, b_up = flat(a_lo), flat(a_up), flat(b_up)
  if own is None:
    mu = flat(shared)[None]  # (1, m, n): shared by both bounds
  else:
    if shared is not None:
      own = own + shared[None]
    mu = flat(own)  # (2, m, n)
  if st.record is not None:
    st.record[x] = mu[0]
  if not c_zero:  # y = c where c is ±inf (see `relu_argument`): Λ·c, with 0·inf = 0
    pinned_rows = _safe_rowdot(mu.reshape((-1, n)), flat(pinned))
    st.bias = st.bias + pinned_rows.reshape((mu.shape[0], m))
  if sigma < 0:
    mu = -mu
  # lower bound: positive coefficients take the lower line, negative the upper line;
  # upper bound the other way round. (Flat (rows, n) arrays vectorise well on CPU.)
  alpha = None if st.alphas is None else st.alphas.get(x)
  sides = st.sides
  if alpha is None:
    a_pos = jnp.stack([a_lo, a_up][:sides])[:, None]  # (sides, 1, n)
    a_neg = jnp.stack([a_up, a_lo][:sides])[:, None]
  else:  # α-CROWN: optimised lower slopes of unstable neurons (lower rows, upper rows)
    unstable = (lt.reshape(-1) < 0) & (ut.reshape(-1) > 0)
    alpha = alpha if alpha.ndim == 3 else alpha[:, None]  # (sides, m or 1, n)
    al = jnp.where(unstable, jnp.clip(alpha, 0.0, 1.0).astype(a_lo.dtype), a_lo)
    up = jnp.broadcast_to(a_up, al.shape[1:])
    a_pos = jnp.stack([al[0], up][:sides])
    a_neg = jnp.stack([up, al[-1]][:sides])
  nu = mu * jnp.where(mu > 0, a_pos, a_neg)  # (sides, m, n)
  beta = None if st.betas is None or st.splits is None else st.betas.get(x)
  if beta is not None and st.splits.get(x) is not None:
    sgn = st.splits[x].astype(nu.dtype)
    if not c_zero:  # an infinite constant: t is not σ(x - c) there (see _relu_argument)
      sgn = jnp.where(jnp.isfinite(flat(relu_parts(e, st.ctx.cenv)[1])), sgn, 0.0)
    bt = jnp.maximum(beta, 0.0).astype(nu.dtype) * sgn  # (sides, m, n)
    nu = nu + jnp.stack([-bt[0], bt[-1]][:sides])
    beta_mag = jnp.abs(bt)
  else:
    beta_mag = None
  mu_lo, mu_hi = mu[0], mu[-1]
  ends = [jnp.minimum(mu_lo, 0) @ b_up] + ([jnp.maximum(mu_hi, 0) @ b_up] if sides == 2 else [])
  st.bias = st.bias + jnp.stack(ends)
  if not c_zero:
    mu2 = jnp.broadcast_to(mu, nu.shape)
    st.bias = st.bias + sigma * rowdot(mu2, flat(c), 2) - sigma * rowdot(nu, flat(c), 2)
  nu = nu.reshape((sides, m, *x.shape))
  add_to(st.lam, x, nu if sigma > 0 else -nu)
  if sound:  # (β: one more term per entry, |Λ_t| + β|s| bounds the summands)
    k = st.ctx.prog.uses.get(x, 1) + 1 + (beta_mag is not None)
    anu = jnp.abs(nu) if beta_mag is None else \
        jnp.abs(nu) + 2 * beta_mag.reshape(nu.shape)
    st.slack = st.slack + coefficient_slack(1 + k, st.dtype,
                                             rowdot(anu, magnitude(st.ivs[x]), 2), st.ivs[x])
    amu = jnp.abs(jnp.stack([mu_lo, mu_hi]))
    absum = rowdot(amu, b_up, 2)
    if not c_zero:
      absum = (absum + rowdot(amu, jnp.abs(flat(c)), 2)
               + rowdot(anu, jnp.abs(c), 2))
    n = 3 * x.size + st.n_eq
    st.slack = st.slack + rounding.gamma(n, st.dtype) * absum + rounding.flush_error(n, st.dtype)


BACKWARD_STEPS = {"nonlinear": _nonlinear_step, "fallback": _fallback_step,
                  "relu": _relu_step, "affine": _affine_step}
"""The backward step of each kind of equation (a ``concrete`` equation has no box-dependent
value and never reaches the pass)."""


def _backward(ctx: Ctx, target: _Var, ivs: dict, pre: dict, rel: dict | None = None,
              spec=None, alphas: dict | None = None, betas: dict | None = None,
              splits: dict | None = None, record: dict | None = None,
              prefix: Prefix | None = None, sides: int = 2):
  """CROWN lower and upper bounds of ``target`` (flattened, shape (m,)) for one example.

  ``ivs``: forward intervals of abstract variables; ``pre``: ReLU input var -> (l, u);
  ``rel``: nonlinear equation index -> its `Lines` on this example; ``spec``: start from
  ``Λ = C``; ``alphas``: ReLU input var -> (2, n) lower slopes of its unstable neurons for the
  lower and the upper bound (α-CROWN; any value in [0, 1] is a valid lower line), or (2, m, n):
  one slope per row; ``betas``: ReLU input var -> (2, m, n) multipliers ``β >= 0`` of the split
  constraints ``splits`` (var -> (n,) signs ``s``, meaning ``s·t >= 0`` for the ReLU argument
  ``t = σ(x - c)``): on the set where they hold, ``min g >= min (g - β s t)`` and ``max g <=
  max (g + β s t)`` (β-CROWN, Wang et al. 2021, §3.1, Lagrangian of the split constraints), so
  ``∓β s`` is added to the lower / upper rows' coefficient of ``t``; entries whose ``c`` is
  infinite carry no multiplier. ``record``: filled with the lower-bound rows' coefficients
  (m, n) of each ReLU's output (keyed by the ReLU's input var) and (m, *shape) of each input.
  ``prefix``: the pass starts from these rows of the target (`select_rows`) instead of all;
  the bounds are then returned flat, one per row. ``sides = 1``: the lower-bound rows alone
  (every equation behind ``target`` of `ONE_SIDED_KINDS`; α and β then hold (1, m, n)), half
  the work; the upper bounds returned are ``+inf``.
  """
  rel = {} if rel is None else rel
  plan = ctx.plans.get(target)
  if plan is not None and spec is None and alphas is None and betas is None \
      and record is None and prefix is None:
    return _windows.backward_patches(plan, target, ivs, pre, ctx.cenv, ctx.prog)
  prog, cenv, sound = ctx.prog, ctx.cenv, ctx.sound
  px: Prefix = ctx.prefixes[target] if prefix is None else prefix
  if spec is not None:
    px = _spec_prefix(px, spec)
  dtype = target.aval.dtype
  m, n_eq = px.m, len(prog.eqns)
  lam: dict = {}  # var -> (sides, m, *shape): [0] for the lower bound, [1] for the upper bound
  bias = jnp.stack([px.bias] * sides)
  slack = jnp.zeros((sides, m), dtype) + prefix_slack(px, cenv, ivs, dtype)
  st = _Pass(ctx, px, m, n_eq, dtype, ivs, pre, rel, alphas, betas, splits, record, lam, bias,
             slack, jnp.zeros((sides, m), dtype), 0, sides)
  if px.pending:
    for i in reversed(ctx.ancestors[target]):
      e = prog.eqns[i]
      BACKWARD_STEPS.get(e.kind, _affine_step)(st, i, e)
  lam, bias, slack, fb_abs, n_fb = st.lam, st.bias, st.slack, st.fb_abs, st.n_fb
  # concretise at the input boxes
  lower, upper = bias[0], bias[-1]
  absum = sum(jnp.abs(bias[k]) + fb_abs[k] for k in range(sides))
  n_in = n_fb
  for v in prog.invars:
    if v not in prog.abstract:
      continue
    l_p = px.at_input.get(v)
    l_2 = lam.get(v)
    if l_p is None and l_2 is None:
      continue
    tot = l_p[None] if l_2 is None else (l_2 if l_p is None else l_2 + l_p[None])
    tot = jnp.broadcast_to(tot, (sides, m, *v.shape))
    if record is not None:
      record[v] = tot[0]
    c, r = center_radius(ivs[v], sound)
    lower = lower + rowdot(tot[0], c) - rowdot(jnp.abs(tot[0]), r)
    if sides == 2:
      upper = upper + rowdot(tot[1], c) + rowdot(jnp.abs(tot[1]), r)
    n_in += v.size
    if sound:
      ac = jnp.abs(c) + r
      absum = absum + sum(rowdot(jnp.abs(tot[k]), ac) for k in range(sides))
  if sound:
    n = 2 * n_in + 3 + n_eq
    err = rounding.gamma(n, dtype) * absum + rounding.flush_error(n, dtype)
    lower = lower - 2 * (slack[0] + err)
    upper = upper + 2 * (slack[-1] + err)
    lower, upper = rounding.outward(lower, upper, ulps=1)
  if sides == 1:
    upper = jnp.full_like(lower, jnp.inf)
  if spec is not None or prefix is not None:
    return lower, upper
  return lower.reshape(target.shape), upper.reshape(target.shape)


def select_rows(px: Prefix, idx) -> Prefix:
  """The prefix of the target's entries ``idx`` only: every row block gathered (exact, so the
  sound mode's slack terms are the rows' own)."""
  take = lambda a: jnp.take(a, idx, axis=0)  # noqa: E731
  return Prefix(idx.shape[0], {v: take(a) for v, a in px.pending.items()},
                {v: take(a) for v, a in px.at_input.items()}, take(px.bias),
                take(jnp.broadcast_to(px.slack_const, px.bias.shape)),
                [(take(a), e, p, n) for (a, e, p, n) in px.steps])


def unstable_backward(ctx: Ctx, x: _Var, ivs: dict, pre: dict, rel: dict, screen: Interval,
                      c, sigma: float, cap: int):
  """CROWN bounds of the ReLU input ``x`` on its unstable neurons only: a neuron whose
  screening box (its forward interval met with the sub-problem's known bounds and splits)
  lies on one side of the kink has an exact relaxation, which no tighter bound changes, so its
  back-substitution is skipped (as auto_LiRPA and α,β-CROWN do). The first ``cap`` unstable
  neurons (a static count, `crown`'s ``unstable_rows``) are bounded by one backward pass
  started from their rows; every other entry gets ``[-inf, inf]``, i.e. keeps its screening
  box. Any choice of rows is sound: it only decides where CROWN tightens the box."""
  lt, ut, _, _ = relu_argument(screen.lower, screen.upper, c, sigma, False)
  unstable = ((lt < 0) & (ut > 0)).reshape(-1)
  idx = jnp.nonzero(unstable, size=cap, fill_value=0)[0]
  lo_r, hi_r = _backward(ctx, x, ivs, pre, rel, prefix=select_rows(ctx.prefixes[x], idx))
  full = jnp.full((x.size,), jnp.inf, lo_r.dtype)
  lo = (-full).at[idx].max(lo_r)  # a filler index repeats entry 0 with its own valid bound
  hi = full.at[idx].min(hi_r)
  return lo.reshape(x.shape), hi.reshape(x.shape)


def _straight_through(met: Interval, lo, hi) -> Interval:
  """``met``'s values with the gradients of the computed bounds ``lo, hi`` (and no other)
  where they are finite (α-CROWN, Xu et al. 2021, §3.2: an intermediate bound met with an
  earlier, tighter one keeps the earlier value, yet its slopes still get the gradient of their
  own bound, so an optimisation that starts where the two are equal is not stuck there).
  Where ``lo``/``hi`` is not finite there is no gradient."""
  def st(value, own):
    own = jnp.where(jnp.isfinite(own), own, 0.0)
    # exactly ``value``: x - x is 0 for finite x; the gradient is ``own``'s alone (``value``
    # may be ``own`` itself, whose gradient must not count twice)
    return lax.stop_gradient(value) + (own - lax.stop_gradient(own))
  return Interval(st(met.lower, lo), st(met.upper, hi), validate=False)


def _intersect(a: Interval, lo, hi, sound: bool) -> Interval:
  """The forward interval ``a`` met with CROWN's bounds ``[lo, hi]``. A NaN in CROWN's bounds
  (``0 · inf`` of a coefficient and an infinite offset or box end) carries no information: the
  interval bound stands there."""
  lo = jnp.where(jnp.isnan(lo), -jnp.inf, lo)
  hi = jnp.where(jnp.isnan(hi), jnp.inf, hi)
  lo2, hi2 = jnp.maximum(a.lower, lo), jnp.minimum(a.upper, hi)
  if not sound:  # both bounds are float approximations; never return an empty box
    lo2, hi2 = jnp.minimum(lo2, hi2), jnp.maximum(lo2, hi2)
  return Interval(lo2, hi2, validate=False)


def _interval_of(e: CrownEqn, vals: list, sound: bool, matmul: str = "midrad") -> list:
  """The forward interval rule of an equation (a composite through the interval domain, which
  may bound its body instead); low-precision arithmetic always in the domain's sound mode, whose
  outward rounding covers the float error of evaluating the operation in that precision.
  ``matmul``: the interval domain's product of two boxes (a relaxed product of two boxes uses
  "best", midpoint-radius met with sign-split: exact per entry when an operand is sign-definite,
  e.g. a post-ReLU activation times a weight box)."""
  low = any(low_precision(o.aval) for o in e.outvars) or any(
      isinstance(v, Interval) and low_precision(jax.typeof(v.lower)) for v in vals)
  ivctx = interval_domain.IntervalContext(sound=sound, matmul=matmul)
  if low and e.name in interval_domain.RULES:
    if sound:  # the real-number value: the float32 rule, sound, rounded outward
      out = interval_domain.sound_low_precision(ivctx, interval_domain.RULES[e.name], e, vals)
      return _no_nan_all(list(out) if e.prim.multiple_results else [out])
    return _no_nan_all(_interval_low_precision(e, vals))
  if e.prim is e.orig.prim:
    return interval_domain.abstract_eqn(ivctx, e.orig, vals)
  out = interval_domain.RULES[e.name](ivctx, *vals, **e.params)
  return _no_nan_all(list(out) if isinstance(out, (list, tuple)) else [out])


def _no_nan_all(outs: list) -> list:
  """NaN ends of float boxes become the full line (see `interval_domain.no_nan`)."""
  return [Interval(*interval_domain.no_nan(o.lower, o.upper), validate=False)
          if isinstance(o, Interval) and jnp.issubdtype(o.dtype, jnp.floating) else o
          for o in outs]


def _is_low_dtype(d) -> bool:
  try:
    return jnp.issubdtype(d, jnp.floating) and jnp.finfo(d).bits < 32
  except TypeError:
    return False


def _interval_low_precision(e: CrownEqn, vals: list) -> list:
  """Interval of a bfloat16/float16 equation: the rule in float32 (every low-precision operand
  and dtype parameter raised to float32), widened by two units of the low format's roundoff
  plus its smallest subnormal, then rounded outward to the output dtype (rounding to nearest is
  monotone, so the stored value of any point of the box stays inside). This covers an operation
  evaluated in float32 and rounded once to the low format (XLA's CPU and GPU evaluation of
  bfloat16 products and sums), not one that rounds every partial sum to bfloat16."""
  f32 = jnp.float32
  up = lambda a: a.astype(f32) if _is_low_dtype(jnp.result_type(a)) else a  # noqa: E731
  vals32 = [Interval(up(v.lower), up(v.upper), validate=False) if isinstance(v, Interval)
            else (up(jnp.asarray(v)) if is_float(jax.typeof(jnp.asarray(v))) else v)
            for v in vals]
  params = {k: (np.dtype(f32) if not isinstance(v, bool) and _is_low_dtype_param(v) else v)
            for k, v in e.params.items()}
  out = interval_domain.RULES[e.name](interval_domain.IntervalContext(), *vals32, **params)
  outs = list(out) if isinstance(out, (list, tuple)) else [out]
  res = []
  for o, var in zip(outs, e.outvars):
    dt = var.aval.dtype
    if not _is_low_dtype(dt):
      res.append(o)
      continue
    info = jnp.finfo(dt)
    margin = 2 * float(info.eps) / 2
    tiny = float(info.smallest_subnormal)
    lo = o.lower - margin * jnp.abs(o.lower) - tiny
    hi = o.upper + margin * jnp.abs(o.upper) + tiny
    lo_d, hi_d = lo.astype(dt), hi.astype(dt)
    lo_d = jnp.where(lo_d.astype(f32) > lo, jnp.nextafter(lo_d, jnp.asarray(-jnp.inf, dt)), lo_d)
    hi_d = jnp.where(hi_d.astype(f32) < hi, jnp.nextafter(hi_d, jnp.asarray(jnp.inf, dt)), hi_d)
    res.append(Interval(lo_d, hi_d, validate=False))
  return res


def _is_low_dtype_param(v) -> bool:
  try:
    return isinstance(v, (np.dtype, type)) and _is_low_dtype(v)
  except Exception:  # pragma: no cover - exotic parameter values
    return False


def _leaky_slopes(e: CrownEqn, cenv: dict, x: _Var):
  """Slopes ``(p, n)`` of a leaky-ReLU equation on the positive and negative side."""
  kind, atom = e.aux
  alpha = jnp.broadcast_to(jnp.asarray(read_value(cenv, atom), x.aval.dtype), x.shape)
  if kind == "select":
    return jnp.ones_like(alpha), alpha
  return jnp.maximum(alpha, 1.0), jnp.minimum(alpha, 1.0)


def _select_lines(e: CrownEqn, cenv: dict, pred: Any, y_iv: Interval) -> Lines:
  """``y = select_n(p, c_0, c_1, ...)`` with a box-dependent predicate ``p ∈ [p_lo, p_hi]``:
  where the predicate is decided (``p_lo = p_hi = k``) ``y = c_k`` exactly (slope 1 on ``c_k``
  if it is box-dependent, its value as offset if concrete); elsewhere the constant lines of the
  interval hull ``y_lo <= y <= y_hi``. (A NaN test ``x != x`` of a value whose interval is finite
  is decided, so ``jnp.logaddexp``'s and ``jnp.nan_to_num``'s guards cost nothing.)"""
  y_lo, y_hi = y_iv.lower, y_iv.upper
  p_lo = jnp.broadcast_to(jnp.asarray(pred.lower if isinstance(pred, Interval) else pred),
                          y_lo.shape).astype(jnp.int32)
  p_hi = jnp.broadcast_to(jnp.asarray(pred.upper if isinstance(pred, Interval) else pred),
                          y_lo.shape).astype(jnp.int32)
  decided = p_lo == p_hi
  zero = jnp.zeros_like(y_lo)
  b = zero
  slopes = []
  for k, c in enumerate(e.invars[1:]):
    chosen = decided & (p_lo == k)
    if isinstance(c, _Var) and c in e.relax_in:
      slopes.append(jnp.where(chosen, 1.0, 0.0).astype(y_lo.dtype))
    else:
      value = jnp.broadcast_to(jnp.asarray(read_value(cenv, c), y_lo.dtype), y_lo.shape)
      b = jnp.where(chosen, value, b)
  # one slope per relaxed operand, in the order of relax_in (an operand used twice: once)
  by_var = {}
  for c, sl in zip([c for c in e.invars[1:] if isinstance(c, _Var) and c in e.relax_in], slopes):
    by_var[c] = sl if c not in by_var else by_var[c] + sl
  lines = [by_var.pop(x) if x in by_var else jnp.zeros_like(y_lo) for x in e.relax_in]
  return Lines(lines, jnp.where(decided, b, y_lo), list(lines), jnp.where(decided, b, y_hi))


def _unary_lines(e: CrownEqn, cenv: dict, bounds: list, y_iv: Interval, sound: bool,
                 pred: Any) -> Lines:
  """An elementwise function (``mode == "unary"``): `unary_relaxation`'s lines (sound mode:
  `sound_unary_lines`), checked at the end points."""
  (l, u), = bounds
  lines = (sound_unary_lines(e.name) if sound else unary_relaxation(e.name, e.params))(l, u)
  return _finite_lines(lines, l, u, y_iv, endpoint_check(unary_fn(e.name, e.params))(l, u))


def _reciprocal_lines(e: CrownEqn, cenv: dict, bounds: list, y_iv: Interval, sound: bool,
                      pred: Any) -> Lines:
  """``c / d`` with a concrete ``c`` (``mode == "reciprocal"``): `reciprocal_lines`."""
  (l, u), = bounds
  c = jnp.broadcast_to(jnp.asarray(read_value(cenv, e.invars[0]), l.dtype), l.shape)
  return _finite_lines(reciprocal_lines(c, l, u), l, u, y_iv,
                       endpoint_check(lambda d: c / d)(l, u))


def _leaky_relu_lines(e: CrownEqn, cenv: dict, bounds: list, y_iv: Interval, sound: bool,
                      pred: Any) -> Lines:
  """``max(x, a x)`` (``mode == "leaky"``): `leaky_lines` with the slopes read from ``cenv``."""
  (l, u), = bounds
  p, n = _leaky_slopes(e, cenv, e.relax_in[0])
  return _finite_lines(leaky_lines(p, n, l, u), l, u, y_iv, None)


def _finite_lines(lines, l, u, y_iv: Interval, check) -> Lines:
  a_lo, b_lo, a_up, b_up = finite_or_constant(*lines, l, u, y_iv.lower, y_iv.upper, check)
  return Lines([a_lo], b_lo, [a_up], b_up)


def _product_lines(e: CrownEqn, cenv: dict, bounds: list, y_iv: Interval, sound: bool,
                   pred: Any) -> Lines:
  """``x z`` of two boxes (``mode == "product"``): McCormick planes (sound mode: one plane per
  side, exact slopes, offsets rounded outward); a non-finite operand bound gives the interval."""
  (lx, ux), (lz, uz) = bounds
  if sound:  # single McCormick planes: exact slopes, offsets rounded outward
    a_lo, b_lo = [lz, lx], -rounding.round_up(lx * lz)  # x z - (l_z x + l_x z - l_x l_z)
    a_up, b_up = [uz, lx], -rounding.round_down(lx * uz)  # = (x - l_x)(z - l_z) >= 0, ...
  else:
    a_lo, b_lo, a_up, b_up = mccormick(lx, ux, lz, uz)
  ok = jnp.isfinite(lx) & jnp.isfinite(ux) & jnp.isfinite(lz) & jnp.isfinite(uz)
  keep = lambda a: jnp.where(ok, a, 0.0)  # noqa: E731
  return Lines([keep(a) for a in a_lo], jnp.where(ok, b_lo, y_iv.lower),
               [keep(a) for a in a_up], jnp.where(ok, b_up, y_iv.upper))


def _max2_lines(e: CrownEqn, cenv: dict, bounds: list, y_iv: Interval, sound: bool,
                pred: Any) -> Lines:
  """``max(x1, x2)`` of two boxes: at least the operand with the larger lower bound; equal to
  an operand that dominates the other, else at most the interval's upper end."""
  (l1, u1), (l2, u2) = bounds
  one, zero = jnp.ones_like(l1), jnp.zeros_like(l1)
  first = l1 >= l2
  sel = [jnp.where(first, one, zero), jnp.where(first, zero, one)]
  d1, d2 = l1 >= u2, l2 >= u1
  dom = [jnp.where(d1, one, zero), jnp.where(d2 & ~d1, one, zero)]
  return Lines(sel, jnp.zeros_like(y_iv.lower), dom, jnp.where(d1 | d2, zero, y_iv.upper))


def _min2_lines(e: CrownEqn, cenv: dict, bounds: list, y_iv: Interval, sound: bool,
                pred: Any) -> Lines:
  """``min(x1, x2)`` of two boxes: `_max2_lines` mirrored."""
  (l1, u1), (l2, u2) = bounds
  one, zero = jnp.ones_like(l1), jnp.zeros_like(l1)
  first = u1 <= u2
  sel = [jnp.where(first, one, zero), jnp.where(first, zero, one)]
  d1, d2 = u1 <= l2, u2 <= l1
  dom = [jnp.where(d1, one, zero), jnp.where(d2 & ~d1, one, zero)]
  return Lines(dom, jnp.where(d1 | d2, zero, y_iv.lower), sel, jnp.zeros_like(y_iv.upper))


def _pool_lines(e: CrownEqn, cenv: dict, bounds: list, y_iv: Interval, sound: bool,
                pred: Any) -> Lines:
  """A pooling maximum (minimum): at least the entry with the largest lower bound (a selection
  map, ties split), at most the interval's upper end (mirrored for a minimum)."""
  (l, u), = bounds
  zeros = jnp.zeros_like(y_iv.lower)
  is_max = e.name in ("reduce_max", "reduce_window_max")
  _, vjp = jax.vjp(lambda z: bind1(e, [z]), l if is_max else u)
  sel = lambda g: vjp(g)[0]  # noqa: E731  a convex combination of the entries (ties split)
  if is_max:
    return Lines([sel], zeros, [None], y_iv.upper)
  return Lines([None], y_iv.lower, [sel], zeros)


def _select_mode_lines(e: CrownEqn, cenv: dict, bounds: list, y_iv: Interval, sound: bool,
                       pred: Any) -> Lines:
  return _select_lines(e, cenv, pred, y_iv)


RELAXATIONS: dict[str, Callable[..., Lines]] = {
    "unary": _unary_lines, "reciprocal": _reciprocal_lines, "leaky": _leaky_relu_lines,
    "product": _product_lines, "max2": _max2_lines, "min2": _min2_lines, "pool": _pool_lines,
    "select": _select_mode_lines,
}
"""The lines of each relaxation mode of a nonlinear equation (``e.mode``, set by its record's
classification, `rules.CLASSIFY`): ``(e, cenv, bounds, y_iv, sound, pred) -> Lines`` on this
example's input ``bounds``. A product of two boxes inside ``dot_general``/``conv`` (``"dot"``)
takes its planes in `_dot_planes` instead."""


def _relax_lines(e: CrownEqn, cenv: dict, bounds: list, y_iv: Interval,
                 sound: bool = False, pred: Any = None) -> Lines:
  """The lines of a nonlinear equation on this example's input bounds (see `Lines`,
  `RELAXATIONS`); ``pred``: the predicate's value or interval (``select`` mode)."""
  return RELAXATIONS[e.mode](e, cenv, bounds, y_iv, sound, pred)


def _spec_interval(iv: Interval, spec):
  """Interval bound of ``C y`` from ``y ∈ [l, u]``: ``C⁺ l + C⁻ u`` and ``C⁺ u + C⁻ l``."""
  l, u = iv.lower.reshape(-1), iv.upper.reshape(-1)
  cp, cn = jnp.maximum(spec, 0), jnp.minimum(spec, 0)
  return Interval(_safe_rowdot(cp, l) + _safe_rowdot(cn, u),
                  _safe_rowdot(cp, u) + _safe_rowdot(cn, l), validate=False)


def _final_bounds(ctx: Ctx, v: _Var, ivs: dict, pre: dict, rel: dict, spec,
                  data: dict | None = None, rerun: Any = None):
  """CROWN bounds of an output; with ``ctx.alpha_steps > 0`` also α-CROWN's (Xu et al.,
  "Fast and Complete", ICLR 2021, §3.1): the lower slopes ``α ∈ [0, 1]`` of the unstable ReLU
  neurons behind ``v`` are optimised by Adam (gradients through the bound; projected onto
  [0, 1] after each step), one set per row of the lower and of the upper bounds, starting from
  CROWN's adaptive slopes (or ``data["alpha"]``, a warm start). With ``ctx.beta`` the
  multipliers ``β >= 0`` of the split constraints ``data["splits"]`` are optimised with them
  (β-CROWN, Wang et al. 2021, §3.1; projected onto ``β >= 0``), starting from 0 (or
  ``data["beta"]``). Every α in [0, 1] and β >= 0 gives a valid bound, so every iterate's bound
  is sound: each row keeps the parameters of the best bound seen (float arithmetic), which are
  evaluated once more in ``ctx``'s mode (sound mode: with its rounding slack); the result is
  the entrywise best of that and CROWN's bound. With β (branch and bound, where compilation
  time counts) the separate CROWN pass is skipped: the first iterate is CROWN's slopes with
  β = 0 (or the warm start), so the best iterate is at least as tight in float arithmetic.

  Returns ``(lower, upper, details)``; ``details`` (when ``ctx.info``): ``alpha`` and ``beta``,
  one (2, m, n) array per ReLU node (lower rows, upper rows), and ``coeffs``, the lower-bound
  rows' coefficients of every ReLU node's output (m, n) and of every input (m, *shape)."""
  data = data or {}
  m = spec.shape[0] if spec is not None else v.size
  splits = {x: s for (x, _), s in zip(ctx.nodes, data.get("splits") or ()) if s is not None}
  rec = {} if ctx.info else None
  # β mode (branch and bound: warm starts, compile time matters) skips the separate CROWN pass
  # and the post-loop evaluation; the iterates' best, from CROWN's slopes or the warm start, is
  # evaluated once in ctx's mode
  lean = bool(ctx.alpha_steps) and ctx.beta
  sides = 1 if one_sided(ctx, v) else 2  # "lower_only": the upper rows are not computed
  if lean:
    lo = hi = None
    dtype = v.aval.dtype
  else:
    lo, hi = _backward(ctx, v, ivs, pre, rel, spec=spec,
                       record=rec if not ctx.alpha_steps else None, sides=sides)
    dtype = lo.dtype

  def default_alpha(x, i):
    e = ctx.prog.eqns[i]
    _, c, sigma = relu_parts(e, ctx.cenv)
    l, u = pre[x]
    lt, ut, _, _ = relu_argument(l, u, c, sigma, False)
    a_lo = relu_lines(lt, ut, False)[0].reshape(-1).astype(dtype)
    return jnp.broadcast_to(a_lo, (sides, m, x.size))

  def warm(w):
    """A warm start of one or two sides (lower rows first) as this pass's ``sides``: a lower
    row's α or β is a valid start for the upper row too."""
    w = w.astype(dtype)
    return w[:sides] if w.shape[0] >= sides else jnp.broadcast_to(w[:1], (sides, *w.shape[1:]))

  warm_a = data.get("alpha") or (None,) * len(ctx.nodes)
  warm_b = data.get("beta") or (None,) * len(ctx.nodes)
  alphas0 = [default_alpha(x, i) if w is None else warm(w)
             for (x, i), w in zip(ctx.nodes, warm_a)]
  betas0 = [jnp.zeros((sides, m, x.size), dtype) if w is None else warm(w)
            for (x, _), w in zip(ctx.nodes, warm_b)]

  def details(alphas, betas):
    if not ctx.info:
      return None
    coeffs = {x: rec.get(x, jnp.zeros((m, x.size), dtype)) for x, _ in ctx.nodes}
    coeffs.update({u: rec[u] for u in rec if u in ctx.prog.invars})
    return {"alpha": list(alphas), "beta": list(betas), "coeffs": coeffs}

  behind = {ctx.prog.eqns[i].invars[ctx.prog.eqns[i].abstract_pos[0]]
            for i in ctx.ancestors[v] if ctx.prog.eqns[i].kind == "relu"}
  anc = set(ctx.ancestors[v])
  s_keys = [x for x, i in ctx.s_nodes if i in anc and x in pre]
  if not ctx.alpha_steps or not (any(x in behind for x, _ in ctx.nodes) or s_keys):
    if ctx.alpha_steps and (ctx.info or lean):  # nothing to optimise: CROWN's pass
      lo, hi = _backward(ctx, v, ivs, pre, rel, spec=spec, record=rec, sides=sides)
    return lo, hi, details(alphas0, betas0)
  import optax
  keys = [x for x, _ in ctx.nodes]  # pytrees keyed by variables do not sort: lists in order
  use_beta = ctx.beta and bool(splits)
  mid_keys, mid0 = _intermediate_alphas(ctx, v, pre, dtype) if rerun is not None else ([], [])

  s0 = [_s_default(pre[x], (2, 2, m, x.size), dtype) for x in s_keys]

  def as_dicts(params):
    al, be, _, ts = params
    return ({**dict(zip(keys, al)), **dict(zip(s_keys, ts))},
            dict(zip(keys, be)) if use_beta else None)

  def passes(params, c: Ctx):
    """The forward pass's boxes and lines: CROWN's, or recomputed with the intermediate
    layers' own slopes."""
    if not mid_keys:
      return ivs, pre, rel
    mids = {t: dict(zip(nodes_t, a)) for (t, nodes_t), a in zip(mid_keys, params[2])}
    return rerun(mids, c)

  fast = dataclasses.replace(ctx, sound=False)  # gradients of the float bound (sound: final)

  def fast_bounds(params):
    al, be = as_dicts(params)
    ivs2, pre2, rel2 = passes(params, fast)
    l2, h2 = _backward(fast, v, ivs2, pre2, rel2, spec=spec, alphas=al, betas=be,
                       splits=splits, sides=sides)
    return l2.reshape(-1), h2.reshape(-1)

  def finite_sum(a):
    return jnp.sum(jnp.where(jnp.isfinite(a), a, 0.0))

  w_up = float(ctx.alpha_objective not in ("lower", "lower_only"))
  w_lo = float(ctx.alpha_objective != "upper")

  def objective(l2, h2):
    """What the steps minimise (``ctx.alpha_objective``): the total width or one side."""
    return w_up * finite_sum(h2) - w_lo * finite_sum(l2)

  def loss(params):
    l2, h2 = fast_bounds(params)
    return objective(l2, h2), (l2, h2)

  def keep_best(params, best, l2, h2):
    """Per row the output slopes and multipliers of its best bound; the intermediate slopes,
    shared by every row, of the best total."""
    bp, b_lo, b_hi, b_loss = best
    l2 = jnp.where(jnp.isnan(l2), -jnp.inf, l2)
    h2 = jnp.where(jnp.isnan(h2), jnp.inf, h2)
    better = jnp.stack([l2 > b_lo, h2 < b_hi][:sides])[:, :, None]  # (sides, m, 1)
    rows = jax.tree_util.tree_map(lambda new, old: jnp.where(better, new, old), params[:2],
                                  bp[:2])
    ts = [jnp.where(better[None], new, old) for new, old in zip(params[3], bp[3])]
    total = objective(l2, h2)
    mid = jax.tree_util.tree_map(lambda new, old: jnp.where(total < b_loss, new, old),
                                 params[2], bp[2])
    return ((*rows, mid, ts), jnp.maximum(b_lo, l2), jnp.minimum(b_hi, h2),
            jnp.minimum(b_loss, total))

  opt = optax.adam(ctx.alpha_lr)

  def step(_, st):
    params, state, best = st
    (_, (l2, h2)), g = jax.value_and_grad(loss, has_aux=True)(params)
    best = keep_best(params, best, l2, h2)
    upd, state = opt.update(g, state, params)
    al, be, mid, ts = optax.apply_updates(params, upd)
    clip = lambda a: jnp.clip(a, 0.0, 1.0)  # noqa: E731
    params = ([clip(a) for a in al], [jnp.maximum(b, 0.0) for b in be],
              jax.tree_util.tree_map(clip, mid), [clip(t) for t in ts])
    return params, state, best

  params0 = (alphas0, betas0, mid0, s0)
  inf = jnp.full((m,), jnp.inf, dtype)
  best0 = (params0, -inf, inf, jnp.asarray(jnp.inf, dtype))
  params, _, best = lax.fori_loop(0, ctx.alpha_steps, step, (params0, opt.init(params0), best0))
  if not lean:
    best = keep_best(params, best, *fast_bounds(params))
  if not (ctx.sound or ctx.info or lean or mid_keys):
    # float mode, output slopes only: a row's bound depends on its own slopes and multipliers
    # alone, so its best iterate's bound is the bound of the kept parameters; no re-evaluation
    return (jnp.maximum(lo, best[1].reshape(lo.shape)), jnp.minimum(hi, best[2].reshape(hi.shape)),
            None)
  bp = jax.lax.stop_gradient(best[0])
  al, be = as_dicts(bp)
  ivs2, pre2, rel2 = passes(bp, ctx)
  l2, h2 = _backward(ctx, v, ivs2, pre2, rel2, spec=spec, alphas=al, betas=be, splits=splits,
                     record=rec, sides=sides)
  det = details(*bp[:2])
  if det is not None and mid_keys:  # the intermediate bounds the final pass used (sound mode:
    det["pre"] = pre2               # computed in ctx's mode, met with CROWN's first pass)
  if lean:
    return l2, h2, det
  return (jnp.maximum(lo, l2.reshape(lo.shape)), jnp.minimum(hi, h2.reshape(hi.shape)), det)


def _s_default(bounds, shape: tuple, dtype):
  """CROWN's tangent fractions (`s_shaped_default_t`) of a logistic/tanh node with input
  ``bounds``, broadcast to ``shape`` (lower/upper line, lower/upper-bound rows, rows, n)."""
  l, u = (a.reshape(-1) for a in bounds)
  return jnp.broadcast_to(s_shaped_default_t(l, u).astype(dtype), shape)


def _intermediate_alphas(ctx: Ctx, v: _Var, pre: dict, dtype) -> tuple[list, list]:
  """α-CROWN on the intermediate layers (Xu et al., ICLR 2021, §3.2: every layer's bounds get
  their own slopes, optimised for the output's bound through the bounds they tighten): for
  each intermediate target (a ReLU or relaxed equation's input, other than ``v``) with ReLU
  nodes behind it: ``(target, its nodes)`` in ``keys`` and the nodes' slopes, (2, rows of the
  target, n) each, in ``slopes``, starting from CROWN's adaptive ones. A target bounded by the
  windowed pass (`windows`, a convolution's output) gets none: every step reruns that pass
  with CROWN's slopes on the tighter bounds below it, so a convolutional network's α steps
  stay windowed."""
  keys, slopes = [], []
  for t, anc in ctx.ancestors.items():
    if t is v or t not in pre or t in ctx.plans:  # a windowed target keeps CROWN's slopes:
      continue  # each step reruns its windowed pass on the bounds the other slopes tightened
    behind = [(x, i) for x, i in ctx.nodes if i in set(anc) and x in pre]
    s_behind = [x for x, i in ctx.s_nodes if i in set(anc) and x in pre]
    if not behind and not s_behind:
      continue
    nodes_t = list(s_behind)  # logistic/tanh nodes: tangent fractions (2, 2, rows, n)
    arrays = [_s_default(pre[x], (2, 2, t.size, x.size), dtype) for x in s_behind]
    for x, i in behind:
      _, c, sigma = relu_parts(ctx.prog.eqns[i], ctx.cenv)
      lt, ut, _, _ = relu_argument(pre[x][0], pre[x][1], c, sigma, False)
      a_lo = relu_lines(lt, ut, False)[0].reshape(-1).astype(dtype)
      nodes_t.append(x)
      arrays.append(jnp.broadcast_to(a_lo, (2, t.size, x.size)))
    keys.append((t, tuple(nodes_t)))
    slopes.append(arrays)
  return keys, slopes


def _constrain(iv: Interval, known, split, c, sigma: float):
  """A ReLU node's input box met with bounds ``known = (lo, hi)`` that hold on the sub-problem
  (e.g. its parent's) and clipped by its split signs (``s·σ(x - c) >= 0``: ``x >= c`` where
  ``s σ > 0``, ``x <= c`` where ``s σ < 0``; β-CROWN, Wang et al. 2021, §3.1, with ``c = 0``,
  ``σ = 1``: ``l <- max(l, 0)`` for ``s = +1``, ``u <- min(u, 0)`` for ``s = -1``). Both keep
  every point of the sub-problem. Returns the box and whether it is empty (the sub-problem is
  infeasible); an empty box is replaced by ``[l, max(u, l)]`` to keep the relaxations defined
  (any bound is valid on an empty set)."""
  lo, hi = iv.lower, iv.upper
  if known is not None:
    lo = jnp.maximum(lo, known[0].reshape(lo.shape).astype(lo.dtype))
    hi = jnp.minimum(hi, known[1].reshape(hi.shape).astype(hi.dtype))
  if split is not None:
    ss = split.reshape(lo.shape) * sigma
    lo = jnp.where(ss > 0, jnp.maximum(lo, c), lo)
    hi = jnp.where(ss < 0, jnp.minimum(hi, c), hi)
  empty = jnp.any(lo > hi)
  return Interval(lo, jnp.maximum(hi, lo), validate=False), empty


@dataclasses.dataclass
class _Forward:
  """The state of `run_backward`'s forward pass: the intervals of abstract variables, the lines
  of every relaxed equation, and ``tighten(x)``, which bounds a relaxed equation's input (by its
  own backward pass when ``intermediate="crown"``) and returns ``(l, u)``."""
  ctx: Ctx
  ivs: dict
  rel: dict
  tighten: Any


def _operands(fw: _Forward, e: CrownEqn) -> list:
  prog = fw.ctx.prog
  return [fw.ivs[a] if isinstance(a, _Var) and a in prog.abstract
          else read_value(fw.ctx.cenv, a) for a in e.invars]


def _set_outputs(fw: _Forward, e: CrownEqn, outs: list) -> None:
  for v, o in zip(e.outvars, outs):
    fw.ivs[v] = o


def _forward_concrete(fw: _Forward, i: int, e: CrownEqn) -> None:
  """No box-dependent operand: its value is in the concrete environment already."""


def _forward_relu(fw: _Forward, i: int, e: CrownEqn) -> None:
  """``max(x, c)`` / ``min(x, c)``: ``x`` is bounded first, the output is its interval image."""
  x, c, sigma = relu_parts(e, fw.ctx.cenv)
  fw.tighten(x)
  op = jnp.maximum if sigma > 0 else jnp.minimum
  fw.ivs[e.outvars[0]] = Interval(op(fw.ivs[x].lower, c), op(fw.ivs[x].upper, c), validate=False)


def _forward_affine(fw: _Forward, i: int, e: CrownEqn) -> None:
  """An affine equation: the interval domain's rule."""
  out = interval_domain.RULES[e.name](interval_domain.IntervalContext(sound=fw.ctx.sound),
                                      *_operands(fw, e), **e.params)
  _set_outputs(fw, e, _no_nan_all(list(out) if isinstance(out, (list, tuple)) else [out]))


def _forward_fallback(fw: _Forward, i: int, e: CrownEqn) -> None:
  """An equation CROWN cannot relax: its operands are bounded as tightly as CROWN can, then the
  interval rule bounds its outputs."""
  for p in e.abstract_pos:
    if e.invars[p] in fw.ctx.prefixes:
      fw.tighten(e.invars[p])
  _set_outputs(fw, e, _interval_of(e, _operands(fw, e), fw.ctx.sound, "midrad"))


def _forward_nonlinear(fw: _Forward, i: int, e: CrownEqn) -> None:
  """A relaxed equation: its inputs are bounded, its output interval computed and its lines
  (``rel[i]``) built on those bounds (a selection's lines need its predicate, not its cases; a
  product of two boxes takes McCormick planes, `_dot_planes`)."""
  ctx, cenv = fw.ctx, fw.ctx.cenv
  bounds = [] if e.mode == "select" else [fw.tighten(x) for x in e.relax_in]
  if e.mode == "leaky":
    (l, u), = bounds
    p, n = _leaky_slopes(e, cenv, e.relax_in[0])
    f = lambda t: jnp.where(t >= 0, p * t, n * t)  # noqa: E731
    lo = jnp.minimum(jnp.minimum(f(l), f(u)), jnp.where((l < 0) & (u > 0), 0.0, jnp.inf))
    outs = [Interval(lo, jnp.maximum(f(l), f(u)), validate=False)]
  else:
    outs = _interval_of(e, _operands(fw, e), ctx.sound, "best" if e.mode == "dot" else "midrad")
  _set_outputs(fw, e, outs)
  if e.mode == "dot":
    piv = e.aux.pivot
    fw.rel[i] = _dot_planes(e, fw.ivs[e.invars[piv]], fw.ivs[e.invars[1 - piv]], ctx.sound)
    return
  pred = None
  if e.mode == "select":
    a = e.invars[0]
    pred = fw.ivs[a] if isinstance(a, _Var) and a in ctx.prog.abstract else read_value(cenv, a)
  fw.rel[i] = _relax_lines(e, cenv, bounds, fw.ivs[e.outvars[0]], ctx.sound, pred)
  if any(j == i for _, j in ctx.s_nodes):  # α-CROWN's tangent points need the far points
    l, u = (a.reshape(-1) for a in bounds[0])
    fw.rel[("far", i)] = s_shaped_far_points(e.name, l, u)


FORWARD_STEPS = {"concrete": _forward_concrete, "relu": _forward_relu,
                 "affine": _forward_affine, "fallback": _forward_fallback,
                 "nonlinear": _forward_nonlinear}
"""The forward step of each kind of equation in `run_backward` (`BACKWARD_STEPS` is the
backward one): together with the kind set by `rules.classify_program` and the relaxation in
`rules`, everything CROWN does with one equation."""


def forward_pass(ctx: Ctx, boxes: Sequence[Interval], data: dict | None = None,
                 mid_alphas: dict | None = None, floor: dict | None = None):
  """`run_backward`'s forward pass on one example: the intervals of every abstract variable,
  the bounds of every ReLU and relaxed equation's input (by its own backward pass when
  ``ctx.intermediate="crown"``, met with ``data``'s known bounds and splits) and the lines of
  every relaxed equation. ``mid_alphas``: target var -> the α-CROWN slopes of its own pass
  (as `_backward`'s ``alphas``); ``floor``: var -> ``(lo, hi)`` bounds known to hold (an
  earlier pass's), met with every bound this pass computes. Returns ``(ivs, pre, rel, empty)``, ``empty`` true where the
  split constraints cannot hold."""
  prog, cenv = ctx.prog, ctx.cenv
  data = data or {}
  ivs = {}
  it = iter(boxes)
  for v in prog.invars:
    if v in prog.abstract:  # one object per input: the same box passed twice is two variables
      b = next(it)
      ivs[v] = Interval(b.lower, b.upper, validate=False)
  pre: dict = {}
  rel: dict = {}
  node_of = {x: k for k, (x, _) in enumerate(ctx.nodes)}
  n_nodes = len(ctx.nodes)
  splits = list(data.get("splits") or (None,) * n_nodes)
  knowns = list(data.get("pre") or (None,) * n_nodes)
  empty = jnp.zeros((), bool)

  def constrain(x, k):
    """``x``'s box met with node k's known bounds and clipped by its splits."""
    nonlocal empty
    if k is not None and (splits[k] is not None or knowns[k] is not None):
      _, c, sigma = relu_parts(prog.eqns[ctx.nodes[k][1]], cenv)
      ivs[x], e_k = _constrain(ivs[x], knowns[k], splits[k], c, sigma)
      empty = empty | e_k

  def tighten(x):
    if x not in pre:
      k = node_of.get(x)
      if ctx.intermediate == "crown" and x in ctx.prefixes and x not in ctx.exact:
        cap = ctx.row_caps.get(x)
        if mid_alphas is not None and x in mid_alphas:
          lo, hi = _backward(ctx, x, ivs, pre, rel, alphas=mid_alphas[x])
        elif cap is None or x in ctx.plans:
          lo, hi = _backward(ctx, x, ivs, pre, rel)
        else:
          constrain(x, k)
          _, c, sigma = relu_parts(prog.eqns[ctx.nodes[k][1]], cenv)
          lo, hi = unstable_backward(ctx, x, ivs, pre, rel, ivs[x], c, sigma, cap)
        met = _intersect(ivs[x], lo, hi, ctx.sound)
        if floor is not None and x in floor:
          met = _intersect(met, *floor[x], ctx.sound)
        if mid_alphas is not None and x in mid_alphas:
          met = _straight_through(met, lo, hi)
        ivs[x] = met
      constrain(x, k)
      pre[x] = (ivs[x].lower, ivs[x].upper)
    return pre[x]

  fw = _Forward(ctx, ivs, rel, tighten)
  for i, e in enumerate(prog.eqns):
    FORWARD_STEPS[e.kind](fw, i, e)
  for k, (x, _) in enumerate(ctx.nodes):  # a node no equation needed bounds for
    if x not in pre and x in ivs:
      tighten(x)
  return ivs, pre, rel, empty


def unstable_fraction(ctx: Ctx, boxes: Sequence[Interval], data: dict | None = None):
  """The largest share of unstable neurons over the ReLU nodes of one example, on the boxes of
  an interval forward pass met with ``data``'s known bounds and splits: the screening boxes of
  `unstable_backward` contain the boxes it sees, so no more of their neurons are unstable."""
  ctx = dataclasses.replace(ctx, intermediate="ibp", row_caps={})
  _, pre, _, _ = forward_pass(ctx, boxes, data)
  share = jnp.zeros((), jnp.float32)
  for x, i in ctx.nodes:
    if x in pre:
      _, c, sigma = relu_parts(ctx.prog.eqns[i], ctx.cenv)
      lt, ut, _, _ = relu_argument(pre[x][0], pre[x][1], c, sigma, False)
      share = jnp.maximum(share, jnp.mean(((lt < 0) & (ut > 0)).astype(jnp.float32)))
  return share


def run_backward(ctx: Ctx, boxes: Sequence[Interval], spec=None, data: dict | None = None):
  """The per-example pass: forward intervals, pre-activation bounds of every ReLU and relaxed
  equation in order (with their lines), and the final CROWN bounds of every abstract output.
  Returns Intervals for abstract outputs.

  ``data`` (split constraints, see `crown`'s ``splits``): ``"splits"`` and ``"pre"``, one entry
  per ReLU node of ``ctx.nodes`` (flat signs; known ``(lo, hi)``; or None), ``"alpha"`` and
  ``"beta"`` (warm starts, see `_final_bounds`). With ``ctx.info`` returns ``(results,
  details)``: the nodes' input bounds, whether the sub-problem is infeasible (its outputs then
  get the empty bounds ``[+inf, -inf]``), α, β and the coefficients of the bounded output."""
  prog = ctx.prog
  data = data or {}
  n_nodes = len(ctx.nodes)
  splits = list(data.get("splits") or (None,) * n_nodes)
  knowns = list(data.get("pre") or (None,) * n_nodes)
  ivs, pre, rel, empty = forward_pass(ctx, boxes, data)
  rerun = None
  if ctx.alpha_steps and ctx.alpha_intermediate and ctx.intermediate == "crown":
    def rerun(mids: dict, c: Ctx):
      """The forward pass again, each intermediate target bounded with its slopes ``mids``
      and met with the bounds of the first pass (so never looser than CROWN's)."""
      again = dict(data, pre=[pre.get(x) for x, _ in ctx.nodes])
      ivs2, pre2, rel2, _ = forward_pass(dataclasses.replace(c, row_caps={}), boxes, again,
                                         mid_alphas=mids, floor=pre)
      return ivs2, pre2, rel2
  results = []
  det = None
  for v in prog.outvars:
    if isinstance(v, _Var) and v in prog.abstract:
      if spec is not None and v is ctx.spec_var:
        lo, hi, det = _final_bounds(ctx, v, ivs, pre, rel, spec, data, rerun)
        res = _intersect(_spec_interval(ivs[v], spec), lo, hi, ctx.sound)
        if ctx.spec_batched:
          res = Interval(res.lower[None], res.upper[None], validate=False)
      elif v in ctx.prefixes and v in pre and ctx.intermediate == "crown" \
          and not ctx.alpha_steps and not ctx.info:
        res = ivs[v]  # already bounded by its own pass (an intermediate target)
      elif v in ctx.prefixes:
        lo, hi, det = _final_bounds(ctx, v, ivs, pre, rel, None, data, rerun)
        res = _intersect(ivs[v], lo, hi, ctx.sound)
      else:
        res = ivs[v]
      if any(a is not None for a in splits + knowns):
        res = Interval(jnp.where(empty, jnp.inf, res.lower),
                       jnp.where(empty, -jnp.inf, res.upper), validate=False)
      results.append(res)
    else:
      results.append(None)
  if not ctx.info:
    return results
  m = 0  # the bounds' rows: from the slopes, or (no ReLU node) from any coefficient array
  if det and det["alpha"]:
    m = det["alpha"][0].shape[1]
  elif det and det["coeffs"]:
    m = next(iter(det["coeffs"].values())).shape[0]
  used = det["pre"] if det and "pre" in det else pre  # α-optimised intermediate bounds if any
  info = {
      "pre": [(used[x][0].reshape(-1), used[x][1].reshape(-1)) for x, _ in ctx.nodes],
      "infeasible": empty,
      "alpha": det["alpha"] if det else [],
      "beta": det["beta"] if det else [],
      "relu_coeffs": [det["coeffs"][x] for x, _ in ctx.nodes] if det else [],
      "input_coeffs": [det["coeffs"].get(u, jnp.zeros((m, u.size), ivs[u].lower.dtype)
                                         ).reshape((m, -1))
                       for u in prog.invars if u in prog.abstract] if det else [],
  }
  return results, info

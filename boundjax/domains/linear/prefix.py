"""The example-independent part of CROWN's backward pass: per-equation transposes of affine
equations and the prefix (the chain of affine equations from a target back to its nearest
non-affine ancestors), shared by the dense pass (`backward`) and the windowed pass (`windows`)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from boundjax.core import primitives, rounding
from boundjax.core.program import Lit as _Lit, Var as _Var
from boundjax.core.interval import Interval

from boundjax.domains.linear.rules import CrownEqn, CrownProgram, bind1, op_record, read_value, upstream


# ----------------------------------------------------------------------------------------------
# Per-equation linear algebra
# ----------------------------------------------------------------------------------------------

def _operands(e: CrownEqn, cenv: dict, abstract_vals: Sequence[Any]) -> list:
  vals = [None if i in e.abstract_pos else read_value(cenv, a) for i, a in enumerate(e.invars)]
  for p, x in zip(e.abstract_pos, abstract_vals):
    vals[p] = x
  return vals


def affine_vjp(e: CrownEqn, cenv: dict):
  """``(y0, vjp)`` of ``x -> op(x, consts)`` at x = 0: the offset and the transposed map."""
  zeros = [jnp.zeros(e.invars[p].shape, e.invars[p].aval.dtype) for p in e.abstract_pos]
  return jax.vjp(lambda *xs: bind1(e, _operands(e, cenv, xs)), *zeros)


def transpose_rows(e: CrownEqn, cenv: dict, vjp, rows) -> list:
  """``[L_pᵀ row for each abstract operand p]`` for a batch of rows (leading axis)."""
  if (e.name == "conv_general_dilated" and e.abstract_pos == (0,)
      and e.params["feature_group_count"] == 1 and e.params["batch_group_count"] == 1):
    return [jax.vmap(lambda g: _conv_transpose_lhs(e, cenv, g))(rows)]
  return list(jax.vmap(vjp)(rows))


def _conv_transpose_lhs(e: CrownEqn, cenv: dict, g):
  """Transpose of ``x -> conv(x, W)`` applied to ``g`` (the lhs VJP, as in JAX's own rule),
  with the flipped kernel materialised in the (spatial..., in, out) layout: XLA:CPU runs a
  convolution whose kernel has swapped feature dimensions on a slow generic path. Its own
  derivative in ``g`` (α-CROWN's gradients through the backward pass) is the equation's
  convolution itself (``(Wᵀ)ᵀ = W``), in the network's own layout, not JAX's transpose of
  the transpose, which again swaps the kernel's feature dimensions."""
  return _conv_transposed(e, g, read_value(cenv, e.invars[1]))


def _phases_apply(p: dict, x_shape: tuple, w_shape: tuple) -> bool:
  """Whether `_conv_transposed_phases` applies: a strided convolution (some stride > 1) with no
  dilation, one feature group and non-negative padding."""
  return (any(s > 1 for s in p["window_strides"]) and all(d == 1 for d in p["lhs_dilation"])
          and all(d == 1 for d in p["rhs_dilation"]) and p["feature_group_count"] == 1
          and p["batch_group_count"] == 1 and all(a >= 0 and b >= 0 for a, b in p["padding"]))


def conv_temporaries(e: CrownEqn) -> int:
  """Values per backward row that `_conv_transposed_phases` (the transpose) or
  `_conv_as_product` (its derivative, float64) hold beside the row itself when they apply to
  the convolution ``e``, for the memory budget: ``g``'s ``ceil(k/s)^n`` shifted copies plus the
  interleaved phases (about two inputs), or ``x``'s ``k^n`` strided copies plus the output.
  0 where JAX's own convolution runs."""
  if e.name != "conv_general_dilated" or len(e.invars) != 2:
    return 0
  p = e.params
  lhs_spec, rhs_spec, out_spec = p["dimension_numbers"]
  x, w, y = e.invars[0].aval, e.invars[1].aval, e.outvars[0].aval
  if not _phases_apply(p, x.shape, w.shape):
    return 0
  ks = [w.shape[d] for d in rhs_spec[2:]]
  strides = [int(s) for s in p["window_strides"]]
  outs = [y.shape[d] for d in out_spec[2:]]
  o_ch, i_ch = y.shape[out_spec[1]], x.shape[lhs_spec[1]]
  kr = [-(-k // s) for k, s in zip(ks, strides)]
  qlen = [o + k - 1 for o, k in zip(outs, kr)]
  phases = int(np.prod(qlen)) * (o_ch * int(np.prod(kr)) + 2 * int(np.prod(strides)) * i_ch)
  im2col = int(np.prod(outs)) * (i_ch * int(np.prod(ks)) + o_ch)
  return max(phases, im2col)


def _conv_transposed_phases(e: CrownEqn, g, w):
  """The transpose of a strided convolution ``x -> conv(x, W)`` applied to ``g``, as one matrix
  product whose ``s^n`` column blocks are the phases, interleaved (the sub-pixel decomposition
  of a transposed convolution, Shi et al., CVPR 2016, §2.2). Per spatial axis, with ``y[o] =
  Σ_t x[s o + t - p] w[t]``, the entry ``j = i + p = s q + r`` of the padded input receives
  ``Σ_m g[q - m] w[r + s m]``: a full convolution of ``g`` with the phase's sub-kernel
  ``w[r::s]`` (padded with zero taps to ``ceil(k / s)``), so ``g``'s ``ceil(k / s)^n`` shifted
  copies side by side, times the sub-kernels of every phase side by side. The same non-zero
  terms as JAX's transpose (a convolution of ``g`` dilated by ``s``, three quarters of whose
  terms are zeros for ``s = 2``), at most as many per sum; XLA:CPU runs that convolution in
  float64 about five times slower than the product."""
  p = e.params
  lhs_spec, rhs_spec, out_spec = p["dimension_numbers"]
  x = e.invars[0]
  nsp = len(lhs_spec) - 2
  strides = tuple(int(s) for s in p["window_strides"])
  # channels last: g (N, *out, O), w (*k, O, I)
  gc = jnp.transpose(g, (out_spec[0], *out_spec[2:], out_spec[1]))
  wc = jnp.transpose(w, (*rhs_spec[2:], rhs_spec[0], rhs_spec[1])).astype(g.dtype)
  ks, outs = wc.shape[:nsp], gc.shape[1:1 + nsp]
  n, o_ch, i_ch = gc.shape[0], wc.shape[nsp], wc.shape[nsp + 1]
  ins = tuple(x.shape[d] for d in lhs_spec[2:])
  pads = tuple(int(a) for a, _ in p["padding"])
  kr = tuple(-(-k // s) for k, s in zip(ks, strides))  # taps per phase (zero weights pad)
  qlen = tuple(o + k - 1 for o, k in zip(outs, kr))
  # the sub-kernels of all phases side by side: tap t = s m + r (m: tap of the phase, r: phase)
  wp = jnp.pad(wc, [(0, k * s - kk) for k, s, kk in zip(kr, strides, ks)] + [(0, 0), (0, 0)])
  wp = wp.reshape(tuple(a for k, s in zip(kr, strides) for a in (k, s)) + (o_ch, i_ch))
  wp = jnp.transpose(wp, [2 * d for d in range(nsp)] + [2 * nsp]
                     + [2 * d + 1 for d in range(nsp)] + [2 * nsp + 1])
  wmat = wp.reshape((int(np.prod(kr)) * o_ch, int(np.prod(strides)) * i_ch))
  gp = jnp.pad(gc, [(0, 0)] + [(k - 1, k - 1) for k in kr] + [(0, 0)])
  cols = [gp[(slice(None),) + tuple(slice(k - 1 - mi, k - 1 - mi + q)
                                    for k, mi, q in zip(kr, m, qlen))]
          for m in np.ndindex(*kr)]
  h = jnp.concatenate(cols, axis=-1).reshape((-1, len(cols) * o_ch)) @ wmat
  # interleave: full[:, s q + r, :] = phase r at q
  full = h.reshape((n, *qlen, *strides, i_ch))
  perm = [0] + [a for d in range(nsp) for a in (1 + d, 1 + nsp + d)] + [1 + 2 * nsp]
  full = jnp.transpose(full, perm).reshape((n, *(q * s for q, s in zip(qlen, strides)), i_ch))
  need = [(0, max(0, pd + size - f)) for pd, size, f in zip(pads, ins, full.shape[1:1 + nsp])]
  full = jnp.pad(full, [(0, 0)] + need + [(0, 0)])
  out = full[(slice(None),) + tuple(slice(pd, pd + size) for pd, size in zip(pads, ins))]
  canon = (lhs_spec[0], *lhs_spec[2:], lhs_spec[1])
  return jnp.transpose(out, np.argsort(canon)).astype(x.aval.dtype)


def _conv_as_product(e: CrownEqn, x, w):
  """The equation's convolution ``conv(x, W)`` (where `_phases_apply` holds, any stride) as one
  matrix product of ``x``'s strided shifted copies (side by side, im2col) with the kernel's
  matrix: the same terms per sum; XLA:CPU runs the product several times faster in float64."""
  p = e.params
  lhs_spec, rhs_spec, out_spec = p["dimension_numbers"]
  nsp = len(lhs_spec) - 2
  strides = tuple(int(s) for s in p["window_strides"])
  xc = jnp.transpose(x, (lhs_spec[0], *lhs_spec[2:], lhs_spec[1]))   # (N, *in, I)
  wc = jnp.transpose(w, (*rhs_spec[2:], rhs_spec[1], rhs_spec[0])).astype(x.dtype)  # (*k, I, O)
  ks = wc.shape[:nsp]
  xp = jnp.pad(xc, [(0, 0)] + [(int(a), int(b)) for a, b in p["padding"]] + [(0, 0)])
  outs = tuple((size - k) // s + 1 for size, k, s in zip(xp.shape[1:1 + nsp], ks, strides))
  cols = [lax.slice(xp, (0, *t, 0), (xp.shape[0], *(ti + (o - 1) * s + 1
                                                   for ti, o, s in zip(t, outs, strides)),
                                     xp.shape[-1]), (1, *strides, 1))
          for t in np.ndindex(*ks)]
  i_ch, o_ch = wc.shape[nsp], wc.shape[nsp + 1]
  y = jnp.concatenate(cols, axis=-1).reshape((-1, len(cols) * i_ch)) \
      @ wc.reshape((len(cols) * i_ch, o_ch))
  y = y.reshape((xc.shape[0], *outs, o_ch))
  return jnp.transpose(y, np.argsort((out_spec[0], *out_spec[2:], out_spec[1])))


def _conv_transposed_impl(e: CrownEqn, g, w):
  from jax._src.lax import convolution as conv_impl
  p = e.params
  if _phases_apply(p, e.invars[0].shape, w.shape):
    return _conv_transposed_phases(e, g, w)
  lhs_spec, rhs_spec, out_spec = p["dimension_numbers"]
  x = e.invars[0]
  nsp = len(lhs_spec) - 2
  lhs_sd, rhs_sd, out_sd = lhs_spec[2:], rhs_spec[2:], out_spec[2:]
  padding = conv_impl._conv_general_vjp_lhs_padding(
      np.take(x.shape, lhs_sd), np.take(w.shape, rhs_sd), p["window_strides"],
      np.take(g.shape, out_sd), p["padding"], p["lhs_dilation"], p["rhs_dilation"])
  kern = jnp.transpose(lax.rev(w, tuple(rhs_sd)), (*rhs_sd, rhs_spec[0], rhs_spec[1]))
  kern = lax.optimization_barrier(kern.astype(g.dtype))
  dn = lax.ConvDimensionNumbers(out_spec, (nsp + 1, nsp, *range(nsp)), lhs_spec)
  out = lax.conv_general_dilated(g, kern, window_strides=p["lhs_dilation"], padding=padding,
                                 lhs_dilation=p["window_strides"],
                                 rhs_dilation=p["rhs_dilation"], dimension_numbers=dn,
                                 precision=p.get("precision"))
  return out.astype(x.aval.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _conv_transposed(e: CrownEqn, g, w):
  return _conv_transposed_impl(e, g, w)


def _conv_transposed_fwd(e: CrownEqn, g, w):
  return _conv_transposed_impl(e, g, w), (g, w)


def _conv_transposed_bwd(e: CrownEqn, res, ct):
  """``d(Wᵀ g)/dg`` applied to ``ct`` is ``W ct``: the equation's convolution (no offset: a
  convolution has none); the kernel's cotangent through the transposed convolution."""
  g, w = res
  x_ct = ct.astype(e.invars[0].aval.dtype)
  if x_ct.dtype == jnp.float64 and _phases_apply(e.params, x_ct.shape, w.shape):
    ct_g = _conv_as_product(e, x_ct, w).astype(g.dtype)
  else:
    ct_g = bind1(e, [x_ct, w]).astype(g.dtype)
  _, vjp_w = jax.vjp(lambda w_: _conv_transposed_impl(e, g, w_), w)
  return ct_g, vjp_w(ct)[0]


_conv_transposed.defvjp(_conv_transposed_fwd, _conv_transposed_bwd)


def abs_linear(e: CrownEqn, cenv: dict, pos: int, v):
  """``|L_pos|(v)``: the linear part of the equation in operand ``pos`` with |coefficients|,
  applied to ``v >= 0`` (other abstract operands and additive constants set to 0)."""
  vals = []
  for i, a in enumerate(e.invars):
    if i == pos:
      vals.append(v)
      continue
    if i in e.abstract_pos:
      vals.append(jnp.zeros(a.shape, a.aval.dtype))
      continue
    c = read_value(cenv, a)
    if not jnp.issubdtype(jnp.result_type(c), jnp.floating):
      vals.append(c)  # indices / predicates
    elif op_record(e.name).additive:
      vals.append(jnp.zeros_like(c))
    else:
      vals.append(jnp.abs(c))
  if e.name == "neg":
    return v
  if e.name == "sub":
    out = vals[0] + vals[1]
    return jnp.broadcast_to(out, e.outvars[0].shape)
  return bind1(e, vals)


def transpose_terms(e: CrownEqn, pos: int) -> int:
  """How many terms the transpose sums into one entry of operand ``pos`` (for γ_n)."""
  x, y = e.invars[pos], e.outvars[0]
  name = e.name
  if op_record(name).exact_transpose or (name == "convert_element_type"
                                  and x.aval.dtype == y.aval.dtype):
    return 0
  if name == "dot_general":
    (lc, rc), (lb, rb) = e.params["dimension_numbers"]
    other = e.invars[1 - pos]
    skip = set(rc if pos == 0 else lc) | set(rb if pos == 0 else lb)
    return int(np.prod([s for d, s in enumerate(other.shape) if d not in skip], dtype=np.int64))
  if name == "reduce_window_sum":
    return int(np.prod(e.params["window_dimensions"]))
  if name in ("mul", "div", "add", "add_any", "sub", "convert_element_type"):
    return max(1, y.size // max(x.size, 1)) + 1
  if name == "cumsum":
    return int(x.shape[e.params["axis"]])
  return y.size  # conv, gather, broadcast: at most every output entry


# ----------------------------------------------------------------------------------------------
# The backward pass
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Prefix:
  """The example-independent start of a backward pass: from ``Λ = I`` at the target through the
  affine equations above it, stopping at ReLU outputs."""
  m: int
  pending: dict  # relu output var -> Λ (m, *shape)
  at_input: dict  # abstract input var -> Λ
  bias: Any  # (m,)
  slack_const: Any  # (m,) example-independent rounding slack (sound mode)
  steps: list  # (|Λ_y|, eqn, pos, n) for the example-dependent slack (sound mode): γ_n, 2nλ


def interval_exact(prog: CrownProgram, anc: Sequence[int]) -> bool:
  """Whether the forward interval pass bounds a target (whose backward pass walks the equations
  ``anc``) as tightly as that pass would in real arithmetic, so the pass can be skipped: every
  equation is a ReLU (``max(x, c)``, ``min(x, c)``, entry by entry) or affine in one
  box-dependent operand, at most one combines entries
  (`primitives.MIXING`: a product with a concrete matrix or kernel, a sum) and every other one
  maps entries one to one (`primitives.ONE_TO_ONE`, its box operand of the result's shape). A
  box mapped entry to entry is a box, and the range of ``Σ_j w_ij x_j`` over a box is
  ``Σ_j min(w_ij l_j, w_ij u_j)`` to ``Σ_j max(w_ij l_j, w_ij u_j)``: the interval bound, and
  CROWN's bound of a linear layer on its input box (Zhang et al. 2018, §3: no relaxation
  behind); a ReLU maps each entry's range to its exact image. Examples: a network's first
  convolution, and its ReLU's output where a max-pooling follows, whose dense backward passes
  from every entry would take gigabytes."""
  mixing = 0
  for i in anc:
    e = prog.eqns[i]
    if e.kind == "relu" and len(e.abstract_pos) == 1 \
        and e.invars[e.abstract_pos[0]].aval.shape == e.outvars[0].aval.shape:
      continue  # max(x, c) entry by entry: a box's image is the box of the entries' images
    if e.kind != "affine" or len(e.abstract_pos) != 1:
      return False
    if e.name in primitives.MIXING:
      mixing += 1
    elif e.name in primitives.ONE_TO_ONE:
      x = e.invars[e.abstract_pos[0]]
      if e.name in ("add", "sub", "mul", "div") and x.aval.shape != e.outvars[0].aval.shape:
        return False
    else:
      return False
  return mixing <= 1


def ancestors_of(prog: CrownProgram, target: _Var) -> list[int]:
  """The abstract equations the backward pass from ``target`` walks through, in order."""
  return sorted(upstream(prog, [target], through_fallback=False))


def rowdot(lam, vec, lead: int = 1):
  """Σ over a variable's entries of ``lam * vec``; lam has ``lead`` leading row axes.

  Computed as a matrix-vector product (much faster on CPU than a fused multiply-reduce)."""
  rows = lam.shape[:lead]
  n = int(np.prod(lam.shape[lead:], dtype=np.int64))
  vec = jnp.broadcast_to(vec, lam.shape[lead:]).reshape((n,))
  return (lam.reshape((-1, n)) @ vec).reshape(rows)


def is_zero(a) -> bool:
  """Statically known to be zero (a literal 0)."""
  return isinstance(a, _Lit) and bool(np.all(np.asarray(a.val) == 0))


def has_offset(e: CrownEqn) -> bool:
  """Whether ``op(0, consts)`` can be non-zero (an additive concrete operand)."""
  if not op_record(e.name).additive:
    return False
  for i, a in enumerate(e.invars):
    if i in e.abstract_pos or is_zero(a):
      continue
    if e.name == "select_n" and i == 0:
      continue
    if jnp.issubdtype(a.aval.dtype if isinstance(a, _Var) else jnp.result_type(a.val),
                      jnp.floating):
      return True
  return False


def add_to(d: dict, k, v):
  d[k] = v if k not in d else d[k] + v


def build_prefix(prog: CrownProgram, cenv: dict, target: _Var, anc: list[int], sound: bool) -> Prefix:
  m = target.size
  dtype = target.aval.dtype
  lam = {target: jnp.eye(m, dtype=dtype).reshape((m, *target.shape))}
  bias = jnp.zeros((m,), dtype)
  slack = jnp.zeros((m,), dtype)
  n_eq = len(prog.eqns)
  pending, steps = {}, []
  for i in reversed(anc):
    e = prog.eqns[i]
    if e.kind != "affine":  # relu, nonlinear, fallback: the example-dependent part
      for y in e.outvars:
        if y in lam:
          pending[y] = lam.pop(y)
      continue
    y = e.outvars[0]
    if y not in lam:
      continue
    lam_y = lam.pop(y)
    y0, vjp = affine_vjp(e, cenv)
    contribs = transpose_rows(e, cenv, vjp, lam_y)
    if has_offset(e):
      bias = bias + rowdot(lam_y, y0)
    if sound and has_offset(e):
      n = y.size + n_eq
      slack = slack + rounding.gamma(n, dtype) * rowdot(jnp.abs(lam_y), jnp.abs(y0)) \
          + rounding.flush_error(n, dtype)
    for p, c in zip(e.abstract_pos, contribs):
      x = e.invars[p]
      add_to(lam, x, c)
      if sound:
        steps.append((jnp.abs(lam_y), e, p, transpose_terms(e, p) + prog.uses.get(x, 1) + 1))
  at_input = {v: l for v, l in lam.items()}
  return Prefix(m, pending, at_input, bias, slack, steps)


def magnitude(iv: Interval):
  """``max(|lower|, |upper|)`` entry by entry: the largest absolute value in the box."""
  return jnp.maximum(jnp.abs(iv.lower), jnp.abs(iv.upper))


def coefficient_slack(n: int, dtype, absdot, iv: Interval):
  """Rounding slack of coefficients ``Λ_x`` computed as n-term sums (γ_n times ``absdot``, the
  sum of |terms| weighted by ``|x|``), plus what flushing may take from each entry (``2nλ``)
  weighted by ``Σ_j max|x_j|``: the error of an entry of ``Λ_x`` reaches the bound multiplied by
  the value of ``x``."""
  flush = rounding.flush_error(n, dtype) * jnp.sum(magnitude(iv))
  return rounding.gamma(n, dtype) * absdot + flush


def prefix_slack(px: Prefix, cenv: dict, ivs: dict, dtype):
  """(m,) rounding slack of a sound-mode prefix on one example's boxes ``ivs``: its constant
  part (the offsets' sums) plus, for each affine step ``Λ_x = Λ_y W``, the coefficient slack of
  its sums weighted by ``|x|`` (`coefficient_slack`). Row i bounds, for every ``x`` in the
  boxes, the difference between the row's float coefficients applied to the inputs of the prefix
  and the real value of the target."""
  slack = jnp.zeros((px.m,), dtype) + px.slack_const
  for (abs_lam, e, p, n) in px.steps:
    x = e.invars[p]
    slack = slack + coefficient_slack(n, dtype, rowdot(abs_lam, abs_linear(
        e, cenv, p, magnitude(ivs[x]))), ivs[x])
  return slack


def center_radius(iv: Interval, sound: bool):
  """Centre and radius of a box; in sound mode the radius covers both ends exactly: rounded up,
  and at least λ = finfo.tiny unless the box is a point (a difference of two close tiny ends may
  be subnormal, which the next operation reads as 0)."""
  c = (iv.lower + iv.upper) / 2
  if not sound:
    return c, (iv.upper - iv.lower) / 2
  r = jnp.maximum(rounding.round_up(c - iv.lower), rounding.round_up(iv.upper - c))
  r = rounding.round_up(r)
  tiny = rounding.underflow_threshold(r.dtype)
  return c, jnp.where(iv.lower == iv.upper, jnp.zeros_like(r), jnp.maximum(r, tiny))

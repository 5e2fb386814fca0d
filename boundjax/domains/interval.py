"""The interval domain (IBP): one rule per JAX primitive.

Every rule maps boxes to a box containing every value the primitive takes on them. Inputs are
`Interval`s or concrete arrays (mixed freely). Conventions used below:

* *monotone increasing* f: ``[f(l), f(u)]``; *decreasing*: ``[f(u), f(l)]``.
* *structural* ops (reshape, slicing, gathers with concrete indices, ...) move entries without
  arithmetic, so they apply to both endpoints.
* bilinear ops (dot_general, conv) use the midpoint–radius form (Rump) by default, or the
  sign-split form, the exact four-corner form, or the intersection of midpoint–radius and
  sign-split ("best"); see `boundjax.interval`.
* a comparison of boxes gives a boolean box ``[definitely true, possibly true]``; ``select_n``
  with an undetermined predicate returns the hull of the branches it may take.

With ``IntervalContext.sound`` every result is rounded outward (see `boundjax.rounding`), so
bounds hold for the exact real-number semantics despite float rounding.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

from boundjax import nn, rounding
from boundjax.core import program as prog_lib
from boundjax.errors import UnsupportedPrimitiveError
from boundjax.interval import (Interval, bilinear_midrad, bilinear_signsplit, lower_of,
                               mul_bounds, upper_of)

MATMUL_MODES = ("midrad", "signsplit", "exact", "best")


@dataclasses.dataclass(frozen=True)
class IntervalContext:
  """Options of the interval domain.

  Attributes:
    matmul: product of two boxes in dot_general/conv: "midrad" (Rump; 4 products),
      "signsplit" (8 products; exact when one operand is sign-definite), "exact" (four-corner
      bound per term, materialises the product: small problems only; dot_general only), or
      "best" (intersection of midrad and signsplit).
    sound: round every bound outward so it holds in exact arithmetic.
  """
  matmul: str = "midrad"
  sound: bool = False

  def __post_init__(self):
    if self.matmul not in MATMUL_MODES:
      raise ValueError(f"matmul must be one of {MATMUL_MODES}, got {self.matmul!r}")


def _iv(lo, hi) -> Interval:
  return Interval(lo, hi, validate=False)


def _point(x) -> bool:
  return not isinstance(x, Interval)


lo_, hi_ = lower_of, upper_of


def _finish(ctx: IntervalContext, lo, hi, ulps: int = 0, err=None) -> Interval:
  """Builds the output box, rounding outward in sound mode.

  ``ulps`` is the number of units in the last place by which the primitive's implementation may
  err; ``err`` an absolute a-priori error bound (for sums and products).
  """
  if jnp.issubdtype(jnp.result_type(lo), jnp.floating):
    lo, hi = _no_nan(lo, hi)
    if ctx.sound:
      lo, hi = rounding.outward(lo, hi, ulps=max(ulps, 1), abs_err=err)
  return _iv(lo, hi)


def _no_nan(lo, hi):
  """NaN endpoints (an operation evaluated outside its real domain, e.g. log of a box reaching
  below 0) widen to ``-inf`` / ``+inf``: a value NaN is not a real number, every real value the
  operation takes stays enclosed, and no NaN reaches a comparison or a returned bound."""
  return jnp.where(jnp.isnan(lo), -jnp.inf, lo), jnp.where(jnp.isnan(hi), jnp.inf, hi)


def _corner_product(al, au, bl, bu):
  """``mul_bounds`` with the interval-arithmetic convention ``0 · ∞ = 0`` (a product of reals in
  the two boxes is finite, so an infinite endpoint times an exact zero contributes 0)."""
  corners = [a * b for a in (al, au) for b in (bl, bu)]
  corners = [jnp.where(jnp.isnan(c), 0, c) for c in corners]
  lo = jnp.minimum(jnp.minimum(corners[0], corners[1]), jnp.minimum(corners[2], corners[3]))
  hi = jnp.maximum(jnp.maximum(corners[0], corners[1]), jnp.maximum(corners[2], corners[3]))
  return lo, hi


# ----------------------------------------------------------------------------------------------
# element-wise rules
# ----------------------------------------------------------------------------------------------

def _increasing(fn: Callable, ulps: int = 0):
  def rule(ctx, x, **params):
    return _finish(ctx, fn(x.lower, **params), fn(x.upper, **params), ulps)
  return rule


def _decreasing(fn: Callable, ulps: int = 0):
  def rule(ctx, x, **params):
    return _finish(ctx, fn(x.upper, **params), fn(x.lower, **params), ulps)
  return rule


def _structural(prim):
  """Rule for an op that only moves entries: apply it to both endpoints."""
  def rule(ctx, x, *rest, **params):
    if any(isinstance(r, Interval) for r in rest):
      raise UnsupportedPrimitiveError(
          f"'{prim.name}' with bounded indices/sizes is not supported (only its operand may be "
          "bounded)")
    return _iv(prim.bind(x.lower, *rest, **params), prim.bind(x.upper, *rest, **params))
  return rule


def _add(ctx, x, y, **_):
  return _finish(ctx, lo_(x) + lo_(y), hi_(x) + hi_(y), 1)


def _sub(ctx, x, y, **_):
  return _finish(ctx, lo_(x) - hi_(y), hi_(x) - lo_(y), 1)


def _neg(ctx, x, **_):
  return _iv(-x.upper, -x.lower)


def _mul_point(c, x: Interval):
  a, b = c * x.lower, c * x.upper
  a, b = jnp.where(jnp.isnan(a), 0, a), jnp.where(jnp.isnan(b), 0, b)  # 0 · ∞ = 0
  return jnp.minimum(a, b), jnp.maximum(a, b)


def _mul(ctx, x, y, **_):
  if _point(x):
    lo, hi = _mul_point(x, y)
  elif _point(y):
    lo, hi = _mul_point(y, x)
  else:
    lo, hi = _corner_product(x.lower, x.upper, y.lower, y.upper)
  return _finish(ctx, lo, hi, 1)


def _square(ctx, x, **_):
  al, au = jnp.abs(x.lower), jnp.abs(x.upper)
  straddle = (x.lower < 0) & (x.upper > 0)
  lo = jnp.where(straddle, 0.0, jnp.minimum(al, au) ** 2).astype(x.lower.dtype)
  hi = jnp.maximum(al, au) ** 2
  return _finish(ctx, lo, hi, 1)


def _reciprocal(lo, hi):
  """Bounds of 1/y for y in [lo, hi]; (-inf, inf) where the box contains 0."""
  has_zero = (lo <= 0) & (hi >= 0)
  inf = jnp.asarray(jnp.inf, dtype=jnp.result_type(lo))
  rlo = jnp.where(has_zero, -inf, 1.0 / hi)
  rhi = jnp.where(has_zero, inf, 1.0 / lo)
  return rlo, rhi


def _div(ctx, x, y, **_):
  if _point(y):
    a, b = lo_(x) / y, hi_(x) / y
    return _finish(ctx, jnp.minimum(a, b), jnp.maximum(a, b), 1)
  rlo, rhi = _reciprocal(y.lower, y.upper)
  has_zero = (y.lower <= 0) & (y.upper >= 0)
  lo, hi = _corner_product(lo_(x), hi_(x), rlo, rhi)
  # a divisor box containing 0: x / y takes every real value unless x is exactly 0
  x_zero = (lo_(x) == 0) & (hi_(x) == 0)
  lo = jnp.where(has_zero & ~x_zero, -jnp.inf, lo)
  hi = jnp.where(has_zero & ~x_zero, jnp.inf, hi)
  return _finish(ctx, lo, hi, 1)


def _max(ctx, x, y, **_):
  return _iv(jnp.maximum(lo_(x), lo_(y)), jnp.maximum(hi_(x), hi_(y)))


def _min(ctx, x, y, **_):
  return _iv(jnp.minimum(lo_(x), lo_(y)), jnp.minimum(hi_(x), hi_(y)))


def _abs(ctx, x, **_):
  al, au = jnp.abs(x.lower), jnp.abs(x.upper)
  straddle = (x.lower < 0) & (x.upper > 0)
  lo = jnp.where(straddle, jnp.zeros_like(al), jnp.minimum(al, au))
  return _iv(lo, jnp.maximum(al, au))


def _integer_pow(ctx, x, *, y: int):
  if y == 0:
    one = jnp.ones_like(x.lower)
    return _iv(one, one)
  if y < 0:
    pos = _integer_pow(ctx, x, y=-y)
    return _finish(ctx, *_reciprocal(pos.lower, pos.upper), 1)
  if y % 2 == 1:
    return _finish(ctx, lax.integer_pow(x.lower, y), lax.integer_pow(x.upper, y), y)
  al, au = jnp.abs(x.lower), jnp.abs(x.upper)
  straddle = (x.lower < 0) & (x.upper > 0)
  lo = jnp.where(straddle, jnp.zeros_like(al), lax.integer_pow(jnp.minimum(al, au), y))
  return _finish(ctx, lo, lax.integer_pow(jnp.maximum(al, au), y), y)


def _pow(ctx, x, y, **_):
  if _point(y) and not isinstance(x, Interval):
    raise AssertionError("unreachable")
  if not _point(y):
    raise UnsupportedPrimitiveError("'pow' with a bounded exponent is not supported; use exp/log")
  # x ** c for a concrete exponent c, x >= 0: monotone increasing if c >= 0, decreasing if c < 0.
  c = jnp.asarray(y)
  l, u = jnp.maximum(x.lower, 0), jnp.maximum(x.upper, 0)
  a, b = lax.pow(l, c), lax.pow(u, c)
  lo, hi = jnp.minimum(a, b), jnp.maximum(a, b)
  neg = x.lower < 0
  lo = jnp.where(neg, jnp.nan, lo)  # outside the real domain: poison loudly
  return _finish(ctx, lo, hi, 4)


def _clamp(ctx, lo_b, x, hi_b, **_):
  return _iv(lax.clamp(lo_(lo_b), lo_(x), lo_(hi_b)), lax.clamp(hi_(lo_b), hi_(x), hi_(hi_b)))


def _is_finite(ctx, x, **_):
  # Finite endpoints => every value in between is finite.
  ok = jnp.isfinite(x.lower) & jnp.isfinite(x.upper)
  return _iv(ok, jnp.ones_like(ok))


def _sign(ctx, x, **_):
  return _iv(jnp.sign(x.lower), jnp.sign(x.upper))


def _convert(ctx, x, *, new_dtype, **params):
  to_bool = jnp.dtype(new_dtype) == jnp.bool_
  if to_bool and not jnp.issubdtype(x.dtype, jnp.bool_):
    # x != 0: definitely true if 0 is outside the box, possibly true unless the box is {0}.
    definitely = (x.lower > 0) | (x.upper < 0)
    possibly = (x.lower != 0) | (x.upper != 0)
    return _iv(definitely, possibly)
  cv = functools.partial(lax.convert_element_type_p.bind, new_dtype=new_dtype, **params)
  lo, hi = cv(x.lower), cv(x.upper)
  if jnp.issubdtype(jnp.dtype(new_dtype), jnp.floating) and ctx.sound:
    return _finish(ctx, lo, hi, 1)
  return _iv(lo, hi)


# ----------------------------------------------------------------------------------------------
# comparisons, boolean logic and selection
# ----------------------------------------------------------------------------------------------

def _compare(strict: bool, flip: bool):
  """x < y (strict) or x <= y; ``flip`` swaps the operands (for gt/ge)."""
  def rule(ctx, x, y, **_):
    if flip:
      x, y = y, x
    if strict:
      definitely, possibly = hi_(x) < lo_(y), lo_(x) < hi_(y)
    else:
      definitely, possibly = hi_(x) <= lo_(y), lo_(x) <= hi_(y)
    return _iv(definitely, possibly)
  return rule


def _eq(ctx, x, y, **_):
  overlap = (lo_(x) <= hi_(y)) & (lo_(y) <= hi_(x))
  single = (lo_(x) == hi_(x)) & (lo_(y) == hi_(y)) & (lo_(x) == lo_(y))
  return _iv(single, overlap)


def _ne(ctx, x, y, **_):
  e = _eq(ctx, x, y)
  return _iv(~e.upper, ~e.lower)


def _and(ctx, x, y, **_):
  return _iv(lax.bitwise_and(lo_(x), lo_(y)), lax.bitwise_and(hi_(x), hi_(y)))


def _or(ctx, x, y, **_):
  return _iv(lax.bitwise_or(lo_(x), lo_(y)), lax.bitwise_or(hi_(x), hi_(y)))


def _not(ctx, x, **_):
  if not jnp.issubdtype(x.dtype, jnp.bool_):
    raise UnsupportedPrimitiveError("bitwise 'not' of a bounded integer is not supported")
  return _iv(~x.upper, ~x.lower)


def _select_n(ctx, pred, *cases, **_):
  if _point(pred):
    return _iv(lax.select_n(pred, *[lo_(c) for c in cases]),
               lax.select_n(pred, *[hi_(c) for c in cases]))
  plo, phi = pred.lower.astype(jnp.int32), pred.upper.astype(jnp.int32)
  big = jnp.asarray(jnp.inf, dtype=jnp.result_type(lo_(cases[0])))
  lo = jnp.broadcast_to(big, jnp.shape(plo))
  hi = jnp.broadcast_to(-big, jnp.shape(plo))
  if not jnp.issubdtype(lo.dtype, jnp.floating):
    info = jnp.iinfo(lo.dtype) if not jnp.issubdtype(lo.dtype, jnp.bool_) else None
    lo = jnp.ones(jnp.shape(plo), lo.dtype) if info is None else jnp.full(jnp.shape(plo), info.max)
    hi = jnp.zeros(jnp.shape(plo), lo.dtype) if info is None else jnp.full(jnp.shape(plo), info.min)
  for i, c in enumerate(cases):
    may = (plo <= i) & (i <= phi)
    lo = jnp.where(may, jnp.minimum(lo, lo_(c)), lo)
    hi = jnp.where(may, jnp.maximum(hi, hi_(c)), hi)
  return _iv(lo, hi)


# ----------------------------------------------------------------------------------------------
# reductions
# ----------------------------------------------------------------------------------------------

def _reduce_sum(ctx, x, *, axes, **params):
  lo, hi = jnp.sum(x.lower, axis=axes), jnp.sum(x.upper, axis=axes)
  err = None
  if ctx.sound:
    n = 1
    for a in axes:
      n *= x.shape[a]
    err = rounding.gamma(n + 1, x.dtype) * jnp.sum(jnp.maximum(jnp.abs(x.lower), jnp.abs(x.upper)),
                                                   axis=axes)
  return _finish(ctx, lo, hi, 1, err)


def _argminmax(is_max: bool):
  def rule(ctx, x, *, axes, index_dtype):
    (axis,) = axes
    if is_max:
      best_lo = jnp.max(x.lower, axis=axis, keepdims=True)
      cand = x.upper >= best_lo  # entries that may be the maximum
    else:
      best_hi = jnp.min(x.upper, axis=axis, keepdims=True)
      cand = x.lower <= best_hi
    idx = lax.broadcasted_iota(index_dtype, x.shape, axis)
    n = x.shape[axis]
    first = jnp.min(jnp.where(cand, idx, n), axis=axis)
    last = jnp.max(jnp.where(cand, idx, -1), axis=axis)
    return _iv(first.astype(index_dtype), last.astype(index_dtype))
  return rule


def _cumulative(prim):
  def rule(ctx, x, **params):
    return _finish(ctx, prim.bind(x.lower, **params), prim.bind(x.upper, **params), 1)
  return rule


def _reduce_window_sum(ctx, x, **params):
  return _finish(ctx, lax.reduce_window_sum_p.bind(x.lower, **params),
                 lax.reduce_window_sum_p.bind(x.upper, **params), 1)


# ----------------------------------------------------------------------------------------------
# bilinear: dot_general and convolution
# ----------------------------------------------------------------------------------------------

def _dot_exact(x, y, dimension_numbers, preferred_element_type, **_):
  """Four-corner bound per term, summed: the tightest interval of a product of boxes."""
  (lc, rc), (lb, rb) = dimension_numbers
  def arrange(a, batch, contract):
    free = [d for d in range(a.ndim) if d not in batch and d not in contract]
    return jnp.transpose(a, (*batch, *free, *contract)), len(free)
  xl, nfx = arrange(lo_(x), lb, lc)
  xu, _ = arrange(hi_(x), lb, lc)
  yl, nfy = arrange(lo_(y), rb, rc)
  yu, _ = arrange(hi_(y), rb, rc)
  nb, nc = len(lb), len(lc)
  # x: (B..., Fx..., C...) -> (B..., Fx..., 1..., C...); y: (B..., Fy..., C...) -> (B..., 1..., Fy..., C...)
  def expand_x(a):
    return a.reshape(a.shape[:nb + nfx] + (1,) * nfy + a.shape[nb + nfx:])
  def expand_y(a):
    return a.reshape(a.shape[:nb] + (1,) * nfx + a.shape[nb:])
  lo, hi = mul_bounds(expand_x(xl), expand_x(xu), expand_y(yl), expand_y(yu))
  axes = tuple(range(lo.ndim - nc, lo.ndim))
  out_dtype = preferred_element_type or jnp.result_type(lo)
  return jnp.sum(lo, axis=axes).astype(out_dtype), jnp.sum(hi, axis=axes).astype(out_dtype)


def _bilinear(prim_bind, exact_fn=None):
  def rule(ctx, x, y, **params):
    op = lambda a, b: prim_bind(a, b, **params)
    both = isinstance(x, Interval) and isinstance(y, Interval)
    mode = ctx.matmul if both else "midrad"
    if mode == "midrad":
      lo, hi = bilinear_midrad(op, x, y)
    elif mode == "signsplit":
      lo, hi = bilinear_signsplit(op, x, y)
    elif mode == "best":
      l1, h1 = bilinear_midrad(op, x, y)
      l2, h2 = bilinear_signsplit(op, x, y)
      lo, hi = jnp.maximum(l1, l2), jnp.minimum(h1, h2)
    else:
      if exact_fn is None:
        raise UnsupportedPrimitiveError("matmul='exact' is only available for dot_general")
      lo, hi = exact_fn(x, y, **params)
    err = None
    if ctx.sound:
      mag = lambda v: jnp.maximum(jnp.abs(lo_(v)), jnp.abs(hi_(v)))
      n = _contraction_size(x, params)
      err = rounding.gamma(n + 4, jnp.result_type(lo)) * op(mag(x), mag(y))
    return _finish(ctx, lo, hi, 1, err)
  return rule


def _contraction_size(x, params) -> int:
  shape = jnp.shape(lo_(x))
  if "dimension_numbers" in params and isinstance(params["dimension_numbers"][0][0], tuple):
    (lc, _), _ = params["dimension_numbers"]
    n = 1
    for d in lc:
      n *= shape[d]
    return n
  # convolution: input features x kernel window; a safe over-count is the whole input size
  n = 1
  for s in shape[1:]:
    n *= s
  return n


# ----------------------------------------------------------------------------------------------
# the table
# ----------------------------------------------------------------------------------------------

def _p(name):
  return getattr(lax, name + "_p")


def _build_rules() -> dict[str, Callable]:
  r: dict[str, Callable] = {
      "add": _add, "add_any": _add, "sub": _sub, "neg": _neg, "mul": _mul, "div": _div,
      "max": _max, "min": _min, "abs": _abs, "integer_pow": _integer_pow, "pow": _pow,
      "square": _square, "clamp": _clamp, "is_finite": _is_finite, "sign": _sign,
      "convert_element_type": _convert,
      "lt": _compare(True, False), "le": _compare(False, False),
      "gt": _compare(True, True), "ge": _compare(False, True), "eq": _eq, "ne": _ne,
      "and": _and, "or": _or, "not": _not, "select_n": _select_n,
      "reduce_sum": _reduce_sum,
      "reduce_max": _increasing(lambda a, axes, **k: jnp.max(a, axis=axes)),
      "reduce_min": _increasing(lambda a, axes, **k: jnp.min(a, axis=axes)),
      "argmax": _argminmax(True), "argmin": _argminmax(False),
      "reduce_window_sum": _reduce_window_sum,
      "reduce_window_max": _increasing(lax.reduce_window_max_p.bind),
      "reduce_window_min": _increasing(lax.reduce_window_min_p.bind),
      "cumsum": _cumulative(lax.cumsum_p), "cummax": _cumulative(lax.cummax_p),
      "cummin": _cumulative(lax.cummin_p), "cumlogsumexp": _cumulative(lax.cumlogsumexp_p),
      "sort": lambda ctx, x, **p: (
          [_iv(lax.sort_p.bind(x.lower, **p)[0], lax.sort_p.bind(x.upper, **p)[0])]
          if p.get("num_keys", 1) == 1 and not isinstance(x, tuple) else None),
      "dot_general": _bilinear(lax.dot_general_p.bind, _dot_exact),
      "conv_general_dilated": _bilinear(lax.conv_general_dilated_p.bind),
      "stop_gradient": lambda ctx, x: x,
      "copy": lambda ctx, x: x, "copy_p": lambda ctx, x: x,
      "optimization_barrier": lambda ctx, *xs: list(xs),
  }
  increasing = {"exp": 2, "exp2": 2, "log": 2, "log1p": 2, "expm1": 2, "tanh": 2, "logistic": 2,
                "sqrt": 1, "cbrt": 2, "erf": 2, "atan": 2, "asinh": 2, "sinh": 2, "floor": 0,
                "ceil": 0, "round": 0, "reduce_precision": 0, "erf_inv": 4, "atanh": 2}
  for name, ulps in increasing.items():
    prim = _p(name)
    r[name] = _increasing(prim.bind, ulps)
  for name, ulps in {"rsqrt": 2, "erfc": 2}.items():
    r[name] = _decreasing(_p(name).bind, ulps)
  structural = ["reshape", "broadcast_in_dim", "transpose", "squeeze", "expand_dims", "slice",
                "dynamic_slice", "gather", "concatenate", "pad", "rev", "split",
                "dynamic_update_slice", "real", "reduce_and", "reduce_or"]
  for name in structural:
    prim = getattr(lax, name + "_p", None)
    if prim is None:
      continue
    if name in ("concatenate",):
      r[name] = lambda ctx, *xs, **p: _iv(lax.concatenate_p.bind(*[lo_(x) for x in xs], **p),
                                          lax.concatenate_p.bind(*[hi_(x) for x in xs], **p))
    elif name == "pad":
      r[name] = lambda ctx, x, v, **p: _iv(lax.pad_p.bind(lo_(x), lo_(v), **p),
                                           lax.pad_p.bind(hi_(x), hi_(v), **p))
    elif name == "dynamic_update_slice":
      r[name] = lambda ctx, x, u, *idx, **p: _iv(
          lax.dynamic_update_slice_p.bind(lo_(x), lo_(u), *idx, **p),
          lax.dynamic_update_slice_p.bind(hi_(x), hi_(u), *idx, **p))
    elif name == "split":
      r[name] = lambda ctx, x, **p: [
          _iv(a, b) for a, b in zip(lax.split_p.bind(x.lower, **p), lax.split_p.bind(x.upper, **p))]
    else:
      r[name] = _structural(prim)
  r["sort"] = _sort
  return r


def _sort(ctx, *operands, **params):
  if len(operands) != 1:
    raise UnsupportedPrimitiveError("'sort' of several bounded operands (argsort) is not supported")
  (x,) = operands
  return [_iv(lax.sort_p.bind(x.lower, **params)[0], lax.sort_p.bind(x.upper, **params)[0])]


RULES = {**_build_rules(), **nn.INTERVAL_RULES}


def abstract_eqn(ctx: IntervalContext, eqn: prog_lib.Eqn, invals: list) -> list:
  """Bounds one box-dependent equation with its rule (a composite whose rule declines is
  bounded through its body)."""
  rule = RULES.get(eqn.name)
  if rule is None:
    raise prog_lib.unsupported("interval", eqn, RULES)
  try:
    out = rule(ctx, *invals, **eqn.params)
  except UnsupportedPrimitiveError as e:
    raise UnsupportedPrimitiveError(f"{e} (at {eqn.where()})") from None
  if out is NotImplemented:
    body = prog_lib.expand(eqn, [isinstance(v, Interval) for v in invals],
                           precision_highest=ctx.sound)
    return evaluate(body, invals, ctx)
  return list(out) if eqn.prim.multiple_results else [out]


def evaluate(program: prog_lib.Program, inputs: list, ctx: IntervalContext) -> list:
  """Interval bounds of every output of ``program`` (inputs: arrays and Intervals)."""
  return prog_lib.evaluate(program, inputs, functools.partial(abstract_eqn, ctx))

"""The interval domain (IBP): one rule per JAX primitive.

Every rule maps boxes to a box containing every value the primitive takes on them. Inputs are
`Interval`s or concrete arrays (mixed freely). Conventions used below:

* *monotone increasing* f: ``[f(l), f(u)]``; *decreasing*: ``[f(u), f(l)]``.
* *structural* ops (reshape, slicing, gathers with concrete indices, ...) move entries without
  arithmetic, so they apply to both endpoints.
* bilinear ops (dot_general, conv) use the midpoint–radius form (Rump) by default, or the
  sign-split form, the exact four-corner form, or the intersection of midpoint–radius and
  sign-split ("best"); see `boundjax.core.interval`.
* a comparison of boxes gives a boolean box ``[definitely true, possibly true]``; ``select_n``
  with an undetermined predicate returns the hull of the branches it may take.

With ``IntervalContext.sound`` every result is rounded outward (see `boundjax.core.rounding`), so
bounds hold for the exact real-number semantics despite float rounding. Every outward step comes
from an error bound of its operation:

* one correctly rounded operation (add, sub, mul, div, sqrt, convert): 1 ulp;
* sums, dot products, convolutions, cumulative and windowed sums: Higham's ``γ·Σ|terms|`` with
  the true number of summed terms (`boundjax.core.rounding.sum_error`);
* cumlogsumexp: an a-priori bound of n log-add-exp steps (`_cumlogsumexp_error`);
* library functions (exp, tanh, erf, ...): the measured budgets of `boundjax.core.budgets`
  (relative ulps plus an absolute floor near a zero of the function);
* every step adds ``finfo.tiny`` (XLA CPU flushes subnormal results to zero) and box ends are
  moved out of the subnormal range before a rule reads them (XLA CPU reads subnormal operands as
  zero), see `boundjax.core.rounding.snap_outward`.

Real domain and NaN. A bound encloses every real value an operation takes on the box. Where a box
leaves the real domain of an operation (``log`` of a box reaching below 0, ``x ** 0.5`` of a
negative box, ``inf − inf``), JAX returns NaN for some points; the rule then returns the full line
``[−inf, +inf]``, which also marks "may be NaN": comparisons with such an operand are never
*definitely* true (a comparison with NaN is False in JAX). A NaN never appears in a bound.

Low precision. In sound mode an equation with bfloat16/float16 operands or outputs is bounded by
its rule in float32 (every such number is a float32 number) and rounded outward to its dtype:
XLA's own low-precision library functions can be several of their ulps off (bfloat16 ``exp2``
by 4 %), so the real value, not the low-precision program's, is what the bound holds.

Known weak points: the NaN marker is propagated through element-wise monotone functions and
comparisons, but not through ``max``/``min``/products with an exact 0 (``0 · [−inf, inf] = 0``;
a NaN test ``x != x`` therefore reads any box with an infinite end as "may be NaN", which covers
``max``/``min``, but not a product with an exact 0);
sound mode relies on XLA CPU flushing to *signed* zeros (x86 FTZ); a concrete operand holding a
subnormal is widened only when its value is known (not under ``jit``); the function budgets
are measured on XLA CPU (x86-64) and hold for that backend.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from boundjax import nn
from boundjax.core import primitives, rounding
from boundjax.core import budgets
from boundjax.core import program as prog_lib
from boundjax.core.errors import MemoryBudgetError, UnsupportedPrimitiveError
from boundjax.core.interval import (Interval, bilinear_midrad, bilinear_signsplit, lower_of,
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
    memory_bytes: the budget of the temporaries of one "exact" product (`_dot_exact` chunks
      its rows to fit; the other forms hold a few arrays of the operands' and result's sizes).
  """
  matmul: str = "midrad"
  sound: bool = False
  memory_bytes: int = 1 << 30

  def __post_init__(self):
    if self.matmul not in MATMUL_MODES:
      raise ValueError(f"matmul must be one of {MATMUL_MODES}, got {self.matmul!r}")
    if isinstance(self.memory_bytes, bool) or not isinstance(self.memory_bytes, (int, np.integer)) \
        or self.memory_bytes < 1:
      raise ValueError(f"memory_bytes must be a positive integer, got {self.memory_bytes!r}")


def _iv(lo, hi) -> Interval:
  return Interval(lo, hi, validate=False)


def _point(x) -> bool:
  return not isinstance(x, Interval)


lo_, hi_ = lower_of, upper_of


class _Finished(threading.local):
  """The boxes `_finish` built while `abstract_eqn` runs one rule (``None`` outside a rule).

  `_finish` leaves no NaN in a box, so `abstract_eqn` does not guard those boxes a second time
  (the guard is an element-wise pass over both ends, as costly as a cheap rule itself). The
  boxes are held, not their ids, so none is freed and its id reused during the rule."""
  boxes: list | None = None


_FINISHED = _Finished()


def _finish(ctx: IntervalContext, lo, hi, ulps: int = 0, err=None, *, sign_exact: bool = False,
            floor=None, ceil=None, nan_free: bool = False) -> Interval:
  """Builds the output box, rounding outward in sound mode.

  Args:
    ulps: units in the last place by which the operation may err (relative).
    err: an absolute a-priori error bound (sums, products, library functions near a zero).
    sign_exact: the computed endpoints have the sign of the exact ones (true for one correctly
      rounded operation of exact operands: rounding is monotone and maps 0 to 0, IEEE 754 §4.3;
      a result flushed to zero is a zero with the sign of the exact result), so a computed
      ``lo`` with a clear sign bit (``hi`` with a set one, or ``hi < 0``) keeps its sign after
      the outward step.
    floor, ceil: a range the exact values are known to lie in (e.g. ``[-1, 1]`` for tanh).
    nan_free: ``lo`` and ``hi`` hold no NaN by construction (products with ``0 · ∞ = 0``), so the
      `no_nan` pass is skipped.
  """
  if jnp.issubdtype(jnp.result_type(lo), jnp.floating):
    if not nan_free:
      lo, hi = no_nan(lo, hi)
    if ctx.sound:
      lo0, hi0 = lo, hi
      lo, hi = rounding.outward(lo, hi, ulps=max(ulps, 1), abs_err=err)
      if sign_exact:
        # the sign bit, not ``>= 0``: a result flushed to zero keeps the sign of the exact result
        # (x86 FTZ, Intel SDM Vol. 1 §10.2.3.3), while -0.0 >= 0 holds numerically
        lo = jnp.where(~rounding.is_negative(lo0), jnp.maximum(lo, 0), lo)
        hi = jnp.where(rounding.is_negative(hi0) | (hi0 < 0), jnp.minimum(hi, 0), hi)
      lo, hi = no_nan(lo, hi)   # the outward step of an infinite end (``inf - inf``)
    if floor is not None:
      lo, hi = jnp.maximum(lo, floor), jnp.maximum(hi, floor)
    if ceil is not None:
      lo, hi = jnp.minimum(lo, ceil), jnp.minimum(hi, ceil)
    out = _iv(lo, hi)
    if _FINISHED.boxes is not None:
      _FINISHED.boxes.append(out)
    return out
  return _iv(lo, hi)


def no_nan(lo, hi):
  """A NaN endpoint (an operation evaluated outside its real domain, e.g. log of a box reaching
  below 0, ``inf − inf``) makes the whole box ``[−inf, +inf]``: every real value stays enclosed,
  the box says "may be NaN" to comparisons (see `_may_be_nan`), and no NaN reaches a bound."""
  bad = jnp.isnan(lo) | jnp.isnan(hi)
  return jnp.where(bad, -jnp.inf, lo), jnp.where(bad, jnp.inf, hi)


def _may_be_nan(x):
  """True where a float box is the full line (the marker of a possible NaN, see `_no_nan`)."""
  lo, hi = lo_(x), hi_(x)
  if not jnp.issubdtype(jnp.result_type(lo), jnp.floating):
    return jnp.zeros(jnp.shape(lo), bool)
  if not isinstance(x, Interval):
    return jnp.isnan(lo)
  return (lo == -jnp.inf) & (hi == jnp.inf)


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

@dataclasses.dataclass(frozen=True)
class Monotone:
  """What a sound rule knows about a monotone element-wise function ``f``.

  Attributes:
    ulps, abs_err: its error budget (`boundjax.core.budgets`): ``|f̂ − f| ≤ ulps·eps·|f̂| +
      abs_err``.
    range: an interval containing every value of ``f`` (e.g. ``(-1, 1)`` for tanh).
    zero: ``f`` changes sign at this argument (``sign f(x) = ±sign(x − zero)``), or None.
  """
  ulps: int = 1
  abs_err: float = 0.0
  range: tuple = (None, None)
  zero: float | None = None


def _monotone_info(name: str, range_=(None, None), zero=None) -> Monotone:
  b = budgets.BUDGETS.get(name)
  if b is None:
    return Monotone(1, 0.0, range_, zero)
  return Monotone(b.ulps, b.abs_err, range_, zero)


def _monotone(fn: Callable, info: Monotone, increasing: bool, elementwise: bool = True):
  """Rule of a monotone function: ``[f(l), f(u)]`` (increasing) or ``[f(u), f(l)]``.

  Element-wise functions: a NaN at an end (the box leaves the real domain) or an operand that may
  be NaN gives the full line (`_no_nan`). In sound mode the ends move out by the function's
  budget, then back into its range and onto the right side of its zero, both known exactly.
  """
  def rule(ctx, x, **params):
    a, b = fn(x.lower, **params), fn(x.upper, **params)
    lo, hi = (a, b) if increasing else (b, a)
    if not jnp.issubdtype(jnp.result_type(lo), jnp.floating):
      return _iv(lo, hi)
    bad = jnp.isnan(lo) | jnp.isnan(hi)
    if elementwise:
      bad = bad | _may_be_nan(x)
    if not ctx.sound:
      out = _finish(ctx, lo, hi)
    else:
      out = _finish(ctx, lo, hi, info.ulps, info.abs_err or None, floor=info.range[0],
                    ceil=info.range[1])
    lo, hi = out.lower, out.upper
    if ctx.sound and info.zero is not None:
      nonneg, nonpos = (x.lower >= info.zero, x.upper <= info.zero) if increasing else \
          (x.upper <= info.zero, x.lower >= info.zero)
      lo = jnp.where(nonneg, jnp.maximum(lo, 0), lo)
      hi = jnp.where(nonpos, jnp.minimum(hi, 0), hi)
    return _iv(jnp.where(bad, -jnp.inf, lo), jnp.where(bad, jnp.inf, hi))
  return rule


def _increasing(fn: Callable, ulps: int = 0, elementwise: bool = True):
  """An increasing function computed exactly (order statistics, floor, ...)."""
  return _monotone(fn, Monotone(ulps), True, elementwise)


def _decreasing(fn: Callable, ulps: int = 0, elementwise: bool = True):
  return _monotone(fn, Monotone(ulps), False, elementwise)


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
  """``[lx + ly, ux + uy]``; one correctly rounded addition per end (1 ulp, sign exact)."""
  return _finish(ctx, lo_(x) + lo_(y), hi_(x) + hi_(y), 1, sign_exact=True)


def _sub(ctx, x, y, **_):
  """``[lx − uy, ux − ly]``; one correctly rounded subtraction per end."""
  return _finish(ctx, lo_(x) - hi_(y), hi_(x) - lo_(y), 1, sign_exact=True)


def _neg(ctx, x, **_):
  return _iv(-x.upper, -x.lower)


def _mul_point(c, x: Interval):
  """``c · x`` for a concrete ``c``: ``0 · ±inf = 0`` (an infinite end stands for unbounded
  finite values); where ``c`` is NaN, or ``±inf`` times a box that reaches 0, the product may be
  NaN and gets the whole line (checked on ``c`` alone when its values are known: a finite
  ``c`` costs no extra pass over the box)."""
  a, b = c * x.lower, c * x.upper
  a, b = jnp.where(jnp.isnan(a), 0, a), jnp.where(jnp.isnan(b), 0, b)
  lo, hi = jnp.minimum(a, b), jnp.maximum(a, b)
  if not isinstance(c, jax.core.Tracer) and bool(np.all(np.isfinite(np.asarray(c)))):
    return lo, hi
  maybe_nan = jnp.isnan(c) | (jnp.isinf(c) & (x.lower <= 0) & (x.upper >= 0))
  return jnp.where(maybe_nan, -jnp.inf, lo), jnp.where(maybe_nan, jnp.inf, hi)


def _mul(ctx, x, y, **_):
  if _point(x):
    lo, hi = _mul_point(x, y)
  elif _point(y):
    lo, hi = _mul_point(y, x)
  else:
    lo, hi = _corner_product(x.lower, x.upper, y.lower, y.upper)
  return _finish(ctx, lo, hi, 1, sign_exact=True, nan_free=True)   # (0 · ∞ = 0: no NaN)


def _square(ctx, x, **_):
  al, au = jnp.abs(x.lower), jnp.abs(x.upper)
  straddle = (x.lower < 0) & (x.upper > 0)
  lo = jnp.where(straddle, 0.0, lax.square(jnp.minimum(al, au))).astype(x.lower.dtype)
  hi = lax.square(jnp.maximum(al, au))
  return _finish(ctx, lo, hi, 1, sign_exact=True, floor=0.0)


def _reciprocal(lo, hi):
  """Bounds of 1/y for y in [lo, hi]; (-inf, inf) where the box contains 0."""
  has_zero = (lo <= 0) & (hi >= 0)
  inf = jnp.asarray(jnp.inf, dtype=jnp.result_type(lo))
  rlo = jnp.where(has_zero, -inf, 1.0 / hi)
  rhi = jnp.where(has_zero, inf, 1.0 / lo)
  return rlo, rhi


def _div(ctx, x, y, **_):
  """x / y: the four corner quotients when 0 is not in the divisor box (one correctly rounded
  division each, so zero-width boxes reproduce ``x / y`` bitwise); the full line when it is,
  unless x is exactly 0 (``0 / y = 0`` for every real y ≠ 0)."""
  if _point(y):
    a, b = lo_(x) / y, hi_(x) / y
    return _finish(ctx, jnp.minimum(a, b), jnp.maximum(a, b), 1, sign_exact=True)
  has_zero = (y.lower <= 0) & (y.upper >= 0)
  qs = [a / b for a in (lo_(x), hi_(x)) for b in (y.lower, y.upper)]
  lo = jnp.minimum(jnp.minimum(qs[0], qs[1]), jnp.minimum(qs[2], qs[3]))
  hi = jnp.maximum(jnp.maximum(qs[0], qs[1]), jnp.maximum(qs[2], qs[3]))
  x_zero = (lo_(x) == 0) & (hi_(x) == 0)
  zero = jnp.zeros_like(lo)
  lo = jnp.where(has_zero, jnp.where(x_zero, zero, -jnp.inf), lo)
  hi = jnp.where(has_zero, jnp.where(x_zero, zero, jnp.inf), hi)
  return _finish(ctx, lo, hi, 1, sign_exact=True)


def _max(ctx, x, y, **_):
  return _iv(jnp.maximum(lo_(x), lo_(y)), jnp.maximum(hi_(x), hi_(y)))


def _min(ctx, x, y, **_):
  return _iv(jnp.minimum(lo_(x), lo_(y)), jnp.minimum(hi_(x), hi_(y)))


def _abs(ctx, x, **_):
  al, au = jnp.abs(x.lower), jnp.abs(x.upper)
  straddle = (x.lower < 0) & (x.upper > 0)
  lo = jnp.where(straddle, jnp.zeros_like(al), jnp.minimum(al, au))
  hi = jnp.maximum(al, au)
  if jnp.issubdtype(jnp.result_type(lo), jnp.floating):
    lo, hi = no_nan(lo, hi)
  return _iv(lo, hi)


def _integer_pow(ctx, x, *, y: int):
  """x ** y for an integer y: odd y increasing; even y through |x|; negative y the reciprocal
  of the positive power (full line when the box contains 0). ``|y|`` multiplications by
  repeated squaring err by at most ``γ_{2 log2 |y|}`` relative: ``|y|`` ulps is a safe budget."""
  if y == 0:
    one = jnp.ones_like(x.lower)
    return _iv(one, one)
  if y < 0:
    pos = _integer_pow(ctx, x, y=-y)
    if not ctx.sound:
      # same operations as lax.integer_pow (1 / x^|y|), so points are reproduced bitwise
      odd = -y % 2 == 1
      contains0 = (x.lower <= 0) & (x.upper >= 0)
      p_lo, p_hi = lax.integer_pow(x.lower, -y), lax.integer_pow(x.upper, -y)
      if odd:
        lo, hi = 1 / p_hi, 1 / p_lo
      else:
        al, au = jnp.abs(x.lower), jnp.abs(x.upper)
        lo = 1 / lax.integer_pow(jnp.maximum(al, au), -y)
        hi = 1 / lax.integer_pow(jnp.minimum(al, au), -y)
        del p_lo, p_hi
      lo = jnp.where(contains0, -jnp.inf if odd else lo, lo)
      hi = jnp.where(contains0, jnp.inf, hi)
      return _finish(ctx, lo, hi)
    rlo, rhi = _reciprocal(pos.lower, pos.upper)
    if -y % 2 == 0:
      rlo = jnp.where(pos.lower <= 0, 0.0, rlo).astype(rlo.dtype)  # x^-2k > 0
    return _finish(ctx, rlo, rhi, 1, sign_exact=True)
  if y % 2 == 1:
    return _finish(ctx, lax.integer_pow(x.lower, y), lax.integer_pow(x.upper, y), y,
                   sign_exact=True)
  al, au = jnp.abs(x.lower), jnp.abs(x.upper)
  straddle = (x.lower < 0) & (x.upper > 0)
  lo = jnp.where(straddle, jnp.zeros_like(al), lax.integer_pow(jnp.minimum(al, au), y))
  return _finish(ctx, lo, lax.integer_pow(jnp.maximum(al, au), y), y, sign_exact=True,
                 floor=0.0)


def _pow_point_exponent(ctx, x: Interval, c):
  """``x ** c`` for a concrete exponent ``c`` (array or scalar).

  * ``c`` integral (``c == round(c)``): like `integer_pow` (even ``c``: a function of ``|x|``;
    odd ``c``: increasing for ``c > 0``, decreasing on each side of the pole at 0 for ``c < 0``),
    evaluated with ``pow`` itself at the ends so zero-width boxes reproduce it bitwise;
  * ``c`` not integral: real only for ``x ≥ 0`` (JAX gives NaN for ``x < 0``): a box reaching
    below 0 gives the full line; otherwise increasing (``c > 0``) or decreasing (``c < 0``).
  """
  c = jnp.asarray(c, x.lower.dtype)
  l, u = x.lower, x.upper
  al, au = jnp.abs(l), jnp.abs(u)
  straddle = (l < 0) & (u > 0)
  contains0 = (l <= 0) & (u >= 0)
  integral = c == jnp.round(c)
  even = integral & (jnp.mod(c, 2) == 0)
  odd = integral & ~even
  p = lambda a: lax.pow(a, c)
  pl, pu = p(l), p(u)
  amin, amax = jnp.minimum(al, au), jnp.maximum(al, au)
  # even: |x|^c, increasing in |x| for c > 0, decreasing for c < 0
  e_lo = jnp.where(c > 0, jnp.where(straddle, 0.0, p(amin)), p(amax))
  e_hi = jnp.where(c > 0, p(amax), jnp.where(contains0, jnp.inf, p(amin)))
  # odd: increasing for c > 0; for c < 0 decreasing on each side of 0, pole at 0
  o_lo = jnp.where(c > 0, pl, jnp.where(contains0, -jnp.inf, pu))
  o_hi = jnp.where(c > 0, pu, jnp.where(contains0, jnp.inf, pl))
  # not integral: x >= 0 only
  n_lo = jnp.where(c > 0, pl, pu)
  n_hi = jnp.where(c > 0, pu, pl)
  n_lo = jnp.where(l < 0, jnp.nan, n_lo)
  lo = jnp.where(even, e_lo, jnp.where(odd, o_lo, n_lo))
  hi = jnp.where(even, e_hi, jnp.where(odd, o_hi, n_hi))
  zero_c = c == 0
  lo = jnp.where(zero_c, 1.0, lo).astype(l.dtype)  # x ** 0 = 1 (also at 0 and inf)
  hi = jnp.where(zero_c, 1.0, hi).astype(l.dtype)
  pos = (even & (c != 0)) | (l >= 0)
  b = budgets.BUDGETS["pow"]
  out = _finish(ctx, lo, hi, b.ulps, b.abs_err or None, sign_exact=True)
  lo2 = jnp.where(pos & ~jnp.isinf(out.lower), jnp.maximum(out.lower, 0), out.lower)
  return _iv(lo2, out.upper)


def _pow(ctx, x, y, **_):
  """``pow(x, y)``: concrete exponent (`_pow_point_exponent`); a bounded exponent needs a
  non-negative base box: ``x^y = exp(y log x)`` is monotone in x for fixed y and in y for fixed
  x, so the extremes over the box are among the four corners (full line if the base box reaches
  below 0, where JAX gives NaN)."""
  if _point(y):
    return _pow_point_exponent(ctx, x, y)
  xl, xu = lo_(x), hi_(x)
  corners = [lax.pow(a, b) for a in (xl, xu) for b in (y.lower, y.upper)]
  lo = jnp.minimum(jnp.minimum(corners[0], corners[1]), jnp.minimum(corners[2], corners[3]))
  hi = jnp.maximum(jnp.maximum(corners[0], corners[1]), jnp.maximum(corners[2], corners[3]))
  # pow(0, 0) = 1 lies between pow(0, y<0) = inf and pow(0, y>0) = 0: covered by the corners
  lo = jnp.where(xl < 0, jnp.nan, lo)
  b = budgets.BUDGETS["pow"]
  out = _finish(ctx, lo, hi, b.ulps, b.abs_err or None, sign_exact=True)
  return _iv(jnp.where((xl >= 0) & ~jnp.isinf(out.lower), jnp.maximum(out.lower, 0), out.lower),
             out.upper)


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
  if jnp.issubdtype(jnp.dtype(new_dtype), jnp.floating):
    # rounding to the new type is monotone (one correctly rounded operation, 1 ulp)
    return _finish(ctx, lo, hi, 1, sign_exact=True)
  if jnp.issubdtype(x.dtype, jnp.floating):
    # float -> integer truncates towards 0 (monotone); a box that may be NaN (NaN converts to an
    # implementation-defined integer) or reaches ±inf takes the whole integer range
    info = jnp.iinfo(jnp.dtype(new_dtype)) if not to_bool else None
    if info is not None:
      wide = _may_be_nan(x)
      lo = jnp.where(wide, info.min, lo).astype(new_dtype)
      hi = jnp.where(wide, info.max, hi).astype(new_dtype)
  return _iv(lo, hi)


# ----------------------------------------------------------------------------------------------
# comparisons, boolean logic and selection
# ----------------------------------------------------------------------------------------------

def _compare(strict: bool, flip: bool):
  """x < y (strict) or x <= y; ``flip`` swaps the operands (for gt/ge).

  Boolean box ``[definitely, possibly]``. Infinite ends compare as IEEE numbers, which is right
  for every real value in the box; an operand that may be NaN (`_may_be_nan`) makes the
  comparison never definitely true (NaN compares False)."""
  def rule(ctx, x, y, **_):
    if flip:
      x, y = y, x
    if strict:
      definitely, possibly = hi_(x) < lo_(y), lo_(x) < hi_(y)
    else:
      definitely, possibly = hi_(x) <= lo_(y), lo_(x) <= hi_(y)
    definitely = definitely & ~_may_be_nan(x) & ~_may_be_nan(y)
    return _iv(definitely, possibly)
  return rule


def _eq(ctx, x, y, **_):
  """x == y: ``[single equal value, overlapping boxes]``. One variable against itself (``x == x``,
  ``jnp.isnan``'s ``x != x``; the program layer passes the same box object for both operands)
  is true unless it may be NaN: ``[not may-be-NaN, True]``; with two different boxes a NaN makes
  the comparison false, which only lowers a possibly-true."""
  if x is y and isinstance(x, Interval) and jnp.issubdtype(x.dtype, jnp.floating):
    nan = _may_be_nan_wide(x)
    return _iv(~nan, jnp.ones_like(nan))
  overlap = (lo_(x) <= hi_(y)) & (lo_(y) <= hi_(x))
  single = (lo_(x) == hi_(x)) & (lo_(y) == hi_(y)) & (lo_(x) == lo_(y))
  single = single & ~_may_be_nan(x) & ~_may_be_nan(y)
  return _iv(single, overlap)


def _ne(ctx, x, y, **_):
  e = _eq(ctx, x, y)
  return _iv(~e.upper, ~e.lower)


def _may_be_nan_wide(x: Interval):
  """Where a float box may hold a NaN as far as a NaN test is concerned: any infinite end. The
  NaN marker of `_no_nan` is the full line, but a marked box loses one infinite end through
  ``max``/``min`` (``max(NaN, 0)`` is NaN in JAX, ``max([−inf, inf], 0) = [0, inf]``), so a NaN
  test reads every box with an infinite end as "may be NaN". (An exact zero times a marked box,
  ``0 · [−inf, inf] = 0``, still hides it: see the module docstring's weak points.)"""
  return ~(jnp.isfinite(x.lower) & jnp.isfinite(x.upper))


def _smear(v):
  """``2^bitlen(v) − 1`` for non-negative integers: every bit below the highest set bit."""
  bits = jnp.iinfo(v.dtype).bits
  shift = 1
  while shift < bits:
    v = v | lax.shift_right_logical(v, jnp.asarray(shift, v.dtype))
    shift *= 2
  return v


def _int_range(dtype, shape):
  info = jnp.iinfo(dtype)
  return jnp.full(shape, info.min, dtype), jnp.full(shape, info.max, dtype)


def _bitwise(is_and: bool):
  """Bitwise and/or of boxes.

  bool: both are monotone, ``[f(lx, ly), f(ux, uy)]``. Integers: for non-negative x, y,
  ``x & y ∈ [0, min(ux, uy)]`` (and ``[0, ux]`` as soon as x ≥ 0), ``x | y ∈ [max(lx, ly),
  2^bitlen(max(ux, uy)) − 1]``; with a possibly negative operand the dtype's range.
  """
  prim = lax.and_p if is_and else lax.or_p

  def rule(ctx, x, y, **_):
    lx, ux, ly, uy = lo_(x), hi_(x), lo_(y), hi_(y)
    dtype = jnp.result_type(lx)
    if jnp.issubdtype(dtype, jnp.bool_):
      return _iv(prim.bind(lx, ly), prim.bind(ux, uy))
    shape = jnp.broadcast_shapes(jnp.shape(lx), jnp.shape(ly))
    lx, ux, ly, uy = [jnp.broadcast_to(a, shape) for a in (lx, ux, ly, uy)]
    if not isinstance(x, Interval) and not isinstance(y, Interval):
      v = prim.bind(lx, ly)
      return _iv(v, v)
    dmin, dmax = _int_range(dtype, shape)
    xpos, ypos = lx >= 0, ly >= 0
    zero = jnp.zeros(shape, dtype)
    if is_and:
      hi = jnp.where(xpos & ypos, jnp.minimum(ux, uy),
                     jnp.where(xpos, ux, jnp.where(ypos, uy, dmax)))
      lo = jnp.where(xpos | ypos, zero, dmin)
    else:
      lo = jnp.where(xpos & ypos, jnp.maximum(lx, ly), dmin)
      hi = jnp.where(xpos & ypos, _smear(jnp.maximum(ux, uy)), dmax)
    # both operands single values: the exact result
    exact = (lx == ux) & (ly == uy)
    v = prim.bind(lx, ly)
    return _iv(jnp.where(exact, v, lo), jnp.where(exact, v, hi))

  return rule


def _not(ctx, x, **_):
  """Bitwise not: ``~x = −x − 1`` (signed) or ``max − x`` (unsigned), decreasing; bool: not."""
  return _iv(~x.upper, ~x.lower)


def _reduce_bitwise(is_and: bool):
  """reduce_and / reduce_or: monotone for bool; integers fold the rule of `_bitwise`."""
  def rule(ctx, x, *, axes, **params):
    prim = lax.reduce_and_p if is_and else lax.reduce_or_p
    if jnp.issubdtype(x.dtype, jnp.bool_):
      return _iv(prim.bind(x.lower, axes=axes, **params), prim.bind(x.upper, axes=axes, **params))
    allpos = jnp.min(x.lower, axis=axes) >= 0
    dmin, dmax = _int_range(x.dtype, allpos.shape)
    if is_and:
      lo = jnp.where(allpos, jnp.zeros_like(dmin), dmin)
      hi = jnp.where(allpos, jnp.min(x.upper, axis=axes), dmax)
    else:
      lo = jnp.where(allpos, jnp.max(x.lower, axis=axes), dmin)
      hi = jnp.where(allpos, _smear(jnp.max(x.upper, axis=axes)), dmax)
    exact = jnp.all(x.lower == x.upper, axis=axes)
    v = prim.bind(x.lower, axes=axes, **params)
    return _iv(jnp.where(exact, v, lo), jnp.where(exact, v, hi))
  return rule


def _dtype_extreme(dtype, shape, high: bool):
  """The largest (``high``) or smallest value of ``dtype``, filled into ``shape``: +inf/−inf
  for floats, the integer range's ends, True/False for bool."""
  dtype = jnp.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.floating):
    return jnp.full(shape, jnp.inf if high else -jnp.inf, dtype)
  if dtype == jnp.bool_:
    return jnp.full(shape, high, dtype)
  info = jnp.iinfo(dtype)
  return jnp.full(shape, info.max if high else info.min, dtype)


def _select_n(ctx, pred, *cases, **_):
  """``select_n(pred, *cases)``: with a box-dependent predicate ``[p_lo, p_hi]`` the hull of the
  cases it may pick (``p_lo <= i <= p_hi``); any case dtype (float, integer, bool)."""
  if _point(pred):
    return _iv(lax.select_n(pred, *[lo_(c) for c in cases]),
               lax.select_n(pred, *[hi_(c) for c in cases]))
  plo, phi = pred.lower.astype(jnp.int32), pred.upper.astype(jnp.int32)
  dtype = jnp.result_type(lo_(cases[0]))
  shape = jnp.shape(plo)
  lo = _dtype_extreme(dtype, shape, high=True)
  hi = _dtype_extreme(dtype, shape, high=False)
  for i, c in enumerate(cases):
    may = (plo <= i) & (i <= phi)
    lo = jnp.where(may, jnp.minimum(lo, lo_(c)), lo)
    hi = jnp.where(may, jnp.maximum(hi, hi_(c)), hi)
  return _iv(lo, hi)


# ----------------------------------------------------------------------------------------------
# gathers and slices at box-dependent indices
# ----------------------------------------------------------------------------------------------

def _hull_into(lo_src, hi_src, keep_axes: tuple, out_shape, out_axes: tuple):
  """``[min lo_src, max hi_src]`` over every axis but ``keep_axes``, broadcast to ``out_shape``
  with the kept axes (in their order) at ``out_axes``."""
  drop = tuple(d for d in range(jnp.ndim(lo_src)) if d not in keep_axes)
  order = tuple(sorted(range(len(keep_axes)), key=lambda k: keep_axes[k]))
  lo, hi = jnp.min(lo_src, axis=drop), jnp.max(hi_src, axis=drop)  # kept axes, sorted order
  inverse = tuple(order.index(k) for k in range(len(keep_axes)))
  lo, hi = jnp.transpose(lo, inverse), jnp.transpose(hi, inverse)  # in keep_axes' order
  bcast = lambda a: lax.broadcast_in_dim(a, tuple(out_shape), tuple(out_axes))  # noqa: E731
  return bcast(lo), bcast(hi)


def _gather_bounded_index(ctx, x, idx: Interval, *, dimension_numbers, slice_sizes, mode,
                          fill_value, **params):
  """``gather`` at box-dependent indices ``[i_lo, i_hi]`` (``x[argmax(x)]``,
  ``take_along_axis``): where an output's index box is one point, the gather itself; elsewhere
  the hull of the operand over every entry the output may read (the whole operand, within the
  same batch for batched gathers). Out-of-bounds indices in ``FILL_OR_DROP`` mode read the fill
  value: if an index may be out of bounds the result widens to the dtype's whole range (NaN fill
  for floats)."""
  dn = dimension_numbers
  xl, xu = lo_(x), hi_(x)
  i_lo, i_hi = idx.lower, idx.upper
  bind = lambda a, i: lax.gather_p.bind(  # noqa: E731
      a, i, dimension_numbers=dn, slice_sizes=slice_sizes, mode=mode, fill_value=fill_value,
      **params)
  point = jnp.all(i_lo == i_hi, axis=-1)  # per gathered slice (the batch shape of the indices)
  exact_lo, exact_hi = bind(xl, i_lo), bind(xu, i_lo)
  out_shape = exact_lo.shape
  batch_pos = tuple(d for d in range(len(out_shape)) if d not in dn.offset_dims)
  point_out = lax.broadcast_in_dim(point, out_shape, batch_pos)
  keep = tuple(dn.operand_batching_dims)
  out_axes = tuple(batch_pos[d] for d in dn.start_indices_batching_dims)
  hull_lo, hull_hi = _hull_into(xl, xu, keep, out_shape, out_axes)
  lo = jnp.where(point_out, exact_lo, hull_lo)
  hi = jnp.where(point_out, exact_hi, hull_hi)
  if mode == lax.GatherScatterMode.FILL_OR_DROP:
    bounds = jnp.asarray([jnp.shape(xl)[d] - slice_sizes[d] for d in dn.start_index_map],
                         i_lo.dtype)
    may_oob = jnp.any(i_lo < 0) | jnp.any(i_hi > bounds)
    lo = jnp.where(may_oob, _dtype_extreme(lo.dtype, out_shape, high=False), lo)
    hi = jnp.where(may_oob, _dtype_extreme(hi.dtype, out_shape, high=True), hi)
  return _iv(lo, hi)


def _dynamic_slice_bounded_index(ctx, x, *starts, slice_sizes, **params):
  """``dynamic_slice`` at box-dependent start indices (JAX clamps them into range, so every
  read is in bounds): the slice itself where every start index is one point, else the hull of
  the whole operand."""
  xl, xu = lo_(x), hi_(x)
  s_lo = [lo_(s) for s in starts]
  point = functools.reduce(jnp.logical_and, [lo_(s) == hi_(s) for s in starts], jnp.bool_(True))
  bind = lambda a: lax.dynamic_slice_p.bind(a, *s_lo, slice_sizes=slice_sizes, **params)  # noqa: E731
  exact_lo, exact_hi = bind(xl), bind(xu)
  hull_lo = jnp.broadcast_to(jnp.min(xl), exact_lo.shape)
  hull_hi = jnp.broadcast_to(jnp.max(xu), exact_hi.shape)
  return _iv(jnp.where(point, exact_lo, hull_lo), jnp.where(point, exact_hi, hull_hi))


def _indexed(prim, bounded_index_rule):
  """A structural rule (`_structural`) whose index operands may also be boxes."""
  plain = _structural(prim)

  def rule(ctx, x, *rest, **params):
    if any(isinstance(r, Interval) for r in rest):
      return bounded_index_rule(ctx, x, *rest, **params)
    if not isinstance(x, Interval):  # only the indices are boxes: handled above
      x = _iv(x, x)
    return plain(ctx, x, *rest, **params)
  return rule


# ----------------------------------------------------------------------------------------------
# reductions
# ----------------------------------------------------------------------------------------------

def _mag(v):
  """``max(|l|, |u|)`` of a box (an array's ``|x|``): the largest magnitude of its values."""
  return jnp.maximum(jnp.abs(lo_(v)), jnp.abs(hi_(v)))


def _nonneg_sum_floor(lo, terms_lo_min):
  """A sum of terms that are all ≥ 0 is ≥ 0 (exactly): keeps the outward step from crossing 0."""
  return jnp.where(terms_lo_min >= 0, jnp.maximum(lo, 0), lo)


def _reduce_sum(ctx, x, *, axes, **params):
  """Σ over ``axes``: ``[Σ l, Σ u]``, sound with ``sum_error(n, Σ max(|l|, |u|))``, n the number of
  summed terms (Higham §3.1)."""
  bind = lambda a: lax.reduce_sum_p.bind(a, axes=tuple(axes), **params)
  lo, hi = bind(x.lower), bind(x.upper)
  if not ctx.sound or not jnp.issubdtype(x.dtype, jnp.floating):
    return _finish(ctx, lo, hi)
  n = 1
  for a in axes:
    n *= x.shape[a]
  out = _finish(ctx, lo, hi, 1, rounding.sum_error(n, bind(_mag(x)), x.dtype))
  return _iv(_nonneg_sum_floor(out.lower, jnp.min(x.lower, axis=tuple(axes))), out.upper)


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
  """cummax / cummin: exact order statistics of prefixes, increasing in every entry."""
  def rule(ctx, x, **params):
    return _finish(ctx, prim.bind(x.lower, **params), prim.bind(x.upper, **params))
  return rule


def _cumsum(ctx, x, *, axis, reverse, **params):
  """Prefix sums ``[cumsum(l), cumsum(u)]``; the k-th prefix is a k-term sum (in whatever order
  XLA evaluates it), so ``|error| ≤ sum_error(n, cumsum(max(|l|, |u|)))`` with n the axis length
  (Higham §3.1; γ is increasing in n)."""
  bind = lambda a: lax.cumsum_p.bind(a, axis=axis, reverse=reverse, **params)
  lo, hi = bind(x.lower), bind(x.upper)
  if not ctx.sound or not jnp.issubdtype(x.dtype, jnp.floating):
    return _finish(ctx, lo, hi)
  err = rounding.sum_error(x.shape[axis], bind(_mag(x)), x.dtype)
  out = _finish(ctx, lo, hi, 1, err)
  return _iv(_nonneg_sum_floor(out.lower, lax.cummin_p.bind(x.lower, axis=axis, reverse=reverse)),
             out.upper)


def _cumlogsumexp_error(x: Interval, axis: int):
  """A-priori error bound of XLA's cumulative log-sum-exp along ``axis`` (length n).

  Each output is ≤ n − 1 steps ``r = m + log1p(exp(−|a − b|))``, ``m = max(a, b)``. One step errs
  by at most ``u(|a| + |b| + |r|)`` (the subtraction, whose error passes through a derivative
  ``σ ≤ 1``, and the final addition) plus ``(b_exp + b_log1p)·eps`` (exp of a value ≤ 1 and log1p
  of a value ≤ 1 within their measured budgets, `boundjax.core.budgets`, derivative ≤ 1). Every
  operand and partial result lies in ``[−M, M + log n]`` with ``M`` the largest finite
  magnitude along the axis, and log-add-exp is 1-Lipschitz in the max-norm, so the step errors
  add up:

      |error| ≤ n · (3u·(M + log n) + (b_exp + b_log1p)·eps) + 2n·λ.

  (Higham §3.1 style forward analysis; λ = finfo.tiny covers flushed intermediate results.)
  """
  n = x.shape[axis]
  dtype = x.dtype
  finfo = jnp.finfo(dtype)
  mag = jnp.where(jnp.isfinite(_mag(x)), _mag(x), 0.0)
  m = jnp.max(mag, axis=axis, keepdims=True)
  u = rounding.unit_roundoff(dtype)
  b = budgets.BUDGETS["exp"].ulps + budgets.BUDGETS["log1p"].ulps
  step = 3 * u * (m + np.log(n) + 1) + b * float(finfo.eps)
  err = n * step + 2 * n * rounding.underflow_threshold(dtype)
  return jnp.broadcast_to(err, x.shape).astype(dtype)


def _cumlogsumexp(ctx, x, **params):
  """Prefix log-sum-exp is increasing in every entry: ``[f(l), f(u)]``, outward by
  `_cumlogsumexp_error` in sound mode."""
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise UnsupportedPrimitiveError(f"'cumlogsumexp' of {x.dtype} values is not supported (a "
                                    "log-sum-exp is real-valued: convert to float first)")
  bind = lambda a: lax.cumlogsumexp_p.bind(a, **params)
  lo, hi = bind(x.lower), bind(x.upper)
  if not ctx.sound:
    return _finish(ctx, lo, hi)
  return _finish(ctx, lo, hi, 1, _cumlogsumexp_error(x, params["axis"]))


def _reduce_window_sum(ctx, x, *, window_dimensions, **params):
  """Windowed sums (average pooling before its division): ``[f(l), f(u)]``; each output sums
  ``n = Π window_dimensions`` terms (padding adds zeros), so ``sum_error(n, f(max(|l|, |u|)))``."""
  bind = lambda a: lax.reduce_window_sum_p.bind(a, window_dimensions=window_dimensions, **params)
  lo, hi = bind(x.lower), bind(x.upper)
  if not ctx.sound or not jnp.issubdtype(x.dtype, jnp.floating):
    return _finish(ctx, lo, hi)
  n = int(np.prod(window_dimensions))
  out = _finish(ctx, lo, hi, 1, rounding.sum_error(n, bind(_mag(x)), x.dtype))
  # padding cells hold 0 (≥ 0) for the sum and are ignored by the min
  floor = lax.reduce_window_min_p.bind(x.lower, window_dimensions=window_dimensions, **params)
  return _iv(_nonneg_sum_floor(out.lower, floor), out.upper)


# ----------------------------------------------------------------------------------------------
# bilinear: dot_general and convolution
# ----------------------------------------------------------------------------------------------

EXACT_LIVE = 8
"""Arrays of the four-corner product's size alive at once in `_dot_exact` (the four corner
products, their minimum and maximum, and the operands broadcast to it), for its memory budget."""


def _dot_exact(x, y, dimension_numbers, preferred_element_type, memory_bytes: int = 1 << 30,
               **_):
  """Four-corner bound per term, summed: the tightest interval of a product of boxes.

  Every term ``x_fc · y_gc`` is materialised (``B × F × G × C`` values for ``B`` batch, ``F`` and
  ``G`` free and ``C`` contracted entries), so the rows ``f`` of ``x`` are taken in chunks whose
  temporaries (`EXACT_LIVE` arrays of the chunk's product) fit ``memory_bytes``; each output is
  the same sum of the same terms whatever the chunk. `MemoryBudgetError` (before anything is
  computed) when one row does not fit.
  """
  (lc, rc), (lb, rb) = dimension_numbers

  def arrange(a, batch, contract):
    free = [d for d in range(a.ndim) if d not in batch and d not in contract]
    a = jnp.transpose(a, (*batch, *free, *contract))
    nb, nf = len(batch), len(free)
    shapes = a.shape[:nb], a.shape[nb:nb + nf], a.shape[nb + nf:]
    return a.reshape(tuple(int(np.prod(t, dtype=np.int64)) for t in shapes)), shapes[:2]

  xl, (bshape, fx) = arrange(lo_(x), lb, lc)
  xu, _ = arrange(hi_(x), lb, lc)
  yl, (_, fy) = arrange(lo_(y), rb, rc)
  yu, _ = arrange(hi_(y), rb, rc)
  nb, nf, nc = xl.shape
  ng = yl.shape[1]
  out_dtype = preferred_element_type or jnp.result_type(xl, yl)
  itemsize = jnp.dtype(jnp.result_type(xl, yl)).itemsize
  per_row = EXACT_LIVE * itemsize * nb * ng * max(nc, 1)
  if per_row > memory_bytes:
    raise MemoryBudgetError(
        f"matmul='exact': one row of the four-corner product needs {per_row} bytes, more than "
        f"memory_bytes={memory_bytes}; raise memory_bytes or use matmul='best'.",
        per_row, memory_bytes)

  def rows(a_l, a_u):  # (B, s, C) rows of x against all of y: (B, s, G) sums
    lo, hi = mul_bounds(a_l[:, :, None, :], a_u[:, :, None, :], yl[:, None], yu[:, None])
    return jnp.sum(lo, axis=-1), jnp.sum(hi, axis=-1)

  size = max(1, min(nf, int(memory_bytes // per_row)))
  if size >= nf:
    lo, hi = rows(xl, xu)
  else:
    k = -(-nf // size)
    pad = ((0, 0), (0, k * size - nf), (0, 0))
    chunks = lambda a: jnp.moveaxis(jnp.pad(a, pad).reshape(nb, k, size, nc), 1, 0)
    lo, hi = lax.map(lambda ab: rows(*ab), (chunks(xl), chunks(xu)))
    lo, hi = (jnp.moveaxis(a, 0, 1).reshape(nb, k * size, ng)[:, :nf] for a in (lo, hi))
  shape = bshape + fx + fy
  return lo.reshape(shape).astype(out_dtype), hi.reshape(shape).astype(out_dtype)


LARGE = 1e38
"""Beyond this magnitude the midpoint–radius form may overflow in its radius products."""


def _midrad_safe(op, x, y):
  """Midpoint–radius bounds (`bilinear_midrad`, which halves before adding, so the centre of a
  box near ±3e38 stays finite), with a sign-split fallback wherever the midpoint–radius result
  is not finite but the sign-split one is (e.g. ends near ±3e38, where ``|c| + r`` overflows)."""
  lo, hi = bilinear_midrad(op, x, y)
  bad = ~(jnp.isfinite(lo) & jnp.isfinite(hi))
  large = (jnp.max(_mag(x)) > LARGE) | (jnp.max(_mag(y)) > LARGE)
  if isinstance(large, jax.core.Tracer) or not bool(large):
    return lo, hi  # under jit: midpoint–radius only (one form, no data-dependent branch)
  l2, h2 = bilinear_signsplit(op, x, y)
  return jnp.where(bad, l2, lo), jnp.where(bad, h2, hi)


def _bilinear(prim_bind, exact_fn=None, count=None):
  """dot_general / conv_general_dilated of boxes (see `IntervalContext.matmul`).

  Sound mode: every form is a few bilinear products of arrays whose magnitudes are bounded by
  ``op(max(|x|), max(|y|))``, so ``sum_error(n, op(|x|, |y|), terms=12)`` bounds the rounding
  error with n the true number of summed products per output (``count``).
  """
  def rule(ctx, x, y, **params):
    op = lambda a, b: prim_bind(a, b, **params)
    both = isinstance(x, Interval) and isinstance(y, Interval)
    mode = ctx.matmul if both else "midrad"
    if not jnp.issubdtype(jnp.result_type(lo_(x)), jnp.floating):
      mode = "signsplit"  # integers: exact corner products (the midpoint is not an integer)
    if mode == "midrad":
      lo, hi = _midrad_safe(op, x, y)
    elif mode == "signsplit":
      lo, hi = bilinear_signsplit(op, x, y)
    elif mode == "best":
      l1, h1 = _midrad_safe(op, x, y)
      l2, h2 = bilinear_signsplit(op, x, y)
      lo, hi = jnp.maximum(l1, l2), jnp.minimum(h1, h2)
      # both enclose the value up to rounding; if rounding makes them cross, keep midrad's
      crossed = lo > hi
      lo, hi = jnp.where(crossed, l1, lo), jnp.where(crossed, h1, hi)
    else:
      if exact_fn is None:
        raise UnsupportedPrimitiveError("matmul='exact' is only available for dot_general")
      lo, hi = exact_fn(x, y, memory_bytes=ctx.memory_bytes, **params)
    err = None
    if ctx.sound and jnp.issubdtype(jnp.result_type(lo), jnp.floating):  # integers are exact
      n = count(jnp.shape(lo_(x)), jnp.shape(lo_(y)), params)
      err = rounding.sum_error(n, op(_mag(x), _mag(y)), jnp.result_type(lo), terms=12)
    return _finish(ctx, lo, hi, 1, err)
  return rule


def dot_count(x_shape, y_shape, params) -> int:
  """Terms per output of dot_general: the product of the contracting dimensions."""
  (lc, _), _ = params["dimension_numbers"]
  return int(np.prod([x_shape[d] for d in lc], dtype=np.int64))


def conv_count(x_shape, y_shape, params) -> int:
  """Terms per output of a convolution: input features per group × kernel window, i.e. every
  kernel entry of one output feature (``rhs.size / rhs.shape[out_feature_dim]``)."""
  rhs_spec = params["dimension_numbers"].rhs_spec
  return int(np.prod(y_shape, dtype=np.int64) // max(y_shape[rhs_spec[0]], 1))


# ----------------------------------------------------------------------------------------------
# the table
# ----------------------------------------------------------------------------------------------

def _p(name):
  return getattr(lax, name + "_p")


_HALF_PI = float(np.nextafter(np.float32(np.pi / 2), np.float32(np.inf)))
MONOTONE: dict[str, tuple[bool, tuple, float | None]] = {
    # name: (increasing, range containing every value, argument where the sign changes)
    "exp": (True, (0.0, None), None), "exp2": (True, (0.0, None), None),
    "expm1": (True, (-1.0, None), 0.0), "log": (True, (None, None), 1.0),
    "log1p": (True, (None, None), 0.0), "tanh": (True, (-1.0, 1.0), 0.0),
    "logistic": (True, (0.0, 1.0), None), "sqrt": (True, (0.0, None), None),
    "cbrt": (True, (None, None), 0.0), "erf": (True, (-1.0, 1.0), 0.0),
    "atan": (True, (-_HALF_PI, _HALF_PI), 0.0), "asinh": (True, (None, None), 0.0),
    "sinh": (True, (None, None), 0.0), "erf_inv": (True, (None, None), 0.0),
    "atanh": (True, (None, None), 0.0), "floor": (True, (None, None), None),
    "ceil": (True, (None, None), None), "round": (True, (None, None), None),
    "reduce_precision": (True, (None, None), None),
    "rsqrt": (False, (0.0, None), None), "erfc": (False, (0.0, 2.0), None),
}
"""Monotone element-wise primitives with their exact ranges and sign changes; error budgets come
from `boundjax.core.budgets`."""


def _identity(multiple: bool) -> Callable:
  """The rule of an identity primitive (`boundjax.core.primitives.IDENTITY`): every operand as
  it is (one result per operand when the primitive returns several)."""
  if multiple:
    return lambda ctx, *xs, **params: list(xs)
  return lambda ctx, x, **params: x


def _build_rules() -> dict[str, Callable]:
  r: dict[str, Callable] = {
      "add": _add, "add_any": _add, "sub": _sub, "neg": _neg, "mul": _mul, "div": _div,
      "max": _max, "min": _min, "abs": _abs, "integer_pow": _integer_pow, "pow": _pow,
      "square": _square, "clamp": _clamp, "is_finite": _is_finite, "sign": _sign,
      "convert_element_type": _convert,
      "lt": _compare(True, False), "le": _compare(False, False),
      "gt": _compare(True, True), "ge": _compare(False, True), "eq": _eq, "ne": _ne,
      "and": _bitwise(True), "or": _bitwise(False), "not": _not, "select_n": _select_n,
      "reduce_and": _reduce_bitwise(True), "reduce_or": _reduce_bitwise(False),
      "reduce_sum": _reduce_sum,
      "reduce_max": _increasing(lambda a, axes, **k: jnp.max(a, axis=axes), elementwise=False),
      "reduce_min": _increasing(lambda a, axes, **k: jnp.min(a, axis=axes), elementwise=False),
      "argmax": _argminmax(True), "argmin": _argminmax(False),
      "reduce_window_sum": _reduce_window_sum,
      "reduce_window_max": _increasing(lax.reduce_window_max_p.bind, elementwise=False),
      "reduce_window_min": _increasing(lax.reduce_window_min_p.bind, elementwise=False),
      "cumsum": _cumsum, "cummax": _cumulative(lax.cummax_p),
      "cummin": _cumulative(lax.cummin_p), "cumlogsumexp": _cumlogsumexp,
      "dot_general": _bilinear(lax.dot_general_p.bind, _dot_exact, dot_count),
      "conv_general_dilated": _bilinear(lax.conv_general_dilated_p.bind, None, conv_count),
  }
  for name in primitives.IDENTITY:  # copies and hints: the value itself
    r[name] = _identity(name in primitives.SEVERAL_RESULTS)
  for name, (increasing, range_, zero) in MONOTONE.items():
    r[name] = _monotone(_p(name).bind, _monotone_info(name, range_, zero), increasing)
  # data movement (`boundjax.core.primitives.DATA_MOVEMENT`: every result entry is one operand
  # entry or a fill, order-preserving): the primitive applied to the lower ends and to the upper
  # ends; those with several operands or results by name, index-reading ones below
  several = {
      "concatenate": lambda ctx, *xs, **p: _iv(lax.concatenate_p.bind(*[lo_(x) for x in xs], **p),
                                               lax.concatenate_p.bind(*[hi_(x) for x in xs], **p)),
      "pad": lambda ctx, x, v, **p: _iv(lax.pad_p.bind(lo_(x), lo_(v), **p),
                                        lax.pad_p.bind(hi_(x), hi_(v), **p)),
      "dynamic_update_slice": lambda ctx, x, u, *idx, **p: _iv(
          lax.dynamic_update_slice_p.bind(lo_(x), lo_(u), *idx, **p),
          lax.dynamic_update_slice_p.bind(hi_(x), hi_(u), *idx, **p)),
      "split": lambda ctx, x, **p: [
          _iv(a, b) for a, b in zip(lax.split_p.bind(x.lower, **p), lax.split_p.bind(x.upper, **p))],
  }
  indexed = {"gather", "dynamic_slice", "scatter"}
  for name in sorted(primitives.DATA_MOVEMENT - set(r) - indexed):
    r[name] = several[name] if name in several else _structural(_p(name))
  # (no rule for ``real``: a box is never complex and no rule produces complex values)
  r["gather"] = _indexed(lax.gather_p, _gather_bounded_index)
  r["dynamic_slice"] = _indexed(lax.dynamic_slice_p, _dynamic_slice_bounded_index)
  r["sort"] = _sort
  r["scatter-add"] = _scatter_add(1)
  r["scatter-sub"] = _scatter_add(-1)
  r["scatter"] = _scatter
  return r


def _scatter_parts(name: str, operand, indices, updates):
  """Checks a scatter's operands: the indices must be concrete; a concrete operand or update
  array becomes a point box."""
  if isinstance(indices, Interval):
    raise UnsupportedPrimitiveError(
        f"'{name}' with bounded indices is not supported (only its operand and updates may be "
        "bounded)")
  as_box = lambda v: v if isinstance(v, Interval) else _iv(v, v)  # noqa: E731
  return as_box(operand), as_box(updates)


def _scatter_add(sign: int):
  """``scatter-add`` (``sign = 1``, ``x.at[i].add(u)``) and ``scatter-sub``: increasing in the
  operand and (decreasing for ``sub``) in the updates, so ``[f(l_x, l_u), f(u_x, u_u)]`` (ends
  of the updates swapped for ``sub``). An entry hit by ``k`` updates is a ``(k + 1)``-term sum
  in some order: ``|error| ≤ sum_error(n, f(|x|, |u|))`` with ``n`` = 1 + the number of
  updates, an upper bound on ``k + 1`` (Higham §3.1; γ is increasing in n)."""
  name = "scatter-add" if sign > 0 else "scatter-sub"
  scatter = lax.scatter_add if sign > 0 else lax.scatter_sub

  def rule(ctx, operand, indices, updates, *, dimension_numbers, mode, **params):
    x, u = _scatter_parts(name, operand, indices, updates)
    u_lo, u_hi = (u.lower, u.upper) if sign > 0 else (u.upper, u.lower)
    # (the lax functions, not `bind`: the equation's combiner is typed for its own dtype, and
    # the sound mode of a low-precision equation runs this rule in float32)
    bind = lambda f, a, b: f(a, indices, b, dimension_numbers, mode=mode)  # noqa: E731
    lo, hi = bind(scatter, x.lower, u_lo), bind(scatter, x.upper, u_hi)
    if not ctx.sound or not jnp.issubdtype(lo.dtype, jnp.floating):
      return _finish(ctx, lo, hi)
    mag = bind(lax.scatter_add, _mag(x), _mag(u))
    return _finish(ctx, lo, hi, 1, rounding.sum_error(1 + u.lower.size, mag, lo.dtype))
  return rule


def _dtype_range(dtype) -> tuple:
  """The least and the greatest value of ``dtype`` (±inf for floats)."""
  if jnp.issubdtype(dtype, jnp.floating):
    return -jnp.inf, jnp.inf
  if dtype == jnp.bool_:
    return False, True
  info = jnp.iinfo(dtype)
  return info.min, info.max


def _scatter(ctx, operand, indices, updates, *, dimension_numbers, mode, **params):
  """``scatter`` (``x.at[i].set(u)``): an entry no update hits keeps the operand's box; an entry
  hit by one or more updates holds one of them (which one is left to XLA when indices repeat),
  so its box is the hull of those updates' boxes, ``[min l_u, max u_u]`` (by `lax.scatter_min`
  and `lax.scatter_max` with the same indices and mode). Data movement: no rounding."""
  x, u = _scatter_parts("scatter", operand, indices, updates)
  kw = dict(dimension_numbers=dimension_numbers, mode=mode)
  hit = lax.scatter(jnp.zeros(x.lower.shape, bool), indices, jnp.ones(u.lower.shape, bool), **kw)
  least, most = _dtype_range(u.lower.dtype)
  lo = lax.scatter_min(jnp.full(x.lower.shape, most, x.lower.dtype), indices, u.lower, **kw)
  hi = lax.scatter_max(jnp.full(x.upper.shape, least, x.upper.dtype), indices, u.upper, **kw)
  return _iv(jnp.where(hit, lo, x.lower), jnp.where(hit, hi, x.upper))


def _sort(ctx, *operands, **params):
  if len(operands) != 1:
    raise UnsupportedPrimitiveError("'sort' of several bounded operands (argsort) is not supported")
  (x,) = operands
  return [_iv(lax.sort_p.bind(x.lower, **params)[0], lax.sort_p.bind(x.upper, **params)[0])]


RULES = {**_build_rules(), **nn.INTERVAL_RULES}


def _snap(v):
  """Sound mode: a float box's subnormal ends move out of the subnormal range
  (`boundjax.core.rounding.snap_outward`: XLA CPU reads them as 0); a concrete float operand holding a
  subnormal becomes the box around it. Tracers of concrete operands are left alone (their values
  are unknown; see the weak points in the module docstring)."""
  if isinstance(v, Interval):
    if jnp.issubdtype(v.dtype, jnp.floating):
      return _iv(*rounding.snap_outward(v.lower, v.upper))
    return v
  if isinstance(v, jax.core.Tracer) or not hasattr(v, "dtype"):
    return v
  if not jnp.issubdtype(jnp.result_type(v), jnp.floating):
    return v
  a = np.asarray(v)
  tiny = np.finfo(a.dtype).tiny if a.dtype.kind == "f" else 0
  if a.dtype.kind == "f" and np.any((a != 0) & (np.abs(a) < tiny)):
    return _iv(*rounding.snap_outward(jnp.asarray(v), jnp.asarray(v)))
  return v


def _is_low(dtype) -> bool:
  """bfloat16 / float16 (and other floats narrower than 32 bits)."""
  try:
    return jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32
  except TypeError:
    return False


def _raise_low(v):
  """A low-precision float box or array raised to float32 (exactly: every bfloat16/float16
  number is a float32 number); other values unchanged."""
  if isinstance(v, Interval):
    if _is_low(v.dtype):
      return _iv(v.lower.astype(jnp.float32), v.upper.astype(jnp.float32))
    return v
  if hasattr(v, "dtype") and _is_low(jnp.result_type(v)):
    return jnp.asarray(v).astype(jnp.float32)
  return v


def _round_outward_to(iv: Interval, dtype) -> Interval:
  """A float32 box rounded outward to ``dtype`` (rounding to nearest is monotone; one step of
  ``nextafter`` where it went inward), its subnormal ends snapped outward."""
  lo, hi = iv.lower.astype(dtype), iv.upper.astype(dtype)
  lo = jnp.where(lo.astype(jnp.float32) > iv.lower, jnp.nextafter(lo, jnp.asarray(-jnp.inf, dtype)),
                 lo)
  hi = jnp.where(hi.astype(jnp.float32) < iv.upper, jnp.nextafter(hi, jnp.asarray(jnp.inf, dtype)),
                 hi)
  return _iv(*rounding.snap_outward(lo, hi))


_NATIVE_LOW = frozenset({"convert_element_type", "reduce_precision"})
"""Rules whose meaning is the rounding to a format itself: evaluated in their own dtypes."""


def sound_low_precision(ctx, rule, eqn: prog_lib.Eqn, invals: list):
  """Sound mode with bfloat16/float16 operands or outputs: the rule runs in float32 (its error
  budgets are float32's; XLA's own low-precision library functions can be several of their ulps
  off, e.g. bfloat16 ``exp2``) and the result is rounded outward to the equation's dtype. The
  exact real-number value of the operation lies in the float32 bound, hence in the rounded one."""
  params = {k: (np.dtype(np.float32) if not isinstance(v, bool) and _is_low_param(v) else v)
            for k, v in eqn.params.items()}
  out = rule(ctx, *[_raise_low(v) for v in invals], **params)
  if out is NotImplemented:
    return out
  outs = list(out) if eqn.prim.multiple_results else [out]
  res = [_round_outward_to(o, var.aval.dtype) if isinstance(o, Interval) and _is_low(
      var.aval.dtype) else o for o, var in zip(outs, eqn.outvars)]
  return res if eqn.prim.multiple_results else res[0]


def _is_low_param(v) -> bool:
  try:
    return isinstance(v, (np.dtype, type)) and _is_low(v)
  except Exception:  # pragma: no cover - exotic parameter values
    return False


def abstract_eqn(ctx: IntervalContext, eqn: prog_lib.Eqn, invals: list) -> list:
  """Bounds one box-dependent equation with its rule (a composite whose rule declines is
  bounded through its body). A NaN end of a rule's result (an operation outside its real
  domain, ``inf − inf`` on boxes with infinite ends) becomes the full line (`_no_nan`)."""
  rule = RULES.get(eqn.name)
  if rule is None:
    raise prog_lib.unsupported("interval", eqn, RULES)
  if ctx.sound:  # one snapped box per object: a variable read twice stays one variable
    snapped = {}
    invals = [snapped.setdefault(id(v), _snap(v)) if isinstance(v, Interval) else _snap(v)
              for v in invals]
  low = ctx.sound and eqn.name not in _NATIVE_LOW and (
      any(_is_low(v.aval.dtype) for v in eqn.outvars)
      or any(_is_low(jnp.result_type(lo_(v))) for v in invals if hasattr(lo_(v), "dtype")))
  saved, _FINISHED.boxes = _FINISHED.boxes, []
  try:
    out = sound_low_precision(ctx, rule, eqn, invals) if low else \
        rule(ctx, *invals, **eqn.params)
  except UnsupportedPrimitiveError as e:
    raise UnsupportedPrimitiveError(f"{e} (at {eqn.where()})") from None
  finally:
    finished, _FINISHED.boxes = _FINISHED.boxes, saved
  if out is NotImplemented:
    body = prog_lib.expand(eqn, [isinstance(v, Interval) for v in invals],
                           precision_highest=ctx.sound)
    return evaluate(body, invals, ctx, guard_inputs=False)   # (boxes already NaN-free)
  outs = list(out) if eqn.prim.multiple_results else [out]
  return [_iv(*no_nan(o.lower, o.upper)) if isinstance(o, Interval) and jnp.issubdtype(
      o.dtype, jnp.floating) and not any(o is f for f in finished) else o for o in outs]


def evaluate(program: prog_lib.Program, inputs: list, ctx: IntervalContext, *,
             guard_inputs: bool = True) -> list:
  """Interval bounds of every output of ``program`` (inputs: arrays and Intervals). Each box
  input gets its own object, so the same `Interval` passed twice stays two variables for the
  rules that compare operands by identity (``x == x``).

  No box of the result has a NaN end: the input boxes pass `no_nan` here (``guard_inputs``;
  under ``jit`` an `Interval` is not validated) and every rule's result in `abstract_eqn`, so
  `boundjax.ibp` need not guard its outputs again (``check_outputs(..., nan_free=True)``).
  """
  inputs = [_iv(*no_nan(v.lower, v.upper)) if guard_inputs and isinstance(v, Interval)
            and jnp.issubdtype(v.dtype, jnp.floating) else
            _iv(v.lower, v.upper) if isinstance(v, Interval) else v for v in inputs]
  return prog_lib.evaluate(program, inputs, functools.partial(abstract_eqn, ctx))

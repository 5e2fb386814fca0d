"""The difference domain: bounds on ``N#(x) - N(x)`` for two parameter sets on one input box.

LUCID, §5.4 and §6.2. ``difference(fn)(params_ref, params_other, *args)``
evaluates ``fn`` twice at once, with the reference parameters ``params_ref`` (N) and with
``params_other`` (N#: one concrete member, or a hyper-network whose leaves are `Interval`s), on
the *same* arguments; arguments may hold `Interval` input boxes. Every value that depends on the
parameters or on a box carries three intervals, a `DiffInterval`:

* ``ref``   encloses N's value (it is exactly what ``bj.ibp`` gives for N),
* ``other`` encloses N#'s value (interval arithmetic, refined by ``ref + delta``),
* ``delta`` encloses ``N#(x) - N(x)`` for the same ``x``: much tighter than ``other - ref``
  when the two parameter sets are close, because the shared input cancels.

Rules (``r, o, d`` = ref, other, delta of an operand; a concrete operand ``c`` has ``d = 0``):

* linear and structural ops ``f`` (add, sub, neg, mul/div by a constant, reshape, broadcast,
  transpose, slices, concatenate, pad, reduce_sum, average pooling, ...): ``f(x#) - f(x) =
  f(x# - x)``, so each of ``r, o, d`` goes through the interval rule of ``f``.
* bilinear ops ``B`` (dot_general, conv_general_dilated, mul of two dependent operands) use an
  exact identity evaluated in interval arithmetic. There are two:

      (F1)  B(x#, y#) - B(x, y) = B(x#, y# - y) + B(x# - x, y)   ->  B(o_x, d_y) + B(d_x, r_y)
      (F2)  B(x#, y#) - B(x, y) = B(x# - x, y#) + B(x, y# - y)   ->  B(d_x, o_y) + B(r_x, d_y)

  For a layer ``B(h, W)`` F1 is the paper's formula ``I_w (z + I_z) + w I_z`` (with ``z + I_z``
  replaced by N#'s own, refined enclosure ``o_h``): N's *point* weights multiply the input
  difference, an exact product. F2 instead multiplies the input difference by the interval
  weights ``W#`` and adds ``w(W#) |d_h|`` to the width, so F1 is the tighter one whenever the
  reference weights are concrete. Both are exact identities, so any intersection is sound;
  ``form="both"`` (default) intersects them (twice the products, robust to operand order, e.g.
  ``W @ h``), ``form="paper"`` uses the form in which the operand with a concrete reference
  value multiplies the other's difference (F1 for ``B(h, W)``).
* ``max(x, c)`` with a concrete ``c`` (ReLU is ``max(x, 0)``, also inside ``custom_jvp``): by
  monotonicity and 1-Lipschitzness ``max(x#, c) - max(x, c) ∈ [min(0, d_l), max(0, d_u)]``
  (LUCID, §6.2), refined soundly: both stably below ``c`` -> 0; both stably above -> ``d``; only
  N above: ``max(d, c - x) ∈ [max(d_l, c - u), max(d_u, c - l)]``; only N# above:
  ``min(d, x# - c) ∈ [min(d_l, l# - c), min(d_u, u# - c)]``. ``max`` of two dependent operands:
  ``[min(d_x_l, d_y_l), max(d_x_u, d_y_u)]``. ``min`` by symmetry; ``reduce_max`` and max
  pooling likewise (``[min d_l, max d_u]`` over the window).
* Refinement: before every non-linear rule and after every bilinear/non-linear rule,
  ``o ∩= r + d`` and ``d ∩= o - r`` (sound: ``o`` and ``r + d`` both enclose N#'s value); ``r`` is
  never changed, so ``ref`` is N's plain IBP bound.

Bias is included, as in LUCID, §6.2 (the authors' public code drops ``I_b``). Everything is
ordinary JAX: the result can be jitted, vmapped and differentiated.

Arguments may also be `DiffInterval`s: a value that already differs between the two networks
(its ``ref``, ``other`` and ``delta`` enclosures are given), e.g. the input of a network's
suffix. `tighten` applies the refinement above to a `DiffInterval`, and `meet`
intersects one with enclosures known from elsewhere.

Known bounds at ReLU nodes (``known=``, one entry per distinct box-dependent input ``z`` of a
``max(z, c)``/``min(z, c)``, `boundjax.core.program.relu_nodes`, the nodes of ``bj.crown``'s
``pre``): where the node's value is computed, each of its three enclosures is met with the given
one (e.g. N's CROWN or LP bounds, N#'s own bounds) and refined, so every later layer starts from
the tighter enclosures; ``return_info=True`` also returns every node's enclosures
(`DifferenceInfo`). This is how a caller with bounds of its own bounds a whole network in one call
(LUCID, §6.2, with N's bounds from its MILP tightening).

Floating point: by default, like ``bj.ibp`` without ``sound=True``, bounds hold up to the
rounding of the working precision. With ``sound=True`` every bound is rounded outward so it holds
in exact arithmetic: the interval rules run in their sound mode (Higham's ``γ_n Σ|a_k b_k|`` for
sums and products, `boundjax.core.rounding`), and the domain's own arithmetic (the sums of the
bilinear identity, the refinement ``r + d``, ``o - r``, the ReLU case bounds ``c - u``, and the
parameter difference ``q - p``) is one correctly rounded operation per entry, rounded outward by
`boundjax.core.rounding.outward`; a difference of two concrete parameters is then an interval, never a
float array. Box ends are not snapped out of the subnormal range (no subnormal arises from
float32 data in float64).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from boundjax.core import primitives, rounding
from boundjax.core import program as prog_lib
from boundjax.domains import interval as interval_domain
from boundjax.core.errors import UnsupportedPrimitiveError
from boundjax.core.interval import Interval, bilinear_midrad, bilinear_signsplit, is_interval, lower_of, \
    mul_bounds, upper_of, validate_arguments

lo_, hi_ = lower_of, upper_of
FORMS = ("both", "paper")


@jax.tree_util.register_pytree_node_class
class DiffInterval:
  """Three enclosures of one value of ``fn`` (all `Interval`, same shape):

  Attributes:
    ref: N's value (``params_ref``), as ``bj.ibp`` bounds it.
    other: N#'s value (``params_other``; any network in the hyper-network's box).
    delta: ``N#(x) - N(x)`` for the same input ``x``, over the input box and parameter box.
  """

  __slots__ = ("ref", "other", "delta")

  def __init__(self, ref: Interval, other: Interval, delta: Interval):
    self.ref, self.other, self.delta = ref, other, delta

  def tree_flatten(self):
    return (self.ref, self.other, self.delta), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    del aux
    return cls(*children)

  @property
  def shape(self) -> tuple[int, ...]:
    return self.ref.shape

  def naive_delta(self) -> Interval:
    """``other - ref`` (what subtracting two separate enclosures gives)."""
    return Interval(self.other.lower - self.ref.upper, self.other.upper - self.ref.lower,
                    validate=False)

  def __repr__(self) -> str:
    return f"DiffInterval(ref={self.ref!r}, other={self.other!r}, delta={self.delta!r})"


@dataclasses.dataclass(frozen=True)
class _DV:
  """Internal abstract value: components are arrays (exact) or Intervals; ``d`` None means the
  value is identical in both networks (``o is r``)."""
  r: Any
  o: Any
  d: Any


@dataclasses.dataclass(frozen=True)
class DifferenceContext:
  """Options: ``matmul`` for interval products (see `IntervalContext`), ``form`` of the
  bilinear identity ("both" or "paper", see the module docstring), ``sound`` outward rounding,
  ``memory_bytes`` the budget of one ``matmul="exact"`` product's temporaries."""
  matmul: str = "best"
  form: str = "both"
  sound: bool = False
  memory_bytes: int = 1 << 30

  def __post_init__(self):
    if self.form not in FORMS:
      raise ValueError(f"form must be one of {FORMS}, got {self.form!r}")
    object.__setattr__(self, "interval", interval_domain.IntervalContext(
        matmul=self.matmul, sound=self.sound, memory_bytes=self.memory_bytes))


def _out(ctx: DifferenceContext, lo, hi) -> Interval:
  """``[lo, hi]`` from one correctly rounded operation per end, rounded outward in sound mode
  (`boundjax.core.rounding.outward`: at least one ulp and ``finfo.tiny``)."""
  if ctx.sound and jnp.issubdtype(jnp.result_type(lo), jnp.floating):
    lo, hi = rounding.outward(lo, hi, ulps=1)
  return _iv(lo, hi)


def _is_dv(x) -> bool:
  return isinstance(x, _DV)


def _lift(x) -> _DV:
  return x if _is_dv(x) else _DV(x, x, None)


def _iv(lo, hi) -> Interval:
  return Interval(lo, hi, validate=False)


def _shape(a) -> tuple:
  return tuple(jnp.shape(lo_(a)))


def _dtype(a):
  return jnp.result_type(lo_(a))


def _zeros_like(a):
  return jnp.zeros(_shape(a), _dtype(a))


def _apply(ctx: DifferenceContext, name: str, prim, comps, params):
  """One primitive on interval-or-array components: the interval rule, or plain JAX."""
  if any(isinstance(c, Interval) for c in comps):
    return interval_domain.RULES[name](ctx.interval, *comps, **params)
  return prim.bind(*comps, **params)


def _add(a, b, ctx: DifferenceContext | None = None):
  """Interval/array sum with None as an exact zero (rounded outward when ``ctx.sound``; a sum of
  two arrays is N's or N#'s own concrete computation and stays an array)."""
  if a is None:
    return b
  if b is None:
    return a
  if not isinstance(a, Interval) and not isinstance(b, Interval):
    return a + b
  lo, hi = lo_(a) + lo_(b), hi_(a) + hi_(b)
  return _out(ctx, lo, hi) if ctx is not None else _iv(lo, hi)


def _neg(a):
  if a is None or not isinstance(a, Interval):
    return None if a is None else -a
  return _iv(-a.upper, -a.lower)


def _meet(a, lo, hi):
  """``a ∩ [lo, hi]`` for an Interval ``a`` (arrays are exact and stay)."""
  if not isinstance(a, Interval):
    return a
  nl = jnp.maximum(a.lower, lo)
  nh = jnp.minimum(a.upper, hi)
  return _iv(nl, jnp.maximum(nh, nl))  # only crossing by rounding


def _tighten(v: _DV, ctx: DifferenceContext | None = None) -> _DV:
  """``o ∩= r + d``, then ``d ∩= o - r`` (both sound: the three enclose matching values; the
  sums rounded outward when ``ctx.sound``)."""
  if v.d is None:
    return v
  r, o, d = v.r, v.o, v.d
  sound = ctx is not None and ctx.sound
  s = _out(ctx, lo_(r) + lo_(d), hi_(r) + hi_(d)) if sound else None
  o = _meet(o, *((s.lower, s.upper) if sound else (lo_(r) + lo_(d), hi_(r) + hi_(d))))
  t = _out(ctx, lo_(o) - hi_(r), hi_(o) - lo_(r)) if sound else None
  d = _meet(d, *((t.lower, t.upper) if sound else (lo_(o) - hi_(r), hi_(o) - lo_(r))))
  return _DV(r, o, d)


def _broadcast(a, shape):
  if a is None or _shape(a) == tuple(shape):
    return a
  if isinstance(a, Interval):
    return _iv(jnp.broadcast_to(a.lower, shape), jnp.broadcast_to(a.upper, shape))
  return jnp.broadcast_to(a, shape)


# ----------------------------------------------------------------------------------------------
# linear and structural rules
# ----------------------------------------------------------------------------------------------

def _linear(name: str, n_data: int | None = None, multiple: bool = False,
            index_pos: tuple = ()):
  """``f(x#) - f(x) = f(x# - x)``: every component through ``f``'s interval rule.

  ``n_data`` operands carry values (the rest, e.g. indices, must be concrete); or
  ``index_pos``: the positions of the concrete index operands (a scatter's indices sit
  between its operand and its updates).
  """
  prim = getattr(lax, name.replace("-", "_") + "_p")

  def rule(ctx, *invals, **params):
    if index_pos:
      data = [v for i, v in enumerate(invals) if i not in index_pos]
      rest = [invals[i] for i in index_pos]
      if any(_is_dv(x) for x in rest):
        raise UnsupportedPrimitiveError(
            f"'{name}' with box- or parameter-dependent indices is not supported by the "
            "difference domain")
      at = lambda comps: _in_place(comps, rest, index_pos)  # noqa: E731
      lifted = [_lift(x) for x in data]
      r = _apply(ctx, name, prim, at([l.r for l in lifted]), params)
      if all(l.d is None for l in lifted):
        return _DV(r, r, None)
      o = _apply(ctx, name, prim, at([l.o for l in lifted]), params)
      ds = [l.d if l.d is not None else _zeros_like(l.r) for l in lifted]
      return _DV(r, o, _apply(ctx, name, prim, at(ds), params))
    k = len(invals) if n_data is None else n_data
    data, rest = list(invals[:k]), list(invals[k:])
    if any(_is_dv(x) for x in rest):
      raise UnsupportedPrimitiveError(
          f"'{name}' with box- or parameter-dependent indices is not supported by the "
          "difference domain")
    if name == "convert_element_type" and not jnp.issubdtype(params["new_dtype"], jnp.floating):
      raise UnsupportedPrimitiveError(
          f"'convert_element_type' of a box- or parameter-dependent value to {params['new_dtype']} "
          "is not supported by the difference domain (only float conversions)")
    lifted = [_lift(x) for x in data]
    r = _apply(ctx, name, prim, [l.r for l in lifted] + rest, params)
    if all(l.d is None for l in lifted):
      o, d = r, None
    else:
      o = _apply(ctx, name, prim, [l.o for l in lifted] + rest, params)
      ds = [l.d if l.d is not None else _zeros_like(l.r) for l in lifted]
      d = _apply(ctx, name, prim, ds + rest, params)
    if multiple:
      if d is None:
        return [_DV(a, a, None) for a in r]
      return [_DV(a, b, c) for a, b, c in zip(r, o, d)]
    return _DV(r, o, d)

  return rule


def _in_place(data: list, index: list, index_pos: tuple) -> list:
  """Operands in their original order: ``index`` at ``index_pos``, ``data`` elsewhere."""
  data, index, out = list(data), list(index), []
  for i in range(len(data) + len(index)):
    out.append(index.pop(0) if i in index_pos else data.pop(0))
  return out


def _scatter_rule(ctx, operand, indices, updates, **params):
  """``x.at[i].set(u)``. With ``unique_indices`` it is linear (`_linear`). Otherwise an entry hit
  by several updates holds one of them, and N and N# need not pick the same one (XLA leaves the
  order to the device), so there the difference is that of the two boxes,
  ``[l# - u, u# - l]``; an entry no update hits keeps the operand's difference."""
  linear = _linear("scatter", index_pos=(1,))(ctx, operand, indices, updates, **params)
  if params.get("unique_indices") or linear.d is None:
    return linear
  kw = dict(dimension_numbers=params["dimension_numbers"], mode=params["mode"])
  shape = _shape(linear.r)
  hit = lax.scatter(jnp.zeros(shape, bool), indices, jnp.ones(_shape(_lift(updates).r), bool),
                    **kw)
  both = _out(ctx, lo_(linear.o) - hi_(linear.r), hi_(linear.o) - lo_(linear.r))
  d = _iv(jnp.where(hit, both.lower, lo_(linear.d)), jnp.where(hit, both.upper, hi_(linear.d)))
  return _DV(linear.r, linear.o, d)


def _rounding_error(in_dtype, params) -> tuple[float, float] | None:
  """``(u, tiny)`` of a float conversion that may round (relative error ≤ u, absolute ≤ tiny
  near zero), or None when it is exact (a widening float conversion)."""
  if "new_dtype" in params:  # convert_element_type
    new = jnp.dtype(params["new_dtype"])
    if not jnp.issubdtype(new, jnp.floating):
      return None
    fi_new, fi_in = jnp.finfo(new), jnp.finfo(in_dtype)
    if fi_new.nmant >= fi_in.nmant and fi_new.maxexp >= fi_in.maxexp and \
        fi_new.minexp <= fi_in.minexp:
      return None
    return float(fi_new.eps) / 2, float(fi_new.smallest_subnormal)
  m, e = params["mantissa_bits"], params["exponent_bits"]  # reduce_precision
  return 2.0 ** -(m + 1), 2.0 ** (2 - 2 ** (e - 1) - m)


def _rounding_rule(name: str):
  """A float conversion that rounds (to a narrower float type; ``reduce_precision``):
  ``rnd(x#) − rnd(x) = (x# − x) + e# − e`` with ``|e| ≤ u|x| + tiny`` (round to nearest), so
  ``d' ⊆ d ± (u·(max|r| + max|o|) + 2·tiny)``, rounded outward into the result type and
  intersected with ``o' − r'``. Widening conversions are exact and linear."""
  linear = _linear(name)
  prim = getattr(lax, name + "_p")

  def rule(ctx, x, **params):
    err = _rounding_error(_dtype(lift_r(x)), params)
    if err is None or not _is_dv(x) or x.d is None:
      return linear(ctx, x, **params)
    u, tiny = err
    r = _apply(ctx, name, prim, [x.r], params)
    o = _apply(ctx, name, prim, [x.o], params)
    mag = lambda a: jnp.maximum(jnp.abs(lo_(a)), jnp.abs(hi_(a)))
    e = u * (mag(x.r) + mag(x.o)) * (1 + 4 * u) + 2 * tiny
    d_lo, d_hi = lo_(x.d) - e, hi_(x.d) + e
    if ctx.sound:
      d_lo, d_hi = rounding.outward(d_lo, d_hi, ulps=1)
    out_dtype = _dtype(r)
    d_lo, d_hi = _narrow_outward(d_lo, d_hi, out_dtype)
    return _tighten(_DV(r, o, _iv(d_lo, d_hi)), ctx)

  return rule


def lift_r(x):
  return x.r if _is_dv(x) else x


def _narrow_outward(lo, hi, dtype):
  """``[lo, hi]`` converted to ``dtype`` with the lower end rounded down and the upper up."""
  lo_n, hi_n = lo.astype(dtype), hi.astype(dtype)
  wide = jnp.result_type(lo)
  lo_n = jnp.where(lo_n.astype(wide) > lo, jnp.nextafter(lo_n, jnp.asarray(-jnp.inf, dtype)), lo_n)
  hi_n = jnp.where(hi_n.astype(wide) < hi, jnp.nextafter(hi_n, jnp.asarray(jnp.inf, dtype)), hi_n)
  return lo_n, hi_n


def _add_rule(sign: float):
  name = "add" if sign > 0 else "sub"

  def rule(ctx, x, y, **_):
    x, y = _lift(x), _lift(y)
    if sign < 0:
      y = _DV(_neg(y.r), _neg(y.o), _neg(y.d))
    r = _add(x.r, y.r, ctx)
    if x.d is None and y.d is None:
      return _DV(r, r, None)
    o = _add(x.o, y.o, ctx)
    d = _broadcast(_add(x.d, y.d, ctx), _shape(r))
    return _DV(r, o, d)

  rule.__name__ = f"_{name}"
  return rule


def _neg_rule(ctx, x, **_):
  return _DV(_neg(x.r), _neg(x.o) if x.d is not None else _neg(x.r), _neg(x.d))


def _with_constant(ctx, name: str, prim, x: _DV, c, x_first: bool, params) -> _DV:
  """``f(x, c)`` for a function linear in ``x`` with a concrete second operand ``c`` (mul or
  div by a constant, a product with a concrete matrix): ``f(x#, c) - f(x, c) = f(x# - x, c)``."""
  def f(a):
    if a is None:
      return None
    return _apply(ctx, name, prim, [a, c] if x_first else [c, a], params)
  r = f(x.r)
  if x.d is None:
    return _DV(r, r, None)
  return _DV(r, f(x.o), f(x.d))


def _by_constant(name: str):
  """``mul``/``div`` by a concrete value (linear); ``mul`` of two dependent operands goes to the
  bilinear rule."""
  prim = getattr(lax, name + "_p")

  def rule(ctx, x, y, **params):
    op = _Op(prim, lambda a, b: interval_domain.RULES[name](ctx.interval, a, b, **params),
             params)
    if name == "div" and _is_dv(y):
      raise UnsupportedPrimitiveError(
          "'div' by a box- or parameter-dependent value is not supported by the difference domain")
    if _is_dv(x) and _is_dv(y):
      return _bilinear_rule(ctx, x, y, op=op, elementwise=True)
    if _is_dv(x):
      return _with_constant(ctx, name, prim, x, y, True, params)
    return _with_constant(ctx, name, prim, y, x, False, params)

  return rule


# ----------------------------------------------------------------------------------------------
# bilinear rules
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Op:
  """A bilinear primitive with its parameters: ``op(a, b)`` on arrays, ``op.rule(a, b)`` the
  interval domain's rule (sound in sound mode)."""
  prim: Any
  rule: Callable
  params: dict

  def __call__(self, a, b):
    return self.prim.bind(a, b, **self.params)


def _product(ctx, op, a, b, elementwise: bool):
  """Enclosure of ``op(a, b)`` for interval/array operands (``None`` = exact zero). In sound
  mode a product with an interval operand is the interval domain's sound rule (``op.rule``)."""
  if a is None or b is None:
    return None
  a_iv, b_iv = isinstance(a, Interval), isinstance(b, Interval)
  if not a_iv and not b_iv:
    return op(a, b)
  if ctx.sound:
    return op.rule(a, b)
  if elementwise and a_iv and b_iv:
    return _iv(*mul_bounds(lo_(a), hi_(a), lo_(b), hi_(b)))
  if not (a_iv and b_iv):
    return _iv(*bilinear_midrad(op, a, b))   # exact with a point operand
  mode = ctx.interval.matmul
  if mode == "exact":  # the interval domain's four-corner product, chunked to its budget
    return op.rule(a, b)
  if mode == "signsplit":
    return _iv(*bilinear_signsplit(op, a, b))
  l1, h1 = bilinear_midrad(op, a, b)
  if mode == "midrad":
    return _iv(l1, h1)
  l2, h2 = bilinear_signsplit(op, a, b)
  return _iv(jnp.maximum(l1, l2), jnp.minimum(h1, h2))


def _bilinear_rule(ctx, x, y, *, op: Callable, elementwise: bool = False):
  x, y = _tighten(_lift(x), ctx), _tighten(_lift(y), ctx)
  r = _product(ctx, op, x.r, y.r, elementwise)
  if x.d is None and y.d is None:
    return _DV(r, r, None)
  o = _product(ctx, op, x.o, y.o, elementwise)
  f1 = _add(_product(ctx, op, x.o, y.d, elementwise), _product(ctx, op, x.d, y.r, elementwise),
            ctx)
  f2 = _add(_product(ctx, op, x.d, y.o, elementwise), _product(ctx, op, x.r, y.d, elementwise),
            ctx)
  if ctx.form == "both":
    if isinstance(f1, Interval) and isinstance(f2, Interval):
      d = _meet(f1, f2.lower, f2.upper)
    else:
      d = f1 if not isinstance(f1, Interval) else f2
  else:  # paper: the operand with a concrete reference value multiplies the other's difference
    d = f2 if (not isinstance(x.r, Interval) and isinstance(y.r, Interval)) else f1
  return _tighten(_DV(r, o, _broadcast(d, _shape(r))), ctx)


def _bilinear(name: str):
  prim = getattr(lax, name + "_p")

  def rule(ctx, x, y, **params):
    op = _Op(prim, lambda a, b: interval_domain.RULES[name](ctx.interval, a, b, **params),
             params)
    # one concrete operand (identical in both networks): linear in the other.
    if not _is_dv(y):
      return _with_constant(ctx, name, prim, x, y, True, params)
    if not _is_dv(x):
      return _with_constant(ctx, name, prim, y, x, False, params)
    return _bilinear_rule(ctx, x, y, op=op)

  return rule


# ----------------------------------------------------------------------------------------------
# max / min (ReLU), reductions
# ----------------------------------------------------------------------------------------------

def _relu_delta(d, r, o, c, sound: bool = False):
  """Bounds on ``max(x#, c) - max(x, c)`` (module docstring) as ``(lo, hi)`` arrays; with
  ``sound`` the differences ``c - u``, ``c - l``, ``l# - c``, ``u# - c`` are rounded outward."""
  dl, du = lo_(d), hi_(d)
  l, u = lo_(r), hi_(r)
  lh, uh = lo_(o), hi_(o)
  zero = jnp.zeros_like(dl)
  c_u, c_l, lh_c, uh_c = c - u, c - l, lh - c, uh - c
  if sound:
    c_u = rounding.outward(c_u, c_u)[0]
    c_l = rounding.outward(c_l, c_l)[1]
    lh_c = rounding.outward(lh_c, lh_c)[0]
    uh_c = rounding.outward(uh_c, uh_c)[1]
  lo, hi = jnp.minimum(dl, zero), jnp.maximum(du, zero)
  act, acth = l >= c, lh >= c
  both = act & acth
  lo, hi = jnp.where(both, dl, lo), jnp.where(both, du, hi)
  only_ref = act & ~acth
  lo = jnp.where(only_ref, jnp.maximum(lo, jnp.maximum(dl, c_u)), lo)
  hi = jnp.where(only_ref, jnp.minimum(hi, jnp.maximum(du, c_l)), hi)
  only_hyp = acth & ~act
  lo = jnp.where(only_hyp, jnp.maximum(lo, jnp.minimum(dl, lh_c)), lo)
  hi = jnp.where(only_hyp, jnp.minimum(hi, jnp.minimum(du, uh_c)), hi)
  dead = (u <= c) & (uh <= c)
  lo, hi = jnp.where(dead, zero, lo), jnp.where(dead, zero, hi)
  return lo, hi


def _max_rule(ctx, x, y, **params):
  if not _is_dv(x):
    x, y = y, x
  x = _tighten(x, ctx)
  r = _apply(ctx, "max", lax.max_p, [x.r, _lift(y).r], params)
  if not _is_dv(y):  # max(x, c): a ReLU-type unit
    if x.d is None:
      return _DV(r, r, None)
    o = _apply(ctx, "max", lax.max_p, [x.o, y], params)
    c = jnp.asarray(y, _dtype(x.r))
    lo, hi = _relu_delta(x.d, x.r, x.o, c, ctx.sound)
    return _tighten(_DV(r, o, _iv(lo, hi)), ctx)
  y = _tighten(y, ctx)
  if x.d is None and y.d is None:
    return _DV(r, r, None)
  o = _apply(ctx, "max", lax.max_p, [x.o, y.o], params)
  dx = x.d if x.d is not None else _zeros_like(x.r)
  dy = y.d if y.d is not None else _zeros_like(y.r)
  d = _iv(jnp.minimum(lo_(dx), lo_(dy)), jnp.maximum(hi_(dx), hi_(dy)))
  return _tighten(_DV(r, o, _broadcast(d, _shape(r))), ctx)


def _negate(v):
  if not _is_dv(v):
    return -v
  return _DV(_neg(v.r), _neg(v.o) if v.d is not None else _neg(v.r), _neg(v.d))


def _min_rule(ctx, x, y, **params):
  out = _max_rule(ctx, _negate(x), _negate(y), **params)
  return _negate(out)


def _reduce_max_rule(ctx, x, *, axes, **params):
  x = _tighten(x, ctx)
  r = _apply(ctx, "reduce_max", lax.reduce_max_p, [x.r], dict(axes=axes, **params))
  if x.d is None:
    return _DV(r, r, None)
  o = _apply(ctx, "reduce_max", lax.reduce_max_p, [x.o], dict(axes=axes, **params))
  d = _iv(jnp.min(lo_(x.d), axis=axes), jnp.max(hi_(x.d), axis=axes))
  return _tighten(_DV(r, o, d), ctx)


def _reduce_window_max_rule(ctx, x, **params):
  x = _tighten(x, ctx)
  r = _apply(ctx, "reduce_window_max", lax.reduce_window_max_p, [x.r], params)
  if x.d is None:
    return _DV(r, r, None)
  o = _apply(ctx, "reduce_window_max", lax.reduce_window_max_p, [x.o], params)
  d = _iv(lax.reduce_window_min_p.bind(lo_(x.d), **params),
          lax.reduce_window_max_p.bind(hi_(x.d), **params))
  return _tighten(_DV(r, o, d), ctx)


def _select_n_rule(ctx, pred, *cases, **params):
  if _is_dv(pred):
    raise UnsupportedPrimitiveError(
        "'select_n' with a box- or parameter-dependent predicate is not supported by the "
        "difference domain (N and N# may take different branches)")
  lifted = [_lift(c) for c in cases]
  r = _apply(ctx, "select_n", lax.select_n_p, [pred] + [l.r for l in lifted], params)
  if all(l.d is None for l in lifted):
    return _DV(r, r, None)
  o = _apply(ctx, "select_n", lax.select_n_p, [pred] + [l.o for l in lifted], params)
  ds = [l.d if l.d is not None else _zeros_like(l.r) for l in lifted]
  d = _apply(ctx, "select_n", lax.select_n_p, [pred] + ds, params)
  return _DV(r, o, d)


def _negated(max_rule: Callable) -> Callable:
  """A minimum's rule from the maximum's: ``min f(x) = -max f(-x)`` (exact negations)."""
  def rule(ctx, x, **params):
    return _negate(max_rule(ctx, _negate(x), **params))
  return rule


def _identity(ctx, x, **_):
  return x


def _identities(ctx, *xs, **_):
  return list(xs)


# ----------------------------------------------------------------------------------------------
# the table
# ----------------------------------------------------------------------------------------------

def _build_rules() -> dict[str, Callable]:
  r: dict[str, Callable] = {
      "add": _add_rule(1.0), "add_any": _add_rule(1.0), "sub": _add_rule(-1.0), "neg": _neg_rule,
      "mul": _by_constant("mul"), "div": _by_constant("div"),
      "dot_general": _bilinear("dot_general"),
      "conv_general_dilated": _bilinear("conv_general_dilated"),
      "max": _max_rule, "min": _min_rule,
      "reduce_max": _reduce_max_rule, "reduce_window_max": _reduce_window_max_rule,
      "reduce_min": _negated(_reduce_max_rule),
      "reduce_window_min": _negated(_reduce_window_max_rule),
      "select_n": _select_n_rule,
  }
  for name in primitives.IDENTITY:  # copies and hints: the value itself
    r[name] = _identities if name in primitives.SEVERAL_RESULTS else _identity
  r["convert_element_type"] = _rounding_rule("convert_element_type")
  r["reduce_precision"] = _rounding_rule("reduce_precision")
  for name in ("dynamic_slice", "gather"):
    r[name] = _linear(name, n_data=1)
  r["dynamic_update_slice"] = _linear("dynamic_update_slice", n_data=2)
  r["split"] = _linear("split", multiple=True)
  for name in ("scatter-add", "scatter-sub"):
    r[name] = _linear(name, index_pos=(1,))
  r["scatter"] = _scatter_rule
  # every other linear primitive (`boundjax.core.primitives.LINEAR`): f(x#) - f(x) = f(x# - x)
  for name in sorted(primitives.LINEAR - set(r)):
    r[name] = _linear(name)
  r["real"] = _linear("real")
  return r


RULES = _build_rules()


def abstract_eqn(ctx: DifferenceContext, eqn: prog_lib.Eqn, invals: list) -> list:
  """Bounds one equation reading a `_DV` with its rule; a composite (softmax, ...) without a
  difference rule is bounded through its body."""
  rule = RULES.get(eqn.name)
  if rule is None:
    from boundjax.core import composite
    if eqn.prim in composite.BODIES:
      body = prog_lib.expand(eqn, [_is_dv(v) for v in invals])
      return prog_lib.evaluate(body, invals, functools.partial(abstract_eqn, ctx))
    raise prog_lib.unsupported("difference", eqn, RULES)
  try:
    out = rule(ctx, *invals, **eqn.params)
  except UnsupportedPrimitiveError as e:
    raise UnsupportedPrimitiveError(f"{e} (at {eqn.where()})") from None
  return list(out) if eqn.prim.multiple_results else [out]


# ----------------------------------------------------------------------------------------------
# the transform
# ----------------------------------------------------------------------------------------------

def _param_value(p, q, ctx: DifferenceContext | None = None):
  """The abstract value of one parameter leaf: N's ``p`` and N#'s ``q`` (arrays or Intervals).
  In sound mode the difference ``q - p`` is an interval rounded outward."""
  p_iv, q_iv = isinstance(p, Interval), isinstance(q, Interval)
  sound = ctx is not None and ctx.sound
  if not p_iv and not q_iv:
    if not isinstance(p, jax.core.Tracer) and not isinstance(q, jax.core.Tracer) and np.array_equal(
        np.asarray(p), np.asarray(q)):
      return p
    p, q = jnp.asarray(p), jnp.asarray(q)
    return _DV(p, q, _out(ctx, q - p, q - p) if sound else q - p)
  d = _out(ctx, lo_(q) - hi_(p), hi_(q) - lo_(p)) if sound else \
      _iv(lo_(q) - hi_(p), hi_(q) - lo_(p))
  return _DV(p, q, d)


def _argument_value(v: "DiffInterval") -> _DV:
  """A `DiffInterval` argument as the domain's value (its three enclosures as given)."""
  return _DV(v.ref, v.other, v.delta)


def tighten(v: DiffInterval, *, sound: bool = False) -> DiffInterval:
  """The domain's refinement of one `DiffInterval`: ``other ∩= ref + delta``, then
  ``delta ∩= other - ref`` (sound: all three enclose matching values of N and N#; the sums
  rounded outward with ``sound``). ``ref`` is unchanged."""
  out = _tighten(_argument_value(v), DifferenceContext(sound=sound))
  return DiffInterval(out.r, out.o, out.d)


def _meet_known(a, k: Interval | None):
  """``a ∩ k`` for one enclosure (an exact array ``a``, or a missing ``k``, is kept)."""
  return a if k is None else _meet(a, k.lower, k.upper)


def _know(v: Any, k: "DiffInterval | None", ctx: DifferenceContext | None) -> Any:
  """A node's value met with the enclosures ``k`` known for it, then refined (`_tighten`). A
  value identical in both networks (``d`` None) is met with both ``k.ref`` and ``k.other``."""
  if k is None or not _is_dv(v):
    return v
  r = _meet_known(v.r, k.ref)
  if v.d is None:
    r = _meet_known(r, k.other)
    return _DV(r, r, None)
  return _tighten(_DV(r, _meet_known(v.o, k.other), _meet_known(v.d, k.delta)), ctx)


def meet(v: DiffInterval, known: DiffInterval, *, sound: bool = False) -> DiffInterval:
  """``v``'s three enclosures met with ``known``'s (a None component is unknown), then refined
  as by `tighten`. Sound whenever both enclose the same values of N and N#."""
  out = _know(_argument_value(v), known, DifferenceContext(sound=sound))
  return DiffInterval(out.r, out.o, out.d)


class DifferenceInfo(NamedTuple):
  """Enclosures at the ReLU nodes (`boundjax.core.program.relu_nodes`, program order) of one
  call with ``return_info=True``.

  Attributes:
    pre: per node, the `DiffInterval` of its input ``z`` (met with ``known``, refined).
    post: per node, the `DiffInterval` of the output of its first ``max(z, c)``/``min(z, c)``.
  """
  pre: tuple
  post: tuple


def _check_known(known: Any, nodes: tuple) -> list:
  """``known`` as one `DiffInterval`-or-None per node, shapes checked."""
  if known is None:
    return [None] * len(nodes)
  known = list(known)
  if len(known) != len(nodes):
    raise ValueError(f"difference: known needs one entry per ReLU node ({len(nodes)}), got "
                     f"{len(known)}.")
  for k, (entry, (z, _)) in enumerate(zip(known, nodes)):
    if entry is None:
      continue
    if not isinstance(entry, DiffInterval):
      raise ValueError(f"difference: known[{k}] must be a DiffInterval (components may be None) "
                       f"or None, got {type(entry).__name__}.")
    for name in ("ref", "other", "delta"):
      c = getattr(entry, name)
      if c is None:
        continue
      if not isinstance(c, Interval):
        raise ValueError(f"difference: known[{k}].{name} must be an Interval or None.")
      if tuple(jnp.shape(c.lower)) != z.shape or tuple(jnp.shape(c.upper)) != z.shape:
        raise ValueError(f"difference: known[{k}].{name} has shape {jnp.shape(c.lower)}, the "
                         f"ReLU node has shape {z.shape}.")
  return known


def _check_pair(ref_leaves, oth_leaves, ref_tree, oth_tree) -> None:
  if ref_tree != oth_tree:
    raise ValueError(
        "difference: params_ref and params_other have different structures "
        f"({ref_tree} vs {oth_tree}); they must describe the same architecture.")
  for i, (a, b) in enumerate(zip(ref_leaves, oth_leaves)):
    sa, sb = jnp.shape(lo_(a)), jnp.shape(lo_(b))
    if sa != sb:
      raise ValueError(f"difference: parameter leaf {i} has shape {sa} in params_ref but {sb} "
                       "in params_other.")
    for v in (a, b):
      if isinstance(v, Interval) and jnp.shape(v.lower) != jnp.shape(v.upper):
        raise ValueError(f"difference: parameter leaf {i} is an Interval whose lower and upper "
                         "shapes differ.")


def _output(v):
  if not _is_dv(v):
    return v
  as_iv = lambda a: a if isinstance(a, Interval) else _iv(a, a)
  d = v.d if v.d is not None else _zeros_like(v.r)
  return DiffInterval(as_iv(v.r), as_iv(v.o), as_iv(d))


def difference(fn: Callable, *, matmul: str = "best", form: str = "both",
               sound: bool = False, return_info: bool = False,
               memory_bytes: int = 1 << 30) -> Callable:
  """Difference intervals of ``fn`` between two parameter sets on shared arguments.

  Args:
    fn: ``fn(params, *args, **kwargs)``, e.g. a Flax ``model.apply``.
    matmul: interval product of two boxes ("midrad", "signsplit", "exact", "best"; see
      `boundjax.domains.interval.IntervalContext`). "best" (default) intersects midpoint–radius
      and sign-split.
    form: "both" (default) or "paper": which exact bilinear identity bounds ``d`` (module
      docstring).
    sound: round every bound outward so it holds in exact arithmetic (module docstring).
    return_info: also return a `DifferenceInfo`: the enclosures at every ReLU node.
    memory_bytes: the budget of one ``matmul="exact"`` product's temporaries (as in
      ``bj.ibp``: its rows are taken in chunks that fit; `MemoryBudgetError` when one row
      does not).

  The returned function takes one keyword-only argument of its own (not passed to ``fn``):
  ``known``, one entry per ReLU node (`boundjax.core.program.relu_nodes`; None for none), a
  `DiffInterval` whose components (`Interval`s of the node's shape, or None) are sound
  enclosures of N's value, N#'s value and their difference at that node, met with the computed
  ones where the node is computed (module docstring). The caller vouches for their soundness.

  Returns:
    ``bounded(params_ref, params_other, *args, **kwargs)``: ``params_ref`` is N (arrays; `Interval`
    leaves are allowed and give the difference of two families), ``params_other`` has the same
    structure with array or `Interval` leaves (one member, or a hyper-network), ``args`` may
    contain `Interval` input boxes shared by both, or `DiffInterval`s (a value that already
    differs between the two networks, with its three enclosures given). Output leaves that depend on a box or on a
    parameter that differs are `DiffInterval`; the others are arrays.

  Raises:
    ValueError: the two parameter trees differ in structure or leaf shapes, or ``known``
      does not match the ReLU nodes.
    UnsupportedPrimitiveError: ``fn`` uses a primitive with no difference rule.
  """
  if not isinstance(sound, bool):
    raise ValueError(f"difference: sound must be a bool, got {sound!r}")
  ctx = DifferenceContext(matmul=matmul, form=form, sound=sound, memory_bytes=memory_bytes)

  @functools.wraps(fn)
  def bounded(params_ref, params_other, *args, **kwargs):
    known = kwargs.pop("known", None)
    ref_leaves, ref_tree = jax.tree_util.tree_flatten(params_ref, is_leaf=is_interval)
    oth_leaves, oth_tree = jax.tree_util.tree_flatten(params_other, is_leaf=is_interval)
    _check_pair(ref_leaves, oth_leaves, ref_tree, oth_tree)
    given: dict = {}  # a DiffInterval argument is traced as a box of its shape (a fresh object)

    def stand_in(v):
      if not isinstance(v, DiffInterval):
        return v
      box = _iv(v.ref.lower, v.ref.upper)
      given[id(box)] = v
      return box

    args, kwargs = jax.tree_util.tree_map(
        stand_in, (args, kwargs), is_leaf=lambda v: isinstance(v, DiffInterval) or is_interval(v))
    arguments = prog_lib.split_arguments((params_ref,) + args, kwargs)
    validate_arguments(arguments.leaves + oth_leaves
                       + [c for v in given.values() for c in (v.other, v.delta)],
                       where="bj.difference")
    n_p = len(ref_leaves)
    values = []
    for i in arguments.dynamic_index:
      leaf = arguments.leaves[i]
      if i < n_p:
        values.append(_param_value(leaf, oth_leaves[i], ctx))
      elif id(leaf) in given:
        values.append(_argument_value(given[id(leaf)]))
      else:
        values.append(_DV(leaf, leaf, None) if is_interval(leaf) else leaf)
    program = prog_lib.trace(fn, arguments)
    prog_lib.mark_dependence(program, [_is_dv(v) for v in values])
    nodes = prog_lib.relu_nodes(program)
    known = _check_known(known, nodes)
    node_of = {z: k for k, (z, _) in enumerate(nodes)}
    first_use = {id(program.eqns[i]): k for k, (_, i) in enumerate(nodes)}
    pre, post = [None] * len(nodes), [None] * len(nodes)

    def step(eqn, invals):
      outs = abstract_eqn(ctx, eqn, invals)
      for j, z in enumerate(eqn.outvars):
        if z in node_of:
          k = node_of[z]
          outs[j] = pre[k] = _know(outs[j], known[k], ctx)
      if id(eqn) in first_use:
        post[first_use[id(eqn)]] = outs[0]
      return outs

    for j, z in enumerate(program.invars):  # a node that is an argument itself
      if z in node_of:
        k = node_of[z]
        values[j] = pre[k] = _know(values[j], known[k], ctx)
    outs = prog_lib.evaluate(program, values, step)
    outs = prog_lib.check_outputs([_output(o) for o in outs], where="bj.difference",
                                  program=program)
    out = jax.tree_util.tree_unflatten(program.out_tree, outs)
    if not return_info:
      return out
    return out, DifferenceInfo(tuple(_output(v) for v in pre), tuple(_output(v) for v in post))

  return bounded

"""CROWN's knowledge of primitives: one `OpRecord` per primitive (`OPS`), the linear
relaxations of nonlinear operations (`Lines`), the classification of a flat program's equations
(`classify_program`) and the ReLU lines. See the package docstring for the method."""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src.lax import lax as lax_internal  # copy_p is not exported by jax.lax

from boundjax.core import budgets
from boundjax.core import primitives, rounding
from boundjax.core import program as prog_lib
from boundjax.core.program import Lit as _Lit, Var as _Var
from boundjax.domains import interval as interval_domain
from boundjax.core.errors import UnsupportedPrimitiveError




INTERMEDIATE_MODES = ("crown", "ibp")


# ----------------------------------------------------------------------------------------------
# Linear relaxations of nonlinear operations
# ----------------------------------------------------------------------------------------------
#
# A relaxation of ``y = f(x_1, ..., x_k)`` on the box ``x_p ∈ [l_p, u_p]`` is a pair of linear
# functions ``L_lo(x) + b_lo <= y <= L_up(x) + b_up`` valid on the whole box (CROWN, Zhang et al.
# 2018, §3.2 and appendix; auto_LiRPA, Xu et al. 2020, §3). Elementwise operations give one
# slope per entry (``L(x) = a ⊙ x``); a pooling maximum gives a selection map. `Lines` holds,
# per relaxed operand, either an array of slopes (the output's shape) or a callable applying
# ``Lᵀ`` to a row of ``Λ`` (None: a zero map).

@dataclasses.dataclass
class Lines:
  """``Σ_p lo[p](x_p) + b_lo <= y <= Σ_p up[p](x_p) + b_up`` on the box."""
  lo: list
  b_lo: Any
  up: list
  b_up: Any


def _safe_div(a, b):
  return a / jnp.where(b == 0, 1.0, b)


def _tangent(f, df, d):
  """Slope and intercept of the tangent of ``f`` at ``d``: ``f(d) + f'(d)(x - d)``."""
  a = df(d)
  return a, f(d) - a * d


def _chord(f, l, u):
  """Slope and intercept of the chord of ``f`` between ``l`` and ``u``."""
  fl, fu = f(l), f(u)
  a = _safe_div(fu - fl, u - l)
  return a, fl - a * l


def _convex(f, df):
  """Convex ``f``: upper line the chord, lower line the tangent at the midpoint (CROWN §3.2)."""
  def lines(l, u):
    a_up, b_up = _chord(f, l, u)
    a_lo, b_lo = _tangent(f, df, (l + u) / 2)
    return a_lo, b_lo, a_up, b_up
  return lines


def _concave(f, df):
  """Concave ``f``: lower line the chord, upper line the tangent at the midpoint."""
  def lines(l, u):
    a_lo, b_lo = _chord(f, l, u)
    a_up, b_up = _tangent(f, df, (l + u) / 2)
    return a_lo, b_lo, a_up, b_up
  return lines


def _bisect(pred, lo, hi, steps: int = 30):
  """Elementwise bisection keeping ``pred(hi)`` true (``pred`` monotone: false at lo side)."""
  def body(_, st):
    a, b = st
    mid = (a + b) / 2
    ok = pred(mid)
    return jnp.where(ok, a, mid), jnp.where(ok, mid, b)
  return lax.fori_loop(0, steps, body, (lo, hi))[1]


def _s_shaped(f, df, far: float = 10.0, ulps: int = 64):
  """An increasing ``f`` convex on ``x <= 0`` and concave on ``x >= 0`` (tanh, logistic, erf,
  atan): CROWN's construction (Zhang et al. 2018, §3.2, "general activations").

  * ``u <= 0``: convex part: chord above, tangent at the midpoint below.
  * ``l >= 0``: concave part: chord below, tangent at the midpoint above.
  * ``l < 0 < u``: upper line the tangent at ``d >= 0`` that passes above ``(l, f(l))``:
    ``g(d) = f(d) + f'(d)(l - d) - f(l)`` is non-decreasing in ``d >= 0`` (``g' = f''(d)(l - d)
    >= 0``), so bisection on ``[0, max(u, far)]`` keeping ``g >= 0`` finds one. It is valid: on
    ``[0, ∞)`` a tangent of the concave part lies above ``f``; on ``[l, 0]`` the line minus
    ``f`` is concave and non-negative at both ends. The lower line is the mirror image (tangent
    at ``d <= 0`` passing below ``(u, f(u))``). Where the chord itself is a valid line it
    replaces the tangent (`_chord_holds`): it is then the tightest line on the box
    (auto_LiRPA, Xu et al. 2020, keeps it too). Lines that fail their end-point check are
    replaced by constants by the caller.
  """
  convex, concave = _convex(f, df), _concave(f, df)

  def lines(l, u):
    c_lines = convex(l, u)
    k_lines = concave(l, u)
    fl, fu = f(l), f(u)
    hi0 = jnp.maximum(u, far)
    d_up = _bisect(lambda d: f(d) + df(d) * (l - d) >= fl, jnp.zeros_like(l), hi0)
    lo0 = jnp.minimum(l, -far)
    d_lo = _bisect(lambda d: f(d) + df(d) * (u - d) <= fu, jnp.zeros_like(u), lo0)
    a_up, b_up = _tangent(f, df, d_up)
    a_lo, b_lo = _tangent(f, df, d_lo)
    left, right = u <= 0, l >= 0
    chord_lo, chord_up = _chord_holds(df, l, u, fl, fu, ulps)
    c_a, c_b = c_lines[2], c_lines[3]                     # the chord (the convex part's upper)
    a_lo, b_lo = jnp.where(chord_lo, c_a, a_lo), jnp.where(chord_lo, c_b, b_lo)
    a_up, b_up = jnp.where(chord_up, c_a, a_up), jnp.where(chord_up, c_b, b_up)
    pick = lambda c, k, m: jnp.where(left, c, jnp.where(right, k, m))  # noqa: E731
    return (pick(c_lines[0], k_lines[0], a_lo), pick(c_lines[1], k_lines[1], b_lo),
            pick(c_lines[2], k_lines[2], a_up), pick(c_lines[3], k_lines[3], b_up))
  return lines


def _chord_holds(df, l, u, fl, fu, ulps: int):
  """Masks of the boxes around 0 (``l < 0 < u``) on which the chord of an S-shaped ``f``
  (convex on ``x <= 0``, concave on ``x >= 0``) is a valid lower line, and a valid upper line.

  The gap ``f − chord`` is 0 at both ends, convex on ``[l, 0]`` and concave on ``[0, u]``. If
  ``f'(l) >= k``, the chord's slope ``k = (f(u) − f(l)) / (u − l)``, the gap rises from ``l``
  and is convex up to 0, then concave with non-negative ends: ``f >= chord`` on the box.
  Mirrored, ``f'(u) >= k`` gives ``f <= chord``. Both tests are made as ``f'(·)(u − l) −
  (f(u) − f(l)) >= m`` with a margin ``m = 4 (E + 2 eps)(1 + |f(l)| + |f(u)|)(1 + u − l)``
  (``E = 2 · ulps · eps``, the error allowance of ``f̂``, `boundjax.core.budgets`) above the
  float error of the two sides (the slope from ``f̂``: ``2E + 4 eps``; the difference: ``2E +
  eps``), so a chord passes only where it holds in exact arithmetic. A chord that fails keeps
  the tangent line, which always holds."""
  eps = float(jnp.finfo(l.dtype).eps)
  E = 2.0 * ulps * eps
  w = u - l
  m = 4 * (E + 2 * eps) * (1 + jnp.abs(fl) + jnp.abs(fu)) * (1 + w)
  rise = fu - fl
  around = (l < 0) & (u > 0)
  return around & (df(l) * w - rise >= m), around & (df(u) * w - rise >= m)


def _dtanh(x):
  t = jnp.tanh(x)
  return 1 - t * t


def _dlogistic(x):
  s = jax.nn.sigmoid(x)
  return s * (1 - s)


def _derf(x):
  return (2 / math.sqrt(math.pi)) * jnp.exp(-x * x)


def _erfc_lines(l, u):
  """``erfc = 1 - erf``: the lines of ``erf`` reflected."""
  a_lo, b_lo, a_up, b_up = _s_shaped(lax.erf, _derf, ulps=budgets.BUDGETS["erf"].ulps)(l, u)
  return -a_up, 1 - b_up, -a_lo, 1 - b_lo


def _abs_lines(l, u):
  """``|x|`` (convex): the chord above; below ``x`` or ``-x``, the one closer on the box."""
  a_up, b_up = _chord(jnp.abs, l, u)
  a_lo = jnp.where(u > -l, 1.0, -1.0).astype(l.dtype)
  return a_lo, jnp.zeros_like(l), a_up, b_up


def _power_lines(n: int):
  """``x^n`` for even ``n >= 2`` (convex): chord above, tangent at the midpoint below."""
  return _convex(lambda x: lax.integer_pow(x, n), lambda x: n * lax.integer_pow(x, n - 1))


def _domain(lines, lo: float, strict: bool):
  """Restricts a relaxation to boxes inside the real domain ``x > lo`` (``x >= lo``); elsewhere
  the caller uses constant lines from the interval bound."""
  def f(l, u):
    bad = (l <= lo) if strict else (l < lo)
    a_lo, b_lo, a_up, b_up = lines(jnp.where(bad, lo + 1.0, l), jnp.where(bad, lo + 2.0, u))
    nan = jnp.full_like(l, jnp.nan)
    return tuple(jnp.where(bad, nan, a) for a in (a_lo, b_lo, a_up, b_up))
  return f


_UNARY_LINES: dict[str, Callable] = {
    "exp": _convex(jnp.exp, jnp.exp),
    "expm1": _convex(jnp.expm1, jnp.exp),
    "log": _domain(_concave(jnp.log, lambda x: 1 / x), 0.0, True),
    "log1p": _domain(_concave(jnp.log1p, lambda x: 1 / (1 + x)), -1.0, True),
    "sqrt": _domain(_concave(jnp.sqrt, lambda x: 0.5 / jnp.sqrt(x)), 0.0, False),
    "rsqrt": _domain(_convex(lax.rsqrt, lambda x: -0.5 * lax.rsqrt(x) / x), 0.0, True),
    "tanh": _s_shaped(jnp.tanh, _dtanh, ulps=budgets.BUDGETS["tanh"].ulps),
    "logistic": _s_shaped(jax.nn.sigmoid, _dlogistic, far=20.0,
                          ulps=budgets.BUDGETS["logistic"].ulps),
    "erf": _s_shaped(lax.erf, _derf, ulps=budgets.BUDGETS["erf"].ulps),
    "erfc": _erfc_lines,
    "atan": _s_shaped(jnp.arctan, lambda x: 1 / (1 + x * x), far=50.0,
                      ulps=budgets.BUDGETS["atan"].ulps),
    "abs": _abs_lines,
    "square": _power_lines(2),
}


# S-shaped functions bounded by 1 in magnitude whose CROWN lines have a sound version
# (`sound_unary_lines`): name -> (the function's derivative in terms of its value, `far`)
_SOUND_UNARY = {"logistic": (lambda y: y * (1 - y), 20.0), "tanh": (lambda y: 1 - y * y, 10.0)}


def sound_unary_lines(name: str):
  """``(l, u) -> (a_lo, b_lo, a_up, b_up)``: `_s_shaped`'s lines of ``logistic`` or ``tanh``
  moved outward so that they hold in exact arithmetic on ``[l, u]`` (sound mode), or None for
  another function.

  Every line `_s_shaped` builds is a chord through ``(l, f̂(l))`` and ``(u, f̂(u))``, a tangent
  at a point ``d`` where the gap ``f − line`` (or ``line − f``) is convex on the box, or (a box
  around 0) a tangent at ``d`` on one side that passes the far end of the box: on the far side
  of 0 the gap is concave and non-negative at its two ends, on the near side convex (CROWN,
  Zhang et al. 2018, §3.2). What float evaluation changes: the values ``f̂`` (|f̂ − f| <= E,
  ``E = 2 · ulps · eps`` from the measured budget of `boundjax.core.budgets`, ``|f| <= 1``),
  the slope of a tangent ``f'(d)`` computed from ``f̂(d)`` (error <= ``2E + 4 eps``), and the
  rounding of ``b`` and of the end-point tests (``4 eps (|a| (|l| + |u| + far) + |b| + 1)``).
  A convex gap is at least its value at ``d`` minus the slope error times the distance from
  ``d`` (at most ``u - l + far``, `_s_shaped` searches ``d`` in ``[0, max(u, far)]``); a
  concave gap is at least its smallest end value. So each line moved by

      δ = 2 [2E + (2E + 4 eps)(u − l + far) + 4 eps (|a| (|l| + |u| + far) + |b| + 1)] + 4 λ

  (the factor 2 covers the rounding of δ itself; λ = finfo.tiny) holds, and its offset is then
  rounded outward once more. Non-finite lines stay non-finite (the caller substitutes the
  interval bound)."""
  if name not in _SOUND_UNARY:
    return None
  lines = _UNARY_LINES[name]

  def sound(l, u):
    return _sound_shift(name, l, u, *lines(l, u))
  return sound


def _sound_shift(name: str, l, u, a_lo, b_lo, a_up, b_up):
  """`sound_unary_lines`' outward move ``δ`` of lines of ``logistic`` or ``tanh`` built by
  `_s_shaped` or `s_shaped_lines_at` (chords, and tangents at points ``d`` at most
  ``|u - l| + far`` from every point of the box), then the offsets rounded outward."""
  from boundjax.core import rounding
  far = _SOUND_UNARY[name][1]
  ulps = budgets.BUDGETS[name].ulps
  fin = jnp.finfo(l.dtype)
  eps, tiny = float(fin.eps), float(fin.tiny)
  E = 2.0 * ulps * eps
  width = jnp.abs(u - l) + far

  def delta(a, b):
    return 2.0 * (2 * E + (2 * E + 4 * eps) * width
                  + 4 * eps * (jnp.abs(a) * (jnp.abs(l) + jnp.abs(u) + far) + jnp.abs(b) + 1)
                  ) + 4 * tiny
  b_lo = rounding.round_down(b_lo - delta(a_lo, b_lo))
  b_up = rounding.round_up(b_up + delta(a_up, b_up))
  return a_lo, b_lo, a_up, b_up


# the S-shaped functions whose tangent points α-CROWN optimises: name -> (f, f', far)
S_SHAPED = {"logistic": (jax.nn.sigmoid, _dlogistic, 20.0), "tanh": (jnp.tanh, _dtanh, 10.0)}


def s_shaped_default_t(l, u):
  """The tangent fractions of `s_shaped_lines_at` that give CROWN's lines (`_s_shaped`): the
  midpoint (0.5) where the box lies on one side of 0, the tangent through the far end (0) on a
  box around 0."""
  return jnp.where((u <= 0) | (l >= 0), 0.5, 0.0).astype(l.dtype)


def s_shaped_far_points(name: str, l, u):
  """The tangent points ``(d_lo, d_up)`` of `s_shaped_lines_at` on a box around 0: the
  tangents there pass below ``(u, f(u))`` and above ``(l, f(l))`` (`_s_shaped`'s bisection).
  No gradient flows through the search (α's gradient keeps its paths through ``l`` and
  ``u`` elsewhere)."""
  f, df, far = S_SHAPED[name]
  ls, us = lax.stop_gradient(l), lax.stop_gradient(u)
  fls, fus = f(ls), f(us)
  d_up = _bisect(lambda d: f(d) + df(d) * (ls - d) >= fls, jnp.zeros_like(ls), jnp.maximum(us, far))
  d_lo = _bisect(lambda d: f(d) + df(d) * (us - d) <= fus, jnp.zeros_like(us), jnp.minimum(ls, -far))
  return d_lo, d_up


def s_shaped_lines_at(name: str, l, u, t_lo, t_up, sound: bool = False, far_points=None):
  """Lines of an S-shaped ``f`` (logistic, tanh) on ``[l, u]`` with optimisable tangent points
  (α-CROWN, Xu et al., ICLR 2021, §3.1, for general activations): ``t_lo, t_up ∈ [0, 1]``
  (broadcast against ``l``, e.g. one per row of a backward pass) choose a point in the range
  where a tangent is a valid line, so every ``t`` gives a sound relaxation:

  * ``u <= 0`` (convex): lower line the tangent at ``d = l + t_lo (u - l)``, any ``d`` in the
    box; upper line the chord. ``l >= 0`` (concave): the mirror image, upper tangent at
    ``l + t_up (u - l)``.
  * ``l < 0 < u``: lower line the tangent at ``d = d* - t_lo (d* - min(l, d*))``, ``d* <= 0``
    the tangent point whose tangent passes below ``(u, f(u))`` (`_s_shaped`'s bisection).
    Every ``d <= d*`` is valid: ``h(d) = f(d) + f'(d)(u - d) - f(u)`` has ``h' = f''(d)(u - d)
    >= 0`` on ``d <= 0``, so ``h(d) <= h(d*) <= 0``; on ``[l, 0]`` a tangent of the convex
    part lies below ``f``, and on ``[0, u]`` the line minus ``f`` is convex and non-positive
    at both ends. The upper line is the mirror image (``d = d* + t_up (max(u, d*) - d*)``).
    Where the chord is a valid line (`_chord_holds`) it is that line whatever ``t``: it is
    then ``f``'s convex (concave) envelope on the box, above (below) every valid line.

  ``t = 0.5`` on one side of 0 and ``t = 0`` around it are CROWN's lines. Sound mode moves the
  lines outward as `sound_unary_lines` does (every tangent point lies within ``|u - l| + far``
  of the box). ``far_points``: `s_shaped_far_points` of the box, if already computed. Returns
  ``(a_lo, b_lo, a_up, b_up)``; the caller checks them (`finite_or_constant`)."""
  f, df, _ = S_SHAPED[name]
  t_lo = jnp.clip(t_lo, 0.0, 1.0).astype(l.dtype)
  t_up = jnp.clip(t_up, 0.0, 1.0).astype(l.dtype)
  d_lo, d_up = far_points if far_points is not None else s_shaped_far_points(name, l, u)
  left, right = u <= 0, l >= 0
  at_lo = jnp.where(left, l + t_lo * (u - l), d_lo - t_lo * (d_lo - jnp.minimum(l, d_lo)))
  at_up = jnp.where(right, l + t_up * (u - l), d_up + t_up * (jnp.maximum(u, d_up) - d_up))
  a_lo, b_lo = _tangent(f, df, at_lo)
  a_up, b_up = _tangent(f, df, at_up)
  c_a, c_b = _chord(f, l, u)
  chord_lo, chord_up = _chord_holds(df, l, u, f(l), f(u), budgets.BUDGETS[name].ulps)
  a_lo, b_lo = (jnp.where(right | chord_lo, c_a, a_lo), jnp.where(right | chord_lo, c_b, b_lo))
  a_up, b_up = (jnp.where(left | chord_up, c_a, a_up), jnp.where(left | chord_up, c_b, b_up))
  if sound:
    return _sound_shift(name, l, u, a_lo, b_lo, a_up, b_up)
  return a_lo, b_lo, a_up, b_up


def finite_or_constant(a_lo, b_lo, a_up, b_up, l, u, y_lo, y_hi, check: Callable | None):
  """Replaces entries whose lines are not finite, whose box is (nearly) a point, or that fail
  the end-point check by the constant lines ``y_lo <= y <= y_hi`` (the interval bound)."""
  tiny = (u - l) <= 1e-6 * (1 + jnp.abs(l) + jnp.abs(u))
  ok = ~tiny & jnp.isfinite(a_lo) & jnp.isfinite(b_lo) & jnp.isfinite(a_up) & jnp.isfinite(b_up)
  if check is not None:
    ok = ok & check(a_lo, b_lo, a_up, b_up)
  # never above (below) the box, up to the rounding of evaluating the line: a tangent through
  # a box end (`_s_shaped`'s lines around 0) meets the interval bound there exactly
  tol_hi, tol_lo = 1e-6 * (1 + jnp.abs(y_hi)), 1e-6 * (1 + jnp.abs(y_lo))
  ok_lo = ok & (a_lo * l + b_lo <= y_hi + tol_hi) & (a_lo * u + b_lo <= y_hi + tol_hi)
  ok_up = ok & (a_up * l + b_up >= y_lo - tol_lo) & (a_up * u + b_up >= y_lo - tol_lo)
  zero = jnp.zeros_like(l)
  return (jnp.where(ok_lo, a_lo, zero), jnp.where(ok_lo, b_lo, y_lo),
          jnp.where(ok_up, a_up, zero), jnp.where(ok_up, b_up, y_hi))


def endpoint_check(f):
  """Both lines on the right side of ``f`` at the box ends (a cheap guard against a line made
  invalid by float error in its construction; the construction itself is the proof)."""
  def check(l, u):
    fl, fu = f(l), f(u)
    def ok(a_lo, b_lo, a_up, b_up):
      tol_l = 1e-6 * (1 + jnp.abs(fl))
      tol_u = 1e-6 * (1 + jnp.abs(fu))
      return ((a_lo * l + b_lo <= fl + tol_l) & (a_lo * u + b_lo <= fu + tol_u)
              & (a_up * l + b_up >= fl - tol_l) & (a_up * u + b_up >= fu - tol_u))
    return ok
  return check


_UNARY_FN = {"exp": jnp.exp, "expm1": jnp.expm1, "log": jnp.log, "log1p": jnp.log1p,
             "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt, "tanh": jnp.tanh, "logistic": jax.nn.sigmoid,
             "erf": lax.erf, "erfc": lax.erfc, "atan": jnp.arctan, "abs": jnp.abs,
             "square": jnp.square}


def unary_relaxation(name: str, params: dict):
  """``(l, u) -> (a_lo, b_lo, a_up, b_up)`` for a unary primitive, or None."""
  if name == "integer_pow":
    n = params["y"]
    if n == 1:
      return lambda l, u: (jnp.ones_like(l), jnp.zeros_like(l), jnp.ones_like(l),
                           jnp.zeros_like(l))
    if n >= 2 and n % 2 == 0:
      return _power_lines(n)
    return None
  return _UNARY_LINES.get(name)


def unary_fn(name: str, params: dict):
  if name == "integer_pow":
    return lambda x: lax.integer_pow(x, params["y"])
  return _UNARY_FN[name]


def reciprocal_lines(c, l, u):
  """``y = c / d`` with ``d ∈ [l, u]`` not containing 0 (``1/d`` is convex for ``d > 0`` and
  concave for ``d < 0``; scaling by ``c < 0`` swaps the lines); straddling boxes get NaN (the
  caller substitutes the interval bound)."""
  pos = l > 0
  neg = u < 0
  inv = lambda x: 1 / x  # noqa: E731
  dinv = lambda x: -1 / (x * x)  # noqa: E731
  lc, uc = jnp.where(pos | neg, l, 1.0), jnp.where(pos | neg, u, 2.0)
  cv = _convex(inv, dinv)(lc, uc)
  cc = _concave(inv, dinv)(lc, uc)
  a_lo, b_lo, a_up, b_up = (jnp.where(pos, x, y) for x, y in zip(cv, cc))
  cpos = c >= 0
  lo = (jnp.where(cpos, c * a_lo, c * a_up), jnp.where(cpos, c * b_lo, c * b_up))
  up = (jnp.where(cpos, c * a_up, c * a_lo), jnp.where(cpos, c * b_up, c * b_lo))
  nan = jnp.full_like(l, jnp.nan)
  bad = ~(pos | neg)
  return tuple(jnp.where(bad, nan, a) for a in (*lo, *up))


def mccormick(lx, ux, ly, uy):
  """``y = x · z``: the average of the two McCormick planes on each side (McCormick 1976;
  used for products in auto_LiRPA, Xu et al. 2020):
  ``x z >= ½[(l_z + u_z) x + (l_x + u_x) z - l_x l_z - u_x u_z]`` and
  ``x z <= ½[(l_z + u_z) x + (l_x + u_x) z - l_x u_z - u_x l_z]`` (an average of valid planes
  is valid)."""
  cx, cy = (lx + ux) / 2, (ly + uy) / 2
  b_lo = -(lx * ly + ux * uy) / 2
  b_up = -(lx * uy + ux * ly) / 2
  return [cy, cx], b_lo, [cy, cx], b_up


def leaky_lines(p, n, l, u):
  """``y = p x`` for ``x >= 0`` and ``n x`` below (leaky ReLU: ``p = 1, n = α``; also
  ``max(x, α x)``): convex for ``n <= p`` (chord above; ``p x`` or ``n x`` below, the one closer
  on the box, as CROWN-Ada, Zhang et al. 2018 §3.2), concave otherwise (mirror image). Exact on
  stable boxes."""
  act, ina = l >= 0, u <= 0
  den = jnp.where(act | ina, 1.0, u - l)
  k = (p * u - n * l) / den  # the chord through (l, n l) and (u, p u)
  kb = p * u - k * u
  near = jnp.where(u > -l, p, n)
  convex = n <= p
  a_lo, b_lo = jnp.where(convex, near, k), jnp.where(convex, 0.0, kb)
  a_up, b_up = jnp.where(convex, k, near), jnp.where(convex, kb, 0.0)
  stable = lambda v, on_act, on_ina: jnp.where(act, on_act, jnp.where(ina, on_ina, v))  # noqa: E731
  return (stable(a_lo, p, n), stable(b_lo, 0.0, 0.0), stable(a_up, p, n),
          stable(b_up, 0.0, 0.0))


@dataclasses.dataclass(frozen=True)
class _DotRoles:
  """How the product of two box-dependent operands of a dot_general / convolution is relaxed
  (`boundjax.domains.linear.backward._dot_planes`).

  Attributes:
    pivot: operand position (0: lhs, 1: rhs) of the *pivot* ``P``: the other operand ``Q``'s
      coefficient in every plane is the point of ``P``'s box nearest to 0.
    concretise: ``Q`` is a box input read by this equation only (a parameter box), so its part
      of the bound is concretised at once against its box (exact: ``Q`` appears nowhere else)
      and never stored as a coefficient array of ``Q``'s size per row.
    rank1: ``P`` has no free dimension (a dot_general whose pivot is a vector per batch entry,
      e.g. one example times a kernel): every row's coefficient on ``Q`` is an outer product,
      so ``Σ|Λ_Q| r_Q = Σ |Λ_y| · (|z_P| ⋆ r_Q)`` without forming ``Λ_Q``.
  """
  pivot: int
  concretise: bool
  rank1: bool


def _dot_roles(e, direct: Callable[[Any], bool]) -> _DotRoles:
  """Pivot: the lhs, unless the lhs is a parameter box (``direct``) and the rhs is not, so that
  a parameter box is the operand concretised at once (``x @ W`` and ``W @ x`` alike)."""
  a, b = e.invars
  pivot = 1 if direct(a) and not direct(b) else 0
  q = e.invars[1 - pivot]
  concretise = direct(q) and q is not e.invars[pivot]
  rank1 = False
  if e.name == "dot_general":
    (lc, rc), (lb, rb) = e.params["dimension_numbers"]
    contract, batch = (lc, lb) if pivot == 0 else (rc, rb)
    p = e.invars[pivot]
    free = [p.shape[d] for d in range(len(p.shape)) if d not in contract and d not in batch]
    rank1 = int(np.prod(free, dtype=np.int64)) == 1
  return _DotRoles(pivot, concretise, rank1)


# ----------------------------------------------------------------------------------------------
# One record per primitive
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class OpRecord:
  """Everything CROWN knows about one primitive applied to box-dependent values.

  Attributes:
    kind: "affine" (linear in its abstract operands jointly, plus a concrete offset),
      "bilinear" (linear in one operand when the others are concrete: mul, div, dot_general,
      conv; a product of two box-dependent operands is relaxed or bounded by intervals),
      "relu" (``max(x, c)`` / ``min(x, c)`` with concrete ``c``; two box-dependent operands are
      relaxed) or "nonlinear" (relaxed by lines on the input box, `Lines`).
    index_operands: operands that must be concrete (indices, predicates); None: every operand
      from position ``index_from`` on (the start indices of dynamic_slice and
      dynamic_update_slice, whose number is the operand's rank).
    additive: a concrete float operand is an offset added to the result, not a coefficient.
    exact_transpose: pure data movement: the transpose is exact in floating point (sound mode
      needs no γ_n for it).
    pattern_safe: the transpose with every concrete float operand set to 1 gives a superset of
      the non-zero pattern of the true transpose (the windowed pass).
    relax: "unary" (elementwise lines ``(l, u) -> (a_lo, b_lo, a_up, b_up)``, see
      `unary_relaxation`) or "pool" (a maximum/minimum over entries: selection map below or
      above, the interval bound on the other side).
  """
  kind: str
  index_operands: tuple | None = ()
  index_from: int = 1
  additive: bool = False
  exact_transpose: bool = False
  pattern_safe: bool = False
  relax: str = ""


_REWRITTEN = frozenset({"split"}) | (primitives.IDENTITY - {"copy"})
"""Linear primitives rewritten into other equations before CROWN's pass (`_ONE_PER_OUTPUT`)."""

_AFFINE_TRAITS: dict[str, dict] = {
    "add": dict(additive=True, pattern_safe=True),
    "add_any": dict(additive=True, pattern_safe=True),
    "sub": dict(additive=True),
    "neg": dict(exact_transpose=True),
    "reshape": dict(exact_transpose=True, pattern_safe=True),
    "broadcast_in_dim": dict(pattern_safe=True),
    "transpose": dict(exact_transpose=True, pattern_safe=True),
    "squeeze": dict(exact_transpose=True, pattern_safe=True),
    "reduce_sum": dict(exact_transpose=True, pattern_safe=True),
    "reduce_window_sum": dict(pattern_safe=True),
    "concatenate": dict(additive=True, exact_transpose=True),
    "slice": dict(exact_transpose=True, pattern_safe=True),
    "pad": dict(additive=True, exact_transpose=True, pattern_safe=True),
    "convert_element_type": dict(pattern_safe=True),
    "copy": dict(exact_transpose=True, pattern_safe=True),
    "rev": dict(exact_transpose=True),
    "select_n": dict(index_operands=(0,), additive=True, exact_transpose=True),
    "dynamic_slice": dict(index_operands=None, exact_transpose=True),
    "dynamic_update_slice": dict(index_operands=None, index_from=2, additive=True,
                                 exact_transpose=True),
    "gather": dict(index_operands=(1,)),
    "scatter": dict(index_operands=(1,), additive=True, exact_transpose=True),
    "scatter-add": dict(index_operands=(1,), additive=True),
    "scatter-sub": dict(index_operands=(1,), additive=True),
}
"""`OpRecord` traits of the linear primitives that have any (the others: none, the safe
default)."""


def _build_ops() -> dict[str, OpRecord]:
  # every linear primitive (`boundjax.core.primitives.LINEAR`) is affine, transposed exactly
  ops = {name: OpRecord("affine", **_AFFINE_TRAITS.get(name, {}))
         for name in sorted(primitives.LINEAR - _REWRITTEN)}
  ops.update({
      "mul": OpRecord("bilinear", pattern_safe=True),
      "div": OpRecord("bilinear", pattern_safe=True),
      "dot_general": OpRecord("bilinear", pattern_safe=True),
      "conv_general_dilated": OpRecord("bilinear", pattern_safe=True),
      "max": OpRecord("relu"),
      "min": OpRecord("relu"),
  })
  for name in (*_UNARY_LINES, "integer_pow"):
    ops[name] = OpRecord("nonlinear", relax="unary")
  for name in ("reduce_max", "reduce_min", "reduce_window_max", "reduce_window_min"):
    ops[name] = OpRecord("nonlinear", relax="pool")
  return ops


OPS: dict[str, OpRecord] = _build_ops()
SUPPORTED = sorted(OPS)
_NO_RECORD = OpRecord("none")


def _split_as_slices(e: CrownEqn) -> list[CrownEqn]:
  """``split`` (several results) as one ``slice`` per result: the same values, and every
  result an affine equation of its own (the backward pass handles one result per equation)."""
  axis, start, parts = e.params["axis"], 0, []
  shape = e.invars[0].aval.shape
  for size, out in zip(e.params["sizes"], e.outvars):
    lo = [0] * len(shape)
    hi = list(shape)
    lo[axis], hi[axis] = start, start + int(size)
    start += int(size)
    parts.append(CrownEqn(lax.slice_p, {"start_indices": tuple(lo), "limit_indices": tuple(hi),
                                    "strides": None}, [e.invars[0]], [out], e.orig))
  return parts


def _barrier_as_copies(e: CrownEqn) -> list[CrownEqn]:
  """``optimization_barrier`` (the identity on a tuple, a scheduling hint) as one ``copy`` per
  value."""
  return [CrownEqn(lax_internal.copy_p, {}, [x], [out], e.orig)
          for x, out in zip(e.invars, e.outvars)]


_ONE_PER_OUTPUT = {name: _barrier_as_copies for name in _REWRITTEN - {"split"}}
_ONE_PER_OUTPUT["split"] = _split_as_slices
"""Primitives rewritten as one equation per result before CROWN's pass: ``split`` as slices,
every identity (`boundjax.core.primitives.IDENTITY`: barriers, placement hints) as copies."""


def op_record(name: str) -> OpRecord:
  return OPS.get(name, _NO_RECORD)


class CrownFallbackWarning(UserWarning):
  """CROWN bounds an operation by its interval bound (no linear relaxation applies)."""


# ----------------------------------------------------------------------------------------------
# A flat program: the jaxpr with every nested call inlined
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class CrownEqn:
  """CROWN's record of one equation of the flat program.

  ``kind``: "concrete" (no box-dependent operand), "affine", "relu" (``max(x, c)`` / ``min(x, c)``),
  "nonlinear" (relaxed by lines in the variables ``relax_in``; ``mode`` names the relaxation)
  or "fallback" (its outputs are bounded by the forward interval pass and enter the backward
  pass as fresh box variables; ``reason`` says why).
  """
  prim: Any
  params: dict
  invars: list
  outvars: list
  orig: prog_lib.Eqn  # the program layer's equation (source line, context)
  kind: str = "concrete"
  abstract_pos: tuple = ()
  relax_in: tuple = ()
  mode: str = ""
  aux: Any = None
  reason: str = ""

  @property
  def name(self) -> str:
    return self.prim.name

  def where(self) -> str:
    return self.orig.where()

  @property
  def back_in(self) -> list:
    """The variables the backward pass continues to from this equation's output."""
    if self.kind in ("affine", "relu"):
      return [self.invars[p] for p in self.abstract_pos]
    if self.kind == "nonlinear":
      return list(self.relax_in)
    return []


@dataclasses.dataclass
class CrownProgram:
  invars: list
  outvars: list
  eqns: list
  consts: dict  # _Var -> value
  abstract: set  # abstract _Vars
  producer: dict  # _Var -> index of its equation
  uses: dict  # _Var -> number of abstract equations reading it


def from_core(program: prog_lib.Program) -> CrownProgram:
  """CROWN's view of a flat program of the program layer. Composites with an interval rule
  (softmax, log-softmax, ...) are kept whole: CROWN bounds them by that (tight) rule."""
  keep = [n for n in interval_domain.RULES if n in _composite_names()]
  program = prog_lib.inline_composites(program, keep=keep)
  eqns = [CrownEqn(e.prim, e.params, e.invars, e.outvars, e) for e in program.eqns]
  producer = {o: i for i, e in enumerate(eqns) for o in e.outvars}
  return CrownProgram(program.invars, program.outvars, eqns, program.consts, set(), producer, {})


def _composite_names() -> set[str]:
  from boundjax.core import composite
  return {p.name for p in composite.BODIES}


def is_float(aval) -> bool:
  return jnp.issubdtype(aval.dtype, jnp.floating)


def low_precision(aval) -> bool:
  """bfloat16 / float16 (their rounding is far from linear at CROWN's tolerance)."""
  return is_float(aval) and jnp.finfo(aval.dtype).bits < 32


def _aval(a):
  """The abstract value of a variable or a literal."""
  return a.aval if isinstance(a, _Var) else jax.typeof(a.val)


def _is_literal_zero(a) -> bool:
  return isinstance(a, _Lit) and np.ndim(a.val) == 0 and float(a.val) == 0.0


def _match_leaky(e: CrownEqn, abstract: set, made_by: dict):
  """``select_n(x >= 0, α x, x)`` (``jax.nn.leaky_relu``; also ``>``, and ``<`` / ``<=`` with
  the cases swapped): returns ``(x, α operand)`` or None."""
  if len(e.invars) != 3 or e.abstract_pos == () or not isinstance(e.invars[0], _Var):
    return None
  cmp = made_by.get(e.invars[0])
  if cmp is None or cmp.name not in ("ge", "gt", "lt", "le") or not _is_literal_zero(cmp.invars[1]):
    return None
  x = cmp.invars[0]
  neg_case, pos_case = (e.invars[1], e.invars[2]) if cmp.name in ("ge", "gt") else \
      (e.invars[2], e.invars[1])
  if pos_case is not x:
    return None
  return _scaled_copy(neg_case, x, abstract, made_by)


def _scaled_copy(v, x, abstract: set, made_by: dict):
  """If ``v = mul(x, α)`` / ``mul(α, x)`` with concrete ``α``: the operand ``α``, else None."""
  m = made_by.get(v) if isinstance(v, _Var) else None
  if m is None or m.name != "mul":
    return None
  a, b = m.invars
  if a is x and not (isinstance(b, _Var) and b in abstract):
    return (x, b)
  if b is x and not (isinstance(a, _Var) and a in abstract):
    return (x, a)
  return None


# Relaxations whose slopes are exact floats (box bounds, 0, 1) and whose offsets are box bounds
# or one rounded product: kept in sound mode (the rest falls back to intervals there, except the
# S-shaped functions of `sound_unary_lines`, whose lines are moved outward by their error).
MODES = frozenset({"unary", "reciprocal", "leaky", "product", "max2", "min2", "pool", "select",
                   "dot"})
"""The relaxation modes a nonlinear equation can be given (`backward.RELAXATIONS` builds the
lines of each; ``"dot"``, a product of two boxes inside a matrix product, its planes)."""

_SOUND_MODES = frozenset({"product", "pool", "max2", "min2", "select", "dot"})


@dataclasses.dataclass
class _Decision:
  """One abstract equation being classified, with what the classification reads: the
  box-dependent variables, the equation that made each variable, the mode and ``direct(v)``
  (``v`` is a box input read by this one equation only, `_dot_roles`)."""
  e: CrownEqn
  abstract: set
  made_by: dict
  sound: bool
  direct: Callable[[Any], bool]

  @property
  def ins(self) -> list:
    return [self.e.invars[p] for p in self.e.abstract_pos]

  @property
  def same_shape(self) -> bool:
    e = self.e
    return all(v.shape == e.outvars[0].shape for v in self.ins) if e.outvars else False

  def affine(self) -> None:
    self.e.kind = "affine"

  def relu(self) -> None:
    self.e.kind = "relu"

  def fallback(self, reason: str) -> None:
    self.e.kind, self.e.reason = "fallback", reason

  def nonlinear(self, mode: str, relax_in, aux=None) -> None:
    assert mode in MODES, mode
    if self.sound and mode not in _SOUND_MODES and not (
        mode == "unary" and self.e.name in _SOUND_UNARY):
      return self.fallback("sound mode bounds smooth nonlinear operations by intervals (their "
                           "lines are not exact in floating point)")
    e = self.e
    e.kind, e.mode, e.relax_in, e.aux = "nonlinear", mode, tuple(relax_in), aux


def _classify_none(d: _Decision, rec: OpRecord) -> None:
  d.fallback("no linear relaxation")


def _classify_affine(d: _Decision, rec: OpRecord) -> None:
  """Linear in its box-dependent operands, unless one of them is an index or a predicate: a
  box-dependent predicate of ``select_n`` is relaxed per entry once its interval is known."""
  e, pos = d.e, d.e.abstract_pos
  idx = rec.index_operands
  if idx is None:
    idx = tuple(range(rec.index_from, len(e.invars)))
  if any(p in idx for p in pos):
    if e.name == "select_n" and pos[0] == 0 and all(
        is_float(_aval(v)) and _aval(v).shape == e.outvars[0].shape for v in e.invars[1:]) \
        and is_float(e.outvars[0].aval):
      return d.nonlinear("select", [e.invars[p] for p in pos[1:]])
    return d.fallback("a box-dependent index or predicate")
  if not all(is_float(v.aval) for v in d.ins):
    return d.fallback("a non-float box-dependent operand")
  d.affine()


def _classify_bilinear(d: _Decision, rec: OpRecord) -> None:
  """Linear in one box-dependent operand; a product of two is relaxed (McCormick planes for
  ``mul``, ``dot_general`` and ``conv_general_dilated``; ``1 / d`` for a divisor)."""
  e, pos, ins, name = d.e, d.e.abstract_pos, d.ins, d.e.name
  if not all(is_float(v.aval) for v in ins):
    return d.fallback("a non-float box-dependent operand")
  if len(pos) == 1 and not (name == "div" and pos == (1,)):
    return d.affine()
  if name == "div" and pos == (1,) and d.same_shape:
    return d.nonlinear("reciprocal", ins)
  if name == "mul" and len(pos) == 2 and d.same_shape:
    return d.nonlinear("product", ins)
  if name in ("dot_general", "conv_general_dilated") and len(pos) == 2 \
      and ins[0].aval.dtype == ins[1].aval.dtype == e.outvars[0].aval.dtype:
    roles = _dot_roles(e, d.direct)
    return d.nonlinear("dot", [e.invars[roles.pivot]] if roles.concretise else ins, roles)
  d.fallback("a product of two box-dependent operands (no linear relaxation of this shape; use "
             "bj.ibp for interval parameters)")


def _classify_relu(d: _Decision, rec: OpRecord) -> None:
  """``max``/``min`` with a concrete operand is a ReLU node; of two box-dependent operands, a
  leaky ReLU ``max(x, αx)`` or a relaxed maximum/minimum."""
  e, pos, ins = d.e, d.e.abstract_pos, d.ins
  if not all(is_float(v.aval) for v in ins):
    return d.fallback("a non-float box-dependent operand")
  if len(pos) == 1 and len(e.invars) == 2:
    return d.relu()
  if len(pos) == 2 and d.same_shape:
    if e.name == "max":
      for x, v in ((e.invars[0], e.invars[1]), (e.invars[1], e.invars[0])):
        leaky = _scaled_copy(v, x, d.abstract, d.made_by)
        if leaky is not None:
          return d.nonlinear("leaky", (x,), ("max", leaky[1]))
    return d.nonlinear(e.name + "2", ins)
  d.fallback("max/min of box-dependent operands of different shapes")


def _classify_nonlinear(d: _Decision, rec: OpRecord) -> None:
  """Relaxed by lines on the input box: a pooling maximum/minimum by its selection map, an
  elementwise function by `unary_relaxation`."""
  e, ins = d.e, d.ins
  if not all(is_float(v.aval) for v in ins):
    return d.fallback("a non-float box-dependent operand")
  if rec.relax == "pool":
    dilated = any(x != 1 for key in ("window_dilation", "base_dilation")
                  for x in e.params.get(key, ()))
    if dilated:  # the selection map is a VJP, and JAX has none for dilated max windows
      return d.fallback("a max/min pooling window with dilation (its selection map is not "
                        "available)")
    return d.nonlinear("pool", ins)
  if unary_relaxation(e.name, e.params) is None:
    return d.fallback("no linear relaxation for these parameters")
  d.nonlinear("unary", ins)


CLASSIFY = {"none": _classify_none, "affine": _classify_affine, "bilinear": _classify_bilinear,
            "relu": _classify_relu, "nonlinear": _classify_nonlinear}
"""How an equation of each record kind (`OpRecord.kind`) is classified: sets the equation's
``kind`` (and ``mode``, ``relax_in``, ``aux``, ``reason``)."""


def _decide(e: CrownEqn, abstract: set, made_by: dict, sound: bool,
            direct: Callable[[Any], bool] = lambda v: False) -> None:
  """Sets ``kind`` (and ``mode``, ``relax_in``, ``aux``, ``reason``) of an abstract equation:
  the checks every primitive shares, then its record kind's rule (`CLASSIFY`)."""
  d = _Decision(e, abstract, made_by, sound, direct)
  if any(low_precision(v.aval) for v in d.ins) or any(low_precision(o.aval) for o in e.outvars):
    return d.fallback("bfloat16/float16 arithmetic (its rounding is not a linear map)")
  if e.name == "select_n":
    leaky = _match_leaky(e, abstract, made_by)
    if leaky is not None:
      return d.nonlinear("leaky", (leaky[0],), ("select", leaky[1]))
  if not all(is_float(o.aval) for o in e.outvars):
    return d.fallback("a non-float result")
  if e.name == "scatter" and not e.params.get("unique_indices"):
    return d.fallback("a scatter whose indices may repeat (which update wins is left to the "
                      "device, so it is no fixed linear map; pass unique_indices=True if they "
                      "do not)")
  rec = op_record(e.name)
  CLASSIFY[rec.kind](d, rec)


def classify_program(prog: CrownProgram, abstract_in: Sequence[bool], sound: bool = False) -> None:
  """Decides every abstract equation's role (`_decide`), rewrites ``x / d`` of two
  box-dependent operands into ``x · (1 / d)``, and counts the uses of every abstract variable.

  Raises `UnsupportedPrimitiveError` for an operation that CROWN can neither relax nor bound
  by intervals (no rule of the interval domain)."""
  abstract = {v for v, a in zip(prog.invars, abstract_in) if a}
  made_by: dict = {}
  eqns: list = []
  fresh = [0]
  reads: dict = {}
  for e in prog.eqns:
    for a in e.invars:
      if isinstance(a, _Var):
        reads[a] = reads.get(a, 0) + 1
  inputs = set(prog.invars)
  outputs = {v for v in prog.outvars if isinstance(v, _Var)}

  def direct(v) -> bool:
    return v in inputs and v in abstract and reads.get(v, 0) == 1 and v not in outputs

  def add(e: CrownEqn):
    pos = tuple(i for i, a in enumerate(e.invars) if isinstance(a, _Var) and a in abstract)
    e.abstract_pos = pos
    if pos:
      _decide(e, abstract, made_by, sound, direct)
      if e.kind == "fallback" and e.name not in interval_domain.RULES:
        raise UnsupportedPrimitiveError(
            f"CROWN (linear domain) cannot bound primitive '{e.name}' at {e.where()}: "
            f"{e.reason}, and the interval domain has no rule for it. Supported on "
            f"box-dependent values: {', '.join(SUPPORTED)}, and by intervals every primitive "
            "of bj.ibp.")
      if e.kind == "affine" and e.name not in interval_domain.RULES:
        raise UnsupportedPrimitiveError(
            f"CROWN (linear domain) cannot bound primitive '{e.name}' at {e.where()}: no "
            "interval rule for the forward pass.")
      abstract.update(e.outvars)
    for o in e.outvars:
      made_by[o] = e
    eqns.append(e)

  for e in prog.eqns:
    ab = [isinstance(a, _Var) and a in abstract for a in e.invars]
    if any(ab) and e.name in _ONE_PER_OUTPUT:
      for part in _ONE_PER_OUTPUT[e.name](e):
        add(part)
      continue
    if e.name == "div" and len(ab) == 2 and all(ab) and e.invars[1].shape == e.outvars[0].shape \
        and e.invars[0].shape == e.outvars[0].shape and is_float(e.outvars[0].aval) \
        and not low_precision(e.outvars[0].aval):
      x, d = e.invars
      fresh[0] -= 1
      r = _Var(d.aval, fresh[0])
      one = _Lit(np.ones((), d.aval.dtype))
      add(CrownEqn(lax.div_p, {}, [one, d], [r], e.orig))
      add(CrownEqn(lax.mul_p, {}, [x, r], list(e.outvars), e.orig))
      continue
    add(e)
  prog.eqns = eqns
  prog.producer = {o: i for i, e in enumerate(eqns) for o in e.outvars}
  uses: dict = {}
  for e in eqns:
    for v in e.back_in:
      uses[v] = uses.get(v, 0) + 1
  prog.abstract = abstract
  prog.uses = uses


def warn_fallbacks(prog: CrownProgram) -> None:
  """One `CrownFallbackWarning` per primitive bounded by intervals on the way to an output."""
  reach = _reachable(prog)
  seen: dict = {}
  for i, e in enumerate(prog.eqns):
    if e.kind == "fallback" and i in reach and e.name not in seen:
      seen[e.name] = e
  for name, e in seen.items():
    hint = " Use bj.ibp, or avg_pool." if name.startswith("reduce_window_max") else \
        " Use bj.ibp if that is enough."
    warnings.warn(f"bj.crown: no linear relaxation for '{name}' at {e.where()} ({e.reason}); "
                  f"its interval bound is used (looser).{hint}", CrownFallbackWarning,
                  stacklevel=4)


def upstream(prog: CrownProgram, starts: Sequence[_Var], *, through_fallback: bool) -> set[int]:
  """Indices of the abstract equations a backward pass from ``starts`` walks through. With
  ``through_fallback`` it also continues through the inputs of fallback equations (whose
  intervals come from earlier equations); otherwise it stops at their outputs."""
  seen, stack, idx = set(), list(starts), set()
  while stack:
    v = stack.pop()
    if v in seen:
      continue
    seen.add(v)
    i = prog.producer.get(v)
    if i is None or prog.eqns[i].kind == "concrete":
      continue
    idx.add(i)
    e = prog.eqns[i]
    stack.extend([e.invars[p] for p in e.abstract_pos]
                 if through_fallback and e.kind == "fallback" else e.back_in)
  return idx


def _reachable(prog: CrownProgram) -> set[int]:
  """Indices of the abstract equations the backward passes of the outputs can reach."""
  return upstream(prog, [v for v in prog.outvars if isinstance(v, _Var)], through_fallback=True)


def _bind(e: CrownEqn, vals: Sequence[Any]):
  # e.prim/e.params, not e.orig's: CROWN rewrites some equations (x / d -> x * (1 / d))
  bind = e.prim.get_bind_params(e.params)
  subfuns, params = bind if isinstance(bind, tuple) else ((), bind)
  with e.orig.manager:
    out = e.prim.bind(*subfuns, *vals, **params)
  return out


def bind1(e: CrownEqn, vals):
  out = _bind(e, vals)
  return out[0] if e.prim.multiple_results else out


def eval_concrete(prog: CrownProgram, args: Sequence[Any]) -> dict:
  """Values of every concrete variable (abstract ones are left out)."""
  env = dict(prog.consts)
  for v, a in zip(prog.invars, args):
    if v not in prog.abstract:
      env[v] = a
  for e in prog.eqns:
    if e.kind != "concrete":
      continue
    out = _bind(e, [read_value(env, a) for a in e.invars])
    outs = out if e.prim.multiple_results else [out]
    for v, o in zip(e.outvars, outs):
      env[v] = o
  return env


def read_value(env, a):
  return a.val if isinstance(a, _Lit) else env[a]


# ----------------------------------------------------------------------------------------------
# ReLU relaxation
# ----------------------------------------------------------------------------------------------

def relu_parts(e: CrownEqn, cenv: dict):
  """For ``y = max(x, c)`` / ``min(x, c)``: (x var, c broadcast, σ) with y = c + σ relu(σ(x-c))."""
  (p,) = e.abstract_pos
  x = e.invars[p]
  c = jnp.broadcast_to(jnp.asarray(read_value(cenv, e.invars[1 - p]), x.aval.dtype), x.shape)
  return x, c, (1.0 if e.name == "max" else -1.0)


def relu_argument(l, u, c, sigma: float, sound: bool):
  """The bounds ``[lt, ut]`` of the ReLU argument ``t = σ(x − c)`` for ``x ∈ [l, u]`` in
  ``y = max(x, c) = c + σ relu(t)`` (σ = 1; ``min``: σ = −1), rounded outward in sound mode.

  Infinite constants are exact, never ``inf − inf``: where ``σc = −inf`` (``max(x, −inf)``,
  ``min(x, +inf)``, e.g. ``jnp.clip(x, -inf, inf)``) the equation is ``y = x``, and where
  ``σc = +inf`` it is the constant ``y = c``. Returns ``(lt, ut, c_finite, pinned)``: such
  entries get ``c_finite = 0`` and a box ``[0, 1]`` (active: slope 1, so ``y = x``) or
  ``[−1, 0]`` (inactive: slope 0), and ``pinned`` holds the constant ``c`` where ``y = c``
  (0 elsewhere), which the caller adds as an offset."""
  sc = sigma * c
  through, fixed = sc == -jnp.inf, sc == jnp.inf
  c_fin = jnp.where(through | fixed, jnp.zeros_like(c), c)
  lt, ut = (l - c_fin, u - c_fin) if sigma > 0 else (c_fin - u, c_fin - l)
  if sound:  # x - 0 is exact (a split's clipped 0 stays 0: the neuron stays stable)
    exact = c_fin == 0
    lt = jnp.where(exact, lt, rounding.round_down(lt))
    ut = jnp.where(exact, ut, rounding.round_up(ut))
  one = jnp.ones_like(lt)
  lt = jnp.where(through, 0 * one, jnp.where(fixed, -one, lt))
  ut = jnp.where(through, one, jnp.where(fixed, 0 * one, ut))
  return lt, ut, c_fin, jnp.where(fixed, c, jnp.zeros_like(c))


def relu_lines(l, u, sound: bool):
  """Slopes/intercepts (a_lo, a_up, b_up) with a_lo·t <= relu(t) <= a_up·t + b_up on [l, u]."""
  active, inactive = l >= 0, u <= 0
  unstable = ~(active | inactive)
  den = jnp.where(unstable, u - l, 1.0)
  if sound:
    den = rounding.round_down(den)
  s = jnp.where(unstable, u, 0.0) / den
  if sound:
    s = rounding.round_up(s)
  b = -s * jnp.where(unstable, l, 0.0)
  if sound:
    b = rounding.round_up(b)
  a_up = jnp.where(active, 1.0, jnp.where(inactive, 0.0, s))
  b_up = jnp.where(unstable, b, 0.0)
  a_lo = jnp.where(active, 1.0, jnp.where(inactive, 0.0, (u > -l).astype(l.dtype)))
  return a_lo, a_up, b_up

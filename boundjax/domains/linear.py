"""The linear domain: backward linear bound propagation (CROWN) over an input box.

``crown(fn)(params, box)`` returns, for every output entry ``y_j`` of ``fn``, scalars
``[lower_j, upper_j]`` such that ``lower_j <= y_j(x) <= upper_j`` for every ``x`` in the box.

Method (Zhang et al., "Efficient Neural Network Robustness Certification with General
Activation Functions", NeurIPS 2018, §3; the backward form of auto_LiRPA):

* ``fn`` is traced to one flat program (`boundjax.core.program`: nested calls inlined) and
  every variable that depends on a box is marked *abstract*. What CROWN does with an abstract
  equation is decided by one record per primitive (`OPS`, an `OpRecord`: kind, index operands,
  additive operands, exact transpose, pattern safety, relaxation): *affine* equations (add, sub,
  mul/div by a concrete value, dot_general/conv with a concrete operand, reshapes, slices, pads,
  reduce_sum, average pooling, ...) are transposed exactly; ``max(x, c)`` / ``min(x, c)`` with
  concrete ``c`` are ReLUs; *nonlinear* equations get sound linear relaxations on their input
  box (`_Lines`): exp, expm1, log, log1p, sqrt, rsqrt, even integer powers / square, abs
  (convex/concave: chord and tangent at the midpoint, CROWN §3.2), tanh, logistic, erf, erfc,
  atan (S-shaped: CROWN's tangent-through-an-end-point construction, `_s_shaped`), ``c / d``
  with a box-dependent denominator of one sign (reciprocal lines), products of two
  box-dependent values (McCormick planes; ``x / d`` of two box-dependent operands is rewritten
  to ``x · (1 / d)``), leaky ReLU (``where(x >= 0, x, αx)`` and ``max(x, αx)``), max/min of two
  box-dependent values, and max/min pooling (``reduce_window_max``, ``reduce_max``: below the
  entry with the largest lower bound, above the interval bound). GELU, SiLU, softplus, LayerNorm
  and attention are bounded through these pieces.
* **Interval fallback.** An abstract equation with no linear relaxation (softmax and the other
  composites of `boundjax.nn`, sort, cumulative max, a product of two box-dependent matrices,
  bfloat16/float16 arithmetic, comparisons, every nonlinearity but ReLU under ``sound_fp``) is
  bounded by the forward interval pass, and its output enters the backward pass as a fresh box
  variable: ``Λ`` stops there and is concretised against that interval, like an input. One
  `CrownFallbackWarning` per primitive names it and the user's line. Only a primitive with
  neither a relaxation nor an interval rule raises `UnsupportedPrimitiveError`.
* **Low precision.** A bfloat16/float16 equation (``nn.Dense(dtype=jnp.bfloat16)``, a
  ``x.astype(bf16).astype(f32)`` round trip) is never treated as exact: it falls back to its
  interval, computed in float32 and rounded outward to the low format (`_interval_low_precision`).
* For a target variable ``t`` with ``m`` entries the pass starts from ``Λ_t = I`` (shape
  ``(m, *t.shape)``) and walks the equations in reverse. An affine equation ``y = L(x) + y0``
  maps ``Λ_x += Lᵀ Λ_y`` (a vmapped `jax.vjp`) and ``bias += <Λ_y, y0>``; fan-out adds.
* A ReLU ``y = relu(t)`` with pre-activation bounds ``[l, u]`` uses the lines
  ``a_L t <= y <= a_U t + b_U``: stable neurons are exact (``a = 1`` if ``l >= 0``, ``a = 0``
  if ``u <= 0``); unstable ones take ``a_U = u / (u - l)``, ``b_U = -a_U l`` and the adaptive
  lower slope ``a_L = 1 if u > -l else 0`` (CROWN-Ada, §3.2 of the paper). For the lower bound
  positive entries of ``Λ`` take the lower line and negative ones the upper line; for the
  upper bound the other way round, so lower and upper bounds carry separate ``Λ``.
* At the input box ``x ∈ [c - r, c + r]``: ``lower = Λ·c - |Λ|·r + bias`` and
  ``upper = Λ·c + |Λ|·r + bias``.
* Pre-activation bounds of every ReLU come, in order, from a backward pass of their own
  (``intermediate="crown"``) or from interval propagation (``intermediate="ibp"``, i.e.
  CROWN-IBP, Zhang et al. ICLR 2020). A forward interval pass (the rule table of
  `boundjax.domains.interval`, fed with the refined bounds) runs alongside, and every CROWN bound
  is intersected with it, so the result is never looser than `bj.ibp`.

Cost. The backward passes from each ReLU layer dominate: for an MLP with hidden widths ``n_k``
a pass from layer ``k`` costs about ``2 n_k · Σ_{j<k} n_j n_{j-1}`` multiply-adds per example.
The part of every pass that runs before the first ReLU it meets (``I`` through the affine layers
above it) does not depend on the example; it is computed once per call and shared by the whole
batch, and the rest runs example by example (`jax.lax.map` over chunks of ``chunk_size``
examples, each chunk vmapped).

Windows (``patches=True``, default outside ``sound_fp``). For a target behind one ReLU layer
whose input ``s = A x + b`` is an affine map of the box (e.g. the second convolution of a CNN),
the rows of ``Λ`` are non-zero only on receptive fields: at trace time the non-zero patterns of
``Λ`` at ``relu(s)`` and of ``A`` are found by the same transposes with every concrete
coefficient set to 1 (all terms non-negative, so no cancellation: a superset of the true
pattern). Rows with the same support ``S_g`` in ``s`` form a group with input window ``X_g``;
per example only ``ν`` on ``S_g`` (k entries, not all of ``s``), ``Λ_x = ν A[S_g, X_g]`` (one
batched matrix product) and the concretisation over ``X_g`` are computed. On the issue's CNN
(conv16 k4 s2, conv32 k4) a conv2 neuron sees 256 of conv1's 2704 outputs and 100 of 784
pixels, which removes the dense transpose of conv1 applied to 2 x 3200 rows per example. The
bounds are those of the dense pass up to the order of float sums.

Specifications (``spec=C``). The backward pass of the output starts from ``Λ = C`` instead of
``I``, so ``C @ y`` (e.g. the margins ``y_label - y_j``) is bounded directly, which is never
looser than bounding ``y`` and combining (CROWN §3.3). ``C`` of shape (k, m) is shared; (batch,
k, m) gives each example its own rows: the example-independent prefix (computed once with
``I``) is multiplied by ``C[i]`` per example, so nothing of size batch × m × n is formed.

α-CROWN (``alpha=True``; Xu et al., "Fast and Complete", ICLR 2021). The lower slopes of
unstable ReLU neurons behind each output are optimised in [0, 1] with Adam, by gradients through
the bound; the result is the entrywise best of CROWN's and the optimised bound.

Batching (``batch_axis``). With ``batch_axis=0`` (default) the batch of boxes is split into
examples and ``fn`` is bounded on each example as a batch of one: *only `Interval` leaves are
split along ``batch_axis``*; concrete leaves (parameters) are passed whole. Every output leaf
that depends on a box must have size 1 along ``batch_axis`` in that batch-of-one call and the
results are concatenated along it; outputs that do not depend on a box are returned as computed
once. This assumes ``fn`` treats examples independently (true for feed-forward networks, false
for layers with batch statistics). ``batch_axis=None`` bounds the whole call as one problem.

Sound floating point (``sound_fp=True``). Every bound holds for the exact real-number
evaluation of ``fn`` with its float parameters (concrete intermediate values, e.g. a reshaped
bias, are taken as computed). The rounding error of every computed ``Λ`` and bias is bounded a
priori with Higham's ``γ_n`` (see `boundjax.rounding`): for a step whose transpose sums at most
``n`` terms into an entry of ``Λ_x`` that receives ``k`` contributions,
``|Λ̃_x - Lᵀ Λ̃_y| <= γ_{n+k} |L|ᵀ |Λ̃_y|``, which moves the bound by at most
``γ_{n+k} |Λ̃_y|·(|L| |x|_max)`` (``|x|_max`` from the sound forward interval pass). These
slacks, the error of the bias sums and of the final dot products are added up (a cheap
matrix-vector product per step), doubled to cover the error of computing them, and the result
is rounded outward with ``nextafter``. ReLU upper lines are rounded up (``a_U`` and ``b_U``),
which keeps them valid. On a GPU, matmuls run with ``precision="highest"`` in this mode (the
error model assumes float32 products and sums).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from boundjax import rounding
from boundjax.core import program as prog_lib
from boundjax.core.program import Lit as _Lit, Var as _Var
from boundjax.domains import interval as interval_domain
from boundjax.errors import BoundError, UnsupportedPrimitiveError
from boundjax.interval import Interval, is_interval

try:  # provided by boundjax.validation (landing alongside)
  from boundjax.validation import validate_arguments
except ImportError:  # pragma: no cover
  def validate_arguments(leaves, *, where):
    return None

INTERMEDIATE_MODES = ("crown", "ibp")


# ----------------------------------------------------------------------------------------------
# Linear relaxations of nonlinear operations
# ----------------------------------------------------------------------------------------------
#
# A relaxation of ``y = f(x_1, ..., x_k)`` on the box ``x_p ∈ [l_p, u_p]`` is a pair of linear
# functions ``L_lo(x) + b_lo <= y <= L_up(x) + b_up`` valid on the whole box (CROWN, Zhang et al.
# 2018, §3.2 and appendix; auto_LiRPA, Xu et al. 2020, §3). Elementwise operations give one
# slope per entry (``L(x) = a ⊙ x``); a pooling maximum gives a selection map. `_Lines` holds,
# per relaxed operand, either an array of slopes (the output's shape) or a callable applying
# ``Lᵀ`` to a row of ``Λ`` (None: a zero map).

@dataclasses.dataclass
class _Lines:
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


def _s_shaped(f, df, far: float = 10.0):
  """An increasing ``f`` convex on ``x <= 0`` and concave on ``x >= 0`` (tanh, logistic, erf,
  atan): CROWN's construction (Zhang et al. 2018, §3.2, "general activations").

  * ``u <= 0``: convex part: chord above, tangent at the midpoint below.
  * ``l >= 0``: concave part: chord below, tangent at the midpoint above.
  * ``l < 0 < u``: upper line the tangent at ``d >= 0`` that passes above ``(l, f(l))``:
    ``g(d) = f(d) + f'(d)(l - d) - f(l)`` is non-decreasing in ``d >= 0`` (``g' = f''(d)(l - d)
    >= 0``), so bisection on ``[0, max(u, far)]`` keeping ``g >= 0`` finds one. It is valid: on
    ``[0, ∞)`` a tangent of the concave part lies above ``f``; on ``[l, 0]`` the line minus
    ``f`` is concave and non-negative at both ends. The lower line is the mirror image (tangent
    at ``d <= 0`` passing below ``(u, f(u))``). Lines that fail their end-point check are
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
    pick = lambda c, k, m: jnp.where(left, c, jnp.where(right, k, m))  # noqa: E731
    return (pick(c_lines[0], k_lines[0], a_lo), pick(c_lines[1], k_lines[1], b_lo),
            pick(c_lines[2], k_lines[2], a_up), pick(c_lines[3], k_lines[3], b_up))
  return lines


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
  a_lo, b_lo, a_up, b_up = _s_shaped(lax.erf, _derf)(l, u)
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
    "tanh": _s_shaped(jnp.tanh, _dtanh),
    "logistic": _s_shaped(jax.nn.sigmoid, _dlogistic, far=20.0),
    "erf": _s_shaped(lax.erf, _derf),
    "erfc": _erfc_lines,
    "atan": _s_shaped(jnp.arctan, lambda x: 1 / (1 + x * x), far=50.0),
    "abs": _abs_lines,
    "square": _power_lines(2),
}


def _finite_or_constant(a_lo, b_lo, a_up, b_up, l, u, y_lo, y_hi, check: Callable | None):
  """Replaces entries whose lines are not finite, whose box is (nearly) a point, or that fail
  the end-point check by the constant lines ``y_lo <= y <= y_hi`` (the interval bound)."""
  tiny = (u - l) <= 1e-6 * (1 + jnp.abs(l) + jnp.abs(u))
  ok = ~tiny & jnp.isfinite(a_lo) & jnp.isfinite(b_lo) & jnp.isfinite(a_up) & jnp.isfinite(b_up)
  if check is not None:
    ok = ok & check(a_lo, b_lo, a_up, b_up)
  ok_lo = ok & (a_lo * l + b_lo <= y_hi) & (a_lo * u + b_lo <= y_hi)  # never above the box
  ok_up = ok & (a_up * l + b_up >= y_lo) & (a_up * u + b_up >= y_lo)
  zero = jnp.zeros_like(l)
  return (jnp.where(ok_lo, a_lo, zero), jnp.where(ok_lo, b_lo, y_lo),
          jnp.where(ok_up, a_up, zero), jnp.where(ok_up, b_up, y_hi))


def _endpoint_check(f):
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


def _unary_relaxation(name: str, params: dict):
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


def _unary_fn(name: str, params: dict):
  if name == "integer_pow":
    return lambda x: lax.integer_pow(x, params["y"])
  return _UNARY_FN[name]


def _reciprocal_lines(c, l, u):
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


def _mccormick(lx, ux, ly, uy):
  """``y = x · z``: the average of the two McCormick planes on each side (McCormick 1976;
  used for products in auto_LiRPA, Xu et al. 2020):
  ``x z >= ½[(l_z + u_z) x + (l_x + u_x) z - l_x l_z - u_x u_z]`` and
  ``x z <= ½[(l_z + u_z) x + (l_x + u_x) z - l_x u_z - u_x l_z]`` (an average of valid planes
  is valid)."""
  cx, cy = (lx + ux) / 2, (ly + uy) / 2
  b_lo = -(lx * ly + ux * uy) / 2
  b_up = -(lx * uy + ux * ly) / 2
  return [cy, cx], b_lo, [cy, cx], b_up


def _leaky_lines(p, n, l, u):
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
      relaxed) or "nonlinear" (relaxed by lines on the input box, `_Lines`).
    index_operands: operands that must be concrete (indices, predicates); None: all but the
      first.
    additive: a concrete float operand is an offset added to the result, not a coefficient.
    exact_transpose: pure data movement: the transpose is exact in floating point (sound mode
      needs no γ_n for it).
    pattern_safe: the transpose with every concrete float operand set to 1 gives a superset of
      the non-zero pattern of the true transpose (the windowed pass).
    relax: "unary" (elementwise lines ``(l, u) -> (a_lo, b_lo, a_up, b_up)``, see
      `_unary_relaxation`) or "pool" (a maximum/minimum over entries: selection map below or
      above, the interval bound on the other side).
  """
  kind: str
  index_operands: tuple | None = ()
  additive: bool = False
  exact_transpose: bool = False
  pattern_safe: bool = False
  relax: str = ""


def _build_ops() -> dict[str, OpRecord]:
  aff = lambda **k: OpRecord("affine", **k)  # noqa: E731
  ops = {
      "add": aff(additive=True, pattern_safe=True),
      "add_any": aff(additive=True, pattern_safe=True),
      "sub": aff(additive=True),
      "neg": aff(exact_transpose=True),
      "reshape": aff(exact_transpose=True, pattern_safe=True),
      "broadcast_in_dim": aff(pattern_safe=True),
      "transpose": aff(exact_transpose=True, pattern_safe=True),
      "squeeze": aff(exact_transpose=True, pattern_safe=True),
      "expand_dims": aff(exact_transpose=True, pattern_safe=True),
      "reduce_sum": aff(exact_transpose=True, pattern_safe=True),
      "reduce_window_sum": aff(pattern_safe=True),
      "concatenate": aff(additive=True, exact_transpose=True),
      "slice": aff(exact_transpose=True, pattern_safe=True),
      "pad": aff(additive=True, exact_transpose=True, pattern_safe=True),
      "convert_element_type": aff(pattern_safe=True),
      "copy": aff(exact_transpose=True, pattern_safe=True),
      "copy_p": aff(exact_transpose=True, pattern_safe=True),
      "stop_gradient": aff(exact_transpose=True),
      "rev": aff(exact_transpose=True),
      "cumsum": aff(),
      "select_n": aff(index_operands=(0,), additive=True, exact_transpose=True),
      "dynamic_slice": aff(index_operands=None, exact_transpose=True),
      "gather": aff(index_operands=(1,)),
      "mul": OpRecord("bilinear", pattern_safe=True),
      "div": OpRecord("bilinear", pattern_safe=True),
      "dot_general": OpRecord("bilinear", pattern_safe=True),
      "conv_general_dilated": OpRecord("bilinear", pattern_safe=True),
      "max": OpRecord("relu"),
      "min": OpRecord("relu"),
  }
  for name in (*_UNARY_LINES, "integer_pow"):
    ops[name] = OpRecord("nonlinear", relax="unary")
  for name in ("reduce_max", "reduce_min", "reduce_window_max", "reduce_window_min"):
    ops[name] = OpRecord("nonlinear", relax="pool")
  return ops


OPS: dict[str, OpRecord] = _build_ops()
SUPPORTED = sorted(OPS)
_NO_RECORD = OpRecord("none")


def _op(name: str) -> OpRecord:
  return OPS.get(name, _NO_RECORD)


class CrownFallbackWarning(UserWarning):
  """CROWN bounds an operation by its interval bound (no linear relaxation applies)."""


# ----------------------------------------------------------------------------------------------
# A flat program: the jaxpr with every nested call inlined
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Eqn:
  """CROWN's record of one equation of the flat program.

  ``kind``: "concrete" (no box-dependent operand), "const" (box-dependent but statically known,
  e.g. ``x != x`` of finite values), "affine", "relu" (``max(x, c)`` / ``min(x, c)``),
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
class _Program:
  invars: list
  outvars: list
  eqns: list
  consts: dict  # _Var -> value
  abstract: set  # abstract _Vars
  producer: dict  # _Var -> index of its equation
  uses: dict  # _Var -> number of abstract equations reading it


def _from_core(program: prog_lib.Program) -> _Program:
  """CROWN's view of a flat program of the program layer. Composites with an interval rule
  (softmax, log-softmax, ...) are kept whole: CROWN bounds them by that (tight) rule."""
  keep = [n for n in interval_domain.RULES if n in _composite_names()]
  program = prog_lib.inline_composites(program, keep=keep)
  eqns = [_Eqn(e.prim, e.params, e.invars, e.outvars, e) for e in program.eqns]
  producer = {o: i for i, e in enumerate(eqns) for o in e.outvars}
  return _Program(program.invars, program.outvars, eqns, program.consts, set(), producer, {})


def _composite_names() -> set[str]:
  from boundjax.core import composite
  return {p.name for p in composite.BODIES}


def _is_float(aval) -> bool:
  return jnp.issubdtype(aval.dtype, jnp.floating)


def _low_precision(aval) -> bool:
  """bfloat16 / float16 (their rounding is far from linear at CROWN's tolerance)."""
  return _is_float(aval) and jnp.finfo(aval.dtype).bits < 32


def _is_literal_zero(a) -> bool:
  return isinstance(a, _Lit) and np.ndim(a.val) == 0 and float(a.val) == 0.0


def _match_leaky(e: _Eqn, abstract: set, made_by: dict):
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


def _decide(e: _Eqn, abstract: set, made_by: dict, sound: bool) -> None:
  """Sets ``kind`` (and ``mode``, ``relax_in``, ``aux``, ``reason``) of an abstract equation."""
  name, pos = e.name, e.abstract_pos
  rec = _op(name)
  ins = [e.invars[p] for p in pos]
  same = all(v.shape == e.outvars[0].shape for v in ins) if e.outvars else False

  def fallback(reason):
    e.kind, e.reason = "fallback", reason

  def nonlinear(mode, relax_in, aux=None):
    if sound:
      return fallback("sound_fp bounds nonlinear operations other than ReLU-type ones by "
                      "intervals")
    e.kind, e.mode, e.relax_in, e.aux = "nonlinear", mode, tuple(relax_in), aux

  if name in ("ne", "eq") and len(e.invars) == 2 and e.invars[0] is e.invars[1] \
      and _is_float(e.invars[0].aval):
    e.kind = "const"  # x != x is False for the finite reals of a box (NaN tests)
    return
  if any(_low_precision(v.aval) for v in ins) or any(_low_precision(o.aval) for o in e.outvars):
    return fallback("bfloat16/float16 arithmetic (its rounding is not a linear map)")
  if name == "select_n":
    leaky = _match_leaky(e, abstract, made_by)
    if leaky is not None:
      return nonlinear("leaky", (leaky[0],), ("select", leaky[1]))
  if not all(_is_float(o.aval) for o in e.outvars):
    return fallback("a non-float result")
  if rec.kind == "none":
    return fallback("no linear relaxation")
  if rec.kind == "affine":
    idx = rec.index_operands
    if idx is None:
      idx = tuple(range(1, len(e.invars)))
    if any(p in idx for p in pos):
      return fallback("a box-dependent index or predicate")
    if not all(_is_float(v.aval) for v in ins):
      return fallback("a non-float box-dependent operand")
    e.kind = "affine"
    return
  if not all(_is_float(v.aval) for v in ins):
    return fallback("a non-float box-dependent operand")
  if rec.kind == "bilinear":
    if len(pos) == 1 and not (name == "div" and pos == (1,)):
      e.kind = "affine"
      return
    if name == "div" and pos == (1,) and same:
      return nonlinear("reciprocal", ins)
    if name == "mul" and len(pos) == 2 and same:
      return nonlinear("product", ins)
    return fallback("a product of two box-dependent operands (no linear relaxation of this "
                    "shape; use bj.ibp for interval parameters)")
  if rec.kind == "relu":
    if len(pos) == 1 and len(e.invars) == 2:
      e.kind = "relu"
      return
    if len(pos) == 2 and same:
      if name == "max":
        for x, v in ((e.invars[0], e.invars[1]), (e.invars[1], e.invars[0])):
          leaky = _scaled_copy(v, x, abstract, made_by)
          if leaky is not None:
            return nonlinear("leaky", (x,), ("max", leaky[1]))
      return nonlinear(name + "2", ins)
    return fallback("max/min of box-dependent operands of different shapes")
  if rec.relax == "pool":
    return nonlinear("pool", ins)
  if _unary_relaxation(name, e.params) is None:
    return fallback("no linear relaxation for these parameters")
  return nonlinear("unary", ins)


def _classify(prog: _Program, abstract_in: Sequence[bool], sound: bool = False) -> None:
  """Decides every abstract equation's role (`_decide`), rewrites ``x / d`` of two
  box-dependent operands into ``x · (1 / d)``, and counts the uses of every abstract variable.

  Raises `UnsupportedPrimitiveError` for an operation that CROWN can neither relax nor bound
  by intervals (no rule of the interval domain)."""
  abstract = {v for v, a in zip(prog.invars, abstract_in) if a}
  made_by: dict = {}
  eqns: list = []
  fresh = [0]

  def add(e: _Eqn):
    pos = tuple(i for i, a in enumerate(e.invars) if isinstance(a, _Var) and a in abstract)
    e.abstract_pos = pos
    if pos:
      _decide(e, abstract, made_by, sound)
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
      if e.kind != "const":
        abstract.update(e.outvars)
    for o in e.outvars:
      made_by[o] = e
    eqns.append(e)

  for e in prog.eqns:
    ab = [isinstance(a, _Var) and a in abstract for a in e.invars]
    if e.name == "div" and len(ab) == 2 and all(ab) and e.invars[1].shape == e.outvars[0].shape \
        and e.invars[0].shape == e.outvars[0].shape and _is_float(e.outvars[0].aval) \
        and not _low_precision(e.outvars[0].aval):
      x, d = e.invars
      fresh[0] -= 1
      r = _Var(d.aval, fresh[0])
      one = _Lit(np.ones((), d.aval.dtype))
      add(_Eqn(lax.div_p, {}, [one, d], [r], e.orig))
      add(_Eqn(lax.mul_p, {}, [x, r], list(e.outvars), e.orig))
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


def _warn_fallbacks(prog: _Program) -> None:
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


def _reachable(prog: _Program) -> set[int]:
  """Indices of the abstract equations the backward passes of the outputs can reach (also
  through the inputs of fallback equations, whose intervals come from earlier equations)."""
  seen, stack, idx = set(), [v for v in prog.outvars if isinstance(v, _Var)], set()
  while stack:
    v = stack.pop()
    if v in seen:
      continue
    seen.add(v)
    i = prog.producer.get(v)
    if i is None or prog.eqns[i].kind in ("concrete", "const"):
      continue
    idx.add(i)
    e = prog.eqns[i]
    stack.extend(e.back_in if e.kind != "fallback" else
                 [e.invars[p] for p in e.abstract_pos])
  return idx


def _bind(e: _Eqn, vals: Sequence[Any]):
  bind = e.prim.get_bind_params(e.params)
  subfuns, params = bind if isinstance(bind, tuple) else ((), bind)
  with e.orig.manager:
    out = e.prim.bind(*subfuns, *vals, **params)
  return out


def _bind1(e: _Eqn, vals):
  out = _bind(e, vals)
  return out[0] if e.prim.multiple_results else out


def _eval_concrete(prog: _Program, args: Sequence[Any]) -> dict:
  """Values of every concrete variable (abstract ones are left out)."""
  env = dict(prog.consts)
  for v, a in zip(prog.invars, args):
    if v not in prog.abstract:
      env[v] = a
  for e in prog.eqns:
    if e.kind == "const":  # x != x / x == x of finite values
      o = e.outvars[0]
      env[o] = np.full(o.shape, e.name == "eq", o.aval.dtype)
      continue
    if e.kind != "concrete":
      continue
    out = _bind(e, [_read(env, a) for a in e.invars])
    outs = out if e.prim.multiple_results else [out]
    for v, o in zip(e.outvars, outs):
      env[v] = o
  return env


def _read(env, a):
  return a.val if isinstance(a, _Lit) else env[a]


# ----------------------------------------------------------------------------------------------
# Per-equation linear algebra
# ----------------------------------------------------------------------------------------------

def _operands(e: _Eqn, cenv: dict, abstract_vals: Sequence[Any]) -> list:
  vals = [None if i in e.abstract_pos else _read(cenv, a) for i, a in enumerate(e.invars)]
  for p, x in zip(e.abstract_pos, abstract_vals):
    vals[p] = x
  return vals


def _affine_vjp(e: _Eqn, cenv: dict):
  """``(y0, vjp)`` of ``x -> op(x, consts)`` at x = 0: the offset and the transposed map."""
  zeros = [jnp.zeros(e.invars[p].shape, e.invars[p].aval.dtype) for p in e.abstract_pos]
  return jax.vjp(lambda *xs: _bind1(e, _operands(e, cenv, xs)), *zeros)


def _transpose_rows(e: _Eqn, cenv: dict, vjp, rows) -> list:
  """``[L_pᵀ row for each abstract operand p]`` for a batch of rows (leading axis)."""
  if (e.name == "conv_general_dilated" and e.abstract_pos == (0,)
      and e.params["feature_group_count"] == 1 and e.params["batch_group_count"] == 1):
    return [jax.vmap(lambda g: _conv_transpose_lhs(e, cenv, g))(rows)]
  return list(jax.vmap(vjp)(rows))


def _conv_transpose_lhs(e: _Eqn, cenv: dict, g):
  """Transpose of ``x -> conv(x, W)`` applied to ``g`` (the lhs VJP, as in JAX's own rule),
  with the flipped kernel materialised in the (spatial..., in, out) layout: XLA:CPU runs a
  convolution whose kernel has swapped feature dimensions on a slow generic path."""
  from jax._src.lax import convolution as conv_impl
  p = e.params
  lhs_spec, rhs_spec, out_spec = p["dimension_numbers"]
  x = e.invars[0]
  w = _read(cenv, e.invars[1])
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


def _abs_linear(e: _Eqn, cenv: dict, pos: int, v):
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
    c = _read(cenv, a)
    if not jnp.issubdtype(jnp.result_type(c), jnp.floating):
      vals.append(c)  # indices / predicates
    elif _op(e.name).additive:
      vals.append(jnp.zeros_like(c))
    else:
      vals.append(jnp.abs(c))
  if e.name == "neg":
    return v
  if e.name == "sub":
    out = vals[0] + vals[1]
    return jnp.broadcast_to(out, e.outvars[0].shape)
  return _bind1(e, vals)


def _transpose_terms(e: _Eqn, pos: int) -> int:
  """How many terms the transpose sums into one entry of operand ``pos`` (for γ_n)."""
  x, y = e.invars[pos], e.outvars[0]
  name = e.name
  if _op(name).exact_transpose or (name == "convert_element_type"
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
# ReLU relaxation
# ----------------------------------------------------------------------------------------------

def _relu_parts(e: _Eqn, cenv: dict):
  """For ``y = max(x, c)`` / ``min(x, c)``: (x var, c broadcast, σ) with y = c + σ relu(σ(x-c))."""
  (p,) = e.abstract_pos
  x = e.invars[p]
  c = jnp.broadcast_to(jnp.asarray(_read(cenv, e.invars[1 - p]), x.aval.dtype), x.shape)
  return x, c, (1.0 if e.name == "max" else -1.0)


def _relu_lines(l, u, sound: bool):
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


# ----------------------------------------------------------------------------------------------
# The backward pass
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Prefix:
  """The example-independent start of a backward pass: from ``Λ = I`` at the target through the
  affine equations above it, stopping at ReLU outputs."""
  m: int
  pending: dict  # relu output var -> Λ (m, *shape)
  at_input: dict  # abstract input var -> Λ
  bias: Any  # (m,)
  slack_const: Any  # (m,) example-independent rounding slack (sound mode)
  steps: list  # (|Λ_y|, eqn, pos, gamma) for the example-dependent slack (sound mode)


def _ancestors(prog: _Program, target: _Var) -> list[int]:
  seen, stack, idx = set(), [target], set()
  while stack:
    v = stack.pop()
    if v in seen:
      continue
    seen.add(v)
    i = prog.producer.get(v)
    if i is None or prog.eqns[i].kind in ("concrete", "const"):
      continue
    idx.add(i)
    stack.extend(prog.eqns[i].back_in)
  return sorted(idx)


def _rowdot(lam, vec, lead: int = 1):
  """Σ over a variable's entries of ``lam * vec``; lam has ``lead`` leading row axes.

  Computed as a matrix-vector product (much faster on CPU than a fused multiply-reduce)."""
  rows = lam.shape[:lead]
  n = int(np.prod(lam.shape[lead:], dtype=np.int64))
  vec = jnp.broadcast_to(vec, lam.shape[lead:]).reshape((n,))
  return (lam.reshape((-1, n)) @ vec).reshape(rows)


def _is_zero(a) -> bool:
  """Statically known to be zero (a literal 0)."""
  return isinstance(a, _Lit) and bool(np.all(np.asarray(a.val) == 0))


def _has_offset(e: _Eqn) -> bool:
  """Whether ``op(0, consts)`` can be non-zero (an additive concrete operand)."""
  if not _op(e.name).additive:
    return False
  for i, a in enumerate(e.invars):
    if i in e.abstract_pos or _is_zero(a):
      continue
    if e.name == "select_n" and i == 0:
      continue
    if jnp.issubdtype(a.aval.dtype if isinstance(a, _Var) else jnp.result_type(a.val),
                      jnp.floating):
      return True
  return False


def _add_to(d: dict, k, v):
  d[k] = v if k not in d else d[k] + v


def _prefix(prog: _Program, cenv: dict, target: _Var, anc: list[int], sound: bool) -> _Prefix:
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
    y0, vjp = _affine_vjp(e, cenv)
    contribs = _transpose_rows(e, cenv, vjp, lam_y)
    if _has_offset(e):
      bias = bias + _rowdot(lam_y, y0)
    if sound and _has_offset(e):
      slack = slack + rounding.gamma(y.size + n_eq, dtype) * _rowdot(jnp.abs(lam_y), jnp.abs(y0))
    for p, c in zip(e.abstract_pos, contribs):
      x = e.invars[p]
      _add_to(lam, x, c)
      if sound:
        g = rounding.gamma(_transpose_terms(e, p) + prog.uses.get(x, 1) + 1, dtype)
        steps.append((jnp.abs(lam_y), e, p, g))
  at_input = {v: l for v, l in lam.items()}
  return _Prefix(m, pending, at_input, bias, slack, steps)


# ----------------------------------------------------------------------------------------------
# Windowed ("patches") backward pass for local layers
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _PatchPlan:
  """A backward pass ``target <- L2 <- relu(s) <- A <- x`` (x a box input) done on windows.

  Rows of ``Λ`` that share their support in ``s`` (for a convolution: the target neurons at one
  spatial position) form a group ``g`` with support ``S_g`` (k entries of s) and input window
  ``X_g`` (q entries of x, the union of the supports of ``A``'s rows in ``S_g``).
  """
  s: _Var  # the ReLU input
  x: _Var  # the box input
  rows: Any  # (G, r) int: target rows of each group (pad: m)
  pos: Any  # (m,) int: where row i sits in the flattened (G, r)
  S: Any  # (G, k) int: support of the group in s (pad: n_s)
  X: Any  # (G, q) int: input window of the group (pad: n_x)
  mu: Any  # (G, r, k): the coefficients of s-side ReLU outputs (from the prefix)
  M: Any  # (G, k, q): A restricted to S_g x X_g
  bias_t: Any  # (m,) offset of the target above the ReLU
  bias_s: Any  # (n_s + 1,) offset of s (A x + bias_s), padded with 0


def _ones_cenv(prog: _Program, anc: list[int]):
  """Concrete operands of ``anc`` with every float value replaced by ones, or None when a
  concrete operand is not a float (its value would matter for the pattern)."""
  env = {}
  for i in anc:
    e = prog.eqns[i]
    if e.kind == "relu":
      continue
    if e.kind != "affine" or not _op(e.name).pattern_safe:
      return None
    for j, a in enumerate(e.invars):
      if j in e.abstract_pos or not isinstance(a, _Var):
        continue
      if not _is_float(a.aval):
        return None
      env[a] = np.ones(a.shape, a.aval.dtype)
  return env


def _support(prog: _Program, target: _Var, anc: list[int], var_of) -> np.ndarray | None:
  """Boolean ``(m, n)`` superset of the non-zero pattern of ``Λ`` rows at one variable, from
  the transpose with all-ones coefficients (evaluated once, at trace time)."""
  env = _ones_cenv(prog, anc)
  if env is None:
    return None
  with jax.ensure_compile_time_eval():
    px = _prefix(prog, env, target, anc, False)
    lam = var_of(px)
    if lam is None:
      return None
    return np.asarray(lam).reshape((px.m, -1)) != 0


def _patch_plan(prog: _Program, cenv: dict, target: _Var, prefixes: dict,
                ancestors: dict) -> _PatchPlan | None:
  """The windowed plan for ``target``, or None when the pattern does not apply or does not pay."""
  px: _Prefix = prefixes[target]
  if len(px.pending) != 1 or px.at_input:
    return None
  (z, mu), = px.pending.items()
  relu = [prog.eqns[i] for i in ancestors[target]
          if prog.eqns[i].kind == "relu" and prog.eqns[i].outvars[0] is z]
  if len(relu) != 1:
    return None
  e = relu[0]
  if e.name != "max" or not _is_zero(e.invars[1 - e.abstract_pos[0]]):
    return None
  s = e.invars[e.abstract_pos[0]]
  ps: _Prefix | None = prefixes.get(s)
  if ps is None or ps.pending or len(ps.at_input) != 1:
    return None
  (x, a_mat), = ps.at_input.items()
  m, n_s, n_x = target.size, s.size, x.size
  above = [i for i in ancestors[target] if i not in set(ancestors[s])]
  pat_mu = _support(prog, target, above, lambda p: p.pending.get(z))
  pat_a = _support(prog, s, ancestors[s], lambda p: p.at_input.get(x))
  if pat_mu is None or pat_a is None:
    return None
  k = int(pat_mu.sum(1).max())
  if k == 0:
    return None
  # groups of rows with the same support in s (sorted, padded with n_s)
  S_rows = np.full((m, k), n_s, np.int64)
  for i in range(m):
    nz = np.flatnonzero(pat_mu[i])
    S_rows[i, :nz.size] = nz
  S, group = np.unique(S_rows, axis=0, return_inverse=True)
  group = group.reshape(-1)
  G = S.shape[0]
  counts = np.bincount(group, minlength=G)
  r = int(counts.max())
  rows = np.full((G, r), m, np.int64)
  pos = np.zeros((m,), np.int64)
  fill = np.zeros((G,), np.int64)
  for i in range(m):
    g = group[i]
    rows[g, fill[g]] = i
    pos[i] = g * r + fill[g]
    fill[g] += 1
  pat_a_pad = np.concatenate([pat_a, np.zeros((1, n_x), bool)])
  windows = [np.flatnonzero(pat_a_pad[S[g]].any(0)) for g in range(G)]
  q = max(1, max(w.size for w in windows))
  X = np.full((G, q), n_x, np.int64)
  for g, w in enumerate(windows):
    X[g, :w.size] = w
  # pays only when the windows are a small part of the dense map
  if k * q * 8 > n_s * n_x or G * (k * q + r * k) > (1 << 26):
    return None
  dtype = target.aval.dtype
  mu_pad = jnp.pad(mu.reshape((m, n_s)), ((0, 1), (0, 1)))
  a_pad = jnp.pad(a_mat.reshape((n_s, n_x)), ((0, 1), (0, 1)))
  return _PatchPlan(
      s=s, x=x, rows=rows, pos=pos, S=S, X=X,
      mu=mu_pad[rows[:, :, None], S[:, None, :]],
      M=a_pad[S[:, :, None], X[:, None, :]],
      bias_t=px.bias, bias_s=jnp.concatenate([ps.bias, jnp.zeros((1,), dtype)]))


def _backward_patches(plan: _PatchPlan, target: _Var, ivs: dict, pre: dict):
  """`_backward` for a target with a `_PatchPlan` (not in sound mode): the same bounds, up to
  the order of float sums, computed on each group's window only.

  With ``μ`` the coefficients of ``relu(s)`` and the ReLU lines ``(a_lo, a_up, b_up)`` on
  ``[l, u]`` of ``s``: ``ν_lo = μ·(μ>0 ? a_lo : a_up)``, ``ν_hi = μ·(μ>0 ? a_up : a_lo)``,
  ``Λ_x = ν M``, and ``lower = bias_t + min(μ,0)·b_up + ν_lo·bias_s + Λ_x·c - |Λ_x|·r`` on the
  window (upper: max, ``+|Λ_x|·r``).
  """
  l, u = pre[plan.s]
  a_lo, a_up, b_up = _relu_lines(l.reshape(-1), u.reshape(-1), False)
  pad = lambda v: jnp.concatenate([v, jnp.zeros((1,), v.dtype)])  # noqa: E731
  a_lo, a_up, b_up = pad(a_lo)[plan.S], pad(a_up)[plan.S], pad(b_up)[plan.S]  # (G, k)
  mu = plan.mu  # (G, r, k)
  pos = mu > 0
  nu_lo = mu * jnp.where(pos, a_lo[:, None], a_up[:, None])
  nu_hi = mu * jnp.where(pos, a_up[:, None], a_lo[:, None])
  nu = jnp.concatenate([nu_lo, nu_hi], axis=1)  # (G, 2r, k)
  bs = plan.bias_s[plan.S]  # (G, k)
  off = jnp.einsum("grk,gk->gr", nu, bs)
  r_ = mu.shape[1]
  off = off + jnp.concatenate([jnp.einsum("grk,gk->gr", jnp.minimum(mu, 0), b_up),
                               jnp.einsum("grk,gk->gr", jnp.maximum(mu, 0), b_up)], axis=1)
  lam_x = jnp.einsum("grk,gkq->grq", nu, plan.M)  # (G, 2r, q)
  c, rad = _center_radius(ivs[plan.x], False)
  c, rad = pad(c.reshape(-1))[plan.X], pad(rad.reshape(-1))[plan.X]  # (G, q)
  lin = jnp.einsum("grq,gq->gr", lam_x, c)
  spread = jnp.einsum("grq,gq->gr", jnp.abs(lam_x), rad)
  lower = (off[:, :r_] + lin[:, :r_] - spread[:, :r_]).reshape(-1)[plan.pos]
  upper = (off[:, r_:] + lin[:, r_:] + spread[:, r_:]).reshape(-1)[plan.pos]
  lower, upper = lower + plan.bias_t, upper + plan.bias_t
  return lower.reshape(target.shape), upper.reshape(target.shape)


@dataclasses.dataclass
class _Ctx:
  prog: _Program
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


def _mag(iv: Interval):
  return jnp.maximum(jnp.abs(iv.lower), jnp.abs(iv.upper))


def _gather_mu(lam: dict, pending: dict, y, m: int):
  """``Λ`` at ``y`` for both bounds, (2, m, *y.shape): the example's own rows plus the shared
  prefix rows; None when neither reaches ``y``."""
  own, shared = lam.pop(y, None), pending.get(y)
  if own is None and shared is None:
    return None
  if own is None:
    return jnp.broadcast_to(shared[None], (2, *shared.shape))
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


def _relaxed_step(ln: _Lines, e: _Eqn, mu, m: int, lam: dict, bias):
  """One nonlinear equation of the backward pass: for the lower bound positive entries of
  ``Λ_y`` take the lower line and negative ones the upper line, for the upper bound the other
  way round (CROWN, Zhang et al. 2018, Theorem 3.2): ``Λ_x += L_loᵀ Λ⁺ + L_upᵀ Λ⁻`` and
  ``bias += Λ⁺·b_lo + Λ⁻·b_up`` (lower; swapped for the upper bound)."""
  lo_rows = jnp.concatenate([jnp.maximum(mu[0], 0), jnp.minimum(mu[1], 0)])  # (2m, ...)
  up_rows = jnp.concatenate([jnp.minimum(mu[0], 0), jnp.maximum(mu[1], 0)])
  bias = bias + (_safe_rowdot(lo_rows, ln.b_lo) + _safe_rowdot(up_rows, ln.b_up)).reshape((2, m))
  for x, t_lo, t_up in zip(e.relax_in, ln.lo, ln.up):
    parts = [q for q in (_apply_map(t_lo, lo_rows), _apply_map(t_up, up_rows)) if q is not None]
    if parts:
      _add_to(lam, x, sum(parts[1:], parts[0]).reshape((2, m, *x.shape)))
  return bias


def _fallback_step(iv: Interval, mu, m: int):
  """A fallback output ``y ∈ [l, u]`` is a box variable: the lower bound gains
  ``Σ Λ⁺ l + Λ⁻ u``, the upper bound ``Σ Λ⁺ u + Λ⁻ l``; also returns ``Σ |Λ|·max(|l|, |u|)``
  (sound mode error terms)."""
  lo, hi = iv.lower, iv.upper
  low = _safe_rowdot(jnp.maximum(mu[0], 0), lo) + _safe_rowdot(jnp.minimum(mu[0], 0), hi)
  up = _safe_rowdot(jnp.maximum(mu[1], 0), hi) + _safe_rowdot(jnp.minimum(mu[1], 0), lo)
  mag = _safe_rowdot(jnp.abs(mu.reshape((2 * m, -1))), _mag(iv).reshape(-1)).reshape((2, m))
  return jnp.stack([low, up]), mag


def _spec_prefix(px: _Prefix, spec) -> _Prefix:
  """The prefix of ``C @ target`` (start ``Λ = C`` instead of ``I``): every shared row block is
  mapped by ``C`` (k, m), which is exact linear algebra on the example-independent part."""
  k = spec.shape[0]
  mapc = lambda a: jnp.tensordot(spec.astype(a.dtype), a, axes=1)  # noqa: E731
  return _Prefix(k, {v: mapc(a) for v, a in px.pending.items()},
                 {v: mapc(a) for v, a in px.at_input.items()}, spec.astype(px.bias.dtype) @ px.bias,
                 jnp.zeros((k,), px.bias.dtype), [])


def _backward(ctx: _Ctx, target: _Var, ivs: dict, pre: dict, rel: dict | None = None,
              spec=None, alphas: dict | None = None):
  """CROWN lower and upper bounds of ``target`` (flattened, shape (m,)) for one example.

  ``ivs``: forward intervals of abstract variables; ``pre``: ReLU input var -> (l, u);
  ``rel``: nonlinear equation index -> its `_Lines` on this example; ``spec``: start from
  ``Λ = C``; ``alphas``: ReLU input var -> (2, n) lower slopes of its unstable neurons for the
  lower and the upper bound (α-CROWN; any value in [0, 1] is a valid lower line).
  """
  rel = {} if rel is None else rel
  plan = ctx.plans.get(target)
  if plan is not None and spec is None and alphas is None:
    return _backward_patches(plan, target, ivs, pre)
  prog, cenv, sound = ctx.prog, ctx.cenv, ctx.sound
  px: _Prefix = ctx.prefixes[target]
  if spec is not None:
    px = _spec_prefix(px, spec)
  dtype = target.aval.dtype
  m, n_eq = px.m, len(prog.eqns)
  lam: dict = {}  # var -> (2, m, *shape): [0] for the lower bound, [1] for the upper bound
  bias = jnp.stack([px.bias, px.bias])
  slack = jnp.zeros((2, m), dtype) + px.slack_const
  for (abs_lam, e, p, g) in px.steps:
    x = e.invars[p]
    slack = slack + g * _rowdot(abs_lam, _abs_linear(e, cenv, p, _mag(ivs[x])))
  fb_abs, n_fb = jnp.zeros((2, m), dtype), 0
  if px.pending:
    for i in reversed(ctx.ancestors[target]):
      e = prog.eqns[i]
      y = e.outvars[0]
      if e.kind == "nonlinear":
        mu = _gather_mu(lam, px.pending, y, m)
        if mu is not None:
          bias = _relaxed_step(rel[i], e, mu, m, lam, bias)
        continue
      if e.kind == "fallback":
        for y2 in e.outvars:
          mu = _gather_mu(lam, px.pending, y2, m)
          if mu is not None:
            add, mag = _fallback_step(ivs[y2], mu, m)
            bias, fb_abs, n_fb = bias + add, fb_abs + mag, n_fb + y2.size
        continue
      if e.kind == "relu":
        own = lam.pop(y, None)  # (2, m, ...) from pass 2, or None
        shared = px.pending.get(y)  # (m, ...) from the prefix, or None
        if own is None and shared is None:
          continue
        x, c, sigma = _relu_parts(e, cenv)
        c_zero = _is_zero(e.invars[1 - e.abstract_pos[0]])
        l, u = pre[x]
        lt, ut = (l - c, u - c) if sigma > 0 else (c - u, c - l)
        if sound:
          lt, ut = rounding.round_down(lt), rounding.round_up(ut)
        a_lo, a_up, b_up = _relu_lines(lt, ut, sound)
        n = x.size
        flat = lambda a: a.reshape(a.shape[:a.ndim - len(x.shape)] + (n,))  # noqa: E731
        a_lo, a_up, b_up = flat(a_lo), flat(a_up), flat(b_up)
        if own is None:
          mu = flat(shared)[None]  # (1, m, n): shared by both bounds
        else:
          if shared is not None:
            own = own + shared[None]
          mu = flat(own)  # (2, m, n)
        if sigma < 0:
          mu = -mu
        # lower bound: positive coefficients take the lower line, negative the upper line;
        # upper bound the other way round. (Flat (rows, n) arrays vectorise well on CPU.)
        alpha = None if alphas is None else alphas.get(x)
        if alpha is None:
          a_pos = jnp.stack([a_lo, a_up])[:, None]  # (2, 1, n)
          a_neg = jnp.stack([a_up, a_lo])[:, None]
        else:  # α-CROWN: optimised lower slopes of unstable neurons (lower rows, upper rows)
          unstable = (lt.reshape(-1) < 0) & (ut.reshape(-1) > 0)
          al = jnp.where(unstable[None], jnp.clip(alpha, 0.0, 1.0).astype(a_lo.dtype), a_lo[None])
          a_pos = jnp.stack([al[0], a_up])[:, None]
          a_neg = jnp.stack([a_up, al[1]])[:, None]
        nu = mu * jnp.where(mu > 0, a_pos, a_neg)  # (2, m, n)
        mu_lo, mu_hi = mu[0], mu[-1]
        bias = bias + jnp.stack([jnp.minimum(mu_lo, 0) @ b_up, jnp.maximum(mu_hi, 0) @ b_up])
        if not c_zero:
          mu2 = jnp.broadcast_to(mu, nu.shape)
          bias = bias + sigma * _rowdot(mu2, flat(c), 2) - sigma * _rowdot(nu, flat(c), 2)
        nu = nu.reshape((2, m, *x.shape))
        _add_to(lam, x, nu if sigma > 0 else -nu)
        if sound:
          k = prog.uses.get(x, 1) + 1
          slack = slack + rounding.gamma(1 + k, dtype) * _rowdot(jnp.abs(nu), _mag(ivs[x]), 2)
          amu = jnp.abs(jnp.stack([mu_lo, mu_hi]))
          absum = _rowdot(amu, b_up, 2)
          if not c_zero:
            absum = (absum + _rowdot(amu, jnp.abs(flat(c)), 2)
                     + _rowdot(jnp.abs(nu), jnp.abs(c), 2))
          slack = slack + rounding.gamma(3 * x.size + n_eq, dtype) * absum
        continue
      if y not in lam:
        continue
      lam_y = lam.pop(y)
      y0, vjp = _affine_vjp(e, cenv)
      contribs = _transpose_rows(e, cenv, vjp, lam_y.reshape((2 * m, *y.shape)))
      if _has_offset(e):
        bias = bias + _rowdot(lam_y, y0, 2)
      if sound and _has_offset(e):
        slack = slack + rounding.gamma(y.size + n_eq, dtype) * _rowdot(jnp.abs(lam_y),
                                                                       jnp.abs(y0), 2)
      for p, cb in zip(e.abstract_pos, contribs):
        x = e.invars[p]
        _add_to(lam, x, cb.reshape((2, m, *x.shape)))
        if sound:
          g = rounding.gamma(_transpose_terms(e, p) + prog.uses.get(x, 1) + 1, dtype)
          slack = slack + g * _rowdot(jnp.abs(lam_y), _abs_linear(e, cenv, p, _mag(ivs[x])), 2)
  # concretise at the input boxes
  lower, upper = bias[0], bias[1]
  absum = jnp.abs(bias[0]) + jnp.abs(bias[1]) + fb_abs[0] + fb_abs[1]
  n_in = n_fb
  for v in prog.invars:
    if v not in prog.abstract:
      continue
    l_p = px.at_input.get(v)
    l_2 = lam.get(v)
    if l_p is None and l_2 is None:
      continue
    tot = l_p[None] if l_2 is None else (l_2 if l_p is None else l_2 + l_p[None])
    tot = jnp.broadcast_to(tot, (2, m, *v.shape))
    c, r = _center_radius(ivs[v], sound)
    lower = lower + _rowdot(tot[0], c) - _rowdot(jnp.abs(tot[0]), r)
    upper = upper + _rowdot(tot[1], c) + _rowdot(jnp.abs(tot[1]), r)
    n_in += v.size
    if sound:
      ac = jnp.abs(c) + r
      absum = absum + _rowdot(jnp.abs(tot[0]), ac) + _rowdot(jnp.abs(tot[1]), ac)
  if sound:
    err = rounding.gamma(2 * n_in + 3 + n_eq, dtype) * absum
    lower = lower - 2 * (slack[0] + err)
    upper = upper + 2 * (slack[1] + err)
    lower, upper = rounding.outward(lower, upper, ulps=1)
  if spec is not None:
    return lower, upper
  return lower.reshape(target.shape), upper.reshape(target.shape)


def _center_radius(iv: Interval, sound: bool):
  c = (iv.lower + iv.upper) / 2
  if not sound:
    return c, (iv.upper - iv.lower) / 2
  r = jnp.maximum(rounding.round_up(c - iv.lower), rounding.round_up(iv.upper - c))
  return c, rounding.round_up(r)


def _intersect(a: Interval, lo, hi, sound: bool) -> Interval:
  lo2, hi2 = jnp.maximum(a.lower, lo), jnp.minimum(a.upper, hi)
  if not sound:  # both bounds are float approximations; never return an empty box
    lo2, hi2 = jnp.minimum(lo2, hi2), jnp.maximum(lo2, hi2)
  return Interval(lo2, hi2, validate=False)


def _interval_of(e: _Eqn, vals: list, sound: bool) -> list:
  """The forward interval rule of an equation (a composite through the interval domain, which
  may bound its body instead); low-precision arithmetic always in the domain's sound mode, whose
  outward rounding covers the float error of evaluating the operation in that precision."""
  low = any(_low_precision(o.aval) for o in e.outvars) or any(
      isinstance(v, Interval) and _low_precision(jax.typeof(v.lower)) for v in vals)
  if low and e.name in interval_domain.RULES:
    return _interval_low_precision(e, vals)
  ivctx = interval_domain.IntervalContext(sound=sound)
  if e.prim is e.orig.prim:
    return interval_domain.abstract_eqn(ivctx, e.orig, vals)
  out = interval_domain.RULES[e.name](ivctx, *vals, **e.params)
  return list(out) if isinstance(out, (list, tuple)) else [out]


def _is_low_dtype(d) -> bool:
  try:
    return jnp.issubdtype(d, jnp.floating) and jnp.finfo(d).bits < 32
  except TypeError:
    return False


def _interval_low_precision(e: _Eqn, vals: list) -> list:
  """Interval of a bfloat16/float16 equation: the rule in float32 (every low-precision operand
  and dtype parameter raised to float32), widened by two units of the low format's roundoff
  plus its smallest subnormal, then rounded outward to the output dtype (rounding to nearest is
  monotone, so the stored value of any point of the box stays inside). This covers an operation
  evaluated in float32 and rounded once to the low format (XLA's CPU and GPU evaluation of
  bfloat16 products and sums), not one that rounds every partial sum to bfloat16."""
  f32 = jnp.float32
  up = lambda a: a.astype(f32) if _is_low_dtype(jnp.result_type(a)) else a  # noqa: E731
  vals32 = [Interval(up(v.lower), up(v.upper), validate=False) if isinstance(v, Interval)
            else (up(jnp.asarray(v)) if _is_float(jax.typeof(jnp.asarray(v))) else v)
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


def _leaky_slopes(e: _Eqn, cenv: dict, x: _Var):
  """Slopes ``(p, n)`` of a leaky-ReLU equation on the positive and negative side."""
  kind, atom = e.aux
  alpha = jnp.broadcast_to(jnp.asarray(_read(cenv, atom), x.aval.dtype), x.shape)
  if kind == "select":
    return jnp.ones_like(alpha), alpha
  return jnp.maximum(alpha, 1.0), jnp.minimum(alpha, 1.0)


def _relax_lines(e: _Eqn, cenv: dict, bounds: list, y_iv: Interval) -> _Lines:
  """The lines of a nonlinear equation on this example's input bounds (see `_Lines`)."""
  y_lo, y_hi = y_iv.lower, y_iv.upper
  zeros = jnp.zeros_like(y_lo)
  if e.mode in ("unary", "reciprocal", "leaky"):
    (l, u), = bounds
    if e.mode == "unary":
      lines = _unary_relaxation(e.name, e.params)(l, u)
      check = _endpoint_check(_unary_fn(e.name, e.params))(l, u)
    elif e.mode == "reciprocal":
      c = jnp.broadcast_to(jnp.asarray(_read(cenv, e.invars[0]), l.dtype), l.shape)
      lines = _reciprocal_lines(c, l, u)
      check = _endpoint_check(lambda d: c / d)(l, u)
    else:
      p, n = _leaky_slopes(e, cenv, e.relax_in[0])
      lines, check = _leaky_lines(p, n, l, u), None
    a_lo, b_lo, a_up, b_up = _finite_or_constant(*lines, l, u, y_lo, y_hi, check)
    return _Lines([a_lo], b_lo, [a_up], b_up)
  if e.mode == "product":
    (lx, ux), (lz, uz) = bounds
    a_lo, b_lo, a_up, b_up = _mccormick(lx, ux, lz, uz)
    ok = jnp.isfinite(lx) & jnp.isfinite(ux) & jnp.isfinite(lz) & jnp.isfinite(uz)
    keep = lambda a: jnp.where(ok, a, 0.0)  # noqa: E731
    return _Lines([keep(a) for a in a_lo], jnp.where(ok, b_lo, y_lo),
                  [keep(a) for a in a_up], jnp.where(ok, b_up, y_hi))
  if e.mode in ("max2", "min2"):
    (l1, u1), (l2, u2) = bounds
    one, zero = jnp.ones_like(l1), jnp.zeros_like(l1)
    if e.mode == "max2":  # max >= the operand with the larger lower bound; = a dominating one
      first = l1 >= l2
      sel = [jnp.where(first, one, zero), jnp.where(first, zero, one)]
      d1, d2 = l1 >= u2, l2 >= u1
      dom = [jnp.where(d1, one, zero), jnp.where(d2 & ~d1, one, zero)]
      return _Lines(sel, zeros, dom, jnp.where(d1 | d2, zero, y_hi))
    first = u1 <= u2
    sel = [jnp.where(first, one, zero), jnp.where(first, zero, one)]
    d1, d2 = u1 <= l2, u2 <= l1
    dom = [jnp.where(d1, one, zero), jnp.where(d2 & ~d1, one, zero)]
    return _Lines(dom, jnp.where(d1 | d2, zero, y_lo), sel, zeros)
  if e.mode == "pool":
    (l, u), = bounds
    is_max = e.name in ("reduce_max", "reduce_window_max")
    _, vjp = jax.vjp(lambda z: _bind1(e, [z]), l if is_max else u)
    sel = lambda g: vjp(g)[0]  # noqa: E731  a convex combination of the entries (ties split)
    if is_max:  # max >= the entry with the largest lower bound; <= the largest upper bound
      return _Lines([sel], zeros, [None], y_hi)
    return _Lines([None], y_lo, [sel], zeros)
  raise AssertionError(e.mode)


def _spec_interval(iv: Interval, spec):
  """Interval bound of ``C y`` from ``y ∈ [l, u]``: ``C⁺ l + C⁻ u`` and ``C⁺ u + C⁻ l``."""
  l, u = iv.lower.reshape(-1), iv.upper.reshape(-1)
  cp, cn = jnp.maximum(spec, 0), jnp.minimum(spec, 0)
  return Interval(_safe_rowdot(cp, l) + _safe_rowdot(cn, u),
                  _safe_rowdot(cp, u) + _safe_rowdot(cn, l), validate=False)


def _final_bounds(ctx: _Ctx, v: _Var, ivs: dict, pre: dict, rel: dict, spec):
  """CROWN bounds of an output; with ``ctx.alpha_steps > 0`` also α-CROWN's (Xu et al.,
  "Fast and Complete", ICLR 2021, §3.1): the lower slopes ``α ∈ [0, 1]`` of the unstable ReLU
  neurons behind ``v`` are optimised by Adam (gradients through the bound; projected onto
  [0, 1] after each step), one set for the lower and one for the upper bounds, starting from
  CROWN's adaptive slopes. Every α gives valid lines, so every iterate's bound is sound; the
  result is the entrywise best of CROWN's and the last iterate's bounds."""
  lo, hi = _backward(ctx, v, ivs, pre, rel, spec=spec)
  if not ctx.alpha_steps:
    return lo, hi
  import optax
  relus = [ctx.prog.eqns[i] for i in ctx.ancestors[v] if ctx.prog.eqns[i].kind == "relu"]
  init = {}
  for e in relus:
    x, c, sigma = _relu_parts(e, ctx.cenv)
    if x in init:
      continue
    l, u = pre[x]
    lt, ut = (l - c, u - c) if sigma > 0 else (c - u, c - l)
    a_lo = _relu_lines(lt, ut, False)[0].reshape(-1)
    init[x] = jnp.stack([a_lo, a_lo])
  if not init:
    return lo, hi

  keys = list(init)  # pytrees keyed by variables do not sort: a list in a fixed order
  as_dict = lambda vals: dict(zip(keys, vals))  # noqa: E731

  fast = dataclasses.replace(ctx, sound=False)  # gradients of the float bound (sound: final)

  def loss(vals):
    l2, h2 = _backward(fast, v, ivs, pre, rel, spec=spec, alphas=as_dict(vals))
    return jnp.sum(h2) - jnp.sum(l2)

  opt = optax.adam(ctx.alpha_lr)

  def step(_, st):
    alphas, state = st
    g = jax.grad(loss)(alphas)
    upd, state = opt.update(g, state, alphas)
    alphas = jax.tree_util.tree_map(lambda a: jnp.clip(a, 0.0, 1.0), optax.apply_updates(alphas, upd))
    return alphas, state

  vals0 = [init[k] for k in keys]
  vals, _ = lax.fori_loop(0, ctx.alpha_steps, step, (vals0, opt.init(vals0)))
  vals = jax.lax.stop_gradient(vals)
  l2, h2 = _backward(ctx, v, ivs, pre, rel, spec=spec, alphas=as_dict(vals))
  return jnp.maximum(lo, l2), jnp.minimum(hi, h2)


def _run(ctx: _Ctx, boxes: Sequence[Interval], spec=None) -> list:
  """The per-example pass: forward intervals, pre-activation bounds of every ReLU and relaxed
  equation in order (with their lines), and the final CROWN bounds of every abstract output.
  Returns Intervals for abstract outputs."""
  prog, cenv = ctx.prog, ctx.cenv
  ivs = {}
  it = iter(boxes)
  for v in prog.invars:
    if v in prog.abstract:
      ivs[v] = next(it)
  pre: dict = {}
  rel: dict = {}

  def tighten(x):
    if x not in pre:
      if ctx.intermediate == "crown" and x in ctx.prefixes:
        lo, hi = _backward(ctx, x, ivs, pre, rel)
        ivs[x] = _intersect(ivs[x], lo, hi, ctx.sound)
      pre[x] = (ivs[x].lower, ivs[x].upper)
    return pre[x]

  for i, e in enumerate(prog.eqns):
    if e.kind in ("concrete", "const"):
      continue
    if e.kind == "relu":
      x, c, sigma = _relu_parts(e, cenv)
      tighten(x)
      op = jnp.maximum if sigma > 0 else jnp.minimum
      ivs[e.outvars[0]] = Interval(op(ivs[x].lower, c), op(ivs[x].upper, c), validate=False)
      continue
    if e.kind == "nonlinear":
      bounds = [tighten(x) for x in e.relax_in]
    elif e.kind == "fallback":
      for p in e.abstract_pos:
        if e.invars[p] in ctx.prefixes:
          tighten(e.invars[p])
    vals = [ivs[a] if isinstance(a, _Var) and a in prog.abstract else _read(cenv, a)
            for a in e.invars]
    if e.kind == "nonlinear" and e.mode == "leaky":
      (l, u), = bounds
      p, n = _leaky_slopes(e, cenv, e.relax_in[0])
      f = lambda t: jnp.where(t >= 0, p * t, n * t)  # noqa: E731
      lo = jnp.minimum(jnp.minimum(f(l), f(u)), jnp.where((l < 0) & (u > 0), 0.0, jnp.inf))
      outs = [Interval(lo, jnp.maximum(f(l), f(u)), validate=False)]
    elif e.kind == "affine":
      out = interval_domain.RULES[e.name](interval_domain.IntervalContext(sound=ctx.sound),
                                          *vals, **e.params)
      outs = out if isinstance(out, (list, tuple)) else [out]
    else:
      outs = _interval_of(e, vals, ctx.sound)
    for v, o in zip(e.outvars, outs):
      ivs[v] = o
    if e.kind == "nonlinear":
      rel[i] = _relax_lines(e, cenv, bounds, ivs[e.outvars[0]])
  results = []
  for v in prog.outvars:
    if isinstance(v, _Var) and v in prog.abstract:
      if spec is not None and v is ctx.spec_var:
        lo, hi = _final_bounds(ctx, v, ivs, pre, rel, spec)
        res = _intersect(_spec_interval(ivs[v], spec), lo, hi, ctx.sound)
        if ctx.spec_batched:
          res = Interval(res.lower[None], res.upper[None], validate=False)
        results.append(res)
      elif v in ctx.prefixes:
        lo, hi = _final_bounds(ctx, v, ivs, pre, rel, None)
        results.append(_intersect(ivs[v], lo, hi, ctx.sound))
      else:
        results.append(ivs[v])
    else:
      results.append(None)
  return results


# ----------------------------------------------------------------------------------------------
# The transformation
# ----------------------------------------------------------------------------------------------

def _is_array_like(x: Any) -> bool:
  return isinstance(x, (jax.Array, np.ndarray, np.generic)) or isinstance(x, jax.core.Tracer)


def _targets(prog: _Program, intermediate: str) -> list[_Var]:
  """Variables bounded by a backward pass of their own, in program order: with
  ``intermediate="crown"`` the inputs of every ReLU and relaxed equation and the affine inputs of
  fallback equations; always the abstract outputs (full-precision floats only)."""
  targets: list = []

  def add(x):
    if isinstance(x, _Var) and x in prog.abstract and _is_float(x.aval) \
        and not _low_precision(x.aval) and x not in targets:
      targets.append(x)

  if intermediate == "crown":
    for e in prog.eqns:
      if e.kind == "relu":
        add(e.invars[e.abstract_pos[0]])
      elif e.kind == "nonlinear":
        for x in e.relax_in:
          add(x)
      elif e.kind == "fallback":
        for p in e.abstract_pos:
          j = prog.producer.get(e.invars[p])
          if j is not None and prog.eqns[j].kind == "affine":
            add(e.invars[p])
  for v in prog.outvars:
    add(v)
  return targets


def _lambda_bytes(prog: _Program, targets: list[_Var], ancestors: dict) -> int:
  """Largest per-example backward state (both bounds), in bytes: sizes the chunks."""
  best = 0
  for t in targets:
    sizes = [t.size] + [prog.eqns[i].invars[p].size for i in ancestors[t]
                        for p in prog.eqns[i].abstract_pos]
    best = max(best, 2 * t.size * max(sizes) * 4)
  return best


def crown(fn: Callable, *, intermediate: str = "crown", batch_axis: int | None = 0,
          sound_fp: bool = False, chunk_size: int | None = None,
          memory_bytes: int = 1 << 30, patches: bool = True, spec: Any = None,
          alpha: bool = False, alpha_steps: int = 20, alpha_lr: float = 0.1) -> Callable:
  """CROWN: backward linear bound propagation of ``fn`` over its `Interval` arguments.

  Args:
    fn: a JAX function, e.g. a Flax linen ``model.apply``: affine operations and ReLUs are
      handled exactly, the nonlinearities listed in the module docstring by linear relaxations,
      anything else with an interval rule by its interval bound (with a warning).
    intermediate: where ReLU pre-activation bounds come from: "crown" (a backward pass per ReLU
      layer; tightest) or "ibp" (interval propagation; CROWN-IBP, much cheaper).
    batch_axis: axis along which the `Interval` leaves hold independent examples (see the module
      docstring for the rule), or None to bound the whole call as one problem.
    sound_fp: round every bound outward by an a-priori bound on the float error so it holds in
      exact arithmetic (see the module docstring).
    chunk_size: examples per vmapped chunk; default: as many as fit in ``memory_bytes``.
    memory_bytes: memory budget for the backward state of one chunk.
    patches: compute the backward pass of a local layer (a convolution behind one ReLU layer
      that follows a convolution of the input) on receptive-field windows (see the module
      docstring); the bounds equal the dense pass up to the order of float sums. Not used with
      ``sound_fp`` (whose error bound follows the dense pass).
    spec: a specification matrix ``C``: bound ``C @ y`` instead of ``y``, where ``y`` is ``fn``'s
      one box-dependent output, flattened per example (``m`` entries). ``C`` of shape (k, m) is
      used for every example; with ``batch_axis=0`` a ``C`` of shape (batch, k, m) gives row i
      of the batch its own ``C[i]`` (e.g. label-dependent margins ``y_label - y_j``). The
      backward pass starts from ``Λ = C`` (CROWN, Zhang et al. 2018, §3.3: bounding a linear
      function of the outputs is tighter than combining bounds of each output). The output is
      an `Interval` of shape (batch, k) (or (k,) with ``batch_axis=None``). Not with
      ``sound_fp``.
    alpha: α-CROWN (Xu et al., ICLR 2021): optimise the lower slopes of unstable ReLU neurons
      in [0, 1] for the bounds of the outputs with ``alpha_steps`` Adam steps of learning rate
      ``alpha_lr`` (gradients through the bound); never looser than CROWN. Intermediate bounds
      stay CROWN's.

  Returns:
    A function with ``fn``'s signature: any pytree leaf may be an `Interval` (the input box;
    concrete leaves are parameters). The output has `Interval` leaves where the box reaches.

  Raises:
    ValueError: bad options, an Interval leaf that is not float or has mismatched endpoints, or
      Interval leaves whose batch sizes disagree.
    UnsupportedPrimitiveError: an operation on box-dependent values with neither a linear
      relaxation nor an interval rule (named, with the source line).
  """
  if intermediate not in INTERMEDIATE_MODES:
    raise ValueError(f"crown: intermediate must be one of {INTERMEDIATE_MODES}, "
                     f"got {intermediate!r}")
  if batch_axis is not None and (isinstance(batch_axis, bool) or not isinstance(batch_axis, int)):
    raise ValueError(f"crown: batch_axis must be an int or None, got {batch_axis!r}")
  if not isinstance(sound_fp, bool):
    raise ValueError(f"crown: sound_fp must be a bool, got {sound_fp!r}")
  if not isinstance(patches, bool):
    raise ValueError(f"crown: patches must be a bool, got {patches!r}")
  if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
    raise ValueError(f"crown: chunk_size must be a positive int, got {chunk_size!r}")
  if not isinstance(alpha, bool):
    raise ValueError(f"crown: alpha must be a bool, got {alpha!r}")
  if alpha and (not isinstance(alpha_steps, int) or alpha_steps < 1 or not alpha_lr > 0):
    raise ValueError("crown: alpha_steps must be a positive int and alpha_lr positive")
  if spec is not None:
    spec = jnp.asarray(spec)
    if not jnp.issubdtype(spec.dtype, jnp.floating) or spec.ndim not in (2, 3):
      raise ValueError(f"crown: spec must be a float matrix (k, m) or (batch, k, m), got "
                       f"shape {spec.shape} and dtype {spec.dtype}")
    if spec.ndim == 3 and batch_axis != 0:
      raise ValueError("crown: a per-example spec (batch, k, m) needs batch_axis=0")
    if batch_axis not in (0, None):
      raise ValueError("crown: spec needs batch_axis=0 or None")
    if sound_fp:
      raise ValueError("crown: spec is not supported with sound_fp=True")

  cache: dict = {}

  @functools.wraps(fn)
  def bounded(*args, **kwargs):
    arguments = prog_lib.split_arguments(args, kwargs)
    validate_arguments(arguments.leaves, where="bj.crown")
    leaves, treedef, dyn = arguments.leaves, arguments.treedef, arguments.dynamic_index
    boxes_idx = [i for i in dyn if arguments.kinds[i] == "box"]
    if not boxes_idx:
      return fn(*args, **kwargs)
    for i in boxes_idx:
      _check_box(leaves[i])
    axes = _batch_axes(leaves, boxes_idx, batch_axis)
    n_batch = None if axes is None else leaves[boxes_idx[0]].lower.shape[axes[boxes_idx[0]]]

    def one_example(i, shape):
      shape = list(shape)
      if axes is not None:
        shape[axes[i]] = 1
      return tuple(shape)

    key = _cache_key(leaves, treedef, dyn)
    if key is not None and key in cache:
      jitted, out_tree = cache[key]
      with _precision(sound_fp):
        return jax.tree_util.tree_unflatten(out_tree, jitted([leaves[i] for i in dyn], spec))
    if axes is not None and n_batch > 1 and key is not None:
      _check_examples_independent(fn, arguments, axes, batch_axis)
    core = prog_lib.trace(fn, arguments, box_shape=one_example, precision_highest=sound_fp)
    out_tree = core.out_tree
    prog = _from_core(core)
    _classify(prog, [v in core.depends for v in core.invars], sound_fp)
    _warn_fallbacks(prog)
    spec_var = _spec_target(prog, spec, n_batch if axes is not None else None)

    def compute(values, spec_arr):
      """The numeric part, one XLA program (inlined when already under jit)."""
      cenv = _eval_concrete(prog, [None if is_interval(v) else v for v in values])
      targets = _targets(prog, intermediate)
      ancestors = {t: _ancestors(prog, t) for t in targets}
      prefixes = {t: _prefix(prog, cenv, t, ancestors[t], sound_fp) for t in targets}
      plans = {}
      if patches and not sound_fp:
        plans = {t: _patch_plan(prog, cenv, t, prefixes, ancestors) for t in targets}
        plans = {t: p for t, p in plans.items() if p is not None}
      ctx = _Ctx(prog, cenv, sound_fp, intermediate, prefixes, ancestors, plans,
                 spec_var, spec_var is not None and axes is not None,
                 alpha_steps if alpha else 0, float(alpha_lr))
      box_list = [v for v in values if is_interval(v)]
      if axes is None:
        outs = _run(ctx, box_list, spec_arr)
      else:
        outs = _batched(ctx, box_list, [axes[i] for i in boxes_idx], n_batch, batch_axis,
                        chunk_size or _auto_chunk(prog, targets, ancestors, memory_bytes),
                        spec_arr)
      return [o if o is not None else _read(cenv, v) for v, o in zip(prog.outvars, outs)]

    jitted = jax.jit(compute)
    if key is not None and len(cache) < 16:
      cache[key] = (jitted, out_tree)
    with _precision(sound_fp):  # the backward pass's own products too, not only fn's
      results = jitted([leaves[i] for i in dyn], spec)
    return jax.tree_util.tree_unflatten(out_tree, results)

  return bounded


def _precision(sound_fp: bool):
  """``precision=HIGHEST`` for every product traced in sound mode (no TF32 on accelerators)."""
  return jax.default_matmul_precision("highest" if sound_fp else None)


def _spec_target(prog: _Program, spec, n_batch: int | None):
  """The output a ``spec`` applies to (the one box-dependent float output), checked against the
  spec's shape; None without a spec."""
  if spec is None:
    return None
  outs = [v for v in prog.outvars if isinstance(v, _Var) and v in prog.abstract]
  if len(outs) != 1 or not _is_float(outs[0].aval) or _low_precision(outs[0].aval):
    raise ValueError(f"crown: spec needs fn to have exactly one box-dependent float32/float64 "
                     f"output, got {len(outs)}")
  v = outs[0]
  if spec.shape[-1] != v.size:
    raise ValueError(f"crown: spec has {spec.shape[-1]} columns but the output has {v.size} "
                     "entries per example")
  if spec.ndim == 3 and spec.shape[0] != n_batch:
    raise ValueError(f"crown: per-example spec has {spec.shape[0]} rows of the batch, the boxes "
                     f"have {n_batch}")
  return v


def _check_examples_independent(fn: Callable, arguments: prog_lib.Arguments, axes: dict,
                                batch_axis: int) -> None:
  """With ``batch_axis`` set, every box leaf is split into examples and ``fn`` is bounded per
  example. That is sound only if ``fn`` on the whole batch equals ``fn`` applied to each example
  (an interval *parameter* whose length happens to equal the batch size is not a batch). Checked
  at a random point of the boxes (concrete leaves as given): a difference raises."""
  key = jax.random.PRNGKey(0)
  values = []
  for n, i in enumerate(arguments.dynamic_index):
    leaf = arguments.leaves[i]
    if arguments.kinds[i] == "box":
      t = jax.random.uniform(jax.random.fold_in(key, n), leaf.shape, leaf.dtype)
      values.append(leaf.lower + t * (leaf.upper - leaf.lower))
    else:
      values.append(leaf)
  box_pos = [n for n, i in enumerate(arguments.dynamic_index) if arguments.kinds[i] == "box"]
  box_axes = [axes[arguments.dynamic_index[n]] for n in box_pos]

  def call(vals):
    a, k = arguments.rebuild(vals)
    return jax.tree_util.tree_leaves(fn(*a, **k))

  def per_example(*boxes):
    vals = list(values)
    for n, b, ax in zip(box_pos, boxes, box_axes):
      vals[n] = jnp.expand_dims(b, ax)
    return call(vals)

  whole = call(values)
  split = jax.vmap(per_example, in_axes=tuple(box_axes))(*[values[n] for n in box_pos])
  for w, s in zip(whole, split):
    w, s = jnp.asarray(w), jnp.asarray(s)
    if not jnp.issubdtype(w.dtype, jnp.floating):
      continue
    nd = w.ndim
    ax = batch_axis % nd if nd else 0
    if nd == 0 or s.ndim != nd + 1 or s.shape[1 + ax] != 1:
      continue  # not split per example: reported by the batched pass itself
    s = jnp.squeeze(jnp.moveaxis(s, 0, ax), ax + 1)
    tol = 1e-4 * (1 + jnp.max(jnp.abs(w))) if w.size else 0
    if s.shape != w.shape or bool(jnp.max(jnp.abs(s - w)) > tol):
      raise BoundError(
          f"bj.crown: with batch_axis={batch_axis} every Interval leaf is split into "
          f"examples along that axis, but fn on the whole batch differs from fn applied to "
          f"each example (e.g. an interval parameter whose length equals the batch size, or a "
          f"layer mixing examples). Use batch_axis=None to bound the call as one problem.")


def _cache_key(leaves, treedef, dyn):
  """Hashable description of a call (structure, shapes, dtypes, static leaves), or None."""
  dyn_set = set(dyn)
  parts = []
  for i, l in enumerate(leaves):
    if i in dyn_set:
      if isinstance(l, jax.core.Tracer) or (is_interval(l) and isinstance(l.lower,
                                                                          jax.core.Tracer)):
        return None  # under an outer trace: nothing to gain
      parts.append((is_interval(l), jnp.shape(l.lower if is_interval(l) else l),
                    str(jnp.result_type(l.lower if is_interval(l) else l))))
    else:
      parts.append(("static", l))
  key = (treedef, tuple(parts))
  try:
    hash(key)
  except TypeError:
    return None
  return key


def _auto_chunk(prog, targets, ancestors, memory_bytes) -> int:
  per = max(_lambda_bytes(prog, targets, ancestors), 1)
  return max(1, int(memory_bytes // (3 * per)))


def _check_box(iv: Interval) -> None:
  if jnp.shape(iv.lower) != jnp.shape(iv.upper):
    raise ValueError(f"crown: Interval argument has lower shape {jnp.shape(iv.lower)} but upper "
                     f"shape {jnp.shape(iv.upper)}.")
  for name, a in (("lower", iv.lower), ("upper", iv.upper)):
    if not jnp.issubdtype(jnp.result_type(a), jnp.floating):
      raise ValueError(f"crown: Interval {name} bound must be floating point, got "
                       f"{jnp.result_type(a)}.")
  if jnp.result_type(iv.lower) != jnp.result_type(iv.upper):
    raise ValueError(f"crown: Interval argument has lower dtype {jnp.result_type(iv.lower)} but "
                     f"upper dtype {jnp.result_type(iv.upper)}.")


def _batch_axes(leaves, boxes_idx, batch_axis):
  if batch_axis is None:
    return None
  axes, sizes = {}, {}
  for i in boxes_idx:
    nd = leaves[i].ndim
    if not -nd <= batch_axis < nd:
      raise ValueError(f"crown: batch_axis={batch_axis} is out of range for an Interval "
                       f"argument of shape {leaves[i].shape}; use batch_axis=None for "
                       "unbatched inputs.")
    axes[i] = batch_axis % nd
    sizes[i] = leaves[i].shape[axes[i]]
  if len(set(sizes.values())) > 1:
    raise ValueError(f"crown: Interval arguments disagree on the batch size along axis "
                     f"{batch_axis}: {sorted(set(sizes.values()))}.")
  if next(iter(sizes.values())) == 0:
    raise ValueError("crown: empty batch.")
  return axes


def _batched(ctx: _Ctx, boxes, axes, n_batch: int, batch_axis: int, chunk: int, spec=None):
  """Runs the per-example pass over the batch (lax.map over vmapped chunks). ``spec``: None,
  one (k, m) matrix for every example, or (batch, k, m) (row i of the batch gets ``spec[i]``)."""
  los = [jnp.moveaxis(b.lower, a, 0) for b, a in zip(boxes, axes)]
  his = [jnp.moveaxis(b.upper, a, 0) for b, a in zip(boxes, axes)]
  per_example = spec is not None and spec.ndim == 3
  specs = spec if per_example else jnp.zeros((n_batch, 0))

  def one(xs):
    lo, hi, sp = xs
    ex = [Interval(jnp.expand_dims(l, a), jnp.expand_dims(h, a), validate=False)
          for l, h, a in zip(lo, hi, axes)]
    outs = _run(ctx, ex, sp if per_example else spec)
    return [None if o is None else (o.lower, o.upper) for o in outs]

  if n_batch == 1:
    stacked = jax.tree_util.tree_map(lambda a: a[None], one(([l[0] for l in los],
                                                              [h[0] for h in his], specs[0])))
  else:
    stacked = lax.map(one, (los, his, specs), batch_size=min(chunk, n_batch))
  outs = []
  for o in stacked:
    if o is None:
      outs.append(None)
      continue
    lo, hi = o
    nd = lo.ndim - 1
    ax = batch_axis % nd if nd else 0
    if nd == 0 or lo.shape[1 + ax] != 1:
      raise ValueError(
          f"crown: with batch_axis={batch_axis}, every box-dependent output must keep a batch "
          f"axis of size 1 when fn is called on one example; got shape {lo.shape[1:]}. Use "
          "batch_axis=None if fn mixes examples.")
    lo = jnp.squeeze(jnp.moveaxis(lo, 0, ax), ax + 1)
    hi = jnp.squeeze(jnp.moveaxis(hi, 0, ax), ax + 1)
    outs.append(Interval(lo, hi, validate=False))
  return outs


# ----------------------------------------------------------------------------------------------
# Demo (called by the `boundjax demo` command)
# ----------------------------------------------------------------------------------------------

def demo_section(eps: float = 0.02, n_examples: int = 64, n_samples: int = 2000,
                 seed: int = 0) -> str:
  """IBP vs CROWN-IBP vs CROWN on a small ReLU MLP trained on scikit-learn's digits.

  Trains a 64-64-64-10 MLP for a few hundred Adam steps, bounds the logits over the L∞ ball of
  radius ``eps`` (pixels in [0, 1]) around ``n_examples`` test images, and reports the mean bound
  width, the number of examples certified robust (lower bound of the true logit above the upper
  bound of every other), and the number of sampled points found outside the bounds (must be 0).
  """
  import flax.linen as nn
  import optax
  from sklearn.datasets import load_digits
  from boundjax.models import fit_full_batch

  class _MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = nn.relu(nn.Dense(64)(x))
      x = nn.relu(nn.Dense(64)(x))
      return nn.Dense(10)(x)

  data = load_digits()
  x_all = jnp.asarray(data.data / 16.0, jnp.float32)
  y_all = jnp.asarray(data.target)
  perm = np.random.default_rng(seed).permutation(len(y_all))
  tr, te = perm[:1400], perm[1400:1400 + n_examples]
  model = _MLP()
  params = fit_full_batch(model.apply, model.init(jax.random.PRNGKey(seed), x_all[:1]), x_all[tr],
                          y_all[tr], optax.adam(1e-2), 300)
  x, y = x_all[te], y_all[te]
  acc = float(jnp.mean(jnp.argmax(model.apply(params, x), -1) == y))
  box = Interval.around(x, eps, domain=(0.0, 1.0))
  from boundjax.transforms import ibp as _ibp
  results = {"IBP": _ibp(model.apply)(params, box),
             "CROWN-IBP": crown(model.apply, intermediate="ibp")(params, box),
             "CROWN": crown(model.apply)(params, box)}
  key = jax.random.PRNGKey(seed + 1)
  pts = box.lower + box.width * jax.random.uniform(key, (n_samples, *box.shape))
  ys = jax.vmap(lambda p: model.apply(params, p))(pts)
  onehot = jax.nn.one_hot(y, 10, dtype=bool)
  lines = [f"CROWN demo: MLP 64-64-64-10 on digits (test accuracy {acc:.3f}), eps={eps}, "
           f"{n_examples} test images, {n_samples} sampled points per image",
           f"{'method':<10} {'mean width':>11} {'ratio to IBP':>13} {'certified':>10}"]
  base = float(jnp.mean(results["IBP"].width))
  violations = 0
  for name, out in results.items():
    true_lo = jnp.sum(jnp.where(onehot, out.lower, 0.0), -1)
    other_hi = jnp.max(jnp.where(onehot, -jnp.inf, out.upper), -1)
    cert = int(jnp.sum(true_lo > other_hi))
    w = float(jnp.mean(out.width))
    tol = 1e-5 * (1 + jnp.abs(ys))  # float rounding of the default (not sound_fp) mode
    violations += int(jnp.sum((ys < out.lower - tol) | (ys > out.upper + tol)))
    lines.append(f"{name:<10} {w:>11.4f} {w / base:>13.3f} {cert:>7d}/{n_examples}")
  lines.append(f"sampled points outside any bound (violations): {violations}")
  return "\n".join(lines)

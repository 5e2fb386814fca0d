"""Outward rounding: make float bounds hold for the exact (real-number) computation.

A bound computed in floating point can be off by rounding error: ``fl(a·b + c)`` is not
``a·b + c``. In sound mode every lower bound is moved down and every upper bound up by an
a-priori bound on that error, then by at least one more ulp (`round_down`, `round_up`).

Error model (Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1): for a sum of n
products computed in any order, ``|fl(Σ a_k b_k) − Σ a_k b_k| ≤ γ_n Σ |a_k b_k|`` with
``γ_n = n·u / (1 − n·u)`` and ``u = 2^-24`` (float32) or ``2^-53`` (float64). Element-wise
library functions (exp, tanh, ...) are assumed accurate to a few ulps; the caller states how
many.

Underflow: XLA on CPU flushes subnormal numbers to zero (results and operands), so every
operation may also err by λ = finfo.tiny in absolute terms (Higham §2.1, the ``+ η`` term);
`outward` always adds λ and never returns a subnormal endpoint, and `snap_outward` moves box ends
out of the subnormal range before a function reads them.

Element-wise library functions: their error budgets are measured, not assumed; see
`boundjax.core.budgets`.

API (used by the interval and linear domains):
  gamma(n, dtype) -> float                      γ_n for the dtype
  flush_error(n, dtype) -> float                2n·λ: what an n-term sum may lose to flushing
  sum_error(n, magnitude, dtype)                γ_{2n+2}·magnitude + 2n·λ (sums, dots, convs)
  outward(lo, hi, ulps=1, abs_err=None) -> (lo', hi')
  snap_outward(lo, hi) -> (lo', hi')            subnormal ends to 0 / ±λ, outward
  round_down(x), round_up(x)                    at least one ulp towards -inf / +inf
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def unit_roundoff(dtype: Any) -> float:
  """u = 2^-(p) for a binary floating type with p-bit significand (float32: 2^-24)."""
  return float(jnp.finfo(dtype).eps) / 2


def gamma(n: int, dtype: Any) -> float:
  """γ_n = n·u / (1 − n·u): the relative error bound of an n-term floating-point sum; +inf
  when ``n·u >= 1`` (e.g. more than 255 terms in bfloat16), where the analysis gives no finite
  bound (the bound it multiplies becomes infinite, which is sound)."""
  u = unit_roundoff(dtype)
  nu = n * u
  if nu >= 1:
    return float("inf")
  return nu / (1 - nu)


def underflow_threshold(dtype: Any) -> float:
  """λ = finfo.tiny, the smallest normal number (float32: 2^-126 ≈ 1.18e-38).

  XLA on CPU flushes subnormal results to zero and reads subnormal operands as zero (FTZ/DAZ),
  so an operation may err by up to λ in absolute terms besides its relative error: the model of
  Higham, *Accuracy and Stability of Numerical Algorithms*, §2.1, ``fl(x op y) = (x op y)(1 + δ)
  + η`` with ``|η| ≤ λ`` for flush-to-zero arithmetic.
  """
  return float(jnp.finfo(dtype).tiny)


def flush_error(n: int, dtype: Any) -> float:
  """``2n·λ``: the absolute error an n-term sum of products may take from flushed results (each
  of its n products and n − 1 additions may lose up to λ = finfo.tiny, Higham §2.1), on top of
  its relative error ``γ_n Σ|a_k b_k|``. A thousand products of 1e-40 each are all flushed to
  zero in float32, so their exact sum 1e-37 is only covered by this term."""
  return 2 * max(int(n), 1) * underflow_threshold(dtype)


def sum_error(n: int, magnitude, dtype: Any, terms: int = 1):
  """A-priori bound on the rounding error of ``terms`` n-term sums of products, any order:

      |fl(Σ_k a_k b_k) − Σ_k a_k b_k| ≤ γ_{2n+2} · M + 2n·terms·λ,   M = fl(Σ_k |a_k b_k|),

  (Higham, §3.1, eq. (3.5): ``γ_n Σ|a_k b_k|``. ``M`` is itself computed in floating point and
  may lie a factor ``1 − γ_n`` below the exact magnitude; ``γ_n / (1 − γ_n) ≤ γ_{2n+2}`` covers
  that, the rounding of the product ``γ·M`` and the few extra operations of the midpoint–radius
  and sign-split forms (whose partial products sum to at most ``M`` in magnitude). ``2n·λ``
  per sum covers the n products and n − 1 additions that may each be flushed to zero, §2.1).
  ``n`` is the true number of summed terms (the contraction length of a dot product; input
  features × kernel window of a convolution; the window of a pooling sum).
  """
  n = max(int(n), 1)
  return gamma(2 * n + 2, dtype) * magnitude + 2 * n * terms * underflow_threshold(dtype)


_UINT = {2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def is_subnormal(x):
  """True where ``x`` is a nonzero subnormal number, read from its bits (exponent field 0,
  significand nonzero): XLA CPU compares subnormals as if they were 0 (DAZ), so ``x != 0`` and
  ``|x| < tiny`` cannot be trusted for them."""
  dtype = jnp.result_type(x)
  info = jnp.finfo(dtype)
  width = np.dtype(dtype).itemsize
  bits = jax.lax.bitcast_convert_type(jnp.asarray(x), _UINT[width])
  mant_bits = int(info.nmant)
  exp_mask = ((1 << int(info.nexp)) - 1) << mant_bits
  mant_mask = (1 << mant_bits) - 1
  udt = _UINT[width]
  exp_zero = (bits & jnp.asarray(exp_mask, udt)) == 0
  mant_nonzero = (bits & jnp.asarray(mant_mask, udt)) != 0
  return exp_zero & mant_nonzero


def is_negative(x):
  """The sign bit of ``x`` (also for subnormals, which XLA CPU would compare as 0)."""
  dtype = jnp.result_type(x)
  width = np.dtype(dtype).itemsize
  bits = jax.lax.bitcast_convert_type(jnp.asarray(x), _UINT[width])
  return (bits >> jnp.asarray(8 * width - 1, _UINT[width])) == 1


def snap_outward(lo, hi):
  """Moves subnormal endpoints out of the subnormal range: ``lo`` down to ``0`` or ``−λ``,
  ``hi`` up to ``λ`` or ``0`` (λ = finfo.tiny).

  XLA CPU reads subnormal operands as zero (DAZ), so ``sqrt(1e-40)`` returns 0 (not 1e-20) and
  ``log(1e-40)`` returns −inf; a box whose ends are normal numbers or zeros is evaluated as
  written. The snapped box contains the original one. Subnormals are recognised by their bits
  (`is_subnormal`), since XLA compares them as zero.
  """
  dtype = jnp.result_type(lo)
  if not jnp.issubdtype(dtype, jnp.floating) or np.dtype(dtype).itemsize not in _UINT:
    return lo, hi
  tiny = jnp.asarray(underflow_threshold(dtype), dtype)
  zero = jnp.zeros((), dtype)
  lo = jnp.where(is_subnormal(lo), jnp.where(is_negative(lo), -tiny, zero), lo)
  hi = jnp.where(is_subnormal(hi), jnp.where(is_negative(hi), zero, tiny), hi)
  return lo, hi


def outward(lo, hi, ulps: int = 1, abs_err=None):
  """Moves ``lo`` down and ``hi`` up by ``abs_err`` (if given), then by ``ulps`` relative ulps
  and the rounding of these very steps.

  With ``x1 = fl(lo − abs_err)`` the result is ``fl(x1 − s)``, ``s = fl(|x1|·(ulps + 2)·eps +
  2λ)`` (`_step`): ``ulps·eps·|x1|`` is the caller's budget (``ulp(x) ≤ eps·|x|`` for normal
  ``x``), and the extra ``2·eps·|x1| + 2λ`` exceeds the two roundings to nearest (``u·|x1|``
  each, plus their O(u²) terms) and a result flushed to zero (< λ). It is the predecessor
  computation of Rump, Zimmermann, Boldo & Melquiond, "Computing predecessor and successor in
  rounding to nearest" (BIT 2009), with a normal λ in place of the smallest subnormal, which
  XLA CPU reads as zero. It is a few element-wise operations where ``nextafter`` is a dozen;
  a sound CROWN program on a small MLP compiles a third faster with it, and runs twice as fast.
  The result needs no `snap_outward`: where arithmetic flushes subnormal results (XLA CPU), it
  has none; where an end comes out subnormal anyway (a platform without flushing, or XLA's
  compile-time folding of constants) and the next operation reads it as 0, the end moves by
  less than λ, and the ``2λ`` of the step holds λ in reserve for exactly that. A lower bound of +inf (an overflowed result whose true value may be
  finite) becomes ``finfo.max`` before the step, an upper bound of −inf becomes ``−finfo.max``;
  NaN never appears in the result (a NaN endpoint becomes −inf / +inf).
  """
  dtype = jnp.result_type(lo)
  finfo = jnp.finfo(dtype)
  big = jnp.asarray(finfo.max, dtype)
  lo = jnp.where(lo == jnp.inf, big, lo)
  hi = jnp.where(hi == -jnp.inf, -big, hi)
  if abs_err is not None:
    lo = lo - abs_err
    hi = hi + abs_err
  lo = lo - _step(lo, ulps)
  hi = hi + _step(hi, ulps)
  lo = jnp.where(jnp.isnan(lo), -jnp.inf, lo)
  hi = jnp.where(jnp.isnan(hi), jnp.inf, hi)
  return lo, hi


def _step(x, ulps: int):
  """``|x|·(ulps + 2)·eps + 2λ`` in x's dtype: moving ``x`` by it (rounded to nearest, or
  flushed to zero) moves it by at least ``ulps`` ulps of ``x`` and never back past ``x``
  (see `outward`). The factors are powers of two times small integers, so exact in every
  float dtype."""
  finfo = jnp.finfo(jnp.result_type(x))
  return jnp.abs(x) * ((int(ulps) + 2) * float(finfo.eps)) + 2 * float(finfo.tiny)


def round_down(x):
  """A number below ``x`` by at least one ulp (at most four): ``fl(x − |x|·2eps − 2λ)``, a
  bound on the error of one correctly rounded operation that produced ``x``, in the safe
  direction (the predecessor of Rump et al. 2009, see `outward`; also safe for a result
  flushed to zero). ``+inf`` becomes ``finfo.max``, ``-inf`` and NaN stay."""
  x = jnp.asarray(x)
  big = jnp.asarray(jnp.finfo(x.dtype).max, x.dtype)
  return jnp.where(x == jnp.inf, big, x - _step(x, 0))


def round_up(x):
  """A number above ``x`` by at least one ulp: ``fl(x + |x|·2eps + 2λ)`` (see `round_down`);
  ``-inf`` becomes ``-finfo.max``."""
  x = jnp.asarray(x)
  big = jnp.asarray(jnp.finfo(x.dtype).max, x.dtype)
  return jnp.where(x == -jnp.inf, -big, x + _step(x, 0))

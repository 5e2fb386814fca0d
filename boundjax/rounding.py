"""Outward rounding: make float bounds hold for the exact (real-number) computation.

A bound computed in floating point can be off by rounding error: ``fl(a·b + c)`` is not
``a·b + c``. In sound mode every lower bound is moved down and every upper bound up by an
a-priori bound on that error, then by one more representable number (``nextafter``).

Error model (Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1): for a sum of n
products computed in any order, ``|fl(Σ a_k b_k) − Σ a_k b_k| ≤ γ_n Σ |a_k b_k|`` with
``γ_n = n·u / (1 − n·u)`` and ``u = 2^-24`` (float32) or ``2^-53`` (float64). Element-wise
library functions (exp, tanh, ...) are assumed accurate to a few ulps; the caller states how
many.

API (used by the interval and linear domains):
  gamma(n, dtype) -> float                      γ_n for the dtype
  outward(lo, hi, ulps=1, abs_err=None) -> (lo', hi')
  round_down(x), round_up(x)                    one nextafter step towards -inf / +inf
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np


def unit_roundoff(dtype: Any) -> float:
  """u = 2^-(p) for a binary floating type with p-bit significand (float32: 2^-24)."""
  return float(np.finfo(np.dtype(dtype)).eps) / 2


def gamma(n: int, dtype: Any) -> float:
  """γ_n = n·u / (1 − n·u): the relative error bound of an n-term floating-point sum."""
  u = unit_roundoff(dtype)
  nu = n * u
  if nu >= 1:
    raise ValueError(f"gamma: n={n} too large for {np.dtype(dtype)} error analysis")
  return nu / (1 - nu)


def outward(lo, hi, ulps: int = 1, abs_err=None):
  """Moves ``lo`` down and ``hi`` up by ``abs_err`` (if given), then by ``ulps`` relative ulps.

  The relative step uses ``|x|·ulps·eps`` plus the smallest normal number so that it also
  moves values near zero; a final ``nextafter`` makes the step strict.
  """
  dtype = jnp.result_type(lo)
  finfo = jnp.finfo(dtype)
  if abs_err is not None:
    lo = lo - abs_err
    hi = hi + abs_err
  if ulps > 0:
    step_lo = jnp.abs(lo) * (ulps * finfo.eps) + finfo.tiny
    step_hi = jnp.abs(hi) * (ulps * finfo.eps) + finfo.tiny
    lo = lo - step_lo
    hi = hi + step_hi
  lo = jnp.nextafter(lo, jnp.asarray(-jnp.inf, dtype))
  hi = jnp.nextafter(hi, jnp.asarray(jnp.inf, dtype))
  return lo, hi


def round_down(x):
  """The next representable number below ``x`` (``nextafter(x, -inf)``): an upper bound on the
  rounding error of one correctly rounded operation that produced ``x``, in the safe direction."""
  x = jnp.asarray(x)
  return jnp.nextafter(x, jnp.asarray(-jnp.inf, x.dtype))


def round_up(x):
  """The next representable number above ``x`` (``nextafter(x, +inf)``)."""
  x = jnp.asarray(x)
  return jnp.nextafter(x, jnp.asarray(jnp.inf, x.dtype))

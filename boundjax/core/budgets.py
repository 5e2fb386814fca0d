"""Measured error budgets of XLA's element-wise float32 functions (sound interval mode).

A sound rule for a monotone library function ``f`` (exp, tanh, erf, ...) evaluates ``f`` at the
box ends and widens the results by what ``f``'s implementation may err. That error is not
specified anywhere for XLA's CPU kernels, so it is *measured* here and multiplied by a safety
factor of 8. The model for each function is

    |f̂(x) − f(x)| ≤ ulps · eps · |f̂(x)| + abs_err,     eps = 2^-23 (float32),

i.e. a relative error of ``ulps`` units in the last place of the result (``ulp(y) ≤ eps·|y|``)
plus an absolute floor ``abs_err`` for functions with a zero (``erf(0) = 0``, ``log(1) = 0``,
...) where a relative error need not stay bounded, and ``finfo.tiny`` (always added by
`boundjax.core.rounding.outward`) for results flushed to zero.

Measurement (`measure`): for every function, about 2.5 million float32 points — random bit
patterns over the whole domain (every exponent, tiny and huge arguments), a dense grid over the
core range, and runs of consecutive floats around zeros, poles and ends of the domain. The
reference is the float64 value of the same float32 points (numpy / ``scipy.special``, accurate
to ~1e-16, i.e. ~1e-9 float32 ulps). ``max_ulps`` is the largest ``|f̂ − f| / ulp32(f)`` over
results ``|f| ≥ ZERO_BAND = 2^-10``; ``max_abs_near_0`` the largest ``|f̂ − f|`` over results
``|f| < ZERO_BAND`` (near a zero of the function), reported (and used as an absolute floor) only
when the relative error there exceeds ``max_ulps``. A finite true value returned as ±inf
(overflow) is measured as ±finfo.max, the value `boundjax.core.rounding.outward` substitutes for
such an endpoint. Subnormal *inputs* are excluded:
XLA CPU flushes them to zero (DAZ), which the interval domain handles by snapping box ends away
from the subnormal range before it calls a function (`boundjax.core.rounding.snap_outward`).

Reproduce (jax 0.10.2, XLA CPU, x86-64; prints the table below):

    JAX_PLATFORMS=cpu python -m boundjax.core.budgets

Measured (max_ulps / max_abs near a zero) and budgets (ulps = ceil(8·max_ulps) with a minimum
of 2, abs_err = 8·max_abs, floored at 2^-60 for functions with a zero)::

    exp        points= 2895820 max_ulps=     5.511 max_abs_near_0=0.000e+00 -> ulps=45 abs_err=0.000e+00
    exp2       points= 2948875 max_ulps=    65.883 max_abs_near_0=2.738e-10 -> ulps=528 abs_err=2.190e-09
    expm1      points= 2929269 max_ulps=     5.518 max_abs_near_0=0.000e+00 -> ulps=45 abs_err=0.000e+00
    log        points= 1809385 max_ulps=     1.119 max_abs_near_0=0.000e+00 -> ulps=9 abs_err=0.000e+00
    log1p      points= 2297424 max_ulps=     2.423 max_abs_near_0=0.000e+00 -> ulps=20 abs_err=0.000e+00
    tanh       points= 2928344 max_ulps=     4.313 max_abs_near_0=0.000e+00 -> ulps=35 abs_err=0.000e+00
    logistic   points= 2895435 max_ulps=     1.991 max_abs_near_0=0.000e+00 -> ulps=16 abs_err=0.000e+00
    sqrt       points= 1719040 max_ulps=     0.500 max_abs_near_0=0.000e+00 -> ulps=4 abs_err=0.000e+00
    rsqrt      points= 1719040 max_ulps=     1.659 max_abs_near_0=0.000e+00 -> ulps=14 abs_err=0.000e+00
    cbrt       points= 2883408 max_ulps=     0.946 max_abs_near_0=0.000e+00 -> ulps=8 abs_err=0.000e+00
    erf        points= 2930547 max_ulps=     5.382 max_abs_near_0=0.000e+00 -> ulps=44 abs_err=0.000e+00
    erfc       points= 2973497 max_ulps=     7.171 max_abs_near_0=3.514e-10 -> ulps=58 abs_err=2.811e-09
    erf_inv    points= 1741651 max_ulps=    64.670 max_abs_near_0=0.000e+00 -> ulps=518 abs_err=0.000e+00
    atan       points= 2883408 max_ulps=     0.797 max_abs_near_0=0.000e+00 -> ulps=7 abs_err=0.000e+00
    asinh      points= 2872792 max_ulps=     2.828 max_abs_near_0=0.000e+00 -> ulps=23 abs_err=0.000e+00
    sinh       points= 2929807 max_ulps=    24.389 max_abs_near_0=0.000e+00 -> ulps=196 abs_err=0.000e+00
    atanh      points= 1741651 max_ulps=     2.728 max_abs_near_0=0.000e+00 -> ulps=22 abs_err=0.000e+00
    pow        points= 2000000 max_ulps=     0.641 max_abs_near_0=2.971e-11 -> ulps=6 abs_err=2.377e-10
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np

SAFETY = 8
"""Safety factor on every measured error (≥ 4 as required by the soundness policy)."""
ZERO_BAND = 2.0 ** -10
"""Results ``|f| < ZERO_BAND`` are measured in absolute terms (near a zero of ``f``)."""
ABS_MIN = 2.0 ** -60
"""Smallest absolute floor for a function with a zero (far below every measured value)."""


@dataclasses.dataclass(frozen=True)
class Budget:
  """The error allowance of one function: ``ulps`` relative ulps plus ``abs_err`` absolute.

  Attributes:
    ulps: units in the last place of the result (``outward(..., ulps=...)``).
    abs_err: absolute error floor near a zero of the function (0: none needed).
    measured_ulps: the largest measured error in ulps (result far from 0).
    measured_abs: the largest measured absolute error near a zero of the result.
  """
  ulps: int
  abs_err: float
  measured_ulps: float
  measured_abs: float


# ----------------------------------------------------------------------------------------------
# the table (filled from `measure`; see the module docstring)
# ----------------------------------------------------------------------------------------------

BUDGETS: dict[str, Budget] = {
    # name: Budget(ulps, abs_err, measured_ulps, measured_abs)
    "exp": Budget(45, 0.0, 5.511, 0),
    "exp2": Budget(528, 2.19035428856984e-09, 65.88, 2.738e-10),
    "expm1": Budget(45, 0.0, 5.518, 0),
    "log": Budget(9, 0.0, 1.119, 0),
    "log1p": Budget(20, 0.0, 2.423, 0),
    "tanh": Budget(35, 0.0, 4.313, 0),
    "logistic": Budget(16, 0.0, 1.991, 0),
    "sqrt": Budget(4, 0.0, 0.5, 0),
    "rsqrt": Budget(14, 0.0, 1.659, 0),
    "cbrt": Budget(8, 0.0, 0.946, 0),
    "erf": Budget(44, 0.0, 5.382, 0),
    "erfc": Budget(58, 2.8112800811233574e-09, 7.171, 3.514e-10),
    "erf_inv": Budget(518, 0.0, 64.67, 0),
    "atan": Budget(7, 0.0, 0.7973, 0),
    "asinh": Budget(23, 0.0, 2.828, 0),
    "sinh": Budget(196, 0.0, 24.39, 0),
    "atanh": Budget(22, 0.0, 2.728, 0),
    "pow": Budget(6, 2.3771942747607966e-10, 0.6414, 2.971e-11),
    # exact by IEEE 754 (correctly rounded or exact): no measurement needed
    "floor": Budget(0, 0.0, 0, 0), "ceil": Budget(0, 0.0, 0, 0), "round": Budget(0, 0.0, 0, 0),
    "reduce_precision": Budget(0, 0.0, 0, 0),
}


def budget(name: str) -> Budget:
  """The budget of primitive ``name`` (KeyError for a function that was not measured)."""
  return BUDGETS[name]


# ----------------------------------------------------------------------------------------------
# measurement
# ----------------------------------------------------------------------------------------------

def _special():
  import scipy.special as sp
  return sp


def _references() -> dict[str, tuple[Callable, Callable, tuple[float, float], tuple[float, ...]]]:
  """name -> (jax float32 function, float64 reference, domain (lo, hi), special points)."""
  import jax.numpy as jnp
  from jax import lax
  sp = _special()
  inf = math.inf
  return {
      "exp": (lax.exp, np.exp, (-inf, inf), (0.0, -87.3, 88.7, -103.9)),
      "exp2": (lax.exp2, np.exp2, (-inf, inf), (0.0, -126.0, 127.9, -149.0, 1.0, -1.0)),
      "expm1": (lax.expm1, np.expm1, (-inf, inf), (0.0, 88.7, -1.0, 1.0)),
      "log": (lax.log, np.log, (0.0, inf), (1.0, 2.0 ** -126, 0.5, 2.0)),
      "log1p": (lax.log1p, np.log1p, (-1.0, inf), (0.0, -1.0, 1.0)),
      "tanh": (lax.tanh, np.tanh, (-inf, inf), (0.0, 9.0, -9.0, 0.6)),
      "logistic": (lax.logistic, sp.expit, (-inf, inf), (0.0, -88.0, -103.0, 17.0)),
      "sqrt": (lax.sqrt, np.sqrt, (0.0, inf), (0.0, 1.0, 2.0 ** -126)),
      "rsqrt": (lax.rsqrt, lambda x: 1.0 / np.sqrt(x), (0.0, inf), (1.0, 2.0 ** -126)),
      "cbrt": (lax.cbrt, np.cbrt, (-inf, inf), (0.0, 1.0, -1.0)),
      "erf": (lax.erf, sp.erf, (-inf, inf), (0.0, 3.9, -3.9, 0.5)),
      "erfc": (lax.erfc, sp.erfc, (-inf, inf), (0.0, 9.0, 10.0, -3.0, 0.5)),
      "erf_inv": (lax.erf_inv, sp.erfinv, (-1.0, 1.0), (0.0, 1.0, -1.0, 0.5)),
      "atan": (lax.atan, np.arctan, (-inf, inf), (0.0, 1.0, -1.0)),
      "asinh": (lax.asinh, np.arcsinh, (-inf, inf), (0.0, 1.0)),
      "sinh": (lax.sinh, np.sinh, (-inf, inf), (0.0, 1.0, 89.4, -89.4)),
      "atanh": (lax.atanh, np.arctanh, (-1.0, 1.0), (0.0, 1.0, -1.0, 0.5)),
      "pow": (None, None, (0.0, inf), ()),
  }


def _samples(domain: tuple[float, float], special: tuple[float, ...], seed: int = 0,
             n_bits: int = 1_500_000, n_grid: int = 500_000, run: int = 20_000) -> np.ndarray:
  """Dense float32 points of ``domain`` (normal numbers and zeros only)."""
  rng = np.random.default_rng(seed)
  tiny = np.finfo(np.float32).tiny
  bits = rng.integers(0, 2 ** 32, size=n_bits, dtype=np.uint64).astype(np.uint32).view(np.float32)
  lo, hi = domain
  core_lo = max(lo, -12.0) if lo > -math.inf else -12.0
  core_hi = min(hi, 12.0) if hi < math.inf else 12.0
  grid = np.linspace(core_lo, core_hi, n_grid, dtype=np.float64).astype(np.float32)
  runs = []
  for c in special:
    c32 = np.float32(c)
    up = c32.copy()
    steps = np.arange(1, run + 1, dtype=np.float64)
    # consecutive floats around c: c + k·ulp(c) (k·2^-149 at 0 would be subnormal: use 2^-126·k)
    u = max(float(np.spacing(c32)), float(tiny))
    runs.append((np.float64(c32) + steps * u).astype(np.float32))
    runs.append((np.float64(c32) - steps * u).astype(np.float32))
    runs.append((np.float64(c32) * (1 + np.geomspace(1e-7, 1e-1, run))).astype(np.float32))
    del up
  tiny_mags = np.geomspace(float(tiny), 1e-3, 200_000).astype(np.float32)
  huge_mags = np.geomspace(1e3, float(np.finfo(np.float32).max), 200_000).astype(np.float32)
  x = np.concatenate([bits, grid, *runs, tiny_mags, -tiny_mags, huge_mags, -huge_mags,
                      np.zeros(1, np.float32)])
  x = x[np.isfinite(x)]
  x = x[(np.abs(x) >= tiny) | (x == 0)]
  x = x[(x >= lo) & (x <= hi)]
  return np.unique(x)


def _errors(y32: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
  """(max ulps far from 0, max absolute error near 0) of float32 results against float64."""
  tiny = float(np.finfo(np.float32).tiny)
  ok = np.isfinite(ref) & (np.abs(ref) <= float(np.finfo(np.float32).max))
  y, r = y32[ok].astype(np.float64), ref[ok]
  if np.any(np.isnan(y)):
    return math.inf, math.inf
  # a finite result returned as ±inf (overflow near the float32 maximum) counts as ±max, which
  # is how `boundjax.core.rounding.outward` treats an infinite lower (upper) bound of +inf (-inf)
  big = float(np.finfo(np.float32).max)
  y = np.where(np.isinf(y), np.sign(y) * big, y)
  err = np.abs(y - r)
  far = np.abs(r) >= ZERO_BAND
  ulp = np.spacing(np.abs(r).astype(np.float32)).astype(np.float64)
  ulp = np.maximum(ulp, 2.0 ** -149)
  mid = (~far) & (np.abs(r) >= tiny)
  max_ulps = float(np.max(err[far] / ulp[far], initial=0.0))
  # near a zero: report the absolute error, and the ulps where results are still normal
  max_ulps_near = float(np.max(err[mid] / ulp[mid], initial=0.0))
  max_abs = float(np.max(err[~far], initial=0.0))
  return max(max_ulps, 0.0), max_abs if max_ulps_near > max_ulps else 0.0


def measure_one(name: str) -> tuple[float, float, int]:
  """Measures one function: (max ulps, max absolute error near a zero, number of points)."""
  import jax
  import jax.numpy as jnp
  fn, ref, domain, special = _references()[name]
  if name == "pow":
    return _measure_pow()
  x = _samples(domain, special)
  y = np.asarray(jax.jit(fn)(jnp.asarray(x)))
  with np.errstate(all="ignore"):
    r = ref(x.astype(np.float64))
  mu, ma = _errors(y, r)
  return mu, ma, x.size


def _measure_pow(n: int = 1_000_000) -> tuple[float, float, int]:
  """``x ** y`` for positive x: every exponent of x with y in [-40, 40] (half integers), and x
  near 1 (relative offsets 1e-1 ... 1e-7) with y in [-2000, 2000]."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  rng = np.random.default_rng(1)
  x = np.abs(rng.integers(0, 2 ** 32, size=n, dtype=np.uint64).astype(np.uint32).view(np.float32))
  x = np.where(np.isfinite(x) & (x >= np.finfo(np.float32).tiny), x, np.float32(1.5))
  y = np.concatenate([rng.uniform(-40, 40, n // 2), rng.integers(-8, 9, n - n // 2)]).astype(
      np.float32)
  y = rng.permutation(y)
  near1 = np.abs(1 + rng.normal(size=n) * rng.choice([1e-1, 1e-3, 1e-5, 1e-7], size=n))
  x = np.concatenate([x, near1.astype(np.float32)])
  y = np.concatenate([y, rng.uniform(-2000, 2000, n).astype(np.float32)])
  got = np.asarray(jax.jit(lax.pow)(jnp.asarray(x), jnp.asarray(y)))
  with np.errstate(all="ignore"):
    r = np.power(x.astype(np.float64), y.astype(np.float64))
  mu, ma = _errors(got, r)
  return mu, ma, x.size


def budget_from(measured_ulps: float, measured_abs: float) -> Budget:
  """The budget for a measurement: ``SAFETY`` times each measured error (ulps at least 2)."""
  ulps = max(2, math.ceil(SAFETY * measured_ulps))
  abs_err = SAFETY * measured_abs
  if measured_abs > 0:
    abs_err = max(abs_err, ABS_MIN)
  return Budget(ulps, float(abs_err), float(measured_ulps), float(measured_abs))


def measure() -> dict[str, Budget]:
  """Measures every function of `_references` (about a minute on one CPU core)."""
  out = {}
  for name in _references():
    mu, ma, n = measure_one(name)
    out[name] = budget_from(mu, ma)
    print(f"    {name:10s} points={n:8d} max_ulps={mu:10.3f} max_abs_near_0={ma:.3e} -> "
          f"ulps={out[name].ulps} abs_err={out[name].abs_err:.3e}", flush=True)
  return out


if __name__ == "__main__":
  measure()

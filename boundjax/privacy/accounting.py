"""Privacy accounting across Q queries (AGT, §3.2).

Every per-query mechanism of `boundjax.privacy.mechanisms` is (eps, 0)-DP (conditionally, for the
smooth-sensitivity ones). Three ways to compose Q of them, and their inverses (per-query eps for a
total (eps_t, delta_t) budget):

* "standard":  (Q eps, 0);
* "advanced":  (sqrt(2 Q ln(1/delta')) eps + Q eps (e^eps - 1), delta')  (Dwork–Rothblum–Vadhan);
* "min":       the smaller of the two (what the paper's experiments use);
* "zcdp":      pure eps-DP is eps^2/2-zCDP (Bun & Steinke 2016); Q of them are Q eps^2/2-zCDP, i.e.
               (Q eps^2/2 + eps sqrt(2 Q ln(1/delta')), delta')-DP. Its exact inverse is the public
               code's ``inverse_composition``; slightly tighter than "advanced".
* "pld":       (inverse only, Laplace mechanisms only) numerical privacy-loss-distribution
               accounting from ``dp-accounting`` for Q Laplace mechanisms of scale 1/eps; valid for
               the global-sensitivity threshold response (post-processing of a Laplace release).

Every result records the method used.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import scipy.optimize

METHODS = ("standard", "advanced", "min", "zcdp", "pld")


class Budget(NamedTuple):
  eps: float
  delta: float
  method: str


def _check(eps: float, Q: int) -> None:
  if not eps > 0 or not math.isfinite(eps):
    raise ValueError(f"accounting: epsilon must be finite and > 0, got {eps!r}.")
  if not isinstance(Q, int) or Q < 1:
    raise ValueError(f"accounting: the number of queries Q must be a positive int, got {Q!r}.")


def standard_composition(eps: float, Q: int, delta: float = 0.0) -> Budget:
  _check(eps, Q)
  return Budget(Q * eps, Q * delta, "standard")


def advanced_composition(eps: float, Q: int, delta: float = 0.0, delta_prime: float = 1e-5
                         ) -> Budget:
  """``(sqrt(2 Q ln(1/delta')) eps + Q eps (e^eps - 1), delta' + Q delta)``."""
  _check(eps, Q)
  if not 0 < delta_prime < 1:
    raise ValueError(f"accounting: delta_prime must be in (0, 1), got {delta_prime!r}.")
  e = math.sqrt(2 * Q * math.log(1 / delta_prime)) * eps + Q * eps * math.expm1(eps)
  return Budget(e, delta_prime + Q * delta, "advanced")


def zcdp_composition(eps: float, Q: int, delta_prime: float = 1e-5) -> Budget:
  """Q pure eps-DP mechanisms through zCDP: ``Q eps^2/2 + eps sqrt(2 Q ln(1/delta'))``."""
  _check(eps, Q)
  e = Q * eps ** 2 / 2 + eps * math.sqrt(2 * Q * math.log(1 / delta_prime))
  return Budget(e, delta_prime, "zcdp")


def compose(eps: float, Q: int, delta: float = 0.0, delta_prime: float = 1e-5,
            method: str = "min") -> Budget:
  """Total (eps, delta) of Q (eps, delta)-DP queries; "min" = min(standard, advanced)."""
  if method == "standard":
    return standard_composition(eps, Q, delta)
  if method == "advanced":
    return advanced_composition(eps, Q, delta, delta_prime)
  if method == "zcdp":
    if delta:
      raise ValueError("accounting: zcdp composition is for pure (eps, 0)-DP queries.")
    return zcdp_composition(eps, Q, delta_prime)
  if method == "min":
    s = standard_composition(eps, Q, delta)
    a = advanced_composition(eps, Q, delta, delta_prime)
    return s if s.eps <= a.eps else a
  raise ValueError(f"accounting: method must be one of standard, advanced, min, zcdp; "
                   f"got {method!r}.")


def _invert(fn, total_eps: float) -> float:
  """Largest eps with fn(eps) <= total_eps for an increasing fn (bracketing + brentq)."""
  hi = total_eps
  while fn(hi) < total_eps:
    hi *= 2
  r = scipy.optimize.brentq(lambda e: fn(e) - total_eps, 1e-12, hi, xtol=1e-14, rtol=1e-12)
  while fn(r) > total_eps:          # keep the inverse on the safe side
    r = math.nextafter(r, 0.0)
  return r


def per_query_budget(total_eps: float, total_delta: float, Q: int, method: str = "min") -> Budget:
  """Per-query pure-DP eps such that Q queries spend at most ``(total_eps, total_delta)``.

  ``delta' = total_delta`` is the composition slack, so per-query delta is 0 (as in the public
  code). "zcdp" is the closed form ``max(sqrt(2/Q)(sqrt(L + eps_t) - sqrt(L)), eps_t / Q)`` with
  L = ln(1/delta'); "pld" holds for Laplace (global-sensitivity) mechanisms only.
  """
  _check(total_eps, Q)
  if not 0 < total_delta < 1:
    raise ValueError(f"accounting: total_delta must be in (0, 1), got {total_delta!r}.")
  std = total_eps / Q
  if method == "standard":
    return Budget(std, 0.0, "standard")
  if method in ("advanced", "min"):
    adv = _invert(lambda e: advanced_composition(e, Q, 0.0, total_delta).eps, total_eps)
    if method == "advanced":
      return Budget(adv, 0.0, "advanced")
    return Budget(adv, 0.0, "advanced") if adv > std else Budget(std, 0.0, "standard")
  if method == "zcdp":
    L = math.log(1 / total_delta)
    z = math.sqrt(2 / Q) * (math.sqrt(L + total_eps) - math.sqrt(L))
    return Budget(z, 0.0, "zcdp") if z > std else Budget(std, 0.0, "standard")
  if method == "pld":
    return Budget(_pld_inverse(total_eps, total_delta, Q), 0.0, "pld")
  raise ValueError(f"accounting: method must be one of {METHODS}, got {method!r}.")


def laplace_pld_epsilon(eps: float, Q: int, delta: float) -> float:
  """Total eps at ``delta`` of Q Laplace mechanisms (sensitivity 1, scale 1/eps), PLD accountant."""
  import dp_accounting
  acc = dp_accounting.pld.PLDAccountant()
  acc.compose(dp_accounting.LaplaceDpEvent(1.0 / eps), Q)
  return float(acc.get_epsilon(delta))


def _pld_inverse(total_eps: float, total_delta: float, Q: int) -> float:
  lo = total_eps / Q                       # standard composition is always within budget
  hi = total_eps
  if laplace_pld_epsilon(hi, Q, total_delta) <= total_eps:
    return hi
  for _ in range(40):
    mid = math.sqrt(lo * hi)
    if laplace_pld_epsilon(mid, Q, total_delta) <= total_eps:
      lo = mid
    else:
      hi = mid
    if hi / lo < 1 + 1e-4:
      break
  return lo

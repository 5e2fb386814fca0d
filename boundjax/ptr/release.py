"""Post-hoc propose-test-release (PTR) for a released representation ``f(x)``.

Propose-test-release (Dwork & Lei 2009; PTR, App. B) as modified by Singh et al. (NeurIPS 2023,
"Posthoc privacy guarantees for collaborative inference with modified Propose-Test-Release",
here "PTR"; App. A and Algorithm 1). The input ``x`` is a point of a low-dimensional space (an
embedding), neighbours are within L∞ distance ``R``, and ``f`` is a network released with ℓ1
Laplace noise:

1. **Propose** a bound ``Δp`` on the local Lipschitz ratio (`propose_bound`, on public data).
2. **Test**: ``ρ = sup{r >= 0 : U(f, N(x, r)) <= Δp}`` for a sound, inclusion-monotone Lipschitz
   upper bound ``U`` (`boundjax.ptr.lipschitz`, or the exact MILP of `milp.lipschitz`), found by
   `radius_search` with a *fixed* number of steps; the statistic ``s`` (below) plus Laplace noise
   is compared with a threshold.
3. **Release** ``f(x) + Lap(b)^m`` with ``b`` from the **proposed** ``Δp``, or ⊥ (``None``).

Statistic (PTR, App. A, eq. 2 and Lemmas A.2–A.3). ``mode="paper"``: ``φ = ρ/2`` when
``U(N(x, R)) <= Δp``, else 0. The printed Lemma A.3 claims ``φ`` has sensitivity 1, but at the
feasibility clamp it jumps from ``>= R/2`` to 0 between arbitrarily close points, and Lemma A.2's
``φ <= γ`` needs ``ρ >= 2R``; what holds is a sensitivity ``< R`` over R-neighbours, which is all
the (2ε, δ/2) statement for R-neighbours below needs. ``mode="sound"``: ``φ* = max(0, ρ - R)``,
1-Lipschitz, ``<= γ`` (the distance to the nearest unsafe point) and 0 at unsafe points; this is
what metric privacy needs. Both are implemented.

Algorithm 1 as printed evaluates ``L(f, N(x, R))`` instead of ``N(x, R_mid)`` in its loop, stops
its ``repeat`` on the wrong condition and has no infeasibility check; here the loop evaluates
``R_mid``, runs ``ceil(log2((R_max - R) / ζ))`` steps (data-independent; the authors' code stops
on a wall-clock timeout, which makes the statistic depend on machine speed), and returns 0 when
``N(x, R)`` already fails. The authors' code releases with the *measured* Lipschitz value, which
is not private; the release here always uses ``Δp``.

Calibration (``calib``). ``"total"`` (the default): the query as a whole is ``(ε, δ/2)``-DP for
R-neighbours, ε split evenly between test and release (basic composition, Dwork & Roth 2014,
Thm 3.16): test noise ``Lap(2(R + ζ)/ε)`` (the statistic's sensitivity over R-neighbours is
``< R + ζ`` in both modes), threshold ``τ = ln(1/δ) · 2(R + ζ)/ε``, release ``Lap(2 Δp R/ε)``
(``||f(x) - f(x')||_1 <= Δp R``). ``"code"`` (the calibration of the authors' public code for
PTR, Singh et al., NeurIPS 2023; not the supplement's Algorithm 1, App. B): test noise ``Lap(R/ε)``,
threshold ``τ = ln(1/δ) R/ε``, release ``Lap(Δp R/ε)``: each half spends ε, so the query is
``(2ε(1 + ζ/2R), δ/2)``-DP, about ``2ε``; use it to reproduce the paper's numbers. ``"unit"``
(the supplement's Algorithm 1): ``Lap(1/ε)``, ``τ = ln(1/δ)/ε``, ``Lap(Δp/ε)``: ε per unit of
L∞ distance (``"code"`` with ``ε_code = ε_unit · R``).

Privacy statements (assumptions: ``U >= L`` and inclusion-monotone — IBP, enumeration, and the
MILP solved to optimality, not a MILP stopped by a time limit; ``Δp`` fixed before seeing ``x``;
the fixed step count; ``ζ`` the bisection tolerance). For ``x, x'`` with ``d = ||x - x'||_inf``:

* ``calib="total"`` (either mode): for ``d <= R``, ``P[M(x) in S] <= e^{ε} P[M(x') in S] + δ/2``
  (test ``ε/2``, release ``ε/2``); ``mode="sound"`` also per unit of distance:
  ``e^{ε (d + ζ)/(2(R + ζ)) + ε d/(2R)}``.
* ``calib="code"``, ``mode="paper"``: for ``d <= R``,
  ``P[M(x) in S] <= e^{2ε} P[M(x') in S] + δ/2`` (test: sensitivity ``< R + ζ``, noise ``R/ε``,
  so ``ε(1 + ζ/R)`` strictly; release: if either point is safe ``||f(x) - f(x')||_1 <= Δp d``;
  both unsafe: ``s = 0`` and the test passes with probability ``δ/2``).
* ``calib="code"``, ``mode="sound"``: the same for ``d <= R``, and per unit of distance
  ``e^{2ε (d + ζ)/R}`` (metric privacy at ``ε/R`` per unit).
* ``calib="unit"``, ``mode="sound"``: metric privacy, ``e^{2ε(d + ζ)}`` and ``+ δ/2`` for ``d <= R``.
* ``calib="unit"``, ``mode="paper"``: near the clamp only ``e^{ε(R + ζ) + ε d}`` for ``d <= R``,
  not metric privacy (the supplement's claim does not hold there).

`privacy_statement` returns these as values. A refused query (⊥) says why in
``PTRAnswer.reason`` (`ptr_query`), with the certified radius and the radius the threshold asks
for.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.ptr import lipschitz as lip

Array = jax.Array
Oracle = Callable[[Any, Any], Any]        # (x, radius) -> an upper bound on L(f, N(x, radius))

MODES = ("paper", "sound")
CALIBS = ("total", "code", "unit")
DEFAULT_CALIB = "total"   # the query is (ε, δ/2)-DP for R-neighbours; "code" spends about 2ε
SEARCHES = ("bisect", "grid")


# ------------------------------------------------------------------------------------------------
# Results
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class RadiusSearch:
  """The test statistic of one query.

  Attributes:
    statistic: ``φ`` (``mode="paper"``) or ``φ*`` (``"sound"``); 0 when ``feasible`` is False.
    feasible: ``U(f, N(x, R)) <= Δp`` (the point is certified safe).
    lo: the largest radius certified (``U(N(x, lo)) <= Δp``); ``0`` when infeasible.
    hi: the smallest radius tried that failed, or ``radius_max``; ``hi - lo <= ζ``.
    evaluations: oracle calls (fixed for the traced search).
    mode: ``"paper"`` or ``"sound"``.
  """

  statistic: float
  feasible: bool
  lo: float
  hi: float
  evaluations: int
  mode: str


@dataclasses.dataclass(frozen=True)
class PTRAnswer:
  """One PTR query.

  Attributes:
    output: the release ``f(x) + Lap(release_scale)^m``, or ``None`` (⊥) when the test failed.
    answered: the test passed.
    statistic: the noiseless statistic ``s``.
    noisy_statistic: ``s + Lap(test_scale)``.
    threshold: ``τ``; the test passes iff ``noisy_statistic >= threshold``.
    test_scale, release_scale: the Laplace scales.
    search: the radius search.
    reason: for ⊥, why (`refusal_reason`: the certified radius against the radius the
      threshold asks for, or that the point is not certified at ``R``); ``""`` when answered.
  """

  output: Array | None
  answered: bool
  statistic: float
  noisy_statistic: float
  threshold: float
  test_scale: float
  release_scale: float
  search: RadiusSearch
  reason: str = ""


@dataclasses.dataclass(frozen=True)
class PrivacyStatement:
  """What one PTR query guarantees, for inputs at L∞ distance ``d <= radius``.

  ``P[M(x) in S] <= exp(eps_per_unit * d + eps_constant) P[M(x') in S] + delta``.
  ``metric`` is True when ``eps_constant`` is only the tolerance term (metric privacy).
  """

  eps_per_unit: float
  eps_constant: float
  delta: float
  radius: float
  metric: bool
  text: str

  @property
  def epsilon_at_radius(self) -> float:
    """The ε of the statement for R-neighbours: ``eps_per_unit · R + eps_constant``."""
    return self.eps_per_unit * self.radius + self.eps_constant


# ------------------------------------------------------------------------------------------------
# Validation and calibration
# ------------------------------------------------------------------------------------------------

def _check(epsilon: float, delta: float, radius: float, proposal: float | None = None,
           radius_max: float | None = None, zeta: float | None = None) -> None:
  if not (isinstance(epsilon, (int, float, np.floating)) and epsilon > 0):
    raise ValueError(f"ptr: epsilon must be > 0 (math.inf for no noise), got {epsilon!r}.")
  if not (0.0 < float(delta) < 1.0):
    raise ValueError(f"ptr: delta must be in (0, 1), got {delta!r}.")
  _check_search(radius, proposal, radius_max, zeta)


def _check_search(radius, proposal=None, radius_max=None, zeta=None) -> None:
  if not (math.isfinite(float(radius)) and float(radius) > 0):
    raise ValueError(f"ptr: radius must be finite and > 0, got {radius!r}.")
  if proposal is not None and not (math.isfinite(float(proposal)) and float(proposal) > 0):
    raise ValueError(f"ptr: proposal (Δp) must be finite and > 0, got {proposal!r}.")
  if radius_max is not None and not (math.isfinite(radius_max) and radius_max >= radius):
    raise ValueError(f"ptr: radius_max must be finite and >= radius ({radius}), got "
                     f"{radius_max!r}.")
  if zeta is not None and not (math.isfinite(zeta) and zeta > 0):
    raise ValueError(f"ptr: zeta must be finite and > 0, got {zeta!r}.")


def _check_choice(name: str, value: str, options: tuple[str, ...]) -> None:
  if value not in options:
    raise ValueError(f"ptr: {name} must be one of {options}, got {value!r}.")


def test_scale(epsilon: float, radius: float, calib: str = DEFAULT_CALIB,
               zeta: float = 0.01) -> float:
  """Laplace scale of the test: ``2(R + ζ)/ε`` (total: ``ε/2`` for a statistic of sensitivity
  ``< R + ζ``), ``R/ε`` (code) or ``1/ε`` (unit); 0 for ``ε = inf``."""
  _check_choice("calib", calib, CALIBS)
  if calib == "total":
    return 2.0 * (radius + zeta) / epsilon
  return (radius if calib == "code" else 1.0) / epsilon


def threshold(epsilon: float, delta: float, radius: float, calib: str = DEFAULT_CALIB,
              zeta: float = 0.01) -> float:
  """``τ = ln(1/δ) · test_scale``, so ``P[0 + Lap(b) >= τ] = δ/2`` (PTR, App. B, step 4;
  Dwork & Lei 2009)."""
  return math.log(1.0 / delta) * test_scale(epsilon, radius, calib, zeta)


def release_scale(proposal: float, epsilon: float, radius: float,
                  calib: str = DEFAULT_CALIB) -> float:
  """Laplace scale of the release, from the proposal ``Δp``, never from ``x``: ``2 Δp R/ε``
  (total: ``ε/2`` for ``||f(x) - f(x')||_1 <= Δp R``), ``Δp R/ε`` (code) or ``Δp/ε`` (unit)."""
  _check_choice("calib", calib, CALIBS)
  if calib == "total":
    return 2.0 * proposal * radius / epsilon
  return proposal * test_scale(epsilon, radius, calib)


def pass_probability(statistic: float, *, epsilon: float, delta: float, radius: float,
                     calib: str = DEFAULT_CALIB, zeta: float = 0.01) -> float:
  """``P[s + Lap(b) >= τ]``: ``1 - exp(-(s - τ)/b)/2`` for ``s >= τ``, else
  ``exp(-(τ - s)/b)/2``; ``δ/2`` at ``s = 0``."""
  _check(epsilon, delta, radius)
  b, tau = (test_scale(epsilon, radius, calib, zeta),
            threshold(epsilon, delta, radius, calib, zeta))
  if b == 0:
    return 1.0 if statistic >= tau else 0.0
  if statistic >= tau:
    return 1.0 - 0.5 * math.exp(-(statistic - tau) / b)
  return 0.5 * math.exp(-(tau - statistic) / b)


def bisection_steps(radius: float, radius_max: float, zeta: float) -> int:
  """``ceil(log2((R_max - R)/ζ))`` (0 when ``R_max - R <= ζ``): the fixed step count."""
  span = radius_max - radius
  return 0 if span <= zeta else int(math.ceil(math.log2(span / zeta)))


def grid_radii(radius: float, radius_max: float, zeta: float) -> np.ndarray:
  """``r_j = min(R + j ζ, R_max)``, ``j = 0..ceil((R_max - R)/ζ)``."""
  n = int(math.ceil((radius_max - radius) / zeta - 1e-12)) if radius_max > radius else 0
  return np.minimum(radius + zeta * np.arange(n + 1), radius_max)


def _statistic(lo, feasible, radius: float, mode: str):
  s = lo / 2.0 if mode == "paper" else jnp.maximum(0.0, lo - radius)
  return jnp.where(feasible, s, 0.0)


def privacy_statement(*, epsilon: float, delta: float, radius: float,
                      calib: str = DEFAULT_CALIB, mode: str = "paper",
                      zeta: float = 0.01) -> PrivacyStatement:
  """The guarantee of `ptr_release` for one query (module docstring; PTR, App. A–B).

  Test and release compose: ``ε_test = Δs / b_test`` with ``Δs`` the statistic's sensitivity
  (``< R + ζ`` for ``d <= R``; ``<= d + ζ`` for φ*) and ``ε_release = Δp d / b_release``.
  ``calib="total"`` gives ``epsilon_at_radius == ε``.
  """
  _check(epsilon, delta, radius, zeta=zeta)
  _check_choice("calib", calib, CALIBS)
  _check_choice("mode", mode, MODES)
  if calib == "total":
    b_test = test_scale(epsilon, radius, calib, zeta)
    release_unit = epsilon / (2.0 * radius)                # Δp d / (2 Δp R / ε) per unit of d
    if mode == "sound":
      per, const = 1.0 / b_test + release_unit, zeta / b_test
      text = (f"metric privacy: P[M(x)∈S] <= exp({per:.4g}·d + {const:.3g}) P[M(x')∈S] + "
              f"{delta / 2:.4g} for d = ||x - x'||_inf <= {radius}, i.e. exp({epsilon:.4g}) "
              f"at d = R")
      return PrivacyStatement(per, const, delta / 2, radius, True, text)
    per, const = release_unit, (radius + zeta) / b_test
    text = (f"(ε, δ) for R-neighbours: P[M(x)∈S] <= exp({per:.4g}·d + {const:.4g}) P[M(x')∈S] "
            f"+ {delta / 2:.4g} for d <= R = {radius}, i.e. exp({epsilon:.4g}) at d = R")
    return PrivacyStatement(per, const, delta / 2, radius, False, text)
  unit = epsilon / radius if calib == "code" else epsilon   # ε per unit of L∞ distance
  if mode == "sound":
    per, const, metric = 2 * unit, 2 * unit * zeta / 2, True
    text = (f"metric privacy: P[M(x)∈S] <= exp({2 * unit:.4g}·d + {unit * zeta:.3g}) "
            f"P[M(x')∈S] + {delta / 2:.4g} for d = ||x - x'||_inf <= {radius}")
  else:
    per, const, metric = unit, unit * (radius + zeta), False
    text = (f"(ε, δ) for R-neighbours: P[M(x)∈S] <= exp({unit:.4g}·d + {unit * (radius + zeta):.4g})"
            f" P[M(x')∈S] + {delta / 2:.4g} for d <= R = {radius}"
            + (f", i.e. exp(2ε(1 + ζ/(2R))) = exp({2 * epsilon + epsilon * zeta / radius:.4g})"
               if calib == "code" else ""))
  return PrivacyStatement(per, const, delta / 2, radius, metric, text)


# ------------------------------------------------------------------------------------------------
# Oracles and the radius search
# ------------------------------------------------------------------------------------------------

def make_oracle(apply_fn: Callable, params: Any, *, method: str = "ibp", out_norm: str = "l1",
                sound: bool = True) -> Oracle:
  """``(x, radius) -> U(f, N(x, radius))`` with a `boundjax.ptr.lipschitz` IBP bound (traceable)."""
  if method not in ("ibp", "ibp_cheap"):
    raise ValueError(f"make_oracle: method must be 'ibp' or 'ibp_cheap' (traceable), got "
                     f"{method!r}; pass oracle=... for others (e.g. milp.lipschitz.milp_oracle).")
  return jax.jit(lambda x, r: lip.ibp_upper(apply_fn, params, x, r, method=method,
                                            out_norm=out_norm, sound=sound))


def _search_traced(U: Oracle, x, radius: float, radius_max: float, proposal: float,
                   zeta: float, search: str):
  """``(lo, hi, feasible)`` in JAX (fixed work, no early exit): ``jit``/``vmap``-able."""
  if search == "grid":
    radii = jnp.asarray(grid_radii(radius, radius_max, zeta), x.dtype)
    ok = jnp.cumprod(jax.vmap(lambda r: U(x, r))(radii) <= proposal) > 0   # feasible prefix
    k = jnp.sum(ok)
    lo = jnp.where(k > 0, radii[jnp.maximum(k - 1, 0)], 0.0)
    hi = jnp.where(k < radii.size, radii[jnp.minimum(k, radii.size - 1)], radius_max)
    return lo, hi, ok[0]
  feasible = U(x, jnp.asarray(radius, x.dtype)) <= proposal
  cap = U(x, jnp.asarray(radius_max, x.dtype)) <= proposal
  lo = jnp.where(cap, radius_max, radius).astype(x.dtype)
  hi = jnp.asarray(radius_max, x.dtype)

  def halve(_, bounds):
    lo, hi = bounds
    mid = (lo + hi) / 2
    ok = U(x, mid) < proposal                 # strict, as Algorithm 1 and the authors' code
    return jnp.where(cap | ok, jnp.where(cap, lo, mid), lo), jnp.where(cap | ok, hi, mid)

  # one traced step in a loop of fixed length: compiled once, not once per step
  lo, hi = jax.lax.fori_loop(0, bisection_steps(radius, radius_max, zeta), halve, (lo, hi))
  return jnp.where(feasible, lo, 0.0), hi, feasible


def _search_eager(U: Oracle, x, radius: float, radius_max: float, proposal: float, zeta: float,
                  search: str) -> tuple[float, float, bool, int]:
  """``(lo, hi, feasible, evaluations)`` with Python control flow (any oracle, e.g. a MILP):
  stops after the first test when ``N(x, R)`` fails or ``N(x, R_max)`` passes."""
  calls = 0

  def ok(r: float, strict: bool) -> bool:
    nonlocal calls
    calls += 1
    u = float(U(x, r))
    return u < proposal if strict else u <= proposal

  if search == "grid":
    radii = grid_radii(radius, radius_max, zeta)
    k = 0
    while k < radii.size and ok(float(radii[k]), False):
      k += 1
    if k == 0:
      return 0.0, float(radii[0]), False, calls
    return float(radii[k - 1]), float(radii[k]) if k < radii.size else radius_max, True, calls
  if not ok(radius, False):
    return 0.0, radius, False, calls
  if ok(radius_max, False):
    return radius_max, radius_max, True, calls
  lo, hi = radius, radius_max
  for _ in range(bisection_steps(radius, radius_max, zeta)):
    mid = (lo + hi) / 2
    if ok(mid, True):
      lo = mid
    else:
      hi = mid
  return lo, hi, True, calls


def _evaluations(radius, radius_max, zeta, search) -> int:
  if search == "grid":
    return int(grid_radii(radius, radius_max, zeta).size)
  return 2 + bisection_steps(radius, radius_max, zeta)


def radius_search(apply_fn: Callable, params: Any, x: Any, *, radius: float, proposal: float,
                  radius_max: float = 1.4, zeta: float = 0.01, mode: str = "paper",
                  search: str = "bisect", method: str = "ibp", out_norm: str = "l1",
                  oracle: Oracle | None = None) -> RadiusSearch:
  """The PTR test statistic at ``x`` (PTR, App. A, eq. 2; Algorithm 1's loop, corrected).

  ``search="bisect"``: ``U(N(x, R)) > Δp`` gives 0; ``U(N(x, R_max)) <= Δp`` gives
  ``lo = R_max``; otherwise ``ceil(log2((R_max - R)/ζ))`` halvings with ``U(N(x, mid)) < Δp``.
  ``search="grid"``: ``U`` on ``r_j = R + jζ`` (one ``vmap``), ``lo`` the end of the feasible
  prefix. Either way ``lo`` is certified and ``hi - lo <= ζ``. The statistic is ``lo/2``
  (``mode="paper"``) or ``max(0, lo - R)`` (``"sound"``).

  Args:
    apply_fn, params: the network ``f(x) = apply_fn(params, x)``.
    x: the query point (embedding).
    radius: ``R`` (> 0); proposal: ``Δp`` (> 0); radius_max, zeta: the search range and tolerance.
    method, out_norm: the `boundjax.ptr.lipschitz` oracle (``"ibp"``/``"ibp_cheap"``) and norm.
    oracle: any ``(x, r) -> upper bound`` instead (e.g. `milp.lipschitz.milp_oracle`); evaluated
      eagerly, with early exits.
  """
  _check_search(radius, proposal, radius_max, zeta)
  _check_choice("mode", mode, MODES)
  _check_choice("search", search, SEARCHES)
  radius, radius_max, zeta, proposal = map(float, (radius, radius_max, zeta, proposal))
  if oracle is not None:
    lo, hi, feasible, calls = _search_eager(oracle, x, radius, radius_max, proposal, zeta, search)
  else:
    fn = _cached(_search_fn, apply_fn, method, out_norm, radius, radius_max, zeta, search)
    lo, hi, feasible = (np.asarray(v) for v in fn(params, jnp.asarray(x), proposal))
    lo, hi, feasible, calls = (float(lo), float(hi), bool(feasible),
                               _evaluations(radius, radius_max, zeta, search))
  stat = float(_statistic(lo, feasible, radius, mode))
  return RadiusSearch(stat, feasible, lo, hi, calls, mode)


def _cached(builder: Callable, *args: Any) -> Callable:
  try:
    return builder(*args)
  except TypeError:  # an unhashable apply_fn
    return builder.__wrapped__(*args)


@functools.lru_cache(maxsize=64)
def _search_fn(apply_fn, method, out_norm, radius, radius_max, zeta, search):
  """Jitted ``(params, x, proposal) -> (lo, hi, feasible)``; one compilation per search shape."""
  def fn(params, x, proposal):
    U = lambda z, r: lip.ibp_upper(apply_fn, params, z, r, method=method, out_norm=out_norm)
    return _search_traced(U, x, radius, radius_max, proposal, zeta, search)
  return jax.jit(fn)


# ------------------------------------------------------------------------------------------------
# Test and release
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Setting:
  """The hashable, static part of a query (one compilation per setting)."""

  radius: float
  radius_max: float
  zeta: float
  proposal: float
  epsilon: float
  delta: float
  calib: str
  mode: str
  search: str
  method: str
  out_norm: str

  @property
  def b_test(self) -> float:
    return test_scale(self.epsilon, self.radius, self.calib, self.zeta)

  @property
  def tau(self) -> float:
    return threshold(self.epsilon, self.delta, self.radius, self.calib, self.zeta)

  @property
  def b_release(self) -> float:
    return release_scale(self.proposal, self.epsilon, self.radius, self.calib)


def _noisy(key: Array, stat, value, st: _Setting):
  """``(noisy statistic, answered, released value)`` for statistic ``stat`` and ``f(x) = value``;
  for ``ε = inf`` no noise is added (the release is ``f(x)`` bit for bit)."""
  if math.isinf(st.epsilon):
    return stat, jnp.asarray(True), value
  k_test, k_release = jax.random.split(key)
  noisy = stat + st.b_test * jax.random.laplace(k_test, (), stat.dtype)
  released = value + st.b_release * jax.random.laplace(k_release, value.shape, value.dtype)
  return noisy, noisy >= st.tau, released


def _query_traced(apply_fn, params, x, key, st: _Setting):
  U = lambda z, r: lip.ibp_upper(apply_fn, params, z, r, method=st.method, out_norm=st.out_norm)
  lo, hi, feasible = _search_traced(U, x, st.radius, st.radius_max, st.proposal, st.zeta,
                                    st.search)
  stat = _statistic(lo, feasible, st.radius, st.mode).astype(x.dtype)
  value = jnp.reshape(apply_fn(params, x), (-1,))
  noisy, answered, released = _noisy(key, stat, value, st)
  return released, answered, stat, noisy, lo, hi, feasible


@functools.lru_cache(maxsize=64)
def _query_fn(apply_fn, st: _Setting):
  return jax.jit(lambda p, x, k: _query_traced(apply_fn, p, x, k, st))


@functools.lru_cache(maxsize=64)
def _batch_fn(apply_fn, st: _Setting):
  return jax.jit(jax.vmap(lambda p, x, k: _query_traced(apply_fn, p, x, k, st),
                          in_axes=(None, 0, 0)))


def _setting(radius, radius_max, zeta, proposal, epsilon, delta, calib, mode, search, method,
             out_norm) -> _Setting:
  _check(epsilon, delta, radius, proposal, radius_max, zeta)
  _check_choice("calib", calib, CALIBS)
  _check_choice("mode", mode, MODES)
  _check_choice("search", search, SEARCHES)
  return _Setting(float(radius), float(radius_max), float(zeta), float(proposal), float(epsilon),
                  float(delta), calib, mode, search, method, out_norm)


def ptr_query(key: Array, apply_fn: Callable, params: Any, x: Any, *, proposal: float,
              epsilon: float, delta: float, radius: float, radius_max: float = 1.4,
              zeta: float = 0.01, calib: str = DEFAULT_CALIB, mode: str = "paper",
              search: str = "bisect", method: str = "ibp", out_norm: str = "l1",
              oracle: Oracle | None = None) -> PTRAnswer:
  """One PTR query with its diagnostics (`ptr_release` returns only the output).

  Args:
    key: PRNG key; split into the test and release noise keys.
    apply_fn, params: the released network ``f``.
    x: the query point.
    proposal: ``Δp``, fixed before seeing ``x`` (`propose_bound` on public data).
    epsilon: ``> 0``; ``math.inf`` releases ``f(x)`` exactly (no privacy).
    delta: in ``(0, 1)``; an unsafe point is answered with probability ``δ/2``.
    radius: ``R`` (> 0), radius_max, zeta: the search (`radius_search`).
    calib: ``"total"`` (default: the query is ``(ε, δ/2)``-DP for R-neighbours), ``"code"``
      (the authors' code, about ``2ε``) or ``"unit"`` (ε per unit distance); mode: ``"paper"`` or
      ``"sound"`` (module docstring for the guarantee of each combination, or
      `privacy_statement`).
    search, method, out_norm, oracle: the radius search and its Lipschitz oracle.
  """
  st = _setting(radius, radius_max, zeta, proposal, epsilon, delta, calib, mode, search, method,
                out_norm)
  x = jnp.asarray(x)
  if oracle is None:
    out = _cached(_query_fn, apply_fn, st)(params, x, key)
    released, answered, stat, noisy, lo, hi, feasible = out
    search_res = RadiusSearch(float(stat), bool(feasible), float(lo), float(hi),
                              _evaluations(st.radius, st.radius_max, st.zeta, search), mode)
  else:
    search_res = radius_search(apply_fn, params, x, radius=radius, proposal=proposal,
                               radius_max=radius_max, zeta=zeta, mode=mode, search=search,
                               oracle=oracle)
    stat = jnp.asarray(search_res.statistic, x.dtype)
    value = jnp.reshape(apply_fn(params, x), (-1,))
    noisy, answered, released = _noisy(key, stat, value, st)
  answered = bool(answered)
  reason = "" if answered else refusal_reason(search_res, float(noisy), st)
  return PTRAnswer(released if answered else None, answered, search_res.statistic, float(noisy),
                   st.tau, st.b_test, st.b_release, search_res, reason)


def required_radius(tau: float, radius: float, mode: str) -> float:
  """The certified radius ``ρ`` whose noiseless statistic reaches ``τ``: ``2τ`` (``φ = ρ/2``,
  mode paper) or ``R + τ`` (``φ* = ρ - R``, mode sound)."""
  return 2.0 * tau if mode == "paper" else radius + tau


def refusal_reason(search: RadiusSearch, noisy: float, st: _Setting) -> str:
  """Why a query got ⊥, with the numbers: not certified at ``R`` (statistic 0), or the certified
  radius ``ρ`` against the radius the threshold asks for (`required_radius`), and the noisy
  statistic against ``τ``."""
  need = required_radius(st.tau, st.radius, st.mode)
  test = (f"the noisy statistic {noisy:.4g} (statistic {search.statistic:.4g} + Lap({st.b_test:.4g})"
          f" noise) is below the threshold τ = {st.tau:.4g}")
  if not search.feasible:
    return (f"⊥: x is not certified at the radius R = {st.radius:g}: the Lipschitz bound on "
            f"N(x, R) exceeds the proposal Δp = {st.proposal:.4g}, so the statistic is 0 and "
            f"{test}")
  if search.lo < need:
    cap = (f"; the search stops at radius_max = {st.radius_max:g}, so only the test noise can "
           "pass at this ε and δ" if need > st.radius_max else "")
    return (f"⊥: the certified radius ρ = {search.lo:.4g} is below the radius {need:.4g} the "
            f"threshold asks for{cap}; {test}")
  return (f"⊥: the certified radius ρ = {search.lo:.4g} reaches the radius {need:.4g} the "
          f"threshold asks for, but the test noise pulled the noisy statistic down: {test}")


def ptr_release(key: Array, apply_fn: Callable, params: Any, x: Any, *, proposal: float,
                epsilon: float, delta: float, radius: float, **options: Any) -> Array | None:
  """``f(x) + Lap(b)^m`` with ``b = 2Δp·R/ε`` (``calib="total"``, the default), ``Δp·R/ε``
  (``"code"``) or ``Δp/ε`` (``"unit"``), or ``None`` (⊥) when the noisy test fails (PTR, App. B,
  Algorithm 1, corrected as in the module docstring; the options are `ptr_query`'s, whose
  ``reason`` says why a query was refused)."""
  return ptr_query(key, apply_fn, params, x, proposal=proposal, epsilon=epsilon, delta=delta,
                   radius=radius, **options).output


def ptr_release_batch(key: Array, apply_fn: Callable, params: Any, xs: Any, *, proposal: float,
                      epsilon: float, delta: float, radius: float, radius_max: float = 1.4,
                      zeta: float = 0.01, calib: str = DEFAULT_CALIB, mode: str = "paper",
                      search: str = "bisect", method: str = "ibp",
                      out_norm: str = "l1") -> tuple[Array, Array, Array]:
  """Many queries in one compiled ``vmap`` (IBP oracles): ``(outputs, answered, statistics)``.

  Query ``i`` uses ``jax.random.split(key, n)[i]``, so it equals
  ``ptr_query(jax.random.split(key, n)[i], ..., xs[i], ...)``. ``outputs[i]`` is meaningful only
  where ``answered[i]`` (⊥ otherwise).
  """
  st = _setting(radius, radius_max, zeta, proposal, epsilon, delta, calib, mode, search, method,
                out_norm)
  xs = jnp.asarray(xs)
  keys = jax.random.split(key, xs.shape[0])
  released, answered, stat, *_ = _cached(_batch_fn, apply_fn, st)(params, xs, keys)
  return released, answered, stat


# ------------------------------------------------------------------------------------------------
# Proposal
# ------------------------------------------------------------------------------------------------

def propose_bound(apply_fn: Callable, params: Any, public_x: Any, *, radius: float,
                  rule: str = "mean+3std", q: float = 0.95, method: str = "ibp",
                  out_norm: str = "l1", oracle: Oracle | None = None) -> float:
  """``Δp`` from the Lipschitz bounds ``U(f, N(z, R))`` over **public or training** points.

  ``rule="mean+3std"`` (the authors' code, ``mean + 3·std`` with the unbiased std; the code
  computes it on test points, which leaks them) or ``"quantile"`` (the ``q``-quantile). Never call
  this on the queries themselves: ``Δp`` must not depend on the private input.
  """
  _check_search(radius)
  xs = jnp.asarray(public_x)
  if oracle is None:
    u = np.asarray(lip.ibp_upper_batch(apply_fn, params, xs, radius, method=method,
                                       out_norm=out_norm), np.float64)
  else:
    u = np.array([float(oracle(x, radius)) for x in xs])
  if rule == "mean+3std":
    return float(u.mean() + 3.0 * (u.std(ddof=1) if u.size > 1 else 0.0))
  if rule == "quantile":
    if not 0.0 <= q <= 1.0:
      raise ValueError(f"propose_bound: q must be in [0, 1], got {q!r}.")
    return float(np.quantile(u, q))
  raise ValueError(f"propose_bound: rule must be 'mean+3std' or 'quantile', got {rule!r}.")

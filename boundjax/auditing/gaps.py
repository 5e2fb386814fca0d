"""Gaps and certificates of model auditing with finite adversaries (Diaz et al., Theorems 1-3).

The formulas of Diaz, Kairouz, Liao, Sankar, "Theoretical guarantees for model auditing with
finite adversaries": geometry of the support ``K`` (`diameter`, `enclosing_radius`,
`radius_term`), the gaps `thm1_gap` (eq. 22/24), `thm2_gap` (eq. 34), `thm3_gap` (eq. 37),
`eq49_gap`, the certificate ``L >= L_emp - gap`` (`certify`), the paper's worked example (§5,
§5) and exact ERM in the classification setting. The adversaries themselves are trained in
`boundjax.auditing.adversary`; the corrections to the paper are listed in `boundjax.auditing`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import scipy.integrate
import scipy.special
import scipy.stats

Array = jax.Array

# ----------------------------------------------------------------------------------------------
# Geometry of the support K
# ----------------------------------------------------------------------------------------------

def _as_box(K: Any) -> tuple[np.ndarray, np.ndarray] | None:
  if hasattr(K, "lower") and hasattr(K, "upper"):
    return np.atleast_1d(np.asarray(K.lower, float)), np.atleast_1d(np.asarray(K.upper, float))
  if isinstance(K, tuple) and len(K) == 2:
    lo, hi = np.atleast_1d(np.asarray(K[0], float)), np.atleast_1d(np.asarray(K[1], float))
    if lo.shape != hi.shape:
      raise ValueError(f"box K: lower and upper shapes differ: {lo.shape} vs {hi.shape}.")
    if np.any(lo > hi):
      raise ValueError("box K: lower > upper.")
    return lo, hi
  return None


def _as_points(K: Any) -> np.ndarray:
  pts = np.asarray(K, float)
  if pts.ndim == 1:
    pts = pts[:, None]
  if pts.ndim != 2 or pts.shape[0] == 0:
    raise ValueError(f"K: expected a box (lower, upper) or points of shape [m, q], got {pts.shape}.")
  if not np.all(np.isfinite(pts)):
    raise ValueError("K: points contain NaN or Inf.")
  return pts


def diameter(K: Any) -> float:
  """``Dia(K) = sup_{x,y in K} ||x - y||_2`` for a box ``(lower, upper)`` / `Interval` or points.

  For points this is the exact maximum pairwise distance (``O(m^2)`` in chunks; exact on the
  convex hull for ``q <= 3`` via SciPy when ``m`` is large).
  """
  box = _as_box(K)
  if box is not None:
    return float(np.linalg.norm(box[1] - box[0]))
  pts = _as_points(K)
  q = pts.shape[1]
  if q == 1:
    return float(pts.max() - pts.min())
  if pts.shape[0] > 2000 and q <= 3:
    import scipy.spatial
    pts = pts[scipy.spatial.ConvexHull(pts).vertices]
  best = 0.0
  for i in range(0, pts.shape[0], 1024):
    d = np.linalg.norm(pts[i:i + 1024, None, :] - pts[None, :, :], axis=-1)
    best = max(best, float(d.max()))
  return best


def enclosing_radius(K: Any, iters: int = 2000) -> tuple[float, np.ndarray]:
  """A ball ``B_r(x0)`` containing ``K``; returns ``(r, x0)``.

  Box: exact (centre and half-diagonal). Points: Badoiu-Clarkson iterations for the centre, then
  ``r = max_i ||x_i - x0||`` *exactly*, so the ball always contains every point (a slightly
  non-minimal ball only loosens the bound, never breaks it).
  """
  box = _as_box(K)
  if box is not None:
    lo, hi = box
    return float(np.linalg.norm(hi - lo) / 2), (lo + hi) / 2
  pts = _as_points(K)
  c = pts.mean(axis=0)
  for i in range(1, iters + 1):
    far = pts[np.argmax(np.sum((pts - c) ** 2, axis=1))]
    c = c + (far - c) / (i + 1)
  r = float(np.sqrt(np.max(np.sum((pts - c) ** 2, axis=1))))
  return r, c


def radius_term(K: Any) -> float:
  """The factor multiplying ``C_eta`` in Theorem 1: ``Dia(K)`` for a box, ``2 r_enc`` otherwise.

  Barron's theorem (Prop. 1) holds with ``2r`` for ``K`` inside a ball of radius ``r`` (re-centred
  at ``x0`` with ``c_0 = h(x0)``; ``C_h`` is translation invariant). ``Dia(K) = 2 r_enc`` for
  centrally symmetric sets such as boxes; in general ``r_enc`` can exceed ``Dia/2`` (Jung), so the
  paper's ``Dia(K)`` can under-state the bound (Barron's theorem, as used in §2, Prop. 1, needs ``K`` in a ball).
  """
  box = _as_box(K)
  if box is not None:
    return diameter(box)
  return 2.0 * enclosing_radius(K)[0]


# ----------------------------------------------------------------------------------------------
# Gaps (Theorem 1, §4.1; Theorems 2-3, §4.2)
# ----------------------------------------------------------------------------------------------

def _check_common(n: Any, delta: float) -> None:
  if not 0.0 < delta < 1.0:
    raise ValueError(f"delta must lie in (0, 1), got {delta}.")
  if np.any(np.asarray(n) < 1):
    raise ValueError(f"n must be >= 1, got {n}.")


def binary_entropy(x: Any) -> Any:
  """``h_b(x) = -x log x - (1 - x) log(1 - x)`` in nats (``h_b(0) = h_b(1) = 0``)."""
  x = np.asarray(x, float)
  return scipy.special.entr(x) + scipy.special.entr(1.0 - x)


def thm1_constants(radius: float, C_eta: float) -> tuple[float, float, float]:
  """``(C0, C1, C2) = ((2 + D)^2, D^2, 4 D)`` with ``D = radius * C_eta`` (eq. 24)."""
  if np.any(np.asarray(C_eta) < 0):
    raise ValueError(
        f"C_eta must be >= 0 (a Barron constant), got {C_eta}; the paper's eq. 48 "
        "C_eta = <v, v0> must read |<v, v0>|.")
  if np.any(np.asarray(radius) < 0):
    raise ValueError(f"radius term must be >= 0, got {radius}.")
  D = np.asarray(radius, float) * np.asarray(C_eta, float)
  return (2.0 + D) ** 2, D ** 2, 4.0 * D


def thm1_gap(n: Any, k: Any, delta: float, radius: float, C_eta: float,
             hoeffding: Literal["eq22", "eq31"] = "eq22") -> Any:
  """Theorem 1 (representation setting, squared loss): w.p. ``>= 1 - delta``

  ``L_{k,S_n} - L <= C0 sqrt(log(1/delta) / (2n)) + C1/k + C2/sqrt(k)`` (eq. 22) with eq. 24's
  constants and ``radius`` = ``Dia(K)`` for boxes or ``2 r_enc(K)`` (`radius_term`).

  ``hoeffding="eq31"`` uses the printed eq. 31, ``sqrt(2 log(1/delta) / (2n))``, a factor
  ``sqrt(2)`` larger than one-sided Hoeffding (the printed eq. 31 is inconsistent with eq. 22; Figure 1 uses
  eq. 22). Vectorised over ``n``, ``k``, ``C_eta``.
  """
  _check_common(n, delta)
  if np.any(np.asarray(k) < 1):
    raise ValueError(f"k must be >= 1, got {k}.")
  if hoeffding not in ("eq22", "eq31"):
    raise ValueError(f"hoeffding must be 'eq22' or 'eq31', got {hoeffding!r}.")
  C0, C1, C2 = thm1_constants(radius, C_eta)
  n = np.asarray(n, float)
  k = np.asarray(k, float)
  lg = math.log(1.0 / delta)
  c = np.sqrt(lg / (2.0 * n)) if hoeffding == "eq22" else np.sqrt(2.0 * lg / (2.0 * n))
  return C0 * c + C1 / k + C2 / np.sqrt(k)


def eq49_gap(mu: Any, n: Any, k: Any, delta: float) -> Any:
  """The worked example's gap, eq. 49, with ``|mu|`` (eq. 48 prints ``<v, v0>``; the constant is its absolute value):

  ``2 (1 + 3|mu|)^2 sqrt(2 log(1/delta) / n) + 36 mu^2 / k + 24 |mu| / sqrt(k)``,
  identical to eq. 22 + eq. 24 with ``Dia([-3, 3]) = 6`` and ``C_eta = |mu|``.
  """
  _check_common(n, delta)
  m = np.abs(np.asarray(mu, float))
  n = np.asarray(n, float)
  k = np.asarray(k, float)
  return (2.0 * (1.0 + 3.0 * m) ** 2 * np.sqrt(2.0 * math.log(1.0 / delta) / n)
          + 36.0 * m ** 2 / k + 24.0 * m / np.sqrt(k))


def thm2_gap(n: Any, delta: float) -> Any:
  """Theorem 2 (classification, squared loss, any ``d``): ``2 sqrt(2 log(1/delta) / n)`` (eq. 34)."""
  _check_common(n, delta)
  return 2.0 * np.sqrt(2.0 * math.log(1.0 / delta) / np.asarray(n, float))


def thm3_min_n(d: int, delta: float) -> float:
  """Theorem 3's precondition: ``n >= 4 (2d + log(1/delta))``."""
  return 4.0 * (2.0 * d + math.log(1.0 / delta))


def thm3_gap(n: Any, d: int, delta: float,
             tv_bound: Literal["paper", "weissman"] = "paper") -> Any:
  """Theorem 3 (classification, log-loss, nats): ``h_b(sqrt((2d + log(1/delta)) / n))`` (eq. 37).

  Raises `ValueError` unless ``n >= 4 (2d + log(1/delta))`` (the theorem's precondition, which
  keeps the TV radius ``<= 1/2`` where ``h_b`` is increasing).

  ``tv_bound="weissman"`` uses the tighter radius ``sqrt((2d ln 2 + ln(1/delta)) / (2n))`` that
  Weissman et al.'s inequality actually gives (derived here); the paper's form is default.
  """
  _check_common(n, delta)
  if d < 1:
    raise ValueError(f"d must be >= 1, got {d}.")
  n_arr = np.asarray(n, float)
  need = thm3_min_n(d, delta)
  if np.any(n_arr < need):
    raise ValueError(
        f"Theorem 3 needs n >= 4(2d + log(1/delta)) = {need:.2f} (d={d}, delta={delta}); "
        f"got n={n}.")
  if tv_bound == "paper":
    theta = np.sqrt((2.0 * d + math.log(1.0 / delta)) / n_arr)
  elif tv_bound == "weissman":
    theta = np.sqrt((2.0 * d * math.log(2.0) + math.log(1.0 / delta)) / (2.0 * n_arr))
  else:
    raise ValueError(f"tv_bound must be 'paper' or 'weissman', got {tv_bound!r}.")
  return binary_entropy(np.minimum(theta, 0.5))


@dataclasses.dataclass(frozen=True)
class AuditCertificate:
  """``lower_bound = L_emp - gap`` on the minimal true loss ``L`` (eq. 18).

  ``certified`` is True only when ``L_emp`` is the exact ERM value (closed-form classification
  ERM); for a trained adversary it is an approximation that biases the bound upward.
  """
  L_emp: float
  gap: float
  lower_bound: float
  ratio: float
  certified: bool
  assumptions: tuple[str, ...]


def certify(L_emp: float, gap: float, erm_exact: bool,
            assumptions: Sequence[str] = ()) -> AuditCertificate:
  """Builds the `AuditCertificate` for ``L >= L_emp - gap`` (w.p. ``>= 1 - delta``)."""
  if not np.isfinite(L_emp) or not np.isfinite(gap) or gap < 0:
    raise ValueError(f"certify: L_emp and gap must be finite with gap >= 0, got {L_emp}, {gap}.")
  notes = list(assumptions)
  if not erm_exact:
    notes.append("L_emp is an approximate ERM (best of trained adversaries): the lower bound is "
                 "an estimate, not a certificate")
  lb = float(L_emp) - float(gap)
  return AuditCertificate(float(L_emp), float(gap), lb, lb / float(L_emp) if L_emp else float("nan"),
                          bool(erm_exact), tuple(notes))


# ----------------------------------------------------------------------------------------------
# Worked example: Gaussian mixture + linear classifier (paper §5)
# ----------------------------------------------------------------------------------------------

def truncated_densities(t: Any, mu: float, r: float = 3.0) -> tuple[np.ndarray, np.ndarray]:
  """``f_+-(t)`` of ``N(+-mu, 1)`` truncated to ``[-r, r]`` (eq. 43); zero outside."""
  t = np.asarray(t, float)
  z_p = scipy.stats.norm.cdf(r - mu) - scipy.stats.norm.cdf(-r - mu)
  z_m = scipy.stats.norm.cdf(r + mu) - scipy.stats.norm.cdf(-r + mu)
  inside = np.abs(t) <= r
  fp = np.where(inside, scipy.stats.norm.pdf(t - mu) / z_p, 0.0)
  fm = np.where(inside, scipy.stats.norm.pdf(t + mu) / z_m, 0.0)
  return fp, fm


def eta_from_densities(fp: Any, fm: Any, prior: float = 0.5) -> np.ndarray:
  """``eta = (lambda f+ - (1-lambda) f-) / (lambda f+ + (1-lambda) f-)`` on ``K`` (eq. 23)."""
  fp, fm = np.asarray(fp, float), np.asarray(fm, float)
  num = prior * fp - (1.0 - prior) * fm
  den = prior * fp + (1.0 - prior) * fm
  return num / den


def equal_cov_eta(mu_plus: Any, mu_minus: Any, cov: Any, prior: float = 0.5,
                  log_mass_ratio: float = 0.0) -> tuple[np.ndarray, float]:
  """``eta(t) = tanh(a . t + b)`` for ``T | S=+-1 ~ N(mu_+-, cov)`` (derived here for equal covariances).

  ``a = cov^-1 (mu_+ - mu_-) / 2``,
  ``b = log(lambda/(1-lambda))/2 - (mu_+^T cov^-1 mu_+ - mu_-^T cov^-1 mu_-)/4 + log(Z_-/Z_+)/2``
  where ``log_mass_ratio = log(Z_-/Z_+)`` accounts for a common truncation set (0 without one).
  Hence ``C_eta = ||a||_2`` whatever ``b`` and the prior.
  """
  mp = np.atleast_1d(np.asarray(mu_plus, float))
  mm = np.atleast_1d(np.asarray(mu_minus, float))
  S = np.atleast_2d(np.asarray(cov, float))
  if not 0.0 < prior < 1.0:
    raise ValueError(f"prior must lie in (0, 1), got {prior}.")
  Si = np.linalg.inv(S)
  a = 0.5 * Si @ (mp - mm)
  b = (0.5 * math.log(prior / (1.0 - prior)) - 0.25 * (mp @ Si @ mp - mm @ Si @ mm)
       + 0.5 * log_mass_ratio)
  return a, float(b)


def sample_gaussian_example(key: Array, n: int, mu: float, r: float = 3.0,
                            prior: float = 0.5) -> tuple[Array, Array]:
  """``S`` Rademacher(prior), ``T | S ~ N(S mu, 1)`` truncated to ``[-r, r]`` (§3.1).

  Exact inverse-CDF sampling per class (as in Fig. 1's experiment, §5.4). Returns ``T [n, 1]`` float32, ``S [n]``
  float32 in ``{-1, +1}``.
  """
  k1, k2 = jax.random.split(key)
  s = jnp.where(jax.random.uniform(k1, (n,)) < prior, 1.0, -1.0)
  m = s * mu
  u = jax.random.uniform(k2, (n,), minval=1e-12, maxval=1.0 - 1e-12)
  cdf = jax.scipy.stats.norm.cdf
  lo, hi = cdf(-r - m), cdf(r - m)
  t = m + jax.scipy.special.ndtri(lo + u * (hi - lo))
  t = jnp.clip(t, -r, r)
  return t[:, None].astype(jnp.float32), s.astype(jnp.float32)


def true_min_loss(mu: float, r: float = 3.0) -> float:
  """Minimal true squared loss ``L = MMSE(S | T)`` of the example, eq. 50 (adaptive quadrature):

  ``L = sqrt(2) / (sqrt(pi) p_mu) int_{-r}^{r} exp(-(t+mu)^2/2) / (1 + exp(-2 mu t)) dt``,
  ``p_mu = Phi(r + mu) - Phi(-r + mu)``.
  """
  p_mu = scipy.stats.norm.cdf(r + mu) - scipy.stats.norm.cdf(-r + mu)
  f = lambda t: math.exp(-(t + mu) ** 2 / 2) / (1.0 + math.exp(-2.0 * mu * t))
  val, _ = scipy.integrate.quad(f, -r, r, epsabs=1e-14, epsrel=1e-13, limit=200)
  return math.sqrt(2.0) / (math.sqrt(math.pi) * p_mu) * val


def true_min_loss_sech2(mu: float, r: float = 3.0) -> float:
  """Equivalent form ``L = E[sech^2(mu T)]``, ``T ~ (f_+ + f_-)/2`` (derived here from eq. 50)."""
  def integrand(t):
    fp, fm = truncated_densities(t, mu, r)
    return 0.5 * (fp + fm) / math.cosh(mu * t) ** 2
  val, _ = scipy.integrate.quad(integrand, -r, r, epsabs=1e-14, epsrel=1e-13, limit=200)
  return val


# ----------------------------------------------------------------------------------------------
# Exact ERM in the classification setting (Theorems 2-3, §4.2)
# ----------------------------------------------------------------------------------------------

def classification_erm(S: Any, T: Any, d: int, loss: Literal["sq", "log"] = "sq") -> float:
  """Minimal empirical loss over all ``h: [d] -> R`` (exact, closed form).

  * ``"sq"``: ``sum_i (n_i/n) (1 - m_i^2)``, attained by ``h(i) = m_i`` (mean of ``S`` on
    ``{T = i}``).
  * ``"log"``: the plug-in conditional entropy ``H_hat(S | T)`` in nats, attained by
    ``h(i) = P_hat(S = 1 | T = i)`` (outputs in ``[0, 1]``).

  ``S`` in ``{-1, +1}``, ``T`` integer in ``{0, ..., d-1}``. Vectorised over leading axes.
  """
  S = np.asarray(S, float)
  T = np.asarray(T)
  if not np.all(np.isin(S, (-1.0, 1.0))):
    raise ValueError("classification_erm: S must take values in {-1, +1}.")
  if np.any((T < 0) | (T >= d)):
    raise ValueError(f"classification_erm: T must take values in 0..{d - 1}.")
  onehot = T[..., None] == np.arange(d)
  n = S.shape[-1]
  cnt = onehot.sum(-2)
  pos = (onehot & (S[..., None] > 0)).sum(-2)
  return conditional_losses(pos / n, (cnt - pos) / n, loss)


def conditional_losses(p_pos: Any, p_neg: Any, loss: Literal["sq", "log"] = "sq") -> np.ndarray:
  """Minimal loss ``inf_h E l(h(T), S)`` for a joint ``P(S=+1, T=i), P(S=-1, T=i)`` (``[..., d]``).

  Squared loss: ``sum_i P(i) (1 - m_i^2)``; log-loss: ``H(S | T)`` (eq. 38).
  """
  pp, pn = np.asarray(p_pos, float), np.asarray(p_neg, float)
  pt = pp + pn
  if loss == "sq":
    m = np.divide(pp - pn, pt, out=np.zeros_like(pt), where=pt > 0)
    return np.sum(pt * (1.0 - m * m), axis=-1)
  if loss == "log":
    return np.sum(scipy.special.entr(pp) + scipy.special.entr(pn) - scipy.special.entr(pt), axis=-1)
  raise ValueError(f"loss must be 'sq' or 'log', got {loss!r}.")

"""Model auditing with finite adversaries: the gaps of Theorems 1-3 and the adversaries themselves.

Spec 004 (Diaz, Kairouz, Liao, Sankar, "Theoretical guarantees for model auditing with finite
adversaries"). An auditor fits a *finite adversary* — a two-layer network with ``k`` hidden units
(eq. 5, activation sigma(t) = tanh(t/2)) — on ``n`` samples ``(S_i, T_i)`` to predict a binary
sensitive ``S in {-1, +1}`` from a released ``T``. If its minimal empirical loss
``L_{k,S_n}`` is large, then with probability ``>= 1 - delta`` the minimal true loss over *all*
adversaries satisfies ``L >= L_{k,S_n} - gap`` (eq. 18).

This module holds

* geometry of the support ``K``: `diameter`, `enclosing_radius`, `radius_term`;
* the gaps: `thm1_gap` (representation setting, eq. 22/24), `thm2_gap` (eq. 34), `thm3_gap`
  (eq. 37) and `AuditCertificate` / `certify`;
* the paper's worked example (§5, spec §3): `sample_gaussian_example`, `eta_from_densities`,
  `equal_cov_eta`, `true_min_loss`, `eq49_gap`;
* exact ERM in the classification setting (`classification_erm`) and approximate ERM over
  ``H_k`` by many restarts in one vmapped, jitted run (`fit_finite_adversary`, optax Adam + SGD).

Corrections to the paper, as the spec asks (each repeated where it applies):

* ``C_eta = |<v, v0>|``, not ``<v, v0>`` (eq. 48); every gap takes ``|mu|`` / rejects ``C < 0``.
* Hoeffding: eq. 22/49 (``sqrt(log(1/delta)/(2n))``) is the default, as in Figure 1; the printed
  eq. 31 carries an extra ``sqrt(2)`` and is offered as ``hoeffding="eq31"``.
* Barron's theorem needs ``K`` inside a ball of radius ``r``: the radius term is ``2 r``, which
  equals ``Dia(K)`` only for centrally symmetric ``K`` (boxes). For point clouds we use twice the
  radius of an enclosing ball (`radius_term`).
* Theorem 3's precondition ``n >= 4 (2d + log(1/delta))`` raises a `ValueError`.
* Log-loss adversaries map into ``[0, 1]``.

Soundness caveats (spec §8): the gap bounds ``L_{k,S_n} - L`` where ``L_{k,S_n}`` is the *exact*
ERM; a trained adversary's loss is an over-estimate of it, so ``trained loss - gap`` is not a
certified lower bound (`certify` records this). ``C_eta`` depends on the population, so outside a
known model it is an estimate.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Literal, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
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
  paper's ``Dia(K)`` can under-state the bound (spec §1.2).
  """
  box = _as_box(K)
  if box is not None:
    return diameter(box)
  return 2.0 * enclosing_radius(K)[0]


# ----------------------------------------------------------------------------------------------
# Gaps (spec §2, §4.2)
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
  ``sqrt(2)`` larger than one-sided Hoeffding (the spec's [DERIVED] inconsistency; Figure 1 uses
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
  """The worked example's gap, eq. 49, with ``|mu|`` (spec §3.2 correction):

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
  Weissman et al.'s inequality actually gives (spec §2.3 [DERIVED]); the paper's form is default.
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
# Worked example: Gaussian mixture + linear classifier (paper §5, spec §3)
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
  """``eta(t) = tanh(a . t + b)`` for ``T | S=+-1 ~ N(mu_+-, cov)`` (spec §3.4 [DERIVED]).

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

  Exact inverse-CDF sampling per class (spec §4.4). Returns ``T [n, 1]`` float32, ``S [n]``
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
  """Equivalent form ``L = E[sech^2(mu T)]``, ``T ~ (f_+ + f_-)/2`` (spec §3.3 [DERIVED])."""
  def integrand(t):
    fp, fm = truncated_densities(t, mu, r)
    return 0.5 * (fp + fm) / math.cosh(mu * t) ** 2
  val, _ = scipy.integrate.quad(integrand, -r, r, epsabs=1e-14, epsrel=1e-13, limit=200)
  return val


# ----------------------------------------------------------------------------------------------
# Exact ERM in the classification setting (spec §4.3)
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


# ----------------------------------------------------------------------------------------------
# Finite adversaries: approximate ERM over H_k (spec §4.3)
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AdversaryConfig:
  """Training setup for finite adversaries (spec §5; the paper leaves most of it open).

  Trials are split evenly between the optimisers in ``optimizers`` (Adam lr 1e-3; SGD lr 1e-2 with
  momentum 0.9 [IMPL]); Glorot-uniform first layer, zero biases and output weights [IMPL];
  activation ``tanh(t/2)`` (eq. 5). The whole-sample loss is evaluated after every epoch and the
  minimum over trials and epochs is reported (paper §5.4).
  """
  k: int = 1000
  trials: int = 512
  epochs: int = 30
  optimizers: tuple[str, ...] = ("adam", "sgd")
  lr_adam: float = 1e-3
  lr_sgd: float = 1e-2
  momentum: float = 0.9
  batch: int = 1024
  activation: str = "tanh_half"
  trial_chunk: int = 512     # trials per vmapped call (memory control)
  eval_chunk: int = 4096     # samples per chunk of the whole-sample loss

  def __post_init__(self):
    for name in ("k", "trials", "epochs", "batch", "trial_chunk", "eval_chunk"):
      if getattr(self, name) < 1:
        raise ValueError(f"AdversaryConfig.{name} must be >= 1, got {getattr(self, name)}.")
    for o in self.optimizers:
      if o not in ("adam", "sgd"):
        raise ValueError(f"AdversaryConfig.optimizers: unknown optimiser {o!r} (adam, sgd).")
    if not self.optimizers:
      raise ValueError("AdversaryConfig.optimizers must not be empty.")


class AdversaryResult(NamedTuple):
  """Outcome of `fit_finite_adversary`.

  ``best_loss`` = ``min`` over trials and epochs of the whole-sample loss (the approximate
  ``L_{k,S_n}``); ``best_params`` its network; ``curves[trial, epoch]`` every whole-sample loss;
  ``optimizer[trial]`` the optimiser's name per trial; ``seconds`` the wall time.
  """
  best_loss: float
  best_params: dict
  curves: np.ndarray
  optimizer: tuple[str, ...]
  seconds: float


def adversary_apply(params: dict, T: Array, activation: str = "tanh_half") -> Array:
  """``h(T) = c0 + sum_i c_i sigma(a_i . T + b_i)`` (eq. 5) for ``T [n, q]``; returns ``[n]``."""
  from boundjax.barron import profile
  g, _ = profile(activation)
  return params["c0"] + g(T @ params["a"] + params["b"]) @ params["c"]


def init_adversary(key: Array, q: int, k: int) -> dict:
  """Glorot-uniform ``a [q, k]``; zero ``b [k]``, ``c [k]``, ``c0`` (spec §4.3 [IMPL])."""
  lim = math.sqrt(6.0 / (q + k))
  return {"a": jax.random.uniform(key, (q, k), jnp.float32, -lim, lim),
          "b": jnp.zeros((k,), jnp.float32), "c": jnp.zeros((k,), jnp.float32),
          "c0": jnp.zeros((), jnp.float32)}


def _optimizer(name: str, cfg: AdversaryConfig) -> optax.GradientTransformation:
  if name == "adam":
    return optax.adam(cfg.lr_adam)
  return optax.sgd(cfg.lr_sgd, momentum=cfg.momentum)


def _full_loss(params: dict, T: Array, S: Array, cfg: AdversaryConfig) -> Array:
  """Mean squared loss on the whole sample, evaluated in chunks of ``cfg.eval_chunk``."""
  n = T.shape[0]
  c = min(cfg.eval_chunk, n)
  m = n // c
  head = jax.lax.map(
      lambda ts: jnp.sum((ts[1] - adversary_apply(params, ts[0], cfg.activation)) ** 2),
      (T[:m * c].reshape(m, c, -1), S[:m * c].reshape(m, c)))
  tail = jnp.sum((S[m * c:] - adversary_apply(params, T[m * c:], cfg.activation)) ** 2)
  return (jnp.sum(head) + tail) / n


def _train_one(key: Array, T: Array, S: Array, cfg: AdversaryConfig, opt_name: str):
  """Trains one adversary; returns (best whole-sample loss, its params, per-epoch losses)."""
  opt = _optimizer(opt_name, cfg)
  n, q = T.shape
  bs = min(cfg.batch, n)
  steps = n // bs
  k_init, k_epochs = jax.random.split(key)
  params = init_adversary(k_init, q, cfg.k)
  state = opt.init(params)

  def loss_fn(p, tb, sb):
    return jnp.mean((sb - adversary_apply(p, tb, cfg.activation)) ** 2)

  def step(carry, idx):
    p, s = carry
    g = jax.grad(loss_fn)(p, T[idx], S[idx])
    upd, s = opt.update(g, s, p)
    return (optax.apply_updates(p, upd), s), None

  def epoch(carry, ek):
    p, s, best, best_p = carry
    perm = jax.random.permutation(ek, n)[:steps * bs].reshape(steps, bs)
    (p, s), _ = jax.lax.scan(step, (p, s), perm)
    L = _full_loss(p, T, S, cfg)
    better = L < best
    best_p = jax.tree.map(lambda x, y: jnp.where(better, x, y), p, best_p)
    return (p, s, jnp.minimum(L, best), best_p), L

  init = (params, state, jnp.asarray(jnp.inf, jnp.float32), params)
  (_, _, best, best_p), curve = jax.lax.scan(epoch, init, jax.random.split(k_epochs, cfg.epochs))
  return best, best_p, curve


@functools.partial(jax.jit, static_argnames=("cfg", "opt_name"))
def _train_many(keys: Array, T: Array, S: Array, cfg: AdversaryConfig, opt_name: str):
  """``vmap`` of `_train_one` over restart keys: many adversaries in one compiled run."""
  return jax.vmap(lambda k: _train_one(k, T, S, cfg, opt_name))(keys)


@functools.partial(jax.jit, static_argnames=("cfg", "opt_name"))
def _train_single(key: Array, T: Array, S: Array, cfg: AdversaryConfig, opt_name: str):
  return _train_one(key, T, S, cfg, opt_name)


def _check_data(T: Any, S: Any) -> tuple[Array, Array]:
  T = jnp.asarray(T, jnp.float32)
  S = jnp.asarray(S, jnp.float32)
  if T.ndim == 1:
    T = T[:, None]
  if T.ndim != 2 or S.shape != (T.shape[0],):
    raise ValueError(f"adversary data: expected T [n, q] and S [n], got {T.shape} and {S.shape}.")
  s_np = np.asarray(S)
  if not np.all((s_np == 1.0) | (s_np == -1.0)):
    raise ValueError("adversary data: S must take values in {-1, +1} (map 0/1 labels by 2 S - 1).")
  if not np.all(np.isfinite(np.asarray(T))):
    raise ValueError("adversary data: T contains NaN or Inf.")
  return T, S


def fit_finite_adversary(key: Array, T: Any, S: Any, cfg: AdversaryConfig = AdversaryConfig(),
                         *, vmapped: bool = True, progress: bool = False) -> AdversaryResult:
  """Approximate ERM over ``H_k``: ``cfg.trials`` random restarts, best whole-sample loss.

  Trials are split evenly over ``cfg.optimizers``; each group runs as one vmapped, jitted call
  per chunk of ``cfg.trial_chunk`` trials (``vmapped=False`` trains them one by one with the same
  compiled per-trial function, for benchmarking). The returned loss is an *upper* estimate of the
  exact ``L_{k,S_n}`` (ERM over ``H_k`` is NP-hard; spec §8).
  """
  T, S = _check_data(T, S)
  names = []
  per = [cfg.trials // len(cfg.optimizers)] * len(cfg.optimizers)
  for i in range(cfg.trials - sum(per)):
    per[i] += 1
  best, best_p, curves = np.inf, None, []
  keys_all = jax.random.split(key, cfg.trials)
  start = 0
  t0 = time.perf_counter()
  bar = None
  if progress:
    from tqdm.auto import tqdm
    bar = tqdm(total=cfg.trials, desc="adversaries", unit="trial")
  for name, m in zip(cfg.optimizers, per):
    keys = keys_all[start:start + m]
    start += m
    for j in range(0, m, cfg.trial_chunk if vmapped else 1):
      kk = keys[j:j + (cfg.trial_chunk if vmapped else 1)]
      if vmapped:
        b, p, c = _train_many(kk, T, S, cfg, name)
      else:
        b, p, c = _train_single(kk[0], T, S, cfg, name)
        b, c = b[None], c[None]
        p = jax.tree.map(lambda x: x[None], p)
      b = np.asarray(b)
      i = int(np.argmin(b))
      if b[i] < best:
        best, best_p = float(b[i]), jax.tree.map(lambda x: np.asarray(x[i]), p)
      curves.append(np.asarray(c))
      names += [name] * len(kk)
      if bar is not None:
        bar.update(len(kk))
  if bar is not None:
    bar.close()
  return AdversaryResult(best, best_p, np.concatenate(curves, 0), tuple(names),
                         time.perf_counter() - t0)


def audit_representation(key: Array, T: Any, S: Any, C_eta: float, K: Any, delta: float = 0.01,
                         cfg: AdversaryConfig = AdversaryConfig(),
                         hoeffding: Literal["eq22", "eq31"] = "eq22",
                         progress: bool = False) -> tuple[AuditCertificate, AdversaryResult]:
  """Theorem 1 audit: trains the finite adversaries on ``(T, S)`` and returns the certificate.

  ``K`` is the support of ``T`` (box or points; see `radius_term`), ``C_eta`` the Barron constant
  of ``E[S | T]`` (known model, or an estimate — then the result is an estimate too).
  """
  T, S = _check_data(T, S)
  res = fit_finite_adversary(key, T, S, cfg, progress=progress)
  gap = float(thm1_gap(T.shape[0], cfg.k, delta, radius_term(K), C_eta, hoeffding))
  cert = certify(res.best_loss, gap, erm_exact=False, assumptions=(
      f"T supported in K with radius term {radius_term(K):.4g}",
      f"C_eta = {C_eta:.6g}", f"delta = {delta}"))
  return cert, res


__all__ = [
    "diameter", "enclosing_radius", "radius_term", "binary_entropy", "thm1_constants", "thm1_gap",
    "eq49_gap", "thm2_gap", "thm3_min_n", "thm3_gap", "AuditCertificate", "certify",
    "truncated_densities", "eta_from_densities", "equal_cov_eta", "sample_gaussian_example",
    "true_min_loss", "true_min_loss_sech2", "classification_erm", "conditional_losses",
    "AdversaryConfig", "AdversaryResult", "adversary_apply", "init_adversary",
    "fit_finite_adversary", "audit_representation",
]

"""PredInt (Sphynx, §4): a predicted interval per parameter from leave-one-out samples —
normalisation, Yeo–Johnson, a Laplace-kernel KDE and its quantiles — vectorised over parameters."""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
from scipy import special, stats


PyTree = Any


# ---------------------------------------------------------------------------------------------
# PredInt (Sphynx, Fig. 4 and App. A), vectorised over a trailing parameter axis
# ---------------------------------------------------------------------------------------------

def l1_normalize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """``z = (w - μ) / Δ`` with ``μ = median``, ``Δ = mean |w - μ|`` per column (step 1).

  Columns with ``Δ = 0`` (all values equal) get ``z = 0``.
  """
  v = np.asarray(values, np.float64)
  mu = np.median(v, axis=0)
  delta = np.mean(np.abs(v - mu), axis=0)
  z = (v - mu) / np.where(delta > 0, delta, 1.0)
  return z, mu, delta


def yeo_johnson(z: np.ndarray, lam: np.ndarray) -> np.ndarray:
  """Yeo–Johnson ``T_λ(z)`` (PredInt's transformation step), ``λ`` broadcast against ``z``'s last axis.

  ``((1+z)^λ - 1)/λ = expm1(λ log1p(z))/λ`` for ``z >= 0`` and
  ``-((1-z)^(2-λ) - 1)/(2-λ)`` for ``z < 0``, with the log limits at ``λ = 0`` and ``λ = 2``.
  """
  z = np.asarray(z, np.float64)
  lam = np.broadcast_to(np.asarray(lam, np.float64), z.shape)
  pos = z >= 0
  lp = np.log1p(np.where(pos, z, 0.0))
  ln = np.log1p(np.where(pos, 0.0, -z))
  l0 = np.where(lam == 0, 1.0, lam)
  l2 = np.where(lam == 2, 1.0, 2.0 - lam)
  tp = np.where(lam == 0, lp, np.expm1(l0 * lp) / l0)
  tn = np.where(lam == 2, -ln, -np.expm1(l2 * ln) / l2)
  return np.where(pos, tp, tn)


def yeo_johnson_inv(y: np.ndarray, lam: np.ndarray) -> np.ndarray:
  """Inverse of `yeo_johnson` for ``λ ∈ [0, 2]`` (derived in closed form)."""
  y = np.asarray(y, np.float64)
  lam = np.broadcast_to(np.asarray(lam, np.float64), y.shape)
  pos = y >= 0
  yp, yn = np.where(pos, y, 0.0), np.where(pos, 0.0, y)
  l0 = np.where(lam == 0, 1.0, lam)
  l2 = np.where(lam == 2, 1.0, 2.0 - lam)
  with np.errstate(over="ignore"):
    zp = np.where(lam == 0, np.expm1(yp), np.expm1(np.log1p(l0 * yp) / l0))
    zn = np.where(lam == 2, -np.expm1(-yn), -np.expm1(np.log1p(-l2 * yn) / l2))
  return np.where(pos, zp, zn)


def yj_gaussian_loglik(z: np.ndarray, lam: np.ndarray) -> np.ndarray:
  """Yeo–Johnson Gaussian profile log-likelihood per column (λ by maximum likelihood, as in PredInt):

  ``ℓ(λ) = -K/2 log σ̂²_λ + (λ - 1) Σ_i sign(z_i) log(1 + |z_i|)``  (equals
  ``scipy.stats.yeojohnson_llf``).
  """
  z = np.asarray(z, np.float64)
  k = z.shape[0]
  t = yeo_johnson(z, lam)
  var = np.var(t, axis=0)
  with np.errstate(divide="ignore"):
    return (-0.5 * k * np.log(var)
            + (np.asarray(lam) - 1.0) * np.sum(np.sign(z) * np.log1p(np.abs(z)), axis=0))


def _fast_gaussian_loglik(z: np.ndarray) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
  """`yj_gaussian_loglik` with the λ-free parts (logs, signs, Jacobian sum) computed once."""
  pos = z >= 0
  lp = np.log1p(np.where(pos, z, 0.0))
  ln = np.log1p(np.where(pos, 0.0, -z))
  jac = np.sum(np.where(pos, lp, -ln), axis=0)
  k = z.shape[0]

  def loglik(_, lam):
    l0 = np.where(lam == 0, 1.0, lam)
    l2 = np.where(lam == 2, 1.0, 2.0 - lam)
    # lp = 0 where z < 0 and ln = 0 where z >= 0, so the two branches simply add.
    t = np.where(lam == 0, lp, np.expm1(l0 * lp) / l0)
    t -= np.where(lam == 2, ln, np.expm1(l2 * ln) / l2)
    var = np.var(t, axis=0)
    with np.errstate(divide="ignore"):
      return -0.5 * k * np.log(var) + (lam - 1.0) * jac

  return loglik


def yj_lambda_mle(z: np.ndarray, lo: float = 0.0, hi: float = 2.0, iters: int = 50,
                  loglik: Callable[[np.ndarray, np.ndarray], np.ndarray] = yj_gaussian_loglik
                  ) -> np.ndarray:
  """``argmax_{λ ∈ [lo, hi]} loglik(z, λ)`` per column by golden-section search.

  Vectorised over columns: every iteration evaluates the likelihood once for all columns. The
  end points are compared too, so a maximum on the boundary (λ = 0 or 2) is found exactly.
  ``loglik`` is pluggable (the λ criterion is replaceable).
  """
  z = np.asarray(z, np.float64)
  if loglik is yj_gaussian_loglik:
    loglik = _fast_gaussian_loglik(z)
  p = z.shape[1:]
  g = (np.sqrt(5.0) - 1.0) / 2.0
  a, b = np.full(p, lo), np.full(p, hi)
  c, d = b - g * (b - a), a + g * (b - a)
  fc, fd = loglik(z, c), loglik(z, d)
  for _ in range(iters):
    left = fc >= fd                       # the maximum lies in [a, d]
    a, b = np.where(left, a, c), np.where(left, d, b)
    new = np.where(left, b - g * (b - a), a + g * (b - a))
    fnew = loglik(z, new)
    c, d, fc, fd = (np.where(left, new, d), np.where(left, c, new),
                    np.where(left, fnew, fd), np.where(left, fc, fnew))
  lam = np.where(fc >= fd, c, d)
  best = np.maximum(fc, fd)
  for edge in (lo, hi):
    fe = loglik(z, np.full(p, edge))
    lam = np.where(fe > best, edge, lam)
    best = np.maximum(best, fe)
  return lam


def laplace_kde_cdf(v: np.ndarray, y: np.ndarray, h: np.ndarray) -> np.ndarray:
  """CDF at ``v`` (shape ``(P,)`` or ``(Q, P)``) of the Laplace KDE of the columns of ``y``.

  ``F(v) = 1/K Σ_i G((v - y_i)/h)`` with ``G(t) = e^t / 2`` for ``t < 0`` and
  ``1 - e^{-t} / 2`` otherwise (kernel ``g(t) = e^{-|t|} / 2``, Sphynx, App. A).
  """
  y = np.asarray(y, np.float64)
  v = np.asarray(v, np.float64)
  t = (v[..., None, :] - y) / h                     # (..., K, P)
  e = 0.5 * np.exp(-np.abs(t))
  return np.mean(np.where(t < 0, e, 1.0 - e), axis=-2)


def laplace_kde_interval(y: np.ndarray, alpha_p: Any, h: Optional[np.ndarray] = None,
                         bisect_iters: int = 200) -> tuple[np.ndarray, np.ndarray]:
  """``[F⁻¹(α'/2), F⁻¹(1 - α'/2)]`` of the Laplace KDE of each column of ``y`` (App. A).

  Closed form (Sphynx, App. A):

    l_y = -h log(1/K Σ e^{-y_i/h}) - h log(1/α'),   u_y = h log(1/K Σ e^{y_i/h}) + h log(1/α').

  It is the exact quantile only when ``l_y <= min y`` (resp. ``u_y >= max y``); elsewhere (the
  guard ``α' > 1/K``) the exact CDF is inverted by bisection, bracketed by the closed form
  (``F <= `` the left-tail formula everywhere) and the data range (``F(max y) >= 1/2``).

  Args:
    y: ``(K, P)`` values.
    alpha_p: per-parameter error ``α'`` in ``(0, 1)`` (scalar or ``(P,)``).
    h: bandwidth per column; default ``mean |y - median(y)|``.
  """
  y = np.asarray(y, np.float64)
  k = y.shape[0]
  a = np.broadcast_to(np.asarray(alpha_p, np.float64), y.shape[1:])
  if np.any((a <= 0) | (a >= 1)):
    raise ValueError(f"alpha' must lie in (0, 1), got {np.asarray(alpha_p)}.")
  if h is None:
    h = np.mean(np.abs(y - np.median(y, axis=0)), axis=0)
  h = np.asarray(h, np.float64)
  ymin, ymax = y.min(axis=0), y.max(axis=0)
  deg = h <= 0
  hs = np.where(deg, 1.0, h)
  log_k = np.log(k)
  ly = -hs * (special.logsumexp(-y / hs, axis=0) - log_k) + hs * np.log(a)
  uy = hs * (special.logsumexp(y / hs, axis=0) - log_k) - hs * np.log(a)
  need_l, need_u = ~deg & (ly > ymin), ~deg & (uy < ymax)
  if need_l.any():
    cols = np.flatnonzero(need_l)
    ly[cols] = _bisect_cdf(y[:, cols], hs[cols], a[cols] / 2, ly[cols], ymax[cols], bisect_iters)
  if need_u.any():
    cols = np.flatnonzero(need_u)
    uy[cols] = _bisect_cdf(y[:, cols], hs[cols], 1 - a[cols] / 2, ymin[cols], uy[cols],
                           bisect_iters)
  return np.where(deg, ymin, ly), np.where(deg, ymax, uy)


def _bisect_cdf(y, h, target, lo, hi, iters):
  """Solves ``F(v) = target`` per column on the bracket ``[lo, hi]`` (F increasing)."""
  lo, hi = lo.copy(), hi.copy()
  for _ in range(iters):
    mid = 0.5 * (lo + hi)
    below = laplace_kde_cdf(mid, y, h) < target
    lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    if np.all(hi - lo <= 1e-15 * np.maximum(1.0, np.abs(mid))):
      break
  return 0.5 * (lo + hi)


PRED_INT_VARIANTS = ("predint", "no_transform", "no_normalize", "gaussian")


def pred_int(values: np.ndarray, alpha_p: float, variant: str = "predint",
             loglik: Callable[[np.ndarray, np.ndarray], np.ndarray] = yj_gaussian_loglik
             ) -> tuple[np.ndarray, np.ndarray]:
  """Sphynx PredInt for every column of ``values`` (``(K, P)``: K networks, P parameters).

  ``variant`` selects the ablations of Sphynx Table 3: ``"predint"`` (the method),
  ``"no_transform"`` (KDE on the raw values), ``"no_normalize"`` (Yeo–Johnson without the
  normalisation), ``"gaussian"`` (−KDE: mean/std normalisation, Yeo–Johnson, Gaussian quantiles).
  Columns whose values are all equal give ``[w, w]``.

  Returns:
    ``(lower, upper)`` float64 vectors of shape ``(P,)``.
  """
  v = np.asarray(values, np.float64)
  if v.ndim == 1:
    v = v[:, None]
  if v.ndim != 2 or v.shape[0] < 2:
    raise ValueError(f"pred_int: values must be (K >= 2, P), got shape {np.shape(values)}.")
  if not np.all(np.isfinite(v)):
    raise ValueError("pred_int: values contain NaN or Inf.")
  if not 0 < alpha_p < 1:
    raise ValueError(f"pred_int: alpha' must lie in (0, 1), got {alpha_p}.")
  if variant not in PRED_INT_VARIANTS:
    raise ValueError(f"pred_int: unknown variant {variant!r}; use one of {PRED_INT_VARIANTS}.")
  const = np.all(v == v[0], axis=0)
  if variant == "no_transform":
    lo, hi = laplace_kde_interval(v, alpha_p)
    return np.where(const, v[0], lo), np.where(const, v[0], hi)
  if variant == "gaussian":
    mu, sd = v.mean(axis=0), v.std(axis=0)
    z = (v - mu) / np.where(sd > 0, sd, 1.0)
  elif variant == "no_normalize":
    z, mu, sd = v, np.zeros(v.shape[1]), np.ones(v.shape[1])
  else:
    z, mu, sd = l1_normalize(v)
  lam = yj_lambda_mle(np.where(const, 0.0, z), loglik=loglik)
  y = yeo_johnson(z, lam)
  if variant == "gaussian":
    q = stats.norm.ppf(1 - alpha_p / 2)
    ly, uy = y.mean(axis=0) - q * y.std(axis=0), y.mean(axis=0) + q * y.std(axis=0)
  else:
    ly, uy = laplace_kde_interval(y, alpha_p)
  lo = mu + sd * yeo_johnson_inv(ly, lam)
  hi = mu + sd * yeo_johnson_inv(uy, lam)
  return np.where(const, v[0], lo), np.where(const, v[0], hi)



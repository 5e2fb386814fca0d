"""Hyper-networks: one network whose parameters are intervals, containing a family of networks.

A hyper-network is a parameter pytree whose leaves are `boundjax.Interval` boxes (LUCID spec 000
§2.3, Sphynx spec 003 §1.4: a non-relational interval abstraction). Because it is an ordinary
pytree of Intervals, ``bj.ibp(model.apply)(hyper, x_box)`` bounds the outputs of every network it
contains (`hyper_output_bounds`).

Two constructions:

* `from_ensemble`: the exact hull of trained networks, coordinate-wise ``[min_n w^n, max_n w^n]``
  (LUCID Def. 5.1). It contains every member and is the smallest box that does.
* `pred_hyper_net`: Sphynx's PredHyperNet (Alg. 1, spec §2.3–2.5): train leave-one-out networks
  in rounds of ``k`` (default 400) and predict each parameter's interval over the unseen ones with
  `pred_int` at ``α' = α / P``, until the Jaccard distance between successive rounds is at most
  ``R`` for a fraction ``M`` of the parameters. The guarantee is statistical, per unseen network,
  with probability ``1 - α`` under Lemma 1's assumptions: it is *not* a sound enclosure of all
  ``|D| + 1`` networks, and `sphynx_metrics` measures how far it falls short.

`pred_int` follows spec §2.5 step by step: median / mean-absolute-deviation normalisation,
Yeo–Johnson with λ restricted to [0, 2] (Gaussian profile likelihood, bounded golden-section search
vectorised over parameters: ``scipy.stats.yeojohnson_normmax`` is unbounded), a Laplace-kernel KDE
with bandwidth ``h = mean |y - median(y)|`` and its closed-form quantiles (computed with
logsumexp), and the inverse maps. Where the closed form is not exact (the quantile falls inside
the data range; the spec's guard ``α' > 1/K`` is a sufficient condition for that) the exact KDE
CDF is inverted by bisection. Everything is float64 numpy; the result is rounded outward to the
parameters' dtype.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special, stats

from boundjax import ensembles
from boundjax.interval import Interval, is_interval, tree_contains
from boundjax.transforms import ibp

PyTree = Any
#: A hyper-network: a parameter pytree whose leaves are `Interval` s (array leaves are points).
HyperNetwork = Any

__all__ = [
    "HyperNetwork",
    "from_ensemble",
    "point",
    "interval_leaves",
    "contains",
    "contains_members",
    "flatten_params",
    "flatten_stacked",
    "flat_bounds",
    "from_flat_bounds",
    "jaccard",
    "l1_normalize",
    "yeo_johnson",
    "yeo_johnson_inv",
    "yj_gaussian_loglik",
    "yj_lambda_mle",
    "laplace_kde_cdf",
    "laplace_kde_interval",
    "pred_int",
    "PredHyperNetResult",
    "pred_hyper_net",
    "ensemble_trainer",
    "weight_abstraction_rate",
    "miscoverage",
    "overcoverage",
    "network_abstraction_rate",
    "sphynx_metrics",
    "hyper_output_bounds",
]


# ---------------------------------------------------------------------------------------------
# Pytree plumbing
# ---------------------------------------------------------------------------------------------

def interval_leaves(hyper: PyTree) -> list[Interval]:
  """The Interval leaves of a hyper-network, in pytree order."""
  return [l for l in jax.tree_util.tree_leaves(hyper, is_leaf=is_interval) if is_interval(l)]


def flatten_params(params: PyTree) -> np.ndarray:
  """All parameters of one network as a ``(P,)`` vector (pytree leaf order)."""
  return np.concatenate([np.asarray(l).ravel() for l in jax.tree_util.tree_leaves(params)])


def flatten_stacked(stacked: PyTree) -> np.ndarray:
  """Stacked networks (leading member axis) as an ``(M, P)`` matrix (pytree leaf order)."""
  leaves = [np.asarray(l) for l in jax.tree_util.tree_leaves(stacked)]
  m = leaves[0].shape[0]
  if any(l.shape[0] != m for l in leaves):
    raise ValueError("stacked parameters disagree on the member axis size.")
  return np.concatenate([l.reshape(m, -1) for l in leaves], axis=1)


def flat_bounds(hyper: PyTree) -> tuple[np.ndarray, np.ndarray]:
  """``(lower, upper)`` vectors of a hyper-network; array leaves count as points."""
  leaves = jax.tree_util.tree_leaves(hyper, is_leaf=is_interval)
  lo = [np.asarray(l.lower if is_interval(l) else l).ravel() for l in leaves]
  hi = [np.asarray(l.upper if is_interval(l) else l).ravel() for l in leaves]
  return np.concatenate(lo), np.concatenate(hi)


def _outward(lo: np.ndarray, hi: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray]:
  """Casts float64 bounds to ``dtype`` rounding ``lo`` down and ``hi`` up.

  ``lo_c = cast(lo)``, then ``lo_c = nextafter(lo_c, -inf)`` where ``lo_c > lo`` (the
  round-to-nearest cast went inward), and symmetrically for ``hi``; compared in float64, so
  ``lo_c <= lo`` and ``hi_c >= hi`` exactly, at most one ulp of ``dtype`` looser than needed.
  """
  dtype = np.dtype(dtype)
  lo_c, hi_c = lo.astype(dtype), hi.astype(dtype)
  lo_c = np.where(lo_c.astype(np.float64) > lo, np.nextafter(lo_c, dtype.type(-np.inf)), lo_c)
  hi_c = np.where(hi_c.astype(np.float64) < hi, np.nextafter(hi_c, dtype.type(np.inf)), hi_c)
  return lo_c, hi_c


def _device_dtype(dtype) -> np.dtype:
  """The dtype ``jnp.asarray`` gives an array of ``dtype`` (float64 -> float32 without x64)."""
  return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def _sound_interval(lo: np.ndarray, hi: np.ndarray) -> Interval:
  """``Interval(lo, hi)`` on the device, rounded outward if the device dtype is narrower.

  ``jnp.asarray`` rounds to nearest: with jax x64 disabled a float64 minimum can round up and a
  maximum down, leaving the very points the box was built from outside it (LUCID Def. 5.1
  needs containment). Floating bounds are therefore cast with `_outward`; others pass as is.
  """
  target = _device_dtype(lo.dtype)
  if np.issubdtype(lo.dtype, np.floating) and target != lo.dtype:
    lo, hi = _outward(np.asarray(lo, np.float64), np.asarray(hi, np.float64), target)
  return Interval(jnp.asarray(lo, target), jnp.asarray(hi, target))


def from_flat_bounds(lower: np.ndarray, upper: np.ndarray, like: PyTree) -> PyTree:
  """A hyper-network shaped like the parameters ``like`` from ``(P,)`` bound vectors.

  Bounds are rounded outward to each leaf's dtype as JAX stores it (float64 leaves become
  float32 when x64 is disabled), so containment survives the cast.
  """
  leaves, treedef = jax.tree_util.tree_flatten(like)
  sizes = [int(np.size(l)) for l in leaves]
  if lower.shape != (sum(sizes),) or upper.shape != lower.shape:
    raise ValueError(f"bounds have shapes {lower.shape}, {upper.shape}; the template has "
                     f"{sum(sizes)} parameters.")
  out, start = [], 0
  for leaf, size in zip(leaves, sizes):
    a = np.asarray(leaf)
    target = _device_dtype(a.dtype)
    lo, hi = _outward(np.asarray(lower[start:start + size], np.float64),
                      np.asarray(upper[start:start + size], np.float64), target)
    out.append(Interval(jnp.asarray(lo.reshape(a.shape), target),
                        jnp.asarray(hi.reshape(a.shape), target)))
    start += size
  return jax.tree_util.tree_unflatten(treedef, out)


# ---------------------------------------------------------------------------------------------
# Exact hyper-network (LUCID Def. 5.1) and containment
# ---------------------------------------------------------------------------------------------

def from_ensemble(stacked: PyTree, members: Optional[Sequence[int] | np.ndarray] = None) -> PyTree:
  """Coordinate-wise ``[min, max]`` over members (LUCID spec §2.3, Def. 5.1).

  Args:
    stacked: parameters with a leading member axis (e.g. ``Ensemble.params``).
    members: row indices (or a boolean mask) to abstract; default all rows.

  Returns:
    A pytree like one member whose leaves are `Interval` s. The hull is computed in the members'
    own dtype and, where JAX stores it narrower (float64 members with x64 disabled become
    float32), rounded outward: ``lower = round_down(min_n w^n)``, ``upper = round_up(max_n w^n)``,
    so every member lies in the box when compared in its own precision.
  """
  def hull(a):
    a = np.asarray(a)
    sel = a if members is None else a[np.asarray(members)]
    if sel.shape[0] == 0:
      raise ValueError("from_ensemble: no members selected.")
    return _sound_interval(sel.min(axis=0), sel.max(axis=0))

  return jax.tree_util.tree_map(hull, stacked)


def point(params: PyTree) -> PyTree:
  """The point hyper-network ``[w, w]`` of one network (Sphynx spec §1.4)."""
  return jax.tree_util.tree_map(Interval.point, params)


def contains(hyper: PyTree, params: PyTree, tol: float = 0.0) -> bool:
  """True iff every parameter of the network ``params`` lies in its interval of ``hyper``."""
  return tree_contains(hyper, params, tol)


def contains_members(hyper: PyTree, stacked: PyTree, tol: float = 0.0) -> np.ndarray:
  """``(M,)`` booleans: which rows of the stacked networks lie entirely in ``hyper``."""
  lo, hi = flat_bounds(hyper)
  w = flatten_stacked(stacked)
  return np.all((w >= lo - tol) & (w <= hi + tol), axis=1)


def jaccard(a: tuple[np.ndarray, np.ndarray], b: Optional[tuple[np.ndarray, np.ndarray]]
            ) -> np.ndarray:
  """Per-parameter Jaccard index ``|I ⊓ I'| / |I ⊔ I'|`` (Sphynx spec §2.4).

  ``a`` and ``b`` are ``(lower, upper)`` vectors. ``J(·, ⊥) = 0`` (``b is None``) and two equal
  points have ``J = 1``.
  """
  al, au = (np.asarray(v, np.float64) for v in a)
  if b is None:
    return np.zeros_like(al)
  bl, bu = (np.asarray(v, np.float64) for v in b)
  inter = np.maximum(0.0, np.minimum(au, bu) - np.maximum(al, bl))
  hull = np.maximum(au, bu) - np.minimum(al, bl)
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(hull > 0, inter / np.where(hull > 0, hull, 1.0), 1.0)


# ---------------------------------------------------------------------------------------------
# PredInt (Sphynx spec §2.5), vectorised over a trailing parameter axis
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
  """Yeo–Johnson ``T_λ(z)`` (spec §2.5 step 2), ``λ`` broadcast against ``z``'s last axis.

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
  """Inverse of `yeo_johnson` for ``λ ∈ [0, 2]`` (spec §2.5, [DERIVED])."""
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
  """Yeo–Johnson Gaussian profile log-likelihood per column (spec §2.5 [IMPL]):

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
  ``loglik`` is pluggable (spec §2.5: the λ criterion should be replaceable).
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
  ``1 - e^{-t} / 2`` otherwise (kernel ``g(t) = e^{-|t|} / 2``, spec §2.5 step 3).
  """
  y = np.asarray(y, np.float64)
  v = np.asarray(v, np.float64)
  t = (v[..., None, :] - y) / h                     # (..., K, P)
  e = 0.5 * np.exp(-np.abs(t))
  return np.mean(np.where(t < 0, e, 1.0 - e), axis=-2)


def laplace_kde_interval(y: np.ndarray, alpha_p: Any, h: Optional[np.ndarray] = None,
                         bisect_iters: int = 200) -> tuple[np.ndarray, np.ndarray]:
  """``[F⁻¹(α'/2), F⁻¹(1 - α'/2)]`` of the Laplace KDE of each column of ``y`` (App. A).

  Closed form (spec §2.5 step 3):

    l_y = -h log(1/K Σ e^{-y_i/h}) - h log(1/α'),   u_y = h log(1/K Σ e^{y_i/h}) + h log(1/α').

  It is the exact quantile only when ``l_y <= min y`` (resp. ``u_y >= max y``); elsewhere (the
  spec's ``α' > 1/K`` guard) the exact CDF is inverted by bisection, bracketed by the closed form
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

  ``variant`` selects the ablations of Sphynx Table 3 (spec §4.5): ``"predint"`` (the method),
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


# ---------------------------------------------------------------------------------------------
# PredHyperNet (Sphynx Alg. 1)
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class PredHyperNetResult:
  """Output of `pred_hyper_net`.

  Attributes:
    hyper: the predicted hyper-network (pytree of Intervals, outward-rounded).
    networks: ``(K, P)`` float matrix of the networks used (row 0 = N).
    entries: ``(K - 1,)`` indices removed by rows 1..K-1, in sampling order (never repeated).
    iterations: rounds of ``k`` networks trained.
    converged_fraction: per round, the fraction of parameters with ``1 - J <= R``.
    converged: whether the stopping rule fired (False when stopped by ``max_networks`` or
      because every point of D was used).
    alpha_p: the per-parameter error ``α / P`` given to `pred_int`.
  """

  hyper: PyTree
  networks: np.ndarray
  entries: np.ndarray
  iterations: int
  converged_fraction: list
  converged: bool
  alpha_p: float


def pred_hyper_net(train_fn: Callable[[np.ndarray], PyTree], full_params: PyTree, n: int, *,
                   alpha: float = 0.1, k: int = 400, R: float = 0.1, M: float = 0.9,
                   seed: int = 0, max_networks: Optional[int] = None, variant: str = "predint",
                   progress: bool = True) -> PredHyperNetResult:
  """Sphynx PredHyperNet (Alg. 1, spec §2.3–2.4).

  Start from ``nets = {N}`` and the point abstraction of N; each round samples ``k`` new points
  uniformly without replacement from ``D \\ entr``, trains ``T(D \\ {x})`` for each
  (``train_fn(indices) -> stacked params``, one network per index), and predicts every parameter's
  interval with ``pred_int(V_w, α / P)`` over all ``K`` networks so far. Stops when at least
  ``M · P`` parameters have Jaccard distance ``1 - J(H_curr, H_prev) <= R``. At least two rounds
  always run (the first compares with the point abstraction).

  Args:
    train_fn: trains the leave-one-out networks of a batch of indices (see `ensemble_trainer`).
    full_params: N, the network trained on all of D.
    n: ``|D|``.
    alpha, k, R, M: Sphynx's defaults 0.1, 400, 0.1, 0.9 (spec §2.9).
    seed: seed of the sampling of entries.
    max_networks: stop (unconverged) once K would exceed this.
    variant: `pred_int` variant.
  """
  if not 0 < alpha < 1 or not 0 <= R <= 1 or not 0 < M <= 1 or k <= 0:
    raise ValueError(f"pred_hyper_net: need 0<alpha<1, 0<=R<=1, 0<M<=1, k>0; got "
                     f"alpha={alpha}, R={R}, M={M}, k={k}.")
  rng = np.random.default_rng(seed)
  order = rng.permutation(n)
  w_full = flatten_params(full_params)
  n_params = w_full.size
  alpha_p = alpha / n_params
  nets = [w_full[None, :]]
  entries: list[np.ndarray] = []
  curr, prev = (w_full, w_full), None
  fractions, used, iterations, converged = [], 0, 0, False
  bar = None
  if progress:
    from tqdm.auto import tqdm
    bar = tqdm(desc="PredHyperNet rounds", unit="round")
  while True:
    frac = float(np.mean(1.0 - jaccard(curr, prev) <= R))
    if prev is not None:
      fractions.append(frac)
    if frac >= M:
      converged = True
      break
    take = min(k, n - used)
    if max_networks is not None:
      take = min(take, max_networks - 1 - used)
    if take <= 0:
      break
    idx = order[used:used + take]
    used += take
    stacked = train_fn(idx)
    block = flatten_stacked(stacked)
    if block.shape != (take, n_params):
      raise ValueError(f"train_fn returned {block.shape} parameters for {take} indices; "
                       f"expected ({take}, {n_params}).")
    nets.append(block)
    entries.append(idx)
    prev, curr = curr, pred_int(np.concatenate(nets), alpha_p, variant)
    iterations += 1
    if bar is not None:
      bar.update(1)
      bar.set_postfix(K=used + 1, converged=f"{np.mean(1.0 - jaccard(curr, prev) <= R):.3f}")
  if bar is not None:
    bar.close()
  hyper = from_flat_bounds(np.asarray(curr[0]), np.asarray(curr[1]), full_params)
  return PredHyperNetResult(hyper, np.concatenate(nets),
                            np.concatenate(entries) if entries else np.zeros(0, np.int64),
                            iterations, fractions, converged, alpha_p)


def ensemble_trainer(model: Any, init_params: PyTree, optimizer: Any, x: Any, y: Any,
                     **train_kwargs) -> Callable[[np.ndarray], PyTree]:
  """``train_fn`` for `pred_hyper_net`: leave-one-out networks by `ensembles.train_ensemble`."""

  def train_fn(indices: np.ndarray) -> PyTree:
    removed = ensembles.leave_k_out(np.asarray(indices), include_full=False)
    return ensembles.train_ensemble(model, init_params, optimizer, x, y, removed,
                                    **train_kwargs).params

  return train_fn


# ---------------------------------------------------------------------------------------------
# Sphynx ablation metrics (spec §4.5)
# ---------------------------------------------------------------------------------------------

def _bounds(hyper: Any) -> tuple[np.ndarray, np.ndarray]:
  if (isinstance(hyper, tuple) and len(hyper) == 2
      and all(isinstance(h, (np.ndarray, jax.Array)) and np.ndim(h) == 1 for h in hyper)):
    return np.asarray(hyper[0], np.float64), np.asarray(hyper[1], np.float64)
  lo, hi = flat_bounds(hyper)
  return lo.astype(np.float64), hi.astype(np.float64)


def _networks(all_nets: Any) -> np.ndarray:
  if isinstance(all_nets, np.ndarray) and all_nets.ndim == 2:
    return all_nets.astype(np.float64)
  return flatten_stacked(all_nets).astype(np.float64)


def weight_abstraction_rate(hyper: Any, all_nets: Any) -> float:
  """Percentage of parameters whose interval contains the parameter's value in every network."""
  lo, hi = _bounds(hyper)
  w = _networks(all_nets)
  return 100.0 * float(np.mean((lo <= w.min(0)) & (hi >= w.max(0))))


def miscoverage(hyper: Any, all_nets: Any) -> tuple[float, int]:
  """Mean over parameters of ``|I* \\ I_pred| / |I_pred|`` (``I*`` = [min, max] over networks).

  Returns ``(mean, excluded)``: parameters with a zero-width predicted interval are left out of
  the mean (the ratio is 0/0 or x/0 there) and counted in ``excluded``.
  """
  lo, hi = _bounds(hyper)
  w = _networks(all_nets)
  slo, shi = w.min(0), w.max(0)
  inter = np.maximum(0.0, np.minimum(hi, shi) - np.maximum(lo, slo))
  missed = (shi - slo) - inter
  width = hi - lo
  ok = width > 0
  return float(np.mean(missed[ok] / width[ok])) if ok.any() else float("nan"), int((~ok).sum())


def overcoverage(hyper: Any, all_nets: Any) -> tuple[float, int]:
  """Geometric mean over parameters of ``|I_pred ⊔ I*| / |I*|``.

  Returns ``(geometric mean, excluded)``: parameters with ``|I*| = 0`` (equal in every network)
  are left out and counted.
  """
  lo, hi = _bounds(hyper)
  w = _networks(all_nets)
  slo, shi = w.min(0), w.max(0)
  star = shi - slo
  ok = star > 0
  ratio = (np.maximum(hi, shi) - np.minimum(lo, slo))[ok] / star[ok]
  return (float(np.exp(np.mean(np.log(ratio)))) if ok.any() else float("nan"),
          int((~ok).sum()))


def network_abstraction_rate(hyper: Any, all_nets: Any) -> float:
  """Percentage of the networks (rows) that lie entirely inside the hyper-network."""
  lo, hi = _bounds(hyper)
  w = _networks(all_nets)
  return 100.0 * float(np.mean(np.all((w >= lo) & (w <= hi), axis=1)))


def sphynx_metrics(hyper: Any, all_nets: Any) -> dict:
  """All four Sphynx metrics (spec §4.5) of ``hyper`` against the networks ``all_nets``.

  ``hyper`` is a hyper-network pytree or ``(lower, upper)`` vectors; ``all_nets`` is stacked
  parameters or an ``(M, P)`` matrix. Miscoverage is a fraction here (Table 3 prints it, by our
  reading, in percent).
  """
  mis, mis_ex = miscoverage(hyper, all_nets)
  over, over_ex = overcoverage(hyper, all_nets)
  return dict(weight_abstraction_rate=weight_abstraction_rate(hyper, all_nets),
              miscoverage=mis, miscoverage_excluded=mis_ex,
              overcoverage=over, overcoverage_excluded=over_ex,
              network_abstraction_rate=network_abstraction_rate(hyper, all_nets))


# ---------------------------------------------------------------------------------------------
# Output bounds
# ---------------------------------------------------------------------------------------------

def hyper_output_bounds(apply_fn: Callable, hyper: PyTree, x: Any) -> Any:
  """Bounds on ``apply_fn(θ, x')`` for every ``θ`` in ``hyper`` and ``x'`` in ``x`` (an array or
  an `Interval` box): ``bj.ibp(apply_fn)(hyper, x)``.
  """
  return ibp(apply_fn)(hyper, x)

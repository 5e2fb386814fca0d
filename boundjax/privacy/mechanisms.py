"""Private prediction mechanisms for a binary label (AGT, §3.2 and §5).

Baselines (global sensitivity, always valid):
  * single model:  R(x) = 1[f_x(D) + Lap(1/eps) > 0.5]                   (eq. 6), (eps, 0)-DP;
  * subsample-and-aggregate (PATE noisy argmax): argmax_j n_j(x) + Lap(2/eps)   (eq. 7).

Smooth sensitivity from AGT certificates (Thm 5.1, Cor. 5.2, Thm 5.3):
  * k'(x) certified stable distance gives SS^beta <= exp(-beta k');
  * Cauchy: R(x) = 1[f_x(D) + Cauchy(6 exp(-eps k'/6) / eps) > 0.5], beta = eps / 6;
  * Laplace (public code only): beta = eps / (2 ln(2/delta)), scale 2 exp(-beta k') / eps,
    (eps, delta);
  * ensembles: K = sum of the n smallest member k's, n = ceil(|n_1 - n_0| / 2) (the proof's and
    the code's conservative form; the statement's ``+ n - 1`` is opt-in).

ASSUMPTION (a gap in AGT, App. D.6, which takes any upper bound on SS as the noise scale). The
smooth-sensitivity framework of Nissim, Raskhodnikova and Smith (2007; SS^beta with max over
k >= 0, A^0 = LS) needs the noise scale to be a beta-smooth upper bound, S(D) <= e^beta S(D') for
neighbours. The paper uses S(D) = exp(-beta k'(D)) with k' from AGT runs on D; nothing proves
|k'(D) - k'(D')| <= 1 for neighbours, and if k' jumps, the noise scale itself leaks. The Cor. 5.2 / Thm 5.3 guarantee here is therefore CONDITIONAL on that
smoothness; `smoothness_diagnostic` tests it empirically, and `private_predict` defaults to the
global-sensitivity mechanism.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
MECHANISMS = ("global", "cauchy", "laplace_smooth")


def _check_eps(eps: float) -> None:
  if not (isinstance(eps, (int, float, np.floating)) and eps > 0 and math.isfinite(eps)):
    raise ValueError(f"privacy: epsilon must be a finite number > 0, got {eps!r}.")


def _check_binary(pred: Any) -> Array:
  p = jnp.asarray(pred)
  if not bool(jnp.all((p == 0) | (p == 1))):
    raise ValueError("privacy: predictions must be binary labels in {0, 1}.")
  return p


def global_sensitivity_response(key: Array, pred: Any, eps: float) -> Array:
  """``1[f + Lap(1/eps) > 0.5]`` per prediction (GS = 1 for a binary label); (eps, 0)-DP."""
  _check_eps(eps)
  p = _check_binary(pred)
  z = jax.random.laplace(key, p.shape) / eps
  return (p + z > 0.5).astype(jnp.int32)


def noisy_argmax(key: Array, counts: Any, eps: float) -> Array:
  """PATE / subsample-and-aggregate: ``argmax_j counts_j + Lap(2/eps)`` (last axis = classes)."""
  _check_eps(eps)
  c = jnp.asarray(counts, jnp.float32)
  return jnp.argmax(c + jax.random.laplace(key, c.shape) * (2.0 / eps), -1).astype(jnp.int32)


def vote_counts(votes: Any, n_classes: int = 2) -> Array:
  """Counts ``n_j(x)`` from member votes of shape (T, n) -> (n, n_classes)."""
  v = jnp.asarray(votes).astype(jnp.int32)
  return jnp.sum(jax.nn.one_hot(v, n_classes, dtype=jnp.int32), 0)


def smooth_sensitivity_bound(k_cert: Any, beta: float) -> Array:
  """``SS^beta <= exp(-beta k')`` for a binary prediction stable at distance k' (Thm 5.1)."""
  k = jnp.asarray(k_cert)
  if bool(jnp.any(k < 0)):
    raise ValueError("privacy: certified k must be >= 0.")
  return jnp.exp(-beta * k)


def cauchy_scale(k_cert: Any, eps: float, beta: float | None = None) -> Array:
  """Scale ``6 SS / eps`` of the Cauchy mechanism, beta = eps / 6 (Cor. 5.2)."""
  _check_eps(eps)
  beta = eps / 6.0 if beta is None else beta
  if beta > eps / 6.0:
    raise ValueError(f"privacy: the Cauchy mechanism needs beta <= eps/6, got {beta} > {eps / 6}.")
  return 6.0 * smooth_sensitivity_bound(k_cert, beta) / eps


def cauchy_response(key: Array, pred: Any, k_cert: Any, eps: float) -> Array:
  """``1[f + Cauchy(6 exp(-eps k'/6)/eps) > 0.5]`` (Cor. 5.2).

  Claimed (eps, 0)-DP per query CONDITIONAL on the smoothness of k' (see module docstring).
  """
  p = _check_binary(pred)
  s = cauchy_scale(k_cert, eps)
  return (p + jax.random.cauchy(key, p.shape) * s > 0.5).astype(jnp.int32)


def laplace_smooth_response(key: Array, pred: Any, k_cert: Any, eps: float, delta: float) -> Array:
  """Laplace smooth-sensitivity release, beta = eps/(2 ln(2/delta)), scale 2 SS/eps (code only).

  (eps, delta)-DP under the same smoothness assumption as `cauchy_response`.
  """
  _check_eps(eps)
  if not 0 < delta < 1:
    raise ValueError(f"privacy: delta must be in (0, 1), got {delta!r}.")
  p = _check_binary(pred)
  beta = eps / (2.0 * math.log(2.0 / delta))
  s = 2.0 * smooth_sensitivity_bound(k_cert, beta) / eps
  return (p + jax.random.laplace(key, p.shape) * s > 0.5).astype(jnp.int32)


def ensemble_stable_k(votes: Any, k_members: Any, plus_n_minus_1: bool = False) -> np.ndarray:
  """Stable distance K of the majority vote ``g = 1[n_1 >= n_0]`` (Thm 5.3).

  Args:
    votes: (T, n) binary member votes; k_members: (T, n) member certified k's.
    plus_n_minus_1: add the statement's ``n - 1`` (valid when each dataset change touches one
      partition, e.g. add/remove with a fixed assignment; AGT, Thm 5.3). Default: the conservative
      form of the proof and the public code, ``K = sum of the n smallest k``.

  Returns:
    (n,) int array, ``n = ceil(|n_1 - n_0| / 2)``.
  """
  v = np.asarray(votes).astype(np.int64)
  km = np.asarray(k_members).astype(np.int64)
  if v.shape != km.shape:
    raise ValueError(f"privacy: votes {v.shape} and k_members {km.shape} must have equal shapes.")
  n1 = v.sum(0)
  n0 = v.shape[0] - n1
  n = np.ceil(np.abs(n1 - n0) / 2).astype(np.int64)
  srt = np.sort(km, axis=0)
  csum = np.concatenate([np.zeros((1, v.shape[1]), np.int64), np.cumsum(srt, 0)], 0)
  K = csum[n, np.arange(v.shape[1])]
  if plus_n_minus_1:
    K = K + np.maximum(n - 1, 0)
  return K


def ensemble_cauchy_response(key: Array, votes: Any, k_members: Any, eps: float,
                             plus_n_minus_1: bool = False) -> Array:
  """Subsample-and-aggregate with smooth sensitivity: majority vote + Cauchy(6 e^{-eps K/6}/eps).

  Conditional on smoothness, as `cauchy_response`.
  """
  v = jnp.asarray(votes)
  g = (2 * jnp.sum(v, 0) >= v.shape[0]).astype(jnp.int32)
  K = ensemble_stable_k(votes, k_members, plus_n_minus_1)
  return cauchy_response(key, g, jnp.asarray(K), eps)


def private_predict(key: Array, pred: Any, eps: float, k_cert: Any = None,
                    mechanism: str = "global", delta: float | None = None) -> Array:
  """Private binary predictions; ``mechanism="global"`` (default, unconditionally valid),
  ``"cauchy"`` or ``"laplace_smooth"`` (conditional on smoothness of k', see module docstring)."""
  if mechanism not in MECHANISMS:
    raise ValueError(f"privacy: mechanism must be one of {MECHANISMS}, got {mechanism!r}.")
  if mechanism == "global":
    return global_sensitivity_response(key, pred, eps)
  if k_cert is None:
    raise ValueError(f"privacy: mechanism {mechanism!r} needs certified k values (k_cert).")
  if mechanism == "cauchy":
    return cauchy_response(key, pred, k_cert, eps)
  if delta is None:
    raise ValueError("privacy: mechanism 'laplace_smooth' needs delta.")
  return laplace_smooth_response(key, pred, k_cert, eps, delta)


def response_probability(pred: Any, scale: Any, noise: str) -> np.ndarray:
  """Exact ``P(R = 1)`` of ``R = 1[f + scale * Z > 0.5]`` for Z standard Laplace or Cauchy."""
  f = np.asarray(pred, np.float64)
  s = np.maximum(np.asarray(scale, np.float64), 1e-300)
  t = (0.5 - f) / s                                  # R = 1 iff Z > t
  if noise == "laplace":
    return np.where(t >= 0, 0.5 * np.exp(-np.abs(t)), 1 - 0.5 * np.exp(-np.abs(t)))
  if noise == "cauchy":
    return 0.5 - np.arctan(t) / np.pi
  raise ValueError(f"privacy: noise must be 'laplace' or 'cauchy', got {noise!r}.")


def smoothness_diagnostic(k_d: Any, k_neighbours: Any) -> dict:
  """Empirical test of the assumption |k'(D) - k'(D')| <= 1 (see the module docstring).

  Args:
    k_d: (n,) certified k' on D; k_neighbours: (M, n) certified k' on M neighbours D'.

  Returns:
    dict with the number of (neighbour, point) pairs compared, how many violate the bound, and
    the largest jump seen. A violation means the smooth-sensitivity mechanisms' guarantee does
    not hold as proved for that data.
  """
  a = np.asarray(k_d)[None]
  b = np.asarray(k_neighbours)
  if b.ndim != 2 or b.shape[1] != a.shape[1]:
    raise ValueError(f"smoothness_diagnostic: k_neighbours must have shape (M, {a.shape[1]}), "
                     f"got {b.shape}.")
  jump = np.abs(b - a)
  return {"pairs": int(jump.size), "violations": int(np.sum(jump > 1)),
          "max_jump": int(jump.max()) if jump.size else 0}

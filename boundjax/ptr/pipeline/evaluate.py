"""Accuracy of PTR releases (PTR, App. D, Table 1) with the answer rate beside it.

The authors' ``multi_eps`` skips the PTR test and reports accuracy over every query. With the test
a query may get ⊥; `ptr_accuracy` reports the answer rate (fraction not ⊥), the accuracy over the
answered queries, and the accuracy counting ⊥ as wrong (the end-to-end utility).

The statistic (the radius search, PTR, App. A, eq. 2) does not depend on ε, so `ptr_accuracy_grid`
runs `boundjax.ptr.release.ptr_release_batch` once (at ε = ∞, which returns the statistics and
``f(z)`` exactly) and then draws, for every ε, the test and release noise exactly as
`ptr_release_batch` draws them for that ε (`release_from_statistics`; the tests check the two
agree bit for bit). One compilation instead of one per ε.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.ptr import release as ptr
from boundjax.ptr.pipeline.arl import TrainedARL

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class PTRAccuracy:
  """``answer_rate``, ``accuracy_answered`` (NaN when nothing was answered),
  ``accuracy_bottom_wrong``, and the mean statistic."""

  epsilon: float
  answer_rate: float
  accuracy_answered: float
  accuracy_bottom_wrong: float
  mean_statistic: float


def release_from_statistics(key: Array, statistics: Any, values: Any, *, proposal: float,
                            epsilon: float, delta: float, radius: float,
                            calib: str = ptr.DEFAULT_CALIB,
                            zeta: float = 0.01) -> tuple[Array, Array]:
  """``(outputs, answered)`` of PTR's test and release given each query's statistic ``s_i`` and
  ``f(z_i)``: ``answered_i = s_i + Lap(b_test) >= τ`` and ``outputs_i = f(z_i) + Lap(b_rel)^m``
  with the scales and threshold of `boundjax.ptr.release` (``test_scale``, ``threshold``,
  ``release_scale``; PTR, App. B, Algorithm 1). Query ``i`` uses ``split(key, n)[i]``, split into
  the test and release keys, as `ptr.ptr_release_batch` does."""
  stats, values = jnp.asarray(statistics), jnp.asarray(values)
  if math.isinf(epsilon):
    return values, jnp.ones(stats.shape, bool)
  b_test = ptr.test_scale(epsilon, radius, calib, zeta)
  tau = ptr.threshold(epsilon, delta, radius, calib, zeta)
  b_rel = ptr.release_scale(proposal, epsilon, radius, calib)

  def one(k, s, v):
    k_test, k_release = jax.random.split(k)
    noisy = s + b_test * jax.random.laplace(k_test, (), s.dtype)
    return v + b_rel * jax.random.laplace(k_release, v.shape, v.dtype), noisy >= tau

  return jax.vmap(one)(jax.random.split(key, stats.shape[0]), stats, values)


def _score(model: TrainedARL, out, answered, y, epsilon: float, stats) -> PTRAccuracy:
  answered = np.asarray(answered)
  correct = np.asarray(model.predict(out)) == np.asarray(y)
  acc_ans = float(correct[answered].mean()) if answered.any() else math.nan
  return PTRAccuracy(float(epsilon), float(answered.mean()), acc_ans,
                     float((correct & answered).mean()), float(np.mean(np.asarray(stats))))


def ptr_accuracy_grid(key: Array, model: TrainedARL, z: Any, y: Any, *, proposal: float,
                      epsilons: Sequence[float], delta: float, radius: float,
                      calib: str = ptr.DEFAULT_CALIB, **options: Any) -> list[PTRAccuracy]:
  """`ptr_accuracy` for every ε in ``epsilons`` with one radius search per query (module
  docstring); ε number ``j`` uses ``fold_in(key, j)``."""
  _, _, stats = ptr.ptr_release_batch(key, model.apply, model.obf_params, z, proposal=proposal,
                                      epsilon=math.inf, delta=delta, radius=radius, calib=calib,
                                      **options)
  values = model.obfuscate(z)
  out = []
  for j, e in enumerate(epsilons):
    if not (isinstance(e, (int, float, np.floating)) and e > 0):
      raise ValueError(f"ptr_accuracy_grid: every epsilon must be > 0, got {e!r}.")
    rel, answered = release_from_statistics(jax.random.fold_in(key, j), stats, values,
                                            proposal=proposal, epsilon=e, delta=delta,
                                            radius=radius, calib=calib,
                                            zeta=options.get("zeta", 0.01))
    out.append(_score(model, rel, answered, y, e, stats))
  return out


def ptr_accuracy(key: jax.Array, model: TrainedARL, z: Any, y: Any, *, proposal: float,
                 epsilon: float, delta: float, radius: float, **options: Any) -> PTRAccuracy:
  """Runs `boundjax.ptr.release.ptr_release_batch` on the query embeddings ``z`` (IBP oracle, one
  compiled ``vmap``) and scores ``argmax g(release)`` against ``y``. ``options`` go to the
  release (``calib``, ``mode``, ``radius_max``, ``zeta``, ``search``, ``method``, ``out_norm``)."""
  out, answered, stat = ptr.ptr_release_batch(key, model.apply, model.obf_params, z,
                                              proposal=proposal, epsilon=epsilon, delta=delta,
                                              radius=radius, **options)
  return _score(model, out, answered, y, epsilon, stat)

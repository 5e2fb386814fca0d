"""Accuracy of PTR releases (PTR, App. D, Table 1) with the answer rate beside it.

The authors' ``multi_eps`` skips the PTR test and reports accuracy over every query. With the test
a query may get ⊥; `ptr_accuracy` reports the answer rate (fraction not ⊥), the accuracy over the
answered queries, and the accuracy counting ⊥ as wrong (the end-to-end utility).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np

from boundjax.privacy import ptr
from boundjax.ptr_pipeline.arl import TrainedARL


@dataclasses.dataclass(frozen=True)
class PTRAccuracy:
  """``answer_rate``, ``accuracy_answered`` (NaN when nothing was answered),
  ``accuracy_bottom_wrong``, and the mean statistic."""

  epsilon: float
  answer_rate: float
  accuracy_answered: float
  accuracy_bottom_wrong: float
  mean_statistic: float


def ptr_accuracy(key: jax.Array, model: TrainedARL, z: Any, y: Any, *, proposal: float,
                 epsilon: float, delta: float, radius: float, **options: Any) -> PTRAccuracy:
  """Runs `boundjax.privacy.ptr.ptr_release_batch` on the query embeddings ``z`` (IBP oracle, one
  compiled ``vmap``) and scores ``argmax g(release)`` against ``y``. ``options`` go to the
  release (``calib``, ``mode``, ``radius_max``, ``zeta``, ``search``, ``method``, ``out_norm``)."""
  out, answered, stat = ptr.ptr_release_batch(key, model.apply, model.obf_params, z,
                                              proposal=proposal, epsilon=epsilon, delta=delta,
                                              radius=radius, **options)
  answered = np.asarray(answered)
  correct = np.asarray(model.predict(out)) == np.asarray(y)
  acc_ans = float(correct[answered].mean()) if answered.any() else math.nan
  return PTRAccuracy(float(epsilon), float(answered.mean()), acc_ans,
                     float((correct & answered).mean()), float(np.mean(np.asarray(stat))))

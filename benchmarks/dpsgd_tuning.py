"""DP-SGD baselines tuned over a small grid, shared by the benchmarks that compare against DP-SGD
(`idpdb_accuracy.py`: LUCID Tables 1-3; `agt_privacy.py`: AGT Fig. 5).

One grid point is one `boundjax.training.dpsgd.train` run (Abadi et al. 2016, Alg. 1) with Poisson
sampling, its noise multiplier calibrated by dp-accounting's RDP accountant to the target
(epsilon, delta) for exactly that point's schedule (expected batch size and epochs), then scored
on an evaluation set the caller chooses (a validation split to select, the test set to report).
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Callable, Optional

import numpy as np

from boundjax.training import dpsgd


def grid_points(learning_rates: list[float], clips: list[float], epochs: list[int]
                ) -> list[dict]:
  """Every (learning rate, clip norm, epochs) combination, in that nesting order."""
  return [dict(lr=float(lr), clip=float(c), epochs=int(e))
          for lr, c, e in itertools.product(learning_rates, clips, epochs)]


def train_point(apply_fn: Callable, params: Any, x: Any, y: Any, x_eval: Any, y_eval: Any,
                predict: Callable[[Any, Any], Any], *, loss: str, lr: float, clip: float,
                epochs: int, batch_size: int, epsilon: float, delta: float, seed: int = 0,
                momentum: Optional[float] = None, score_key: str = "accuracy"
                ) -> tuple[dict, dpsgd.DPSGDResult]:
  """Trains DP-SGD at one grid point and scores it on ``(x_eval, y_eval)``.

  The noise multiplier is recomputed for this point: the smallest sigma whose RDP epsilon for
  ``epochs * (n // batch_size)`` Poisson-subsampled Gaussian steps at rate ``batch_size / n``
  is <= ``epsilon`` at ``delta`` (Mironov, Talwar & Zhang 2019; `boundjax.training.dpsgd`).
  ``predict(params, x)`` returns labels. Returns the row (the point, ``score_key``: the
  accuracy on the evaluation set, the accounted epsilon, sigma, steps, seconds) and the
  `boundjax.training.dpsgd.DPSGDResult`.
  """
  t0 = time.perf_counter()
  r = dpsgd.train(apply_fn, params, np.asarray(x, np.float32), np.asarray(y), loss=loss,
                  learning_rate=lr, epochs=epochs, batch_size=batch_size, l2_norm_clip=clip,
                  epsilon=epsilon, delta=delta, seed=seed, sampling="poisson",
                  momentum=momentum)
  acc = float(np.mean(np.asarray(predict(r.params, x_eval)) == np.asarray(y_eval)))
  row = dict(lr=float(lr), clip=float(clip), epochs=int(epochs), batch_size=int(batch_size),
             **{score_key: acc}, epsilon_accounted=r.epsilon, delta=r.delta,
             noise_multiplier=r.noise_multiplier, steps=r.schedule.steps,
             capacity=r.schedule.capacity, accounting=r.accounting,
             seconds=time.perf_counter() - t0)
  return row, r


def choose(rows: list[dict], score_key: str = "accuracy") -> dict:
  """The row of highest ``score_key`` (rounded to 1e-6); ties to fewer epochs, then the smaller
  learning rate, then the smaller clip norm."""
  if not rows:
    raise ValueError("choose: rows is empty")
  return max(rows, key=lambda r: (round(r[score_key], 6), -r["epochs"], -r["lr"], -r["clip"]))

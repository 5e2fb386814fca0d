"""The ``bounds`` section of ``boundjax demo``: certified-robust accuracy with IBP and CROWN."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from boundjax.data import load_sklearn
from boundjax.demos.common import Section
from boundjax.core.interval import Interval
from boundjax.models import MLP, fit_full_batch
from boundjax.core.transforms import crown, ibp


# Printed by ``boundjax demo`` before the section runs.
TITLE = "certified-robust accuracy with IBP and CROWN (breast_cancer)"
# ``boundjax demo --quick``: smaller sizes and fewer steps (keyword arguments of `run`).
QUICK: dict = {"eps_list": (0.01, 0.05), "steps": 100, "n_samples": 50, "timing_repeats": 1}
# Wall seconds of the section on a quiet 2-core CPU, full and ``--quick``: the CPU seconds it
# took (``boundjax demo --json``, 2026-11-27, a shared 2-core machine) scaled by the ratio of
# the full demo's quiet wall time (85 s) to its CPU seconds. Printed as the expected time.
SECONDS = {"full": 6.6, "quick": 3.7}


def run(eps_list: tuple[float, ...] = (0.005, 0.01, 0.02, 0.05), steps: int = 300,
        n_samples: int = 200, timing_repeats: int = 5, seed: int = 0) -> Section:
  """Certified-robust accuracy with IBP and CROWN on scikit-learn's breast_cancer.

  Trains an MLP 30-32-32-2 (ReLU, Adam, full batch) on the min-max scaled training split, then for
  every ``eps`` bounds the logits over the L∞ ball of radius ``eps`` (clipped to [0, 1]) around
  each test example. An example is *certified robust* when it is classified correctly and the
  lower bound of its true logit exceeds the upper bound of the other one. Reports the
  certified-robust accuracy of IBP and CROWN, the time each bound took (jitted, compilation
  excluded, median of ``timing_repeats`` calls), and the number of sampled points of the boxes found
  outside a bound (must be 0).
  """
  data = load_sklearn("breast_cancer", seed=seed)
  x_tr, y_tr = jnp.asarray(data.x_train), jnp.asarray(data.y_train)
  x, y = jnp.asarray(data.x_test), jnp.asarray(data.y_test)
  model = MLP(hidden=(32, 32), out=2)
  params = fit_full_batch(model.apply, model.init(jax.random.PRNGKey(seed), x_tr[:1]), x_tr, y_tr,
                          optax.adam(3e-3), steps)
  logits = model.apply(params, x)
  correct = jnp.argmax(logits, -1) == y
  onehot = jax.nn.one_hot(y, 2, dtype=bool)
  methods = {"IBP": jax.jit(ibp(model.apply)), "CROWN": crown(model.apply)}

  def robust(out):
    true_lo = jnp.sum(jnp.where(onehot, out.lower, 0.0), -1)
    other_hi = jnp.max(jnp.where(onehot, -jnp.inf, out.upper), -1)
    return float(jnp.mean(correct & (true_lo > other_hi)))

  lines = [f"bounds demo: MLP 30-32-32-2 on breast_cancer ({len(y)} test examples, "
           f"clean accuracy {float(jnp.mean(correct)):.3f})",
           "certified-robust accuracy over the L-inf ball of radius eps; time of one bound call "
           f"for the whole test set (jitted, compilation excluded, median of {timing_repeats})",
           f"{'eps':>7} " + " ".join(f"{m + ' acc':>10} {m + ' time':>11}" for m in methods)]
  violations = 0
  robust_acc: dict[str, list[float]] = {m: [] for m in methods}
  for i, eps in enumerate(eps_list):
    box = Interval.around(x, eps, domain=(0.0, 1.0))
    cells = []
    pts = box.lower + box.width * jax.random.uniform(jax.random.PRNGKey(seed + i),
                                                     (n_samples, *box.shape))
    vals = jax.vmap(lambda p: model.apply(params, p))(pts)
    for name, fn in methods.items():
      out = jax.block_until_ready(fn(params, box))  # compile
      times = []
      for _ in range(timing_repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(params, box))
        times.append(time.perf_counter() - t0)
      seconds = float(np.median(times))
      tol = 1e-5 * (1 + jnp.abs(vals))  # float32 rounding of the sampled forward passes
      violations += int(jnp.sum((vals < out.lower - tol) | (vals > out.upper + tol)))
      robust_acc[name].append(robust(out))
      cells.append(f"{robust_acc[name][-1]:>10.3f} {seconds * 1e3:>9.1f}ms")
    lines.append(f"{eps:>7.3f} " + " ".join(cells))
  n_checked = n_samples * len(eps_list) * len(methods) * logits.size
  lines.append(f"sampled logits outside their bound (violations, must be 0): {violations} of "
               f"{n_checked}")
  numbers = {"clean_accuracy": float(jnp.mean(correct)), "eps": list(eps_list),
             "robust_accuracy": robust_acc, "violations": violations, "checked": n_checked,
             "samples": n_samples, "test_examples": int(len(y))}
  return Section("\n".join(lines), numbers)

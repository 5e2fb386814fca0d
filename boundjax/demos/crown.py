"""The ``crown`` section of ``boundjax demo``: IBP vs CROWN-IBP vs CROWN on digits."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

from boundjax.demos.common import Section
from boundjax.core.interval import Interval
from boundjax.models import MLP, fit_full_batch
from boundjax.core.transforms import crown, ibp


# Printed by ``boundjax demo`` before the section runs.
TITLE = "IBP vs CROWN-IBP vs CROWN (digits)"
# ``boundjax demo --quick``: smaller sizes and fewer steps (keyword arguments of `run`).
QUICK: dict = {"n_examples": 16, "n_samples": 100, "steps": 60}
# Wall seconds of the section on a quiet 2-core CPU, full and ``--quick``: the CPU seconds it
# took (``boundjax demo --json``, 2026-11-27, a shared 2-core machine) scaled by the ratio of
# the full demo's quiet wall time (85 s) to its CPU seconds. Printed as the expected time.
SECONDS = {"full": 6.8, "quick": 4.2}


def run(eps: float = 0.02, n_examples: int = 64, n_samples: int = 2000, steps: int = 300,
        seed: int = 0) -> Section:
  """IBP vs CROWN-IBP vs CROWN on a small ReLU MLP trained on scikit-learn's digits.

  Trains a 64-64-64-10 MLP for ``steps`` Adam steps, bounds the logits over the L∞ ball of
  radius ``eps`` (pixels in [0, 1]) around ``n_examples`` test images, and reports the mean bound
  width, the number of examples certified robust (lower bound of the true logit above the upper
  bound of every other), and the number of sampled points found outside the bounds (must be 0).
  """
  data = load_digits()
  x_all = jnp.asarray(data.data / 16.0, jnp.float32)
  y_all = jnp.asarray(data.target)
  perm = np.random.default_rng(seed).permutation(len(y_all))
  tr, te = perm[:1400], perm[1400:1400 + n_examples]
  model = MLP(hidden=(64, 64), out=10)
  params = fit_full_batch(model.apply, model.init(jax.random.PRNGKey(seed), x_all[:1]), x_all[tr],
                          y_all[tr], optax.adam(1e-2), steps)
  x, y = x_all[te], y_all[te]
  acc = float(jnp.mean(jnp.argmax(model.apply(params, x), -1) == y))
  box = Interval.around(x, eps, domain=(0.0, 1.0))
  results = {"IBP": ibp(model.apply)(params, box),
             "CROWN-IBP": crown(model.apply, intermediate="ibp")(params, box),
             "CROWN": crown(model.apply)(params, box)}
  key = jax.random.PRNGKey(seed + 1)
  pts = box.lower + box.width * jax.random.uniform(key, (n_samples, *box.shape))
  ys = jax.vmap(lambda p: model.apply(params, p))(pts)
  onehot = jax.nn.one_hot(y, 10, dtype=bool)
  lines = [f"CROWN demo: MLP 64-64-64-10 on digits (test accuracy {acc:.3f}), eps={eps}, "
           f"{n_examples} test images, {n_samples} sampled points per image",
           f"{'method':<10} {'mean width':>11} {'ratio to IBP':>13} {'certified':>10}"]
  base = float(jnp.mean(results["IBP"].width))
  violations = 0
  width, certified = {}, {}
  for name, out in results.items():
    true_lo = jnp.sum(jnp.where(onehot, out.lower, 0.0), -1)
    other_hi = jnp.max(jnp.where(onehot, -jnp.inf, out.upper), -1)
    cert = int(jnp.sum(true_lo > other_hi))
    w = float(jnp.mean(out.width))
    tol = 1e-5 * (1 + jnp.abs(ys))  # float rounding of the default (not sound) mode
    violations += int(jnp.sum((ys < out.lower - tol) | (ys > out.upper + tol)))
    width[name], certified[name] = w, cert
    lines.append(f"{name:<10} {w:>11.4f} {w / base:>13.3f} {cert:>7d}/{n_examples}")
  lines.append(f"sampled points outside any bound (violations): {violations}")
  numbers = {"accuracy": acc, "eps": eps, "examples": n_examples, "mean_width": width,
             "certified": certified, "violations": violations}
  return Section("\n".join(lines), numbers)

"""AGT with SGD, SGD-momentum and Adam: certified fraction, box width and retraining soundness.

The AGT paper trains with SGD (and, in its public code, SGD with momentum); it gives no numbers
for Adam, so there is no paper column. Setting (one run, every optimiser on the same data,
initialisation and schedule): Gaussian blobs (2 classes, 6 features, centres drawn from
N(0, 1.5^2), unit noise; 2,000 train / 500 test, seed 0), MLP 6 -> 16 -> 1 with BCE, float64,
``sound=True``, batch 500 (4 batches per epoch, AGT's fixed order), 3 epochs, clip_gamma 0.1;
step sizes per optimiser (SGD 0.5, SGDM 0.05 with momentum 0.9, Adam 0.01 with optax's
defaults b1 0.9, b2 0.999, eps 1e-8, and Adam 0.003). For each optimiser and k in {1, 2, 5}
(removals and additions per batch): nominal test accuracy, fraction of test points certified
stable at k (AGT, Lemma 4.4), mean and max box width, and a retraining check
(`boundjax.agt.retrain.empirical_retrain_test`: neighbouring datasets retrained with the same
optimiser, every step checked; the Adam retraining is ``optax.adam``'s arithmetic bit for bit,
tests/test_agt_optim.py).

Adam's step m_hat / sqrt(v_hat) is about 1 in size whatever the gradient's size, so a
coordinate whose gradient is not much larger than the spread k gamma / b of Thm 4.6 gets a step
range of order 1 (`boundjax.agt.optim`): its box grows by about the step size per step, where
SGD's grows by the step size times the spread.

  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/agt_optim.py [--sets 32] [--epochs 10]

Results: benchmarks/results/agt_optim.json and a printed table.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from boundjax import agt
from boundjax.agt import mlp, retrain
from boundjax.core.interval import split_tree

from common import record

OUT = Path(__file__).resolve().parent / "results" / "agt_optim.json"
OPTIMIZERS = {
    "sgd": dict(optimizer="sgd", learning_rate=0.5),
    "sgdm": dict(optimizer="sgdm", learning_rate=0.05, momentum=0.9),
    "adam": dict(optimizer="adam", learning_rate=0.01),
    "adam_small_lr": dict(optimizer="adam", learning_rate=0.003),
}
KS = (1, 2, 5)


def blobs(n_train: int = 2000, n_test: int = 500, d: int = 6, seed: int = 0):
  """Two Gaussian blobs: centres ~ N(0, 1.5^2 I), unit noise; float64 train and test arrays."""
  rng = np.random.default_rng(seed)
  n = n_train + n_test
  y = rng.integers(0, 2, n)
  x = rng.normal(size=(2, d))[y] * 1.5 + rng.normal(size=(n, d))
  return (jnp.asarray(x[:n_train]), jnp.asarray(y[:n_train], jnp.float64),
          jnp.asarray(x[n_train:]), y[n_train:])


def run(sets: int, epochs: int) -> dict:
  x, y, x_te, y_te = blobs()
  params = mlp.init(jax.random.PRNGKey(0), [x.shape[1], 16, 1], jnp.float64)
  rows = []
  for name, opt in OPTIMIZERS.items():
    for k in KS:
      cfg = agt.Config(n_epochs=epochs, batch_size=500, k_private=k, clip_gamma=0.1,
                       sound=True, **opt)
      t0 = time.perf_counter()
      with warnings.catch_warnings():
        warnings.simplefilter("ignore", agt.VacuousCertificateWarning)
        res = agt.fit(mlp.apply, params, x, y, cfg, progress=False)
      seconds = time.perf_counter() - t0
      pred = np.asarray(agt.predict(mlp.apply, res.params, x_te, cfg.loss))
      cert = np.asarray(agt.certify(mlp.apply, res.params, res.bounds, x_te))
      lo, hi = (jax.tree_util.tree_leaves(t) for t in split_tree(res.bounds))
      widths = np.concatenate([np.ravel(np.asarray(h) - np.asarray(l)) for l, h in zip(lo, hi)])
      rep = retrain.empirical_retrain_test(mlp.apply, params, x, y, cfg, x_te, n_sets=sets,
                                           seed=k)
      rows.append(dict(optimizer=name, k=k, accuracy=float(np.mean(pred == y_te)),
                       certified=float(cert.mean()), width_mean=float(widths.mean()),
                       width_max=float(widths.max()), fit_seconds=round(seconds, 2),
                       retrained_models=rep.retrained_models, steps_checked=rep.steps_checked,
                       param_violations=rep.param_violations,
                       prediction_changes=rep.prediction_changes))
      print(_row(rows[-1]), flush=True)
      if rep.param_violations or rep.prediction_changes:
        raise SystemExit(f"UNSOUND: {rows[-1]}")
  return dict(
      setting=dict(dataset="Gaussian blobs, d=6, 2000 train / 500 test, seed 0",
                   model="6-16-1 BCE",
                   batch_size=500, epochs=epochs, clip_gamma=0.1, sound=True,
                   dtype="float64", optimizers=OPTIMIZERS, retrained_sets_per_run=sets,
                   paper="AGT reports no Adam numbers; no paper column"),
      rows=rows)


def _row(r: dict) -> str:
  return (f"{r['optimizer']:13s} k={r['k']}  acc {r['accuracy']:.3f}  certified "
          f"{r['certified']:.3f}  width mean {r['width_mean']:.2e} max {r['width_max']:.2e}  "
          f"retrained {r['retrained_models']} x {r['steps_checked'] // r['retrained_models']} "
          f"steps: {r['param_violations']} violations, {r['prediction_changes']} changes")


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--sets", type=int, default=32, help="neighbouring datasets retrained per run")
  ap.add_argument("--epochs", type=int, default=3)
  args = ap.parse_args()
  jax.config.update("jax_enable_x64", True)
  out = run(args.sets, args.epochs)
  out["provenance"] = record()
  OUT.parent.mkdir(exist_ok=True)
  OUT.write_text(json.dumps(out, indent=1))
  print(f"wrote {OUT}")


if __name__ == "__main__":
  main()

"""Choosing AGT settings: one knob at a time around a base run, measured.

AGT's box grows at every step by about ``alpha (k gamma + spread of the per-sample bounds) / b``
(AGT, Thm 4.6 and the "Limitations" paragraph of §4), so batch size b, clipping level gamma,
step size alpha and k decide whether the final box is narrow enough to certify anything. This
script varies each of them alone around a base configuration and records, for the test set,
the nominal accuracy, the certified fraction, and the final box's mean width against the
weights (the largest per-leaf ratio ``mean width / layer mean |w|`` of
`boundjax.agt.diagnostics`, where > 1 means vacuous).

Task: AGT's blobs, "overlapping" setting (`boundjax.data.make_blobs`, 6 raw features, 5,000
training / 1,250 test points), a 6-32-2 ReLU network, cross-entropy, 4 epochs, eta 0.3,
lr_min 1e-3, sound floating-point mode, float32. Base: b = 1000, gamma = 0.06, alpha = 0.5,
k = 5. The AGT paper sweeps k on its own tasks (Fig. 2-4) but publishes no such per-knob table.

  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/agt_settings.py

Result: benchmarks/results/agt_settings.json (and the table printed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

import boundjax.data as bd
from boundjax import agt
from boundjax.agt import diagnostics, mlp
from common import RESULTS, record

SWEEP = {"batch_size": [250, 1000, 5000], "clip_gamma": [0.02, 0.06, 0.2],
         "learning_rate": [0.1, 0.5, 2.0], "k_private": [1, 5, 20, 50]}


def one_run(params, X, y, Xt, yt, cfg) -> dict:
  t0 = time.perf_counter()
  res = agt.fit(mlp.apply, params, X, y, cfg, progress=False)
  stats = diagnostics.box_stats(res.params, res.bounds)
  cert = agt.certify(mlp.apply, res.params, res.bounds, Xt)
  acc = np.mean(np.asarray(agt.predict(mlp.apply, res.params, Xt)) == np.asarray(yt))
  return dict(accuracy=float(acc), certified=float(np.mean(cert)),
              width_mean=float(np.average(stats.width_mean)),
              max_width_ratio=float(max(stats.ratio)), vacuous=bool(stats.vacuous_layers()),
              seconds=round(time.perf_counter() - t0, 2))


def run() -> dict:
  d = bd.make_blobs("overlapping", n_train=5000, seed=0, scale=False)
  X, y = jnp.asarray(d.x_train, jnp.float32), jnp.asarray(d.y_train)
  Xt, yt = jnp.asarray(d.x_test, jnp.float32), d.y_test
  params = mlp.init(jax.random.PRNGKey(0), [6, 32, 2], jnp.float32)
  base = agt.Config(n_epochs=4, learning_rate=0.5, batch_size=1000, loss="cross_entropy",
                    k_private=5, clip_gamma=0.06, lr_decay=0.3, lr_min=1e-3, sound=True,
                    fragsize=1000)
  rows = []
  print(f"{'knob':>14} {'value':>7} {'acc':>6} {'cert':>6} {'width':>9} {'w/|w|':>7}")
  for knob, values in SWEEP.items():
    for v in values:
      cfg = dataclasses.replace(base, **{knob: v})
      if cfg.k_private >= cfg.batch_size:
        continue
      r = dict(knob=knob, value=v, **one_run(params, X, y, Xt, yt, cfg))
      rows.append(r)
      flag = "  vacuous" if r["vacuous"] else ""
      print(f"{knob:>14} {v:>7} {r['accuracy']:6.3f} {r['certified']:6.3f} "
            f"{r['width_mean']:9.3g} {r['max_width_ratio']:7.3g}{flag}", flush=True)
  return dict(task=("blobs 'overlapping' (make_blobs, raw features), 5000 train / 1250 test, "
                    "6-32-2 ReLU, cross-entropy, 4 epochs, eta 0.3, lr_min 1e-3, sound, float32, "
                    "interval bounds; one knob varied at a time around the base"),
              base=dict(batch_size=base.batch_size, clip_gamma=base.clip_gamma,
                        learning_rate=base.learning_rate, k_private=base.k_private),
              columns=dict(certified="fraction of test points certified stable at k",
                           width_mean="mean box width, averaged over the parameter leaves",
                           max_width_ratio="largest leaf mean width / its layer's mean |w| "
                                           "(> 1: vacuous, agt.diagnostics)"),
              rows=rows, provenance=record())


def main():
  argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
  res = run()
  RESULTS.mkdir(exist_ok=True)
  (RESULTS / "agt_settings.json").write_text(json.dumps(res, indent=1))
  print("wrote", RESULTS / "agt_settings.json")


if __name__ == "__main__":
  main()

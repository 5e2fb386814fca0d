"""Certified fraction of AGT with CROWN forward bounds against interval bounds, at equal k.

For each network and k, AGT runs twice from the same initialisation and data order (one nominal
model): once with ``bound_method="interval"`` (the paper's IBP, AGT §4.2) and once with
``bound_method="crown"`` (`boundjax.agt.crown`), each certified with its own forward bound; the
table also certifies the interval-trained box with CROWN ("ibp box, crown cert"), which splits
the gain into the training part (a narrower box) and the certification part.

Task: AGT's blobs, "overlapping" setting (6 features, 5,000 training / 1,250 test points;
`boundjax.data.make_blobs`), cross-entropy, batch 2,500, 3 epochs, alpha 0.5, eta 0.3,
gamma 0.06, sound floating-point mode, float32. Networks: 6-128-2 (one hidden layer: CROWN equals
the sign-split interval product there, so only the "midrad" default gains) and 6-64-64-2 and
6-32-32-32-2 (where CROWN tightens the logits). This is a smaller setting than the paper's
figures (which use IBP only and report no CROWN numbers), chosen so the run takes minutes on
2 CPU cores.

  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/agt_crown.py [--quick]

Result: benchmarks/results/agt_crown.json.
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
from boundjax.agt import mlp
from boundjax.core.interval import Interval
from common import RESULTS, record

NETS = {"6-128-2": [6, 128, 2], "6-64-64-2": [6, 64, 64, 2], "6-32-32-32-2": [6, 32, 32, 32, 2]}


def _width(bounds) -> float:
  ivs = jax.tree_util.tree_leaves(bounds, is_leaf=lambda a: isinstance(a, Interval))
  return float(np.mean(np.concatenate([np.ravel(iv.upper - iv.lower) for iv in ivs])))


def run(quick: bool) -> dict:
  d = bd.make_blobs("overlapping", n_train=2000 if quick else 5000, seed=0, scale=False)
  X, y = jnp.asarray(d.x_train, jnp.float32), jnp.asarray(d.y_train)
  Xt = jnp.asarray(d.x_test, jnp.float32)
  base = agt.Config(n_epochs=2 if quick else 3, learning_rate=0.5,
                    batch_size=1000 if quick else 2500,
                    loss="cross_entropy", clip_gamma=0.06, lr_decay=0.3, lr_min=1e-3,
                    sound=True, fragsize=500)
  ks = [1, 10] if quick else [1, 5, 10, 20]
  rows = []
  for net, sizes in NETS.items():
    params = mlp.init(jax.random.PRNGKey(0), sizes, jnp.float32)
    for k in ks:
      out = dict(net=net, k=k)
      for method in ("interval", "crown"):
        cfg = dataclasses.replace(base, k_private=k, bound_method=method)
        t0 = time.perf_counter()
        res = agt.fit(mlp.apply, params, X, y, cfg, progress=False)
        jax.block_until_ready(res.bounds)
        out[f"{method}_fit_s"] = round(time.perf_counter() - t0, 2)
        out[f"{method}_box_width"] = _width(res.bounds)
        out[f"{method}_certified"] = float(np.mean(agt.certify(
            mlp.apply, res.params, res.bounds, Xt, bound_method=method)))
        if method == "interval":
          out["ibp_box_crown_cert"] = float(np.mean(agt.certify(
              mlp.apply, res.params, res.bounds, Xt, bound_method="crown")))
          nominal = res.params
      out["accuracy"] = float(np.mean(np.asarray(agt.predict(mlp.apply, nominal, Xt))
                                      == np.asarray(d.y_test)))
      out["gain"] = out["crown_certified"] - out["interval_certified"]
      rows.append(out)
      print(f"{net:>14} k={k:>3}  acc {out['accuracy']:.3f}  certified: interval "
            f"{out['interval_certified']:.3f}  crown {out['crown_certified']:.3f}  "
            f"(ibp box, crown cert {out['ibp_box_crown_cert']:.3f})  box width "
            f"{out['interval_box_width']:.3g} -> {out['crown_box_width']:.3g}  fit s "
            f"{out['interval_fit_s']} / {out['crown_fit_s']}", flush=True)
  return dict(
      task=("blobs 'overlapping' (make_blobs, raw features), n_train "
            f"{X.shape[0]}, test {Xt.shape[0]}, cross-entropy, batch {base.batch_size}, "
            f"{base.n_epochs} epochs, alpha 0.5, eta 0.3, lr_min 1e-3, gamma 0.06, sound, "
            "float32, matmul 'midrad' (the default); certified = fraction of test points "
            "certified stable by the run's own bound method"),
      paper="the AGT paper reports IBP only (no CROWN numbers to compare against)",
      quick=quick, rows=rows, provenance=record())


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--quick", action="store_true", help="smaller data, fewer k (a smoke run)")
  a = ap.parse_args()
  res = run(a.quick)
  RESULTS.mkdir(exist_ok=True)
  name = "agt_crown_quick.json" if a.quick else "agt_crown.json"
  (RESULTS / name).write_text(json.dumps(res, indent=1))
  print("wrote", RESULTS / name)


if __name__ == "__main__":
  main()

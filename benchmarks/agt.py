"""Cost of Abstract Gradient Training against plain SGD, side by side (AGT spec §4.1, §5).

One AGT epoch (nominal clipped per-sample step + interval bounds + Thm 4.6 streaming top-k +
interval update) against one plain jitted SGD epoch (mean-loss gradient + update) on the same
model and the same batches, in one process. The paper reports 2–4x for its PyTorch code. Also
(``--soundness``) the retraining soundness counts at a larger size than CI.

  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/agt.py            # cost table + JSON
  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/agt.py --soundness

Results: benchmarks/results/agt_cost.json, benchmarks/results/agt_soundness.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from boundjax import agt
from boundjax.agt import losses, mlp, retrain

RESULTS = pathlib.Path(__file__).parent / "results"


def _settings(quick: bool):
  """(name, X, y, sizes, loss, config): the three settings of benchmarks/agt_privacy.py."""
  import sys
  sys.path.insert(0, str(pathlib.Path(__file__).parent))
  import agt_privacy
  import boundjax.data as bd
  out = []
  names = ["blobs", "fashion"] + (["amazon"] if bd.embeddings_available() else [])
  for name in names:
    s = agt_privacy.setting(name)
    k = 50 if name == "blobs" else 10
    cfg = dataclasses.replace(s["cfg"], k_private=k)
    sizes = "-".join(map(str, s["sizes"]))
    full = "full batch " if cfg.batch_size == s["X"].shape[0] else ""
    out.append((f"{name} {sizes} {full}b={cfg.batch_size}", s["X"], s["y"], s["sizes"],
                cfg.loss, cfg))
    if name == "fashion" and not quick:
      mb = dataclasses.replace(cfg, batch_size=500, fragsize=500)
      out.append((f"{name} {sizes} minibatch b=500", s["X"], s["y"], s["sizes"], cfg.loss, mb))
  return out


def _sgd_epoch_fn(sizes_loss):
  loss = sizes_loss
  lf = losses.per_sample_loss(loss)

  def mean_loss(p, xb, yb):
    return jnp.mean(jax.vmap(lambda a, b: lf(mlp.apply(p, a[None])[0], b))(xb, yb))
  return mean_loss


def _time(fn, reps):
  ts = []
  for _ in range(reps):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    ts.append(time.perf_counter() - t)
  return float(np.median(ts))


def cost(quick: bool, reps: int) -> dict:
  rows = []
  for name, X, y, sizes, loss, cfg in _settings(quick):
    X, y = jnp.asarray(X), jnp.asarray(y)
    params = mlp.init(jax.random.PRNGKey(0), sizes)
    sched = agt.batches(X.shape[0], cfg)
    xb = [X[i] for i in sched]
    yb = [y[i] for i in sched]
    # plain SGD: jitted mean-loss gradient + optax sgd update
    tx = optax.sgd(cfg.learning_rate, momentum=cfg.momentum or None, nesterov=cfg.nesterov)
    mean_loss = _sgd_epoch_fn(loss)

    @jax.jit
    def sgd_step(p, s, a, b):
      g = jax.grad(mean_loss)(p, a, b)
      u, s = tx.update(g, s, p)
      return optax.apply_updates(p, u), s

    def sgd_epoch():
      p, s = params, tx.init(params)
      for a, b in zip(xb, yb):
        p, s = sgd_step(p, s, a, b)
      return p
    sgd_epoch()
    t_sgd = _time(sgd_epoch, reps)
    row = {"setting": name, "n_train": int(X.shape[0]), "batch_size": cfg.batch_size,
           "k": cfg.k_private, "batches_per_epoch": len(xb), "sgd_epoch_s": t_sgd}
    for label, c in [("agt", cfg), ("agt_k0", dataclasses.replace(cfg, k_private=0))]:
      step = jax.jit(agt.make_step(mlp.apply, c, "mlp"))

      def agt_epoch():
        s = agt.init(params, c)
        for a, b in zip(xb, yb):
          s = step(s, a, b)
        return s
      agt_epoch()
      row[f"{label}_epoch_s"] = _time(agt_epoch, reps)
      row[f"{label}_ratio"] = row[f"{label}_epoch_s"] / t_sgd
    rows.append(row)
    print(f"{name:40s} SGD {t_sgd * 1e3:8.1f} ms | AGT k={cfg.k_private} "
          f"{row['agt_epoch_s'] * 1e3:8.1f} ms ({row['agt_ratio']:.2f}x) | AGT k=0 "
          f"{row['agt_k0_epoch_s'] * 1e3:8.1f} ms ({row['agt_k0_ratio']:.2f}x)", flush=True)
  return {"device": jax.devices()[0].device_kind, "platform": platform.platform(),
          "jax": jax.__version__, "reps": reps, "rows": rows,
          "note": "median of reps epochs after one warm-up epoch; ratios are the result, "
                  "absolute times depend on the (shared) machine"}


def soundness(n_sets: int) -> dict:
  """Retraining counts at a size above CI (float64): every count of violations must be 0."""
  import boundjax.data as bd
  out = []
  with jax.enable_x64(True):
    blobs = bd.make_blobs("overlapping", n_train=1200, seed=1)
    X = jnp.asarray(blobs.x_train, jnp.float64)
    yb = jnp.asarray(blobs.y_train)
    sep = bd.make_blobs("separable", n_train=1200, seed=1)
    cases = [
        ("separable blobs 6-16-1 BCE SGD", [6, 16, 1], None,
         dict(loss="binary_cross_entropy", learning_rate=1.0, clip_gamma=0.05)),
        ("blobs 6-32-16-1 BCE SGD", [6, 32, 16, 1], yb.astype(jnp.float64),
         dict(loss="binary_cross_entropy", learning_rate=1.0, lr_decay=0.3, clip_gamma=0.05)),
        ("blobs 6-32-16-1 BCE SGDM nesterov + L2", [6, 32, 16, 1], yb.astype(jnp.float64),
         dict(loss="binary_cross_entropy", learning_rate=0.3, clip_gamma=0.05, optimizer="sgdm",
              momentum=0.9, nesterov=True, l2_reg=0.01)),
        ("blobs 6-32-2 CE SGD + L1", [6, 32, 2], yb,
         dict(loss="cross_entropy", learning_rate=1.0, clip_gamma=0.05, l1_reg=0.001)),
    ]
    for name, sizes, y, kw in cases:
      data = sep if y is None else blobs
      X = jnp.asarray(data.x_train, jnp.float64)
      if y is None:
        y = jnp.asarray(data.y_train).astype(jnp.float64)
      for k in (1, 5, 20):
        cfg = agt.Config(n_epochs=3, batch_size=400, k_private=k, fragsize=128, fp_margin=True,
                         **kw)
        params = mlp.init(jax.random.PRNGKey(k), sizes, jnp.float64)
        t = time.perf_counter()
        r = retrain.empirical_retrain_test(mlp.apply, params, X, y, cfg,
                                           jnp.asarray(data.x_test, jnp.float64),
                                           n_sets=n_sets, seed=k)
        rec = {"setting": name, **dataclasses.asdict(r), "seconds": time.perf_counter() - t}
        out.append(rec)
        print(f"{name:40s} k={k:3d} models={r.retrained_models} removals={r.removals} "
              f"additions={r.additions} steps={r.steps_checked} violations={r.param_violations} "
              f"certified={r.certified_points} changed={r.prediction_changes}", flush=True)
  tot = {key: int(sum(o[key] for o in out)) for key in
         ("retrained_models", "removals", "additions", "steps_checked", "param_violations",
          "certified_checks", "prediction_changes")}
  print("total", tot)
  return {"rows": out, "total": tot}


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--quick", action="store_true", help="full-batch settings only")
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--soundness", action="store_true")
  ap.add_argument("--n-sets", type=int, default=64)
  a = ap.parse_args()
  RESULTS.mkdir(parents=True, exist_ok=True)
  if a.soundness:
    res = soundness(a.n_sets)
    (RESULTS / "agt_soundness.json").write_text(json.dumps(res, indent=1))
    return
  res = cost(a.quick, a.reps)
  (RESULTS / "agt_cost.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
  main()

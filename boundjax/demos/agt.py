"""The ``agt`` section of ``boundjax demo``: certified private prediction, a small AGT run end to end."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import boundjax.data as bd
from boundjax import agt, privacy
from boundjax.agt import mlp, retrain
from boundjax.demos.common import Section


# Printed by ``boundjax demo`` before the section runs.
TITLE = "certified private prediction with AGT (blobs)"
# ``boundjax demo --quick``: smaller sizes and fewer steps (keyword arguments of `run`).
QUICK: dict = {"n_train": 200, "ks": (0, 1, 5), "eps": (1.0,), "n_retrain": 0}
# Wall seconds of the section on a quiet 2-core CPU, full and ``--quick``: the CPU seconds it
# took (``boundjax demo --json``, 2026-11-27, a shared 2-core machine) scaled by the ratio of
# the full demo's quiet wall time (85 s) to its CPU seconds. Printed as the expected time.
SECONDS = {"full": 12.8, "quick": 2.9}


def run(n_train: int = 1000, ks: tuple[int, ...] = (0, 1, 5, 20, 50, 100, 200),
                 eps: tuple[float, ...] = (0.05, 0.2, 1.0), n_retrain: int = 8,
        seed: int = 0) -> Section:
  """Runs AGT on AGT's separable blobs and returns a text report.

  Trains a logistic regression with AGT for every k in ``ks`` (one shared nominal model),
  certifies the test points, compares the expected accuracy of the global-sensitivity (Laplace)
  and smooth-sensitivity (Cauchy) private predictions at each per-query epsilon, and retrains
  ``n_retrain`` models on neighbouring datasets (k = max(ks)) to check the bounds for real
  (none: no check).
  """
  d = bd.make_blobs("separable", n_train=n_train, seed=seed, scale=False)
  X, y = jnp.asarray(d.x_train), jnp.asarray(d.y_train)
  Xt, yt = jnp.asarray(d.x_test), np.asarray(d.y_test)
  cfg = agt.Config(n_epochs=4, learning_rate=2.0, batch_size=n_train, loss="cross_entropy",
                   clip_gamma=0.06, lr_decay=0.6, lr_min=1e-3)
  params0 = mlp.init(jax.random.PRNGKey(seed), [6, 2])
  nominal, grid = agt.fit_k_grid(mlp.apply, params0, X, y, cfg, list(ks), progress=False)
  pred = np.asarray(agt.predict(mlp.apply, nominal, Xt))
  kmax = agt.max_certified_k(mlp.apply, nominal, grid, Xt)
  certified = {k: float(np.mean(agt.certify(mlp.apply, nominal, grid[k], Xt))) for k in ks}
  lines = ["Certified private prediction (AGT, blobs, logistic regression, "
           f"{n_train} train / {len(yt)} test points)",
           f"  nominal test accuracy: {np.mean(pred == yt):.3f}",
           "  k      : " + " ".join(f"{k:6d}" for k in ks),
           "  cert.  : " + " ".join(f"{certified[k]:6.2f}" for k in ks),
           "  per-query eps | accuracy GS (Laplace) | accuracy SS (Cauchy, AGT k')"]
  accuracy = {}
  for e in eps:
    p_gs = privacy.response_probability(pred, 1.0 / e, "laplace")
    p_ss = privacy.response_probability(pred, np.asarray(privacy.cauchy_scale(kmax, e)), "cauchy")
    acc = lambda p: float(np.mean(np.where(yt == 1, p, 1 - p)))  # noqa: E731
    accuracy[str(e)] = {"global": acc(p_gs), "smooth": acc(p_ss)}
    lines.append(f"  {e:13.3f} | {acc(p_gs):21.3f} | {acc(p_ss):.3f}")
  kk = max(ks)
  checked = {"retrained_models": 0, "param_violations": 0, "prediction_changes": 0}
  if n_retrain > 0:
    with jax.enable_x64(True):
      X64 = jnp.asarray(d.x_train, jnp.float64)
      p64 = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), params0)
      cfg_k = dataclasses.replace(cfg, k_private=kk, sound=True)   # sound floating-point mode
      rep = retrain.empirical_retrain_test(mlp.apply, p64, X64, y, cfg_k,
                                           jnp.asarray(d.x_test, jnp.float64), n_sets=n_retrain,
                                           seed=seed)
    checked = {k: getattr(rep, k) for k in checked}
    lines.append(f"  retraining check at k={kk}: {rep.retrained_models} models, {rep.removals} "
                 f"removals, {rep.additions} additions, {rep.param_violations} parameter "
                 f"violations, {rep.prediction_changes} changed certified predictions")
  else:
    lines.append("  retraining check skipped (n_retrain=0, as in `boundjax demo --quick`)")
  lines.append("  (smooth sensitivity assumes k' is smooth between neighbouring datasets; "
               "global sensitivity is the default mechanism)")
  numbers = {"nominal_accuracy": float(np.mean(pred == yt)),
             "certified": {str(k): v for k, v in certified.items()}, "private_accuracy": accuracy,
             **checked}
  return Section("\n".join(lines), numbers)

"""The ``idp`` section of ``boundjax demo``: LUCID's guarded label-only predictor end to end
(the iDP deterministic bound, iDP-DB, is LUCID's §4, Def. 4.1)."""

from __future__ import annotations

import time
from typing import Sequence

import jax
import numpy as np

from boundjax import ensembles as E
from boundjax.data import load_sklearn
from boundjax.demos.common import Section
from boundjax.models import MLP
from boundjax.privacy.evaluation import accuracy_table, format_table
from milp.idpdb import compute_betas


# Printed by ``boundjax demo`` before the section runs.
TITLE = "LUCID's guarded label-only predictor (iDP-DB by MILP)"
# ``boundjax demo --quick``: smaller sizes and fewer steps (keyword arguments of `run`).
QUICK: dict = {"per_class": 10, "epochs": 20, "repeats": 2, "latency_queries": 10}
# Wall seconds of the section on a quiet 2-core CPU, full and ``--quick``: the CPU seconds it
# took (``boundjax demo --json``, 2026-11-27, a shared 2-core machine) scaled by the ratio of
# the full demo's quiet wall time (85 s) to its CPU seconds. Printed as the expected time.
SECONDS = {"full": 18.4, "quick": 6.7}


def run(per_class: int = 30, features: Sequence[int] = (7, 20, 21), epochs: int = 60,
        repeats: int = 20, latency_queries: int = 100, seed: int = 0) -> Section:
  """LUCID end to end on scikit-learn's breast_cancer: D = ``2 per_class`` balanced training
  points with three features (mean concave points, worst radius, worst texture; min–max scaled),
  N = MLP 3-6-6-2 (SGD lr 0.5, weight decay 1e-5, batch 8) and *all* |D| leave-one-out networks
  in one vmapped run, β per class by `compute_betas` (LUCID's branch-and-bound), then the
  guarded predictor's test accuracy at ε = 0 and 1 (mean over ``repeats`` noise draws) beside N,
  Naive-iDP and Naive-Noise, and the fraction of noised queries (latency measured over
  ``latency_queries`` queries)."""
  ds = load_sklearn("breast_cancer")
  rng = np.random.default_rng(seed)
  idx = np.sort(np.concatenate([rng.choice(np.flatnonzero(ds.y_train == c), per_class,
                                           replace=False) for c in (0, 1)]))
  cols = list(features)
  x, y = ds.x_train[idx][:, cols], ds.y_train[idx]
  xt, yt = ds.x_test[:, cols], ds.y_test
  model = MLP(hidden=(6, 6), out=2)
  init = model.init(jax.random.PRNGKey(seed), x[:1])
  t0 = time.perf_counter()
  ens = E.train_ensemble(model, init, E.sgd(0.5, weight_decay=1e-5), x, y,
                         E.leave_k_out(np.arange(len(idx))), epochs=epochs, batch_size=8,
                         seed=seed, progress=False)
  train_s = time.perf_counter() - t0
  members = ens.select(np.arange(1, len(idx) + 1)).params
  beta = compute_betas(ens.full, members, node_time_limit=20.0)
  betas = beta.betas
  table = accuracy_table(model.apply, ens.full, betas, xt, yt, idp_epsilons=(0.0, 1.0),
                         members=members, repeats=repeats, key=jax.random.PRNGKey(seed),
                         latency_queries=latency_queries)
  lines = [
      f"LUCID on breast_cancer ({len(idx)} training points, features {cols}): N + {len(idx)} "
      f"leave-one-out MLPs 3-6-6-2 in {train_s:.1f} s; beta by {beta.method} in "
      f"{beta.seconds:.1f} s ({beta.n_milps} MILPs, exact {beta.all_exact}): "
      + ", ".join(f"beta_{c} = {b:.3f}" for c, b in betas.items()),
      format_table(table),
  ]
  numbers = {"betas": {str(c): float(b) for c, b in betas.items()}, "method": beta.method,
             "exact": bool(beta.all_exact), "table": table.as_dict()}
  return Section("\n".join(lines), numbers)

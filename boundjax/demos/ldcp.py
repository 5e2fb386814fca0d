"""The ``ldcp`` section of ``boundjax demo``: Sphynx's LDCP query (local differential
classification privacy, Sphynx §3) against the ground truth."""

from __future__ import annotations

import time

import jax
import numpy as np

from boundjax import ensembles, hypernet
from boundjax.data import load
from boundjax.demos.common import Section
from boundjax.models import MLP
from milp import neighbourhoods as nb_lib
from milp import network as net_lib
from milp.ldcp import family_from_stacked, verify, verify_naive


# Printed by ``boundjax demo`` before the section runs.
TITLE = "Sphynx's LDCP query against the ground truth (MILP)"
# ``boundjax demo --quick``: smaller sizes and fewer steps (keyword arguments of `run`).
QUICK: dict = {"members": 6, "inputs": 1, "epochs": 2, "bounds": "ibp"}
# Wall seconds of the section on a quiet 2-core CPU, full and ``--quick``: the CPU seconds it
# took (``boundjax demo --json``, 2026-11-27, a shared 2-core machine) scaled by the ratio of
# the full demo's quiet wall time (85 s) to its CPU seconds. Printed as the expected time.
SECONDS = {"full": 15.7, "quick": 2.0}


def run(members: int = 48, inputs: int = 8, eps: float = 0.05, epochs: int = 5,
        bounds: str = "crown", seed: int = 0) -> Section:
  """LDCP on scikit-learn's breast-cancer data (the embedded dataset), in about 10-20 s on CPU.

  Trains N and ``members - 1`` leave-one-out networks (MLP 30-16-16-2), builds the exact
  min/max hyper-network, and for ``inputs`` test points checks membership and DP-robustness
  (L-inf ``eps``) LDCP with one hyper-network MILP against the per-member ground truth.
  ``bounds``: the engine bounds behind the MILPs' big-M values and the member-wise screening,
  ``"crown"`` or ``"ibp"`` (looser, nothing to compile; the MILPs' verdicts are exact either way).
  """
  ds = load("breast_cancer")
  x, y = np.asarray(ds.x_train), np.asarray(ds.y_train)
  model = MLP(hidden=(16, 16), out=2)
  init = model.init(jax.random.PRNGKey(seed), x[:1])
  rng = np.random.default_rng(seed)
  removed = ensembles.leave_k_out(rng.choice(len(x), members - 1, replace=False))
  t = time.perf_counter()
  ens = ensembles.train_ensemble(model, init, ensembles.sgd(0.1, weight_decay=1e-5), x, y,
                                 removed, epochs=epochs, batch_size=64, seed=seed,
                                 chunk_size=members, progress=False)
  train_s = time.perf_counter() - t
  hyper = hypernet.from_ensemble(ens.params)
  fam = family_from_stacked(ens.params)
  h_net = net_lib.from_params(hyper)
  lines = [f"LDCP (Sphynx query, exact min/max hyper-network of {members} networks trained in "
           f"{train_s:.1f} s on breast_cancer, MLP 30-16-16-2):"]
  agree = total = 0
  counts = {}
  for kind, make in (("membership", nb_lib.membership),
                     (f"L-inf eps={eps}", lambda v: nb_lib.linf_ball(v, eps))):
    verdicts, hyper_s, naive_s = [], [], []
    for i in range(inputs):
      xi = np.asarray(ds.x_test[i], np.float64)
      nbhd = make(xi)
      r = verify(None, ens.full, h_net, nbhd, members=fam, bounds=bounds)
      g = verify_naive(None, fam, nbhd, r.label, bounds=bounds)
      verdicts.append((r.verdict, g.ldcp))
      hyper_s.append(r.seconds)
      naive_s.append(g.seconds)
      agree += (r.verdict == "LDCP") == bool(g.ldcp)
      total += 1
    n_ldcp = sum(v == "LDCP" for v, _ in verdicts)
    n_true = sum(t is True for _, t in verdicts)
    counts[kind] = {"proven": n_ldcp, "true": n_true, "inputs": inputs,
                    "wrong": sum(v == "LDCP" and t is not True for v, t in verdicts)}
    lines.append(f"  {kind:16s}: {n_ldcp}/{inputs} proven LDCP by the hyper-network query "
                 f"(median {np.median(hyper_s) * 1e3:.0f} ms); ground truth over all {members} "
                 f"networks: {n_true}/{inputs} LDCP (median {np.median(naive_s) * 1e3:.0f} ms)")
  lines.append(f"  agreement with the ground truth: {agree}/{total} (the exact hyper-network "
               "never claims LDCP wrongly; disagreements are over-approximation)")
  return Section("\n".join(lines), {"members": members, "queries": counts, "agree": agree,
                                     "total": total})

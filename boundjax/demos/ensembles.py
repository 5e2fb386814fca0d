"""The ``ensembles`` section of ``boundjax demo``: a leave-one-out family in one vmapped run."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.datasets import load_breast_cancer

from boundjax import hypernet
from boundjax.demos.common import Section
from boundjax.domains.difference import difference
from boundjax.ensembles import leave_k_out, sgd, train_ensemble
from boundjax.core.interval import Interval
from boundjax.models import MLP


# Printed by ``boundjax demo`` before the section runs.
TITLE = "a leave-one-out family in one vmapped run, its hyper-network"
# ``boundjax demo --quick``: smaller sizes and fewer steps (keyword arguments of `run`).
QUICK: dict = {"members": 8, "epochs": 2}
# Wall seconds of the section on a quiet 2-core CPU, full and ``--quick``: the CPU seconds it
# took (``boundjax demo --json``, 2026-11-27, a shared 2-core machine) scaled by the ratio of
# the full demo's quiet wall time (85 s) to its CPU seconds. Printed as the expected time.
SECONDS = {"full": 4.2, "quick": 2.8}


def run(members: int = 64, epochs: int = 10, seed: int = 0) -> Section:
  """Trains N and ``members - 1`` leave-one-out networks on scikit-learn's breast-cancer data
  (min–max scaled; MLP 30-16-16-2, SGD lr 0.1, weight decay 1e-5, batch 32) in one vmapped run,
  builds the exact min/max hyper-network, and bounds its logits with `bj.ibp` over the whole data
  set: where the bounds fix the label, N and every network in the family agree.
  """
  data = load_breast_cancer()
  x = data.data.astype(np.float32)
  x = (x - x.min(0)) / np.maximum(x.max(0) - x.min(0), 1e-12)
  y = data.target.astype(np.int32)
  model = MLP(hidden=(16, 16), out=2)
  init = model.init(jax.random.PRNGKey(seed), x[:1])
  rng = np.random.default_rng(seed)
  removed = leave_k_out(rng.choice(x.shape[0], members - 1, replace=False))
  t = time.perf_counter()
  ens = train_ensemble(model, init, sgd(0.1, weight_decay=1e-5), x, y, removed, epochs=epochs,
                       batch_size=32, seed=seed, chunk_size=members, progress=False)
  secs = time.perf_counter() - t
  hyper = hypernet.from_ensemble(ens.params)
  lo, hi = hypernet.flat_bounds(hyper)
  widths = hi - lo
  acc = float(np.mean(np.argmax(model.apply(ens.full, x), -1) == y))
  lines = [
      f"leave-one-out ensemble: {members} networks (N + {members - 1}) of MLP 30-16-16-2 on "
      f"breast_cancer ({x.shape[0]} points), {epochs} epochs, batch 32, one vmapped run: "
      f"{secs:.1f} s",
      f"  N's training accuracy {acc:.3f}; min/max hyper-network: median width "
      f"{np.median(widths):.2e}, max {widths.max():.2e} over {widths.size} parameters; contains "
      f"every member: {bool(hypernet.contains_members(hyper, ens.params).all())}",
  ]
  out = hypernet.hyper_output_bounds(model.apply, hyper, jnp.asarray(x))
  l, u = np.asarray(out.lower), np.asarray(out.upper)
  margin_lo, margin_hi = l[:, 1] - u[:, 0], u[:, 1] - l[:, 0]   # bounds on logit1 - logit0
  fixed = (margin_lo > 0) | (margin_hi < 0)
  lines.append(f"  bj.ibp over the hyper-network: the label is the same for every network in the "
               f"box at {int(fixed.sum())} of {x.shape[0]} points")
  # Difference intervals (LUCID, §5.4 and §6.2): N#(x) - N(x) on the same x, over [0,1]^30.
  box = Interval(jnp.zeros((1, x.shape[1]), x.dtype), jnp.ones((1, x.shape[1]), x.dtype))
  diff = difference(model.apply)(ens.full, hyper, box)
  d_w = float(np.mean(np.asarray(diff.delta.upper - diff.delta.lower)))
  n_w = float(np.mean(np.asarray(diff.other.upper - diff.ref.lower)
                      - np.asarray(diff.other.lower - diff.ref.upper)))
  lines.append(f"  over the whole input box [0,1]^{x.shape[1]}: hyper-network logit width "
               f"{float(np.mean(np.asarray(diff.other.upper - diff.other.lower))):.3g}; bj.difference "
               f"interval of N#(x) - N(x): width {d_w:.3g} ({n_w / d_w:.0f}x narrower than "
               f"IBP(N#) - IBP(N))")
  numbers = {"members": members, "seconds": secs, "accuracy": acc,
             "contains_members": bool(hypernet.contains_members(hyper, ens.params).all()),
             "label_fixed": int(fixed.sum()), "points": int(x.shape[0]),
             "hyper_width": float(np.mean(np.asarray(diff.other.upper - diff.other.lower))),
             "difference_width": d_w, "subtraction_width": n_w}
  return Section("\n".join(lines), numbers)

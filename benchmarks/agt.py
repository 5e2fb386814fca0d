"""Cost of Abstract Gradient Training against plain SGD, side by side (AGT, §4.3 and App. E).

One AGT epoch (nominal clipped per-sample step + interval bounds + Thm 4.6 streaming top-k +
interval update) against one plain jitted SGD epoch (mean-loss gradient + update) on the same
model and the same batches, in one process. The paper reports 2–4x for its PyTorch code. Also
(``--soundness``) the retraining soundness counts at a larger size than CI.

  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/agt.py            # cost table, floors, memory
                                                                  # vs batch + JSON
  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/agt.py --soundness

  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/agt.py --profile   # per-fragment breakdown
                                          # (or with the cost table: --with-profile)
  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/agt.py --public-task [--poison]
  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/agt.py --public-floor  # FLOP / bandwidth floors

The public PyTorch AGT (psosnin/AbstractGradientTraining) side by side: not possible here. It is
not on the package index this machine reaches (``pip download abstract-gradient-training``
finds no distribution, nor ``abstract_gradient_training==0.3``), and it needs gurobipy. So
``--public-task`` runs only our side of the issue's comparison task (blobs, 6-128-2 ReLU,
20,000 points, batch 5,000, 4 epochs, k = 10, gamma = 0.06): the time of the 4 epochs and
the final box and logit-bound widths, writes the exact data and initial weights to
``results/agt_public_task.npz`` so the public code can be run on the same inputs elsewhere, and
records in ``results/agt_public.json`` that the public side was not run.

Results: benchmarks/results/agt_cost.json, benchmarks/results/agt_soundness.json,
agt_public.json, agt_public_poison.json, agt_public_floor.json.

Where a step's time goes (``--profile``, process CPU ms per fragment on the 2-core machine;
Fashion 128-32-1, fragment 2,000, P = 4,161 / Amazon-shaped 384-100-1, fragment 500,
P = 38,601): nominal per-sample gradients 3 / 36 (``vmap(grad)`` took 27 / 83 before they were
written as batched passes), interval forward pass < 1 / < 1, per-sample interval gradient bounds
21 / 68, clipping of the three b x P arrays 46 / 125 (as a separate pass; fused inside the
step), sums 14 / 54, sums + the two exact top-k selections 39 / 250; whole step 633 / 929.
Changes of this round: the top-k merge is a two-level exact search
(`boundjax.agt.descent.topk_leading`, 4x cheaper than ``lax.top_k`` over the transposed
fragment for the Fashion kernel), batched nominal gradients, fused fragment sums, no padding.
A/B on the same machine (CPU seconds per epoch, k = 10, sound, Gaussian inputs of the
settings' shapes): Fashion-shaped 786 -> 447 ms (199x -> 124x SGD); Amazon-shaped 3.28 ->
3.47 s (471x -> 522x, unchanged within noise: there ``lax.top_k``'s per-row cost over 38,601
coordinates dominates the merge).

Re-measured with CROWN (``--profile --reps 2``, load average ~27 on 2 cores, CPU ms per fragment,
Fashion / Amazon-shaped): nominal gradients 17 / 36, interval gradient bounds 21 / 67,
``bound_method="crown"`` gradient bounds 41 / 153 (one hidden layer: the exact first layer and
the sign-split second layer, no backward pass; no gain in tightness there over "signsplit"),
clipping 33 / 117 (separate pass), sums 17 / 59, sums + top-k 42 / 258; whole step 539 / 1046.
The top-k merge over 38,601 coordinates still dominates the Amazon step; no bit-identical
speed-up was found in this round.

Public task (``--public-task``, process CPU seconds for the 4 epochs, 2-core machine under a
load average of 6-8): 2.0-2.25 s with the hand-written interval passes, 3.0-3.4 s once the
per-sample bounds were ``boundjax.ibp`` of the nominal passes, 1.3-1.5 s (same final box, bit
for bit) since `boundjax.agt.descent.scan_fragments` carries each fragment's per-sample values
into the next scan iteration. Within one iteration XLA fused the engine's element-wise chain
(NaN guards, 0 * inf products, the hidden-layer delta) into each consumer of the merge (the
sums, the group maxima and the gathered groups of the top-k) and recomputed it there, through
an index-remapping reshape; ``lax.optimization_barrier`` does not stop that on CPU (XLA removes
it before fusion), a loop boundary does. The "mlp" back-end also writes the delta boxes once
(two pipeline stages, `boundjax.agt.mlp.grad_parts` then `grads_from_parts`), instead of
recomputing them for each of the 6 inputs of the first kernel's outer product (about 10 % in
an interleaved A/B, 1.31 against 1.46 s). The poisoning row (``--public-task --poison``,
k_poison = 10, epsilon = 0.01): 6.3 s before, 2.5 s after (bit for bit; it still computes its
two bounds in one stage).

Since then (interleaved A/B in one process, process CPU seconds for the 4 epochs, bit for bit
the same final state): the per-sample arrays are no longer carried from one scan iteration to
the next, which made XLA copy every carried buffer twice per iteration (it could not prove
that the merge reads the old value before the next stage writes the new one; an
``optimization_barrier`` leaves no trace on CPU); each stage's output is instead the result of
a ``lax.cond`` that is never false-branched (`boundjax.agt.descent._written`), which XLA
writes once without fusing its producer into the consumers. The poisoning row runs in two
stages as well (`boundjax.agt.poisoning.mlp_stages`), and the nominal per-sample gradients are
computed in the second stage. Privacy 1.10 -> 0.85 s, poisoning 2.60 -> 1.36 s, a batch in a
single fragment (``fragsize=5000``) 4.08 -> 1.63 s; compilation 27 -> 7 s and 35 -> 12 s.
``--public-floor`` measures the floors (XLA's flop count of the per-sample stages against the
GEMM throughput, and the per-sample arrays written and read once against the copy bandwidth).

The streaming fold (this round; process CPU time side by side, ``results/agt_cost.json``, which
also records the machine's load). Profiles of the Amazon-shaped step (``jax.profiler`` traces,
"X" events by name) showed three costs that were not the bound work itself: (1) ``lax.top_k``
on XLA's CPU back-end costs about 0.5 us per row whatever its length (18 ms for 38,601 rows of
16, 163 ms for rows of 1,024), so every selection over the coordinates was 20-70 ms; (2) XLA's
CPU reductions over the leading (sample) axis run at 5-20 ns per value (``jnp.sum(v, 0)`` of
a (32, 38,601) array: 25 ms; the same as a (1, 32) x (32, 38,601) product: 0.3 ms); (3) every
buffer above 32 MB (glibc's threshold for fresh memory maps) is page-faulted on first touch
each time, an element-wise pass over a 74 MB array costing 60 ms against 0.5 ns per value
below the threshold. Now: the batch is streamed in chunks of at most
`boundjax.agt.descent.CHUNK_BYTES` (8 MB) per per-sample array
(`boundjax.agt.descent.chunk_size`), and each chunk is folded in one native pass
(`boundjax.agt.select`, an XLA FFI custom call built once with the system compiler; the XLA
fold is the reference and runs elsewhere): running sums and k unordered slots per coordinate
with their threshold tracked, a value replacing the least extreme slot only when it beats it
(about k (1 + ln(b / k)) replacements per coordinate and batch in random order). The scratch
memory of a step no longer grows with b x #params (``memory_vs_batch`` in the JSON). What
remains on the Amazon-shaped step is the engine's per-sample interval products and clipping
(the ``cond`` stage, written once per chunk) and those replacements.

Measured at ebfc8ab (``results/agt_cost.json``, process CPU time per epoch, AGT / SGD, load
average 8-11 on the 2 cores) against the branch point a0522d3 (same method, load 2-6):
public task's 6-128-2 b=5000 11.2x -> 5.2x; blobs 6-2 5.2x -> 5.9x (a 14-parameter network,
noise); Fashion 128-32-1 full batch 36x -> 19x; Fashion minibatch b=500 42x -> 20x (17x at a
24 MB budget); Amazon-shaped 384-100-1 110x -> 68x (46-58x in quieter runs). The 10x target is
met only by the blobs networks. The floors there were computed with GEMM and copy rates
measured in wall time under that load (11 GFLOP/s, 2.3 GB/s, about 6x below the unloaded
74 GFLOP/s and 12 GB/s of ``results/agt_public_floor.json``); with the unloaded rates the
per-sample work of a step is 17 ms of GEMM-speed flops for the Amazon shape (4x its SGD step)
and 20 ms for Fashion's full batch (2.4x), and writing and reading its three b x #params arrays
once through memory 76 ms and 82 ms: a fused per-sample pass that keeps a chunk in cache would
put 10x within reach; XLA's element-wise producers plus the native fold are 4-17x above the
compute floor. Public task (``results/agt_public.json``, ``agt_public_poison.json``): privacy
0.91 -> 0.59 s CPU, poisoning 1.35 -> 1.01 s CPU, the same boxes up to rounding.

The fused fold (``fused_outer_fold`` in each row): a Dense kernel's per-sample values are the
outer products of per-sample factors, so `boundjax.agt.descent.accumulate_outer` (and
`boundjax.agt.poisoning.accumulate_outer`) hand the native fold the O(b x width) factors; it
forms each entry's corner-product box, clips it and folds it into the sums and the k-extreme
slots in registers, a tile of kernel rows at a time, samples taken largest first, rows split
between two threads. The b x #params arrays are never written, and the chunk is set by the
factors' size (``chunk`` in the rows: 2,000 for Fashion, 500 for the Amazon shape, against 504
and 54 before). Measured at ae27529 (quiet machine, process CPU per epoch, AGT / SGD) against
f1c7b5e (before): Fashion full batch 23.9x -> 14.4x, Fashion minibatch b=500 21.8x -> 19.0x,
Amazon-shaped 76.0x -> 40.4x (k = 0: 36.5x -> 17.8x), the public task's 6-128-2 6.9x -> 6.5x;
public task 0.22 / 0.42 s -> 0.23 / 0.40 s (privacy / poisoning, the same boxes). What remains
above 10x is the k-extreme slots: a value that beats its coordinate's threshold replaces the
least extreme slot (about k (1 + ln(b / k)) replacements per coordinate and step in random
order, fewer largest first), which costs Fashion's minibatch and the Amazon shape as much as
the rest of the fold (the k = 0 columns); and for Fashion's full batch the fold itself, about
1.3 ns of CPU per entry and bound.

Why 3x is out of reach on a 2-core CPU: plain SGD is three GEMMs over the batch, about 6 b P
flops that run at GEMM speed (~50 GFLOP/s here: 5 ms for Fashion's b = 10,000). AGT must
produce 3 b P per-sample values (nominal, lower, upper: 125 M for Fashion, each a product,
select and clip that cannot be folded into a GEMM because of the per-sample clipping), sum them
and select the k extremes of 2 b P of them per coordinate. That work is element-wise and
memory-bound: one write and read of 3 b P floats is already ~1 GB per Fashion step, ~100 ms at
the ~10 GB/s this machine sustains, i.e. ~20x SGD before any selection; k = 0 (no top-k)
measures 29x. The paper's 2-4x is on a GPU, where the element-wise b P work runs at memory
bandwidth ~100x higher and the GEMMs are not much faster.
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
from boundjax.agt import descent, losses, mlp, retrain, select
from boundjax.agt import train as agt_train
from boundjax.core.interval import Interval
from common import RESULTS, median_times, record


def _settings(quick: bool):
  """(name, X, y, sizes, loss, config): the three settings of benchmarks/agt_privacy.py."""
  import sys
  sys.path.insert(0, str(pathlib.Path(__file__).parent))
  import agt_privacy
  import boundjax.data as bd
  out = []
  names = ["blobs", "fashion"] + (["amazon"] if bd.embeddings_available() else [])
  if "amazon" not in names:
    # The cost depends on the shapes only: without the embedding model, Gaussian inputs of the
    # Amazon setting's shape (4,000 x 384) with its configuration (benchmarks/agt_privacy.py).
    X = np.random.default_rng(0).normal(size=(4000, 384)).astype(np.float32)
    y = (X[:, :8].sum(1) > 0).astype(np.float32)
    cfg = agt.Config(n_epochs=5, learning_rate=1.0, batch_size=1000, k_private=10,
                     loss="binary_cross_entropy", clip_gamma=0.1, lr_decay=0.05, lr_min=1e-3,
                     optimizer="sgdm", momentum=0.9, fragsize=500, sound=True)
    extra = [("amazon-shaped (Gaussian inputs) 384-100-1 b=1000", X, y, [384, 100, 1],
              cfg.loss, cfg)]
  else:
    extra = []
  pub = _public_task_data()
  out.append(("blobs 6-128-2 b=5000 (the public task's network)", pub["X"], pub["y"],
              [6, 128, 2], pub["cfg"].loss, pub["cfg"]))
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
  return out + extra


def _public_task_data() -> dict:
  """The public task's data and configuration (`public_task`): blobs, 6-128-2, 20,000 points,
  batch 5,000, k = 10, gamma = 0.06."""
  import boundjax.data as bd
  d = bd.make_blobs("separable", n_train=20_000, seed=0, scale=False)
  cfg = agt.Config(n_epochs=4, learning_rate=2.0, batch_size=5000, loss="cross_entropy",
                   k_private=10, clip_gamma=0.06, lr_decay=0.6, lr_min=1e-3, fragsize=1000)
  return {"X": np.asarray(d.x_train[:20_000], np.float32), "y": np.asarray(d.y_train[:20_000]),
          "Xt": np.asarray(d.x_test, np.float32), "cfg": cfg}


def _sgd_epoch_fn(sizes_loss):
  loss = sizes_loss
  lf = losses.per_sample_loss(loss)

  def mean_loss(p, xb, yb):
    return jnp.mean(jax.vmap(lambda a, b: lf(mlp.apply(p, a[None])[0], b))(xb, yb))
  return mean_loss


CHUNK_BUDGETS = (2 * 2 ** 20, 8 * 2 ** 20, 24 * 2 ** 20)


def machine_rates(reps: int = 5) -> tuple[float, float]:
  """(GEMM flop/s of a jitted 1024 x 1024 float32 product, copy bytes/s of ``numpy.copyto``
  over 64 MB, read + write), the best of ``reps``."""
  n = 1024
  a = jnp.asarray(np.random.default_rng(0).random((n, n), dtype=np.float32))
  mm = jax.jit(lambda a: a @ a)
  mm(a).block_until_ready()
  gemm = 2 * n ** 3 / min(_wall(lambda: mm(a).block_until_ready()) for _ in range(reps))
  src = np.random.default_rng(0).random(16 * 2 ** 20, dtype=np.float32)
  dst = np.empty_like(src)
  copy = 2 * src.nbytes / min(_wall(lambda: np.copyto(dst, src)) for _ in range(reps))
  return gemm, copy


_RATES: list = []


def _chunk_at(params, cfg, budget: int) -> int:
  """`boundjax.agt.train.fold_chunk` under the memory budget ``budget``."""
  default = descent.CHUNK_BYTES
  descent.CHUNK_BYTES = budget
  try:
    return agt_train.fold_chunk(params, cfg)
  finally:
    descent.CHUNK_BYTES = default


def step_floor(params, xb, yb, cfg, sgd_step_cpu_s: float, agt_step_cpu_s: float) -> dict:
  """The floor of one AGT step of the "mlp" back-end (AGT, App. B and Thm 4.6), measured here.

  FLOPs: XLA's cost analysis of the per-sample work of one chunk (the nominal clipped
  gradients and their clipped interval bounds: `boundjax.agt.mlp.grad_parts` then
  `boundjax.agt.mlp.grads_from_parts`; every element-wise operation one flop) times the chunks
  of a step, against the GEMM throughput (`machine_rates`). Bytes: the three per-sample arrays
  of the step (nominal, lower, upper; b x #params values each) written once and read once,
  against the copy bandwidth (the fold of `boundjax.agt.select` reads each once; no top-k
  selection counted). The step's and plain SGD's measured process CPU seconds beside them.
  The bytes term is the floor of forming the per-sample products; the fused fold
  (`boundjax.agt.descent.accumulate_outer`, ``fused_outer_fold`` in the row) forms them in
  registers and moves O(b x width) bytes, so for it the FLOP term is the floor.
  """
  if not _RATES:
    _RATES.extend(machine_rates())
  gemm, copy = _RATES
  b = xb.shape[0]
  f = descent.chunk_size(params, b, cfg.fragsize)
  gamma = cfg.gamma
  box = jax.tree_util.tree_map(lambda w: Interval(w - 1e-3, w + 1e-3, validate=False), params)

  def per_sample(x, y):
    g = descent.clip(mlp.per_sample_grads(params, x, y, cfg.loss), gamma)
    return g, descent.clip(mlp.grad_bounds(box, x, y, cfg.loss, cfg.matmul), gamma)
  ca = jax.jit(per_sample).lower(xb[:f], yb[:f]).compile().cost_analysis()
  ca = ca[0] if isinstance(ca, list) else ca
  n_params = sum(int(np.size(v)) for v in jax.tree_util.tree_leaves(params))
  flops = float(ca["flops"]) * b / f
  moved = 2 * 3 * b * n_params * 4
  return {"gemm_gflop_s": gemm / 1e9, "copy_gb_s": copy / 1e9, "chunk": f,
          "n_params": n_params, "per_sample_flops_step": flops,
          "compute_floor_step_s": flops / gemm, "bytes_step": moved,
          "memory_floor_step_s": moved / copy, "agt_step_cpu_s": agt_step_cpu_s,
          "sgd_step_cpu_s": sgd_step_cpu_s,
          "agt_over_compute_floor": agt_step_cpu_s / (flops / gemm),
          "agt_over_memory_floor": agt_step_cpu_s / (moved / copy),
          "floor_over_sgd": max(flops / gemm, moved / copy) / sgd_step_cpu_s}


def memory_vs_batch(batches=(500, 1000, 2000, 4000, 8000, 16000)) -> dict:
  """Peak scratch memory of one compiled AGT step against the batch size: XLA's buffer
  assignment of the jitted step (``memory_analysis().temp_size_in_bytes``, deterministic), for
  the Fashion-shaped 128-32-1 and the Amazon-shaped 384-100-1 networks (k = 10, sound), with
  the per-sample array of one chunk (chunk x #params float32) and the batch itself beside it.
  The scratch grows only with the batch's inputs (b x input width) once b exceeds one chunk,
  not with b x #params."""
  out = []
  for sizes, loss in (([128, 32, 1], "binary_cross_entropy"), ([384, 100, 1],
                                                                "binary_cross_entropy")):
    params = mlp.init(jax.random.PRNGKey(0), sizes)
    n_params = sum(int(np.size(v)) for v in jax.tree_util.tree_leaves(params))
    for b in batches:
      cfg = agt.Config(n_epochs=1, learning_rate=0.1, batch_size=b, loss=loss, k_private=10,
                       clip_gamma=0.1, fragsize=b, sound=True)
      step = jax.jit(agt.make_step(mlp.apply, cfg, "mlp"))
      x = jax.ShapeDtypeStruct((b, sizes[0]), jnp.float32)
      y = jax.ShapeDtypeStruct((b,), jnp.float32)
      ma = step.lower(agt.init(params, cfg), x, y).compile().memory_analysis()
      f = agt_train.fold_chunk(params, cfg)
      rec = {"network": "-".join(map(str, sizes)), "n_params": n_params, "batch": b,
             "chunk": f, "temp_mb": ma.temp_size_in_bytes / 2 ** 20,
             "chunk_array_mb": f * sum(int(np.size(a)) for a in mlp.chunk_values(params)) * 4
             / 2 ** 20 if descent.fused_outer(jnp.float32) else f * n_params * 4 / 2 ** 20,
             "batch_inputs_mb": b * sizes[0] * 4 / 2 ** 20,
             "per_sample_arrays_if_materialised_mb": 3 * b * n_params * 4 / 2 ** 20}
      out.append(rec)
      print(rec, flush=True)
  return {"rows": out, "chunk_bytes": descent.CHUNK_BYTES}


def cost(quick: bool, reps: int) -> dict:
  """Epoch times of plain SGD and AGT (the setting's fragsize, a small fragsize sweep, k = 0)."""
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
    t_sgd, c_sgd = median_times(sgd_epoch, reps)
    row = {"setting": name, "n_train": int(X.shape[0]), "batch_size": cfg.batch_size,
           "k": cfg.k_private, "sound": cfg.sound, "fragsize": cfg.fragsize,
           "batches_per_epoch": len(xb), "sgd_epoch_s": t_sgd, "sgd_epoch_cpu_s": c_sgd}

    def agt_time(c):
      step = jax.jit(agt.make_step(mlp.apply, c, "mlp"))

      def agt_epoch():
        s = agt.init(params, c)
        for a, b in zip(xb, yb):
          s = step(s, a, b)
        return s
      agt_epoch()
      return median_times(agt_epoch, reps)
    for label, c in [("agt", cfg), ("agt_k0", dataclasses.replace(cfg, k_private=0))]:
      t, cp = agt_time(c)
      row.update({f"{label}_epoch_s": t, f"{label}_epoch_cpu_s": cp, f"{label}_ratio": t / t_sgd,
                  f"{label}_cpu_ratio": cp / c_sgd})
    row["chunk"] = agt_train.fold_chunk(params, cfg)
    row["native_fold"] = select.use_native(jnp.float32)
    row["fused_outer_fold"] = descent.fused_outer(jnp.float32)
    sweep = {descent.CHUNK_BYTES: (row["agt_epoch_s"], row["agt_epoch_cpu_s"])}
    default = descent.CHUNK_BYTES
    for budget in CHUNK_BUDGETS:
      if budget != default:
        descent.CHUNK_BYTES = budget
        try:
          sweep[budget] = agt_time(cfg)
        finally:
          descent.CHUNK_BYTES = default
    best = min(sweep, key=lambda m: sweep[m][1])
    row["chunk_budget_sweep_cpu_s"] = {
        f"{m // 2 ** 20} MB (chunk {_chunk_at(params, cfg, m)})":
        v[1] for m, v in sorted(sweep.items())}
    row.update({"best_chunk_budget_mb": best // 2 ** 20, "agt_best_epoch_cpu_s": sweep[best][1],
                "agt_best_cpu_ratio": sweep[best][1] / c_sgd})
    row["floor"] = step_floor(params, xb[0], yb[0], cfg, c_sgd / len(xb),
                              row["agt_epoch_cpu_s"] / len(xb))
    rows.append(row)
    print(f"{name:40s} SGD {c_sgd * 1e3:8.1f} ms | AGT k={cfg.k_private} "
          f"{row['agt_epoch_cpu_s'] * 1e3:8.1f} ms ({row['agt_cpu_ratio']:.1f}x; best budget "
          f"{best >> 20} MB: {row['agt_best_cpu_ratio']:.1f}x) | AGT k=0 "
          f"{row['agt_k0_epoch_cpu_s'] * 1e3:8.1f} ms ({row['agt_k0_cpu_ratio']:.1f}x)   "
          f"[CPU seconds; wall ratio {row['agt_ratio']:.1f}x]", flush=True)
  return {"device": jax.devices()[0].device_kind, "platform": platform.platform(),
          "jax": jax.__version__, "reps": reps, "rows": rows,
          "note": "medians of reps epochs after one warm-up epoch, in process CPU seconds "
                  "(*_cpu_*) and wall seconds; the CPU ratios are the result (the machine is "
                  "shared, so wall times carry other users' load)"}


def profile(reps: int) -> dict:
  """Where one AGT step's time goes, per fragment (AGT, App. B and Thm 4.6), in process CPU ms.

  Parts timed as separate compiled functions on the setting's first fragment and a box of
  width 2e-3 around the initial parameters: nominal per-sample gradients (the batched passes
  and, for comparison, ``vmap(grad)``), the interval pass (forward only and forward+backward),
  clipping of the three per-sample arrays, the streaming merge (sums only, and with the two
  top-k selections), and the whole step.
  """
  from boundjax.agt import bounds as bnd
  from boundjax.agt import descent, train
  from boundjax.core.interval import Interval
  out = []
  for name, X, y, sizes, loss, cfg in _settings(True):
    X, y = jnp.asarray(X), jnp.asarray(y)
    p = mlp.init(jax.random.PRNGKey(0), sizes)
    box = jax.tree_util.tree_map(lambda w: Interval(w - 1e-3, w + 1e-3, validate=False), p)
    f = min(cfg.fragsize, cfg.batch_size)
    xf, yf = X[:f], y[:f]
    gam = cfg.clip_gamma
    def t(fn, *a):
      jax.block_until_ready(fn(*a))     # compile outside the timing
      return median_times(lambda: fn(*a), reps)[1] * 1e3
    gfn = jax.jit(lambda p, x, y: mlp.per_sample_grads(p, x, y, loss))
    bfn = jax.jit(bnd.grad_bounds_fn(mlp.apply, loss, "mlp", cfg.matmul))
    g, gb = gfn(p, xf, yf), bfn(box, xf, yf)
    leaves = jax.tree_util.tree_leaves(p)

    def merge(g, gb, k):
      ivs = jax.tree_util.tree_leaves(gb, is_leaf=lambda v: isinstance(v, Interval))
      return [descent.accumulate(descent.init_accumulator(pl, k), gn, iv.lower, iv.upper, None,
                                 cfg.sound)
              for pl, gn, iv in zip(leaves, jax.tree_util.tree_leaves(g), ivs)]
    state = agt.init(p, cfg)._replace(bounds=box)
    step = jax.jit(agt.make_step(mlp.apply, cfg, "mlp"))
    xb, yb = X[: cfg.batch_size], y[: cfg.batch_size]
    rec = {"setting": name, "fragment": f, "k": cfg.k_private,
           "n_params": int(sum(l.size for l in leaves)),
           "nominal_grads_batched_ms": t(gfn, p, xf, yf),
           "nominal_grads_vmap_grad_ms": t(jax.jit(train.nominal_grad_fn(mlp.apply, loss)),
                                           p, xf, yf),
           "interval_forward_ms": t(jax.jit(lambda pb, x: mlp.forward_bounds(pb, x)), box, xf),
           "interval_grad_bounds_ms": t(bfn, box, xf, yf),
           "crown_grad_bounds_ms": t(jax.jit(bnd.grad_bounds_fn(mlp.apply, loss, "mlp",
                                                                cfg.matmul, "crown")),
                                     box, xf, yf),
           "clip_ms": t(jax.jit(lambda g, gb: (descent.clip(g, gam), descent.clip(gb, gam))),
                        g, gb),
           "merge_sums_only_ms": t(jax.jit(lambda g, gb: merge(g, gb, 0)), g, gb),
           "merge_with_topk_ms": t(jax.jit(lambda g, gb: merge(g, gb, cfg.k_private)), g, gb),
           "step_ms": t(step, state, xb, yb), "fragments_per_step": -(-cfg.batch_size // f)}
    out.append(rec)
    print(name, {k: (round(v, 1) if isinstance(v, float) else v) for k, v in rec.items()
                 if k != "setting"}, flush=True)
  return {"rows": out, "unit": "process CPU ms per fragment (step_ms: per step)"}


def public_task(reps: int, poison: bool = False) -> dict:
  """Our side of the issue's AGT-vs-public comparison (the module docstring): one process,
  blobs 6-128-2, 20,000 points, batch 5,000, 4 epochs, k = 10, gamma = 0.06 (interval bounds,
  matmul "midrad" = the public code's "rump", its default); the public package is not
  installable here. ``poison``: the poisoning row of the same task instead of the privacy
  row (k_private = 0, k_poison = 10, epsilon = 0.01; `boundjax.agt.poisoning`)."""
  from boundjax.agt import bounds as bnd
  pub = _public_task_data()
  X, y, Xt, cfg = jnp.asarray(pub["X"]), jnp.asarray(pub["y"]), jnp.asarray(pub["Xt"]), pub["cfg"]
  params = mlp.init(jax.random.PRNGKey(0), [6, 128, 2])
  if poison:
    cfg = dataclasses.replace(cfg, k_private=0, k_poison=10, epsilon=0.01)
  np.savez(RESULTS / "agt_public_task.npz", x=np.asarray(X), y=np.asarray(y),
           x_test=np.asarray(Xt), **{f"{k}{i}": np.asarray(v) for i, l in enumerate(params)
                                    for k, v in l.items()})
  step = jax.jit(agt.make_step(mlp.apply, cfg, "mlp"))
  sched = agt.batches(X.shape[0], cfg)

  def run():
    s = agt.init(params, cfg)
    for _ in range(cfg.n_epochs):
      for i in sched:
        s = step(s, X[i], y[i])
    return s
  state = run()
  t, c = median_times(run, reps)
  out = {}
  for method in ("interval", "crown"):
    fb = bnd.forward_bounds_fn(mlp.apply, "mlp", cfg.matmul, method)(state.bounds, Xt)
    out[f"logit_width_{method}"] = float(jnp.mean(fb.upper - fb.lower))
    out[f"certified_{method}"] = float(np.mean(agt.certify(
        mlp.apply, state.params, state.bounds, Xt, bound_method=method)))
  from boundjax.core.interval import Interval
  ivs = jax.tree_util.tree_leaves(state.bounds, is_leaf=lambda v: isinstance(v, Interval))
  rec = {"task": "blobs separable, 6-128-2 ReLU, 20,000 points, batch 5,000, 4 epochs, "
                 + ("k_poison=10, epsilon=0.01, " if poison else "k=10, ")
                 + "gamma=0.06, alpha 2.0, eta 0.6, float32, matmul midrad (public: rump)",
         "public_agt": "not run: abstract-gradient-training is not installable here (no "
                       "distribution on the reachable index; it also needs gurobipy)",
         "ours_4_epochs_s": t, "ours_4_epochs_cpu_s": c,
         "param_box_width_mean": float(np.mean(np.concatenate(
             [np.ravel(iv.upper - iv.lower) for iv in ivs]))), **out,
         "data": "results/agt_public_task.npz (x, y, x_test, kernel0, bias0, kernel1, bias1)"}
  print(rec, flush=True)
  return rec


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
        cfg = agt.Config(n_epochs=3, batch_size=400, k_private=k, fragsize=128, sound=True,
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


def memory_floor(reps: int) -> dict:
  """The per-sample memory floor of one AGT step on Fashion 128-32-1 (full batch), measured.

  Bytes a step must move at least: the three per-sample arrays (nominal gradient, lower and
  upper bound, ``3 b P`` float32 values) written once and read once by the sums and the top-k
  selection. Bandwidth: the best of ``reps`` copies of a ``b P`` float32 array into a
  preallocated one (``numpy.copyto``, read + write), and the same pass as one jitted XLA
  element-wise map (what XLA's CPU back-end sustains for a fresh output). The step of the
  setting of ``benchmarks/agt_privacy.py`` (k = 10) is timed in the same process; the ratio
  step / floor is the remaining gap.
  """
  import sys
  sys.path.insert(0, str(pathlib.Path(__file__).parent))
  import agt_privacy
  s = agt_privacy.setting("fashion")
  cfg = dataclasses.replace(s["cfg"], k_private=10)
  X, y = jnp.asarray(s["X"]), jnp.asarray(s["y"])
  batch = cfg.batch_size
  params = mlp.init(jax.random.PRNGKey(0), s["sizes"])
  n_params = sum(int(np.size(v)) for v in jax.tree_util.tree_leaves(params))
  values = batch * n_params
  src = np.random.default_rng(0).random(values, dtype=np.float32)
  dst = np.empty_like(src)
  copy = min(_wall(lambda: np.copyto(dst, src)) for _ in range(reps))
  fn = jax.jit(lambda x: x * 1.0001 + 0.5)
  x = jnp.asarray(src)
  fn(x).block_until_ready()
  xla = min(_wall(lambda: fn(x).block_until_ready()) for _ in range(reps))
  moved = 2 * 3 * values * 4                     # 3 b P float32 values, written and read once
  step = jax.jit(agt.make_step(mlp.apply, cfg, "mlp"))
  state = agt.init(params, cfg)
  xb, yb = X[:batch], y[:batch]
  jax.block_until_ready(step(state, xb, yb))
  step_s = min(_wall(lambda: jax.block_until_ready(step(state, xb, yb))) for _ in range(reps))
  bw_copy = 2 * values * 4 / copy
  bw_xla = 2 * values * 4 / xla
  return {"setting": f"fashion {'-'.join(map(str, s['sizes']))} b={batch}, k=10, "
                     f"fragsize {cfg.fragsize}, sound={cfg.sound}",
          "n_params": n_params, "bytes_per_step_floor": moved,
          "bandwidth_copy_gb_s": bw_copy / 1e9, "bandwidth_xla_elementwise_gb_s": bw_xla / 1e9,
          "floor_ms_at_copy_bandwidth": 1e3 * moved / bw_copy,
          "floor_ms_at_xla_bandwidth": 1e3 * moved / bw_xla,
          "step_ms": 1e3 * step_s,
          "step_over_floor_copy": step_s / (moved / bw_copy),
          "step_over_floor_xla": step_s / (moved / bw_xla)}


def public_floor(reps: int) -> dict:
  """The floor of the public task's 4 epochs (both rows, `public_task`), measured on this machine.

  Work of one step's per-sample bounds (the two stages of every fragment: nominal clipped
  gradients and their interval bounds, clipped; for poisoning also the bounds over the input
  box), counted by XLA's cost analysis of the compiled stages (every element-wise operation is
  one flop), against the best GEMM throughput (a jitted 1024 x 1024 float32 product, 2 n^3
  flops); and the bytes the streaming bound must move at least, each of its per-sample arrays
  (privacy: nominal, lower, upper; poisoning: nominal and the clean and poisoned lower and
  upper bounds, b x #params float32 each) written once and read once, against the copy
  bandwidth (``numpy.copyto`` of 64 MB, read + write). Neither floor counts the top-k merge.
  """
  from boundjax.agt import poisoning
  from boundjax.core.interval import Interval
  n = 1024
  a = jnp.asarray(np.random.default_rng(0).random((n, n), dtype=np.float32))
  mm = jax.jit(lambda a: a @ a)
  mm(a).block_until_ready()
  gemm = 2 * n ** 3 / min(_wall(lambda: mm(a).block_until_ready()) for _ in range(max(reps, 5)))
  src = np.random.default_rng(0).random(16 * 2 ** 20, dtype=np.float32)
  dst = np.empty_like(src)
  copy = 2 * src.nbytes / min(_wall(lambda: np.copyto(dst, src)) for _ in range(max(reps, 5)))
  params = mlp.init(jax.random.PRNGKey(0), [6, 128, 2])
  n_params = sum(int(np.size(v)) for v in jax.tree_util.tree_leaves(params))
  box = jax.tree_util.tree_map(lambda w: Interval(w - 1e-3, w + 1e-3, validate=False), params)
  b, f, steps = 5000, 1000, 16
  x = jnp.asarray(np.random.default_rng(0).normal(size=(f, 6)), jnp.float32)
  y = jnp.zeros((f,), jnp.int32)
  out = {"gemm_gflop_s": gemm / 1e9, "copy_gb_s": copy / 1e9, "n_params": n_params,
         "batch": b, "fragment": f, "steps": steps, "rows": []}
  for poison in (False, True):
    cfg = agt.Config(n_epochs=4, learning_rate=2.0, batch_size=b, loss="cross_entropy",
                     k_private=10, clip_gamma=0.06, lr_decay=0.6, lr_min=1e-3, fragsize=f)
    if poison:
      cfg = dataclasses.replace(cfg, k_private=0, k_poison=10, epsilon=0.01)
      gfn = lambda p, x, y: mlp.per_sample_grads(p, x, y, cfg.loss)  # noqa: E731
      first, second = poisoning.mlp_stages(cfg, gfn, params, box)
      fn, arrays = (lambda x, y: second(first(x, y))), 5
    else:
      def fn(x, y):
        g = descent.clip(mlp.per_sample_grads(params, x, y, cfg.loss), cfg.gamma)
        return g, descent.clip(mlp.grad_bounds(box, x, y, cfg.loss, cfg.matmul), cfg.gamma)
      arrays = 3
    ca = jax.jit(fn).lower(x, y).compile().cost_analysis()
    ca = ca[0] if isinstance(ca, list) else ca
    flops = float(ca["flops"]) * (b // f) * steps
    moved = 2 * arrays * b * n_params * 4 * steps
    out["rows"].append({"row": "poisoning" if poison else "privacy", "arrays_per_sample": arrays,
                        "flops_4_epochs": flops, "compute_floor_s": flops / gemm,
                        "bytes_4_epochs": moved, "memory_floor_s": moved / copy})
  print(json.dumps(out, indent=1), flush=True)
  return out


def _wall(fn) -> float:
  t = time.perf_counter()
  fn()
  return time.perf_counter() - t


def main():
  global RESULTS
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--quick", action="store_true", help="full-batch settings only")
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--soundness", action="store_true")
  ap.add_argument("--profile", action="store_true", help="per-fragment breakdown of one step")
  ap.add_argument("--public-task", action="store_true",
                  help="our side of the public-AGT comparison task (module docstring)")
  ap.add_argument("--poison", action="store_true",
                  help="with --public-task: the poisoning row (k_poison=10, epsilon=0.01)")
  ap.add_argument("--public-floor", action="store_true",
                  help="FLOP and bandwidth floors of the public task's two rows")
  ap.add_argument("--floor", action="store_true",
                  help="the per-sample memory floor of a Fashion step against the step's time")
  ap.add_argument("--with-profile", action="store_true",
                  help="with the cost table: also the per-fragment breakdown (--profile)")
  ap.add_argument("--n-sets", type=int, default=64)
  ap.add_argument("--results", default=str(RESULTS), help="folder of the JSONs")
  a = ap.parse_args()
  RESULTS = pathlib.Path(a.results)
  RESULTS.mkdir(parents=True, exist_ok=True)
  if a.profile:
    profile(a.reps)
    return
  if a.floor:
    res = {"provenance": record(), **memory_floor(max(a.reps, 3))}
    print(json.dumps(res, indent=1))
    (RESULTS / "agt_memory_floor.json").write_text(json.dumps(res, indent=1))
    return
  if a.public_floor:
    res = {"provenance": record(), **public_floor(a.reps)}
    (RESULTS / "agt_public_floor.json").write_text(json.dumps(res, indent=1))
    return
  if a.public_task:
    res = {"provenance": record(), **public_task(a.reps, a.poison)}
    name = "agt_public_poison.json" if a.poison else "agt_public.json"
    (RESULTS / name).write_text(json.dumps(res, indent=1))
    return
  if a.soundness:
    res = {"provenance": record(), **soundness(a.n_sets)}
    (RESULTS / "agt_soundness.json").write_text(json.dumps(res, indent=1))
    return
  res = {"provenance": record(), **cost(a.quick, a.reps)}
  res["memory_vs_batch"] = memory_vs_batch()
  res["load_average_after"] = list(__import__("os").getloadavg())
  (RESULTS / "agt_cost.json").write_text(json.dumps(res, indent=1))
  if a.with_profile:   # the CROWN timing of the Amazon shape needs ~15 GB
    res["profile"] = profile(a.reps)
    (RESULTS / "agt_cost.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
  main()

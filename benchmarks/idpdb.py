"""LUCID Table 1 / Table 4 on Adult: the iDP deterministic bound beta_c by branch-and-bound.

Steps (LUCID, §2, §6.1 and §7):

1. **Family.** Adult with LUCID's 21-feature encoding (`boundjax.data.load_adult("sphynx")`,
   LUCID, App. B), an MLP (``--hidden``, default 2x50, 2 logits) or LUCID's CNN (``--hidden
   conv``: `boundjax.models.Conv1dNet`, read into the MILP through `milp.network.from_flax`,
   each convolution as its dense matrix; trained without LUCID's dropout 0.1, as
   `ensembles.train_ensemble` has none) trained as LUCID trains: SGD
   lr 0.1, weight decay 1e-5, batch 1024, ``--epochs`` (LUCID's code: 30; the paper says 50),
   the same init (seed ``--seed``, LUCID's 666) and the same shuffles for every member, the
   removed point masked out of its batch (`boundjax.ensembles.train_ensemble`). The full family has
   |D| + 1 = 32,562 networks (~3 CPU-hours here); by default we train N and a **random subset**
   of ``--members`` leave-one-out networks (the first entries of a seeded permutation of D).
   beta is then sound for *that subset's family*, not for all of D: this is said in the JSON
   (``family``) and in the printout. The trained N and members are saved (npz, gitignored) to
   ``--family-npz`` so other benchmarks (the guarded predictor's accuracy table) reuse them.
2. **beta per class.** `milp.idpdb.lucid_compute` with MD and RiS (tau 0.01), node limit
   ``--node-time-limit``, total limit ``--time-limit`` per class: beta, exact flag, time to reach
   the final bound, the anytime curve, number of MILPs, and two lower bounds on beta*: the best
   confirmed leaking confidence among MILP incumbents (``lower``) and from a projected-gradient
   search (`--attack-starts`, `milp.idpdb.attack`, ``attack_lower``): beta* lies in
   [max(lower, attack_lower), beta].
3. **Ablation** (LUCID, §7, Table 4) on the first ``--ablation-members`` members, every variant
   with the same limits: ``--ablation-node-time-limit`` per MILP (10 s) and
   ``--ablation-time-limit`` per class (100 s = 10 members x 10 s, so Naive can reach every
   member): H (one hyper-network MILP), HM (+ matching dependencies), HMRiS (+ relax-if-similar),
   HMB (HM + branch-and-bound), LUCID (all four), and Naive (per-member MILPs, exact when it
   finishes). The table says, per variant, how many MILPs ran and how many were solved to
   optimality (Naive: members reached and solved); Naive's β is a bound only when it reached
   every member.

    python benchmarks/idpdb.py                              # defaults, ~15 min on 2 cores
    python benchmarks/idpdb.py --attack-starts 2048 --attack-steps 400   # the stored JSON
    python benchmarks/idpdb.py --members 0 --train-processes 2 --time-limit 480 \\
        --node-time-limit 240 --ablation-members 0 --attack-starts 256 --attack-steps 200 \\
        --family-npz benchmarks/results/idpdb_adult_2x50_full_family.npz \\
        --classes 0 --out benchmarks/results/idpdb_adult_2x50_full_c0.json
        # all 32,562 networks (~2.2 h of training on two idle cores, resumable), then LUCID's
        # k-means branch-and-bound for class 0; the same with --classes 1 (..._c1.json)
    python benchmarks/idpdb.py --members 0 --time-limit 3600 --node-time-limit 6 --screen \
        --retry-singletons --tightening lp-net --ablation-members 0 --attack-starts 256 \
        --attack-steps 200 --attack-members 512 \
        --family-npz benchmarks/results/idpdb_adult_2x50_full_family.npz \
        --classes 0 --out benchmarks/results/idpdb_adult_2x50_full_screen_c0.json
        # the target run on the trained family: screening + peeled singleton MILPs, one hour;
        # the same with --classes 1 (..._screen_c1.json) in a second process (one core each)
    python benchmarks/idpdb.py --members 200 --time-limit 1 --node-time-limit 1 --classes 0 \
        --attack-starts 0 --ablation-members 10 \
        --out benchmarks/results/idpdb_ablation_adult_2x50.json
        # the ablation with the Screen variant, on the first 10 cached members (~15 min)
    python benchmarks/idpdb.py --hidden 100,100 --out benchmarks/results/idpdb_adult_2x100.json
    python benchmarks/idpdb.py --hidden conv --out benchmarks/results/idpdb_adult_conv.json
        # LUCID's CNN (Tables 1 and 4 on Adult conv): N + 200 members, then the ablation
    python benchmarks/idpdb.py --tighten --members 20 --time-limit 90 --node-time-limit 30
        # tighten="none" vs "lp" side by side on the cached family (no ablation, no attack):
        # benchmarks/results/idpdb_tighten_adult_2x50.json

Whole family (32,562 networks; the two classes in parallel, one core each). LUCID's k-means
branch-and-bound from the root hyper-network, 480 s per class: beta = 0.903 / 0.982 (2 MILPs
each, all timed out): the box over 32k members forgets which parameters move together.
Screening every member alone by its difference intervals (``--screen``; 20 s per class for all
32,561 members) gives 0.396 / 0.393 at once; peeling the members of largest bound off as 6 s
singleton MILPs, retried with doubled time when one is on top, reaches **0.262 / 0.280 in one
hour** (475 / 379 MILPs; paper 0.55 / 0.63 in 2.9 / 3.0 h on 32 workers with Gurobi).

Tightening (``--tighten``, 20 members, 90 s per class, 30 s per MILP, shared 2-core CPU): LP
tightening halves the mean width of N's second layer (5.03 -> 2.78) and logits (23.4 -> 12.5)
but no neuron becomes stable (the first layer's 50 neurons are all unstable *exactly*: interval
bounds of one affine map of [0, 1]^21 are tight), so every MILP still times out; the root bound
drops about 3% (0.331 -> 0.322, 0.335 -> 0.325) and the final beta moves by the noise of the
time-limited search (0.287 -> 0.252, 0.275 -> 0.279). Not a clear win: the default stays "none".

One AGT run instead of training the family (``--agt-enclosure``): AGT's removal-only rule with
k = 1 on LUCID's exact schedule provably encloses every leave-one-out network (checked against
real families in tests/test_agt_unlearning.py), but on Adult 2x50 at lr 0.1 the interval box
grows x2.33 per step and overflows at step 19 of 960 (idpdb_agt_enclosure_adult_2x50.json),
while the 200 trained members spread by only 3.1e-4 per parameter after all 960 steps: interval
arithmetic loses the correlation between a sample's gradient and the shared parameters. The
full family has to be trained (``--members 0``: ~3.2 h on two idle cores here, 0.36 s per
network; chunks are checkpointed, so the run resumes where it stopped).

Timings are CPU wall-clock on a shared 2-core machine (LUCID: 32 workers, Gurobi, 8 h limit).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import pathlib
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from boundjax import ensembles  # noqa: E402
from boundjax.data import load_adult  # noqa: E402
from boundjax.models import MLP, Conv1dNet  # noqa: E402
from milp import idpdb  # noqa: E402
from milp import network as net_lib  # noqa: E402
from milp.ldcp import family_from_stacked  # noqa: E402
from common import record  # noqa: E402

PAPER = {"2x50": dict(beta0=0.55, T0_h=2.9, beta1=0.63, T1_h=3.0, acc=83.1),
         "2x100": dict(beta0=0.93, T0_h=4.3, beta1=0.91, T1_h=4.1, acc=83.3),
         "conv": dict(beta0=0.29, T0_h=0.2, beta1=0.52, T1_h=0.1, acc=79.2)}


def parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--hidden", default="50,50",
                 help="hidden widths, e.g. 50,50 or 100,100; or 'conv' for LUCID's CNN "
                      "(boundjax.models.Conv1dNet: two 1x3 convolutions of 6 channels, then "
                      "Dense 2, ReLU, Dense 2)")
  p.add_argument("--members", type=int, default=200,
                 help="leave-one-out networks trained (random subset of D; 0 = all of D)")
  p.add_argument("--epochs", type=int, default=30)
  p.add_argument("--seed", type=int, default=666)
  p.add_argument("--time-limit", type=float, default=240.0, help="seconds per class (BaB)")
  p.add_argument("--classes", default="0,1",
                 help="classes to bound, e.g. 0 or 1 (one process per class halves the wall time)")
  p.add_argument("--node-time-limit", type=float, default=60.0, help="seconds per MILP")
  p.add_argument("--tau", type=float, default=0.01)
  p.add_argument("--bounds", default="ibp", choices=("ibp", "crown"))
  p.add_argument("--solver", default="highs", choices=("highs", "scip"))
  p.add_argument("--workers", type=int, default=1)
  p.add_argument("--executor", default="process", choices=("serial", "process", "ray"),
                 help="runs the MILPs (--workers) and the training processes (--train-processes)")
  p.add_argument("--max-k", type=int, default=2,
                 help="cap on the elbow k (LUCID's code: 2; 0 = no cap, the pure elbow)")
  p.add_argument("--attack-starts", type=int, default=1024, help="PGD starts (0 skips it)")
  p.add_argument("--attack-steps", type=int, default=300)
  p.add_argument("--attack-members", type=int, default=1024,
                 help="members inside the PGD search (a seeded subset when the family is larger; "
                      "the float64 replay checks every member)")
  p.add_argument("--ablation-members", type=int, default=10, help="0 skips the ablation")
  p.add_argument("--ablation-time-limit", type=float, default=100.0,
                 help="seconds per class and variant, the same for every variant")
  p.add_argument("--ablation-node-time-limit", type=float, default=10.0,
                 help="seconds per MILP, the same for every variant (Naive: per member)")
  p.add_argument("--screen", action="store_true",
                 help="screen every member by its difference bound first, then peel the largest "
                      "off as singleton MILPs (IdpDbConfig.screen) instead of LUCID's k-means")
  p.add_argument("--retry-singletons", action="store_true",
                 help="solve a timed-out singleton on top of the queue again with twice the time")
  p.add_argument("--tightening", default="none", choices=idpdb.TIGHTEN_MODES,
                 help="IdpDbConfig.tighten for the main run (lp-net: LP on N once)")
  p.add_argument("--tighten", action="store_true",
                 help="only compare IdpDbConfig.tighten 'none' vs 'lp' (--tighten-modes) on the first "
                      "--members members of the cached family; writes idpdb_tighten_adult_<arch>.json")
  p.add_argument("--tighten-modes", default="none,lp", help="modes compared with --tighten")
  p.add_argument("--agt-enclosure", action="store_true",
                 help="only try to enclose the whole leave-one-out family by one AGT run (removal-"
                      "only, k=1, LUCID's schedule); writes idpdb_agt_enclosure_adult_<arch>.json")
  p.add_argument("--train-processes", type=int, default=1,
                 help="train the family in this many single-threaded worker processes run by "
                      "--executor (train_ensemble(workers=...); one per core: ~1.4x the "
                      "networks per second of one process on 2 cores)")
  p.add_argument("--checkpoint-dir", default=os.path.expanduser("~/.cache/boundjax/idpdb"))
  p.add_argument("--family-npz", default=None,
                 help="where N + members are saved (default benchmarks/results/"
                      "idpdb_adult_<arch>_family.npz, gitignored)")
  p.add_argument("--out", default=None,
                 help="JSON path (default benchmarks/results/idpdb_adult_<arch>.json)")
  a = p.parse_args(argv)
  a.argv = list(sys.argv[1:] if argv is None else argv)
  a.conv = a.hidden.strip() == "conv"
  if a.conv and (a.tighten or a.agt_enclosure):
    p.error("--tighten and --agt-enclosure take an MLP (--hidden widths), not --hidden conv")
  try:
    a.hidden_t = None if a.conv else tuple(int(h) for h in a.hidden.split(","))
  except ValueError:
    p.error(f"--hidden {a.hidden!r}: give comma-separated widths (e.g. 50,50) or 'conv'")
  a.arch = "conv" if a.conv else "x".join([str(len(a.hidden_t)), str(a.hidden_t[0])]) \
      if len(set(a.hidden_t)) == 1 else "-".join(map(str, a.hidden_t))
  a.family_npz = a.family_npz or f"benchmarks/results/idpdb_adult_{a.arch}_family.npz"
  a.out = a.out or (f"benchmarks/results/idpdb_tighten_adult_{a.arch}.json" if a.tighten
                    else f"benchmarks/results/idpdb_agt_enclosure_adult_{a.arch}.json"
                    if a.agt_enclosure else f"benchmarks/results/idpdb_adult_{a.arch}.json")
  a.family_npz_path = _rooted(a.family_npz)
  return a


CHUNK = 128   # members per compiled program (part of the checkpoint's settings)


def train_family(ds, a):
  """N and the leave-one-out members (``--members``), trained by `ensembles.train_ensemble`
  in ``--train-processes`` worker processes (``--executor``), resumable from the checkpoint."""
  n, d = ds.x_train.shape
  model = architecture(a)
  init = model.init(jax.random.PRNGKey(a.seed), jnp.zeros((1, d)))
  order = np.random.default_rng(a.seed).permutation(n)
  k = n if a.members <= 0 else min(a.members, n)
  idx = np.sort(order[:k])
  removed = ensembles.leave_k_out(idx)
  ckpt = pathlib.Path(a.checkpoint_dir) / f"{a.arch}_s{a.seed}_e{a.epochs}_m{k}"
  timing = ckpt / "train_seconds.json"
  t0 = time.perf_counter()
  ens = ensembles.train_ensemble(
      model, init, functools.partial(ensembles.sgd, 0.1, weight_decay=1e-5), ds.x_train,
      ds.y_train, removed, epochs=a.epochs, batch_size=1024, seed=a.seed,
      loss_fn=ensembles.softmax_cross_entropy, chunk_size=CHUNK, checkpoint_dir=ckpt,
      workers=a.train_processes, executor=a.executor)
  train_s = time.perf_counter() - t0
  if timing.exists():   # a resumed run: the seconds (and a note) recorded when it completed
    train_s = json.loads(timing.read_text())
  else:
    timing.write_text(json.dumps({"seconds": train_s}))
    train_s = {"seconds": train_s}
  ens.save(a.family_npz_path)
  return model, ens, idx, train_s


def architecture(a):
  """The Flax model of ``--hidden``: `MLP` of those widths, or LUCID's CNN (`Conv1dNet`)."""
  return Conv1dNet(channels=6, out=2) if a.conv else MLP(hidden=a.hidden_t, out=2)


def networks(model, ens, d: int):
  """N and the family of members as `milp` objects: an MLP's layers are read directly; the
  CNN's through `milp.network.from_flax` (each convolution as its dense matrix, replayed
  against ``model.apply``)."""
  members = jax.tree_util.tree_map(lambda x: np.asarray(x)[1:], ens.params)
  if isinstance(model, MLP):
    return net_lib.from_params(ens.full), family_from_stacked(members)
  net = net_lib.from_flax(model, ens.full, (d,), sparse_threshold=0.0)
  return net, idpdb.as_family(members, net.output, model=model, input_shape=(d,))


def time_to_final(res: idpdb.IdpDbResult) -> float:
  """Seconds until the anytime bound first reached its final value."""
  for t, b in res.anytime:
    if b <= res.beta:
      return t
  return res.seconds


def class_record(res: idpdb.IdpDbResult, conf_test: np.ndarray, pred: np.ndarray) -> dict:
  c = res.label
  mine = pred == c
  noised = float(np.mean(conf_test[mine] <= res.beta)) if mine.any() else 0.0
  return dict(beta=idpdb.json_float(res.beta), exact=res.exact, timed_out=res.timed_out,
              lower=idpdb.json_float(res.lower), lower_member=res.lower_member,
              n_milps=res.n_milps, seconds=res.seconds, time_to_final_s=time_to_final(res),
              anytime=[(t, idpdb.json_float(b)) for t, b in res.anytime],
              noised_fraction_of_predicted=noised, screen=res.screen_summary(),
              tree=[r.as_dict() for r in res.tree])


def ablation(net, fam, a) -> dict:
  base = idpdb.IdpDbConfig(tau=a.tau, bounds=a.bounds, solver=a.solver,
                           node_time_limit=a.ablation_node_time_limit,
                           total_time_limit=a.ablation_time_limit, workers=a.workers,
                           executor=a.executor, max_k=a.max_k or None)
  off = dict(matching=False, matching_pre=False, relax=False)
  variants = {
      "H": dataclasses.replace(base, **off),
      "HM": dataclasses.replace(base, relax=False),
      "HMRiS": base,
      "HMB": dataclasses.replace(base, relax=False),
      "LUCID": base,
      "Screen": dataclasses.replace(base, screen=True),   # ours: member screening + peeling
  }
  out = {}
  all_rows = np.arange(fam.size)
  for c in (0, 1):
    rows = {}
    for name, cfg in variants.items():
      if name in ("H", "HM", "HMRiS"):  # one hyper-network MILP over the whole family
        r = idpdb.node_bound(net, idpdb.hyper_of(fam, all_rows), c, cfg)
        rows[name] = dict(beta=idpdb.json_float(r.upper), seconds=r.seconds, n_milps=1,
                          n_optimal=int(r.optimal), exact=False, status=r.status,
                          n_binaries=r.n_binaries, n_relaxed=r.n_relaxed)
      else:
        r = idpdb.lucid_compute(net, fam, c, cfg, progress=False)
        rows[name] = dict(beta=idpdb.json_float(r.beta), seconds=r.seconds, n_milps=r.n_milps,
                          n_optimal=sum(bool(t.optimal) for t in r.tree), exact=r.exact,
                          timed_out=r.timed_out)
      print(f"  ablation class {c} {name:6s} beta={rows[name]['beta']} "
            f"({rows[name]['seconds']:.1f} s)", flush=True)
    nv = idpdb.naive_compute(net, fam, c, dataclasses.replace(
        base, total_time_limit=a.ablation_time_limit))
    rows["Naive"] = dict(beta=idpdb.json_float(nv.beta) if nv.complete else None,
                         seconds=nv.seconds, n_milps=nv.n_milps,
                         n_optimal=sum(bool(t.optimal) for t in nv.nodes), exact=nv.exact,
                         complete=nv.complete, members_done=int(np.sum(~np.isnan(nv.per_member))),
                         members=int(fam.size))
    print(f"  ablation class {c} Naive  beta={rows['Naive']['beta']} "
          f"({nv.seconds:.1f} s, {rows['Naive']['members_done']}/{fam.size} members)", flush=True)
    out[str(c)] = rows
  return out


def tighten_comparison(a) -> None:
  """``tighten`` modes side by side in one process on the first ``--members`` members of the
  default run's family (``--family-npz``; trained first, or loaded from its checkpoint, when
  the file is missing: it is not committed)."""
  from boundjax.ensembles import Ensemble
  from milp import bounds as bounds_lib
  if not a.family_npz_path.exists():  # the default run's family (its members, resumable)
    print(f"{a.family_npz} missing: training the default family first", flush=True)
    train_family(load_adult("sphynx"), argparse.Namespace(
        **{**vars(a), "members": parse([]).members}))
  ens = Ensemble.load(a.family_npz_path)
  net = net_lib.from_params(ens.full)
  k = min(a.members, ens.n_members - 1) if a.members > 0 else ens.n_members - 1
  members = jax.tree_util.tree_map(lambda x: np.asarray(x)[1:1 + k], ens.params)
  fam = family_from_stacked(members)
  d = net.input_size
  lo, hi = np.zeros(d), np.ones(d)
  modes = [m.strip() for m in a.tighten_modes.split(",") if m.strip()]
  base = idpdb.IdpDbConfig(tau=a.tau, bounds=a.bounds, solver=a.solver,
                           node_time_limit=a.node_time_limit, total_time_limit=a.time_limit,
                           workers=a.workers, executor=a.executor, max_k=a.max_k or None)
  print(f"Adult {a.arch}: tighten {modes} on the first {fam.size} leave-one-out members, "
        f"{a.time_limit:.0f} s per class, {a.node_time_limit:.0f} s per MILP.", flush=True)
  rows = {}
  for mode in modes:
    cfg = dataclasses.replace(base, tighten=mode)
    t0 = time.perf_counter()
    ref = idpdb.tighten_net(net, lo, hi, cfg)
    t_net = time.perf_counter() - t0
    root = idpdb.hyper_of(fam, np.arange(fam.size))
    t0 = time.perf_counter()
    diff = idpdb.tighten_hyper(net, root, lo, hi, ref, cfg)
    t_root = time.perf_counter() - t0
    width = lambda bs: [float(np.mean(U - L)) for L, U in bs]
    rec = dict(config=dataclasses.asdict(cfg),
               net=dict(unstable=bounds_lib.count_unstable(ref), mean_width=width(ref),
                        tighten_s=t_net),
               root_hyper=dict(unstable=bounds_lib.count_unstable(diff.hyper),
                               mean_width=width(diff.hyper), tighten_s=t_root,
                               post_diff_mean_width=[float(np.mean(w)) for w in diff.widths()]),
               classes={})
    for c in (0, 1):
      res = idpdb.lucid_compute(net, fam, c, cfg, progress=True)
      solved = [r for r in res.tree if r.solved]
      rec["classes"][str(c)] = dict(
          beta=idpdb.json_float(res.beta), exact=res.exact, timed_out=res.timed_out,
          lower=idpdb.json_float(res.lower), n_milps=res.n_milps, seconds=res.seconds,
          optimal_milps=sum(r.optimal for r in solved),
          milp_seconds=float(sum(r.seconds for r in solved)),
          tighten_seconds=float(sum(r.tighten_seconds for r in solved)) + res.tighten_seconds_net,
          root_bound=idpdb.json_float(res.tree[0].milp_bound),
          root_status=res.tree[0].status, root_binaries=res.tree[0].n_binaries,
          root_unstable=res.tree[0].n_unstable,
          anytime=[(t, idpdb.json_float(b)) for t, b in res.anytime])
      print(f"  tighten={mode} class {c}: beta={res.beta:.4f} milps={res.n_milps} "
            f"({res.seconds:.1f} s)", flush=True)
    rows[mode] = rec
  out = dict(benchmark="idpdb tighten comparison (LUCID, §6.2, Adult)",
             args={k_: v for k_, v in vars(a).items() if k_ not in ("hidden_t", "family_npz_path")},
             members=fam.size, family_npz=str(a.family_npz),
             family_note=f"the first {fam.size} members of the cached family (N = row 0)",
             modes=rows,
             ratio_beta={c: _ratio(rows, modes, c) for c in ("0", "1")})
  path = _write_json(a.out, out)
  print()
  print(f"{'tighten':>8} {'class':>5} {'beta':>9} {'root':>9} {'unst N':>7} {'unst N#':>8} "
        f"{'bins':>5} {'MILPs':>6} {'optimal':>8} {'MILP[s]':>8} {'tight[s]':>9} {'total[s]':>9}")
  for mode, rec in rows.items():
    for c, r in rec["classes"].items():
      print(f"{mode:>8} {c:>5} {_f(r['beta']):>9} {_f(r['root_bound']):>9} "
            f"{rec['net']['unstable']:>7} {rec['root_hyper']['unstable']:>8} "
            f"{r['root_binaries']:>5} {r['n_milps']:>6} {r['optimal_milps']:>8} "
            f"{r['milp_seconds']:>8.1f} {r['tighten_seconds']:>9.1f} {r['seconds']:>9.1f}")
  print(f"\nwrote {path}")


def agt_enclosure(a) -> None:
  """Can one AGT run replace training the family? (`boundjax.agt`, ``neighbourhood="remove"``.)

  A box holding every leave-one-out network would give a sound hyper-network for all of D
  without training 32,562 networks. AGT's removal-only rule with k = 1 on LUCID's exact
  schedule (`ensembles.batch_schedule`, weight decay as ``l2_reg``, the sound floating-point
  mode) encloses them (tests/test_agt_unlearning.py checks it against real families); this
  records how wide the box gets, step by step, on Adult.
  """
  from boundjax import agt
  ds = load_adult("sphynx")
  n, d = ds.x_train.shape
  model = MLP(hidden=a.hidden_t, out=2)
  init = model.init(jax.random.PRNGKey(a.seed), jnp.zeros((1, d)))
  sched = ensembles.batch_schedule(a.seed, n, a.epochs, 1024)
  cfg = agt.Config(n_epochs=a.epochs, learning_rate=0.1, batch_size=1024, loss="cross_entropy",
                   k_private=1, neighbourhood="remove", l2_reg=1e-5, sound=True,
                   fragsize=1024)
  step = jax.jit(agt.make_step(model.apply, cfg, "mlp"))
  state = agt.init(init, cfg)
  x, y = jnp.asarray(ds.x_train), jnp.asarray(ds.y_train)
  is_iv = lambda v: hasattr(v, "lower")  # noqa: E731
  widths, t0 = [], time.perf_counter()
  for i, row in enumerate(sched):
    row = row[row >= 0]
    state = step(state, x[row], y[row])
    leaves = jax.tree_util.tree_leaves(state.bounds, is_leaf=is_iv)
    w = float(np.mean(np.concatenate([np.ravel(l.upper - l.lower) for l in leaves])))
    widths.append(w)
    print(f"  step {i:4d}: mean parameter width {w:.3e}", flush=True)
    if not np.isfinite(w):
      break
  finite = [w for w in widths if np.isfinite(w)]
  growth = float(np.exp(np.mean(np.diff(np.log(finite[:12]))))) if len(finite) > 2 else None
  out = dict(benchmark="idpdb: one AGT run (removal-only, k=1) as the family's hyper-network",
             args={k_: v for k_, v in vars(a).items() if k_ not in ("hidden_t", "family_npz_path")},
             config=dataclasses.asdict(cfg), steps_total=int(len(sched)), steps_run=len(widths),
             first_non_finite_step=None if len(finite) == len(widths) else len(finite),
             mean_width_per_step=[idpdb.json_float(w) for w in widths],
             growth_per_step=growth, seconds=time.perf_counter() - t0)
  path = _write_json(a.out, out)
  print(f"\n{len(widths)} of {len(sched)} steps; width grows x{growth:.2f} per step; "
        f"first non-finite step: {out['first_non_finite_step']}\nwrote {path}")


def _ratio(rows, modes, c):
  if len(modes) < 2:
    return None
  b0, b1 = rows[modes[0]]["classes"][c]["beta"], rows[modes[-1]]["classes"][c]["beta"]
  if isinstance(b0, float) and isinstance(b1, float) and b0 != 0:
    return b1 / b0
  return None


def main(argv=None):
  a = parse(argv)
  if a.tighten:
    tighten_comparison(a)
    return
  if a.agt_enclosure:
    agt_enclosure(a)
    return
  t_all = time.perf_counter()
  ds = load_adult("sphynx")
  n, d = ds.x_train.shape
  model, ens, idx, train_s = train_family(ds, a)
  t0 = time.perf_counter()
  net, fam = networks(model, ens, d)
  print(f"N and {fam.size} members as MILP networks in {time.perf_counter() - t0:.1f} s",
        flush=True)
  logits = net_lib.forward_batch(net, ds.x_test)
  pred = logits.argmax(1)
  acc = float(np.mean(pred == ds.y_test))
  conf_test = np.where(pred == 1, logits[:, 1] - logits[:, 0], logits[:, 0] - logits[:, 1])
  subset = fam.size < n
  family_note = (f"beta is sound for the family of N and {fam.size} leave-one-out networks (a "
                 f"random subset of the |D| = {n} points, seed {a.seed}), NOT for all of D"
                 if subset else f"all |D| = {n} leave-one-out networks")
  print(f"Adult {a.arch}: N test accuracy {acc:.4f}; {family_note}.", flush=True)

  cfg = idpdb.IdpDbConfig(tau=a.tau, bounds=a.bounds, solver=a.solver,
                          node_time_limit=a.node_time_limit, total_time_limit=a.time_limit,
                          workers=a.workers, executor=a.executor, max_k=a.max_k or None,
                          screen=a.screen, tighten=a.tightening,
                          retry_singletons=a.retry_singletons)
  classes = {}
  for c in (int(v) for v in a.classes.split(",")):
    t0 = time.perf_counter()
    att, att_member = -float("inf"), None
    if a.attack_starts > 0:
      found = idpdb.attack(net, fam, c, starts=a.attack_starts, steps=a.attack_steps,
                           key=jax.random.PRNGKey(a.seed),
                           search_members=a.attack_members or None)
      att, att_member = found.confidence, found.member
    att_s = time.perf_counter() - t0
    print(f"class {c}: attack lower bound {att:.4f} (member {att_member}, {att_s:.1f} s)",
          flush=True)
    res = idpdb.lucid_compute(net, fam, c, cfg, progress=True)
    classes[str(c)] = class_record(res, conf_test, pred)
    classes[str(c)].update(attack_lower=idpdb.json_float(att), attack_member=att_member,
                           attack_seconds=att_s)
    print(f"class {c}: beta={res.beta:.4f} exact={res.exact} timed_out={res.timed_out} "
          f"lower={res.lower:.4f} milps={res.n_milps} ({res.seconds:.1f} s)", flush=True)

  abl = None
  if a.ablation_members > 0:
    sub = fam.select(np.arange(min(a.ablation_members, fam.size)))
    print(f"ablation on the first {sub.size} members, {a.ablation_time_limit:.0f} s per class "
          "and variant:", flush=True)
    abl = dict(members=sub.size, time_limit_s=a.ablation_time_limit,
               node_time_limit_s=a.ablation_node_time_limit,
               limits="the same for every variant: node_time_limit_s per MILP (Naive: per "
                      "member), time_limit_s per class",
               classes=ablation(net, sub, a))

  out = dict(
      benchmark="idpdb (LUCID Table 1 / Table 4, Adult)",
      args={k: v for k, v in vars(a).items() if k not in ("hidden_t", "family_npz_path", "conv")},
      dataset=dict(name="adult", encoding="sphynx (21 features, LUCID, App. B)", n_train=n,
                   n_test=int(len(ds.x_test)), d=d),
      architecture=("LUCID's CNN (boundjax.models.Conv1dNet): Conv 1x3 1->6, ReLU, Conv 1x3 "
                    "6->6, ReLU, flatten (102), Dense 2, ReLU, Dense 2; no dropout (LUCID "
                    "trains with dropout 0.1)") if a.conv else f"MLP {d}-{a.hidden}-2",
      training=dict(optimizer="SGD lr 0.1, weight decay 1e-5", batch_size=1024,
                    epochs=a.epochs, seed=a.seed, init="PRNGKey(seed), PyTorch-style uniform",
                    removal="masked (LUCID train.py)", seconds=train_s["seconds"],
                    per_network_s=train_s["seconds"] / ens.n_members,
                    note=train_s.get("note")),
      family=dict(members=fam.size, removed_indices=idx.tolist() if subset else "all",
                  subset=subset,
                  note=family_note, family_npz=str(a.family_npz),
                  npz_layout="boundjax.ensembles.Ensemble.save: row 0 = N (removed -1), "
                             "row i = N without point removed[i]"),
      n=dict(test_accuracy=acc, params_npz=str(a.family_npz), row=0, seed=a.seed),
      config=dataclasses.asdict(cfg),
      betas={c: classes[c]["beta"] for c in classes},
      classes=classes,
      ablation=abl,
      paper=PAPER.get(a.arch),
      total_seconds=time.perf_counter() - t_all,
  )
  path = _write_json(a.out, out)

  print()
  print(f"{'class':>5} {'beta':>9} {'lower':>9} {'attack':>9} {'exact':>6} {'MILPs':>6} "
        f"{'t_final[s]':>10} {'total[s]':>9} {'noised%':>8} {'paper beta':>10}")
  for c, r in classes.items():
    pb = (PAPER.get(a.arch) or {}).get(f"beta{c}", float("nan"))
    print(f"{c:>5} {_f(r['beta']):>9} {_f(r['lower']):>9} {_f(r['attack_lower']):>9} "
          f"{str(r['exact']):>6} "
          f"{r['n_milps']:>6} {r['time_to_final_s']:>10.1f} {r['seconds']:>9.1f} "
          f"{100 * r['noised_fraction_of_predicted']:>8.2f} {pb:>10}")
  if abl:
    print(f"\nablation ({abl['members']} members; every variant {abl['node_time_limit_s']:.0f} s "
          f"per MILP, {abl['time_limit_s']:.0f} s per class): beta, seconds, MILPs solved "
          "optimally / run (Naive: members reached / all; '-' = incomplete, no bound)")
    names = list(abl["classes"]["0"])
    print(f"{'class':>5} {'variant':>7} {'beta':>9} {'s':>6} {'optimal/run':>12} {'members':>8}")
    for c, rows in abl["classes"].items():
      for nm in names:
        r = rows[nm]
        mem = f"{r['members_done']}/{r['members']}" if "members_done" in r else ""
        print(f"{c:>5} {nm:>7} {_f(r['beta']):>9} {r['seconds']:>6.0f} "
              f"{r['n_optimal']:>5}/{r['n_milps']:<6} {mem:>8}")
  print(f"\n{family_note}.\nwrote {path}")


def _write_json(p: str, out: dict) -> pathlib.Path:
  """Writes the benchmark record ``out`` to ``p`` (relative to the repository root)."""
  path = _rooted(p)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps({"provenance": record(), **out}, indent=1))
  return path


def _rooted(p: str) -> pathlib.Path:
  """A path given relative to the repository root (as stored in the JSON) made absolute."""
  q = pathlib.Path(p)
  return q if q.is_absolute() else ROOT / q


def _f(v) -> str:
  if v is None:
    return "-"
  return f"{v:.4f}" if isinstance(v, float) else str(v)


if __name__ == "__main__":
  main()

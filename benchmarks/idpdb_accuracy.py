"""LUCID Tables 1–3 on Adult 2×50: accuracy of the guarded label-only predictor against
Naive-Noise, Naive-iDP, DP-SGD and ALIBI, the fraction of noised queries and the guard's latency.

Setting (LUCID, §7 and Tables 1-3):

* **N.** Adult with the 21-feature encoding (`load_adult("sphynx")`), MLP 21-50-50-2 trained as
  LUCID trains it: SGD lr 0.1, weight decay 1e-5, batch 1024, 30 epochs (LUCID's code; the paper
  says 50), seed 666, PyTorch-style init. When ``benchmarks/results/idpdb_adult_2x50.json`` (from
  ``benchmarks/idpdb.py``) and its family ``.npz`` exist, N, the leave-one-out members and β are
  read from them, so the β used here is the one computed for exactly this N.
* **β.** From that JSON; otherwise computed here with `milp.idpdb` with ``--time-limit``
  seconds per class (a short, clearly labelled fallback whose anytime bound is sound but may be
  loose) on the family ``.npz`` of ``benchmarks/idpdb.py`` if present, else on N and
  ``--members`` leave-one-out networks trained here. Either way, β is sound for the family it
  was computed on: a random subset of D's leave-one-out networks unless all |D| were trained.
  The guard (and Naive-iDP) is iDP for D only over all of D's leave-one-out networks, so when
  the family is a subset the printed table labels the LUCID and Naive-iDP rows with it
  ("iDP over 200/32561 nets only").
* **Mechanisms.** LUCID's guard (ε-iDP) and Naive-Noise (ε-DP) at ε ∈ {0, 0.02, 0.2, 1},
  averaged over ``--repeats`` noise draws; Naive-iDP over the available members; ALIBI
  (ε-label-DP, Laplace randomised response with the Bayesian posterior, LUCID's optimiser and
  epochs) and DP-SGD ((ε, δ)-DP, δ = 1/n) at ε ∈ {0.02, 0.2, 1}.
* **ALIBI, tuned like DP-SGD.** As many grid points as DP-SGD's (DP-SGD's learning rates x 1 or
  2 rounds), chosen on a 20 % validation split of the training points by agreement with the
  argmax of their *noisy-label* posterior, then retrained on all points (`tune_alibi`). The
  labels are released once and everything after reads only that release and the public
  features, so the chosen model is still ε-label-DP. The untuned point (lr 0.1, 2 rounds) is
  kept as "ALIBI (no tuning)".
* **DP-SGD, like for like.** N's own budget: batch 1024 (expected), ``--dp-epochs`` = 30 epochs
  (N's), noise calibrated by dp-accounting's RDP accountant for exactly the sampling used:
  Poisson sampling (`boundjax.training.dpsgd.PoissonSchedule`), so the stated ε is a proven bound. A
  grid of G = |``--dp-grid-lr``| x |``--dp-grid-clip``| = 2 x 2 (learning rate x clip norm) is
  trained at every ε; the table gives the pre-declared default (lr 0.5, clip 1, no tuning: the
  stated (ε, δ) holds) and the best of the G runs by test accuracy. The selection is *not*
  private: the selected model is (Gε, Gδ)-DP by basic composition (Dwork & Roth 2014,
  Thm 3.16); a private selection à la Liu & Talwar 2019 (random stopping, Thm 3.4) costs ~3ε.
  The best-of-G row is labelled "(G eps, G delta)-DP" and is optimistic for DP-SGD. The
  paper's DP-SGD settings (epochs, lr, clip, δ) are not given (LUCID, §7).
* **Latency.** One ``guard.query`` per test input (200 inputs, after a warm-up), CPU.

    JAX_PLATFORMS=cpu python benchmarks/idpdb_accuracy.py          # ~20 min on 2 cores
    python benchmarks/idpdb_accuracy.py --beta 0.55,0.63           # β given by hand
    python benchmarks/idpdb_accuracy.py --beta 0.2622479162272933,0.2797131403793902 \
        --beta-note "whole family: idpdb_adult_2x50_full_screen_c0.json / _c1.json" \
        --out benchmarks/results/idpdb_accuracy_adult_2x50_full.json

    JAX_PLATFORMS=cpu python benchmarks/idpdb_accuracy.py --hidden conv
        # LUCID's CNN: N, members and beta from `benchmarks/idpdb.py --hidden conv`

Writes ``benchmarks/results/idpdb_accuracy_adult_2x50.json`` (``_conv.json``) and prints the table beside the
paper's (Table 1/2/3 Adult 2×50; headline: LUCID 1.4% decrease at ε = 0, DP baselines 12.7%).
"""

from __future__ import annotations

import argparse
import dataclasses
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

from boundjax import ensembles as E  # noqa: E402
from boundjax.data import load_adult  # noqa: E402
from boundjax.models import MLP, Conv1dNet  # noqa: E402
from boundjax.privacy import label_only as L  # noqa: E402
from dpsgd_tuning import train_point  # noqa: E402
from milp.idpdb import compute_betas  # noqa: E402
from common import record  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--hidden", default="50,50", choices=("50,50", "conv"),
                 help="N's network: the 2x50 MLP, or LUCID's CNN (boundjax.models.Conv1dNet; "
                      "its N, members and beta from `benchmarks/idpdb.py --hidden conv`)")
  p.add_argument("--idpdb-json", default=None,
                 help="default benchmarks/results/idpdb_adult_<2x50|conv>.json")
  p.add_argument("--beta", default=None, help="β per class by hand, e.g. 0.55,0.63")
  p.add_argument("--beta-note", default=None,
                 help="where the --beta values come from (written to the JSON's origin)")
  p.add_argument("--family-npz", default=None,
                 help="N + members from benchmarks/idpdb.py, used when its JSON is missing "
                      "(default benchmarks/results/idpdb_adult_<2x50|conv>_family.npz)")
  p.add_argument("--members", type=int, default=40,
                 help="fallback only: leave-one-out networks for β when no idpdb JSON exists")
  p.add_argument("--time-limit", type=float, default=120.0,
                 help="fallback only: seconds per class for milp.idpdb")
  p.add_argument("--epochs", type=int, default=30)
  p.add_argument("--seed", type=int, default=666)
  p.add_argument("--repeats", type=int, default=10)
  p.add_argument("--dp-epochs", type=int, default=30, help="DP-SGD epochs (N's 30 by default)")
  p.add_argument("--dp-lr", type=float, default=0.5, help="DP-SGD's pre-declared default lr")
  p.add_argument("--dp-clip", type=float, default=1.0, help="DP-SGD's pre-declared clip norm")
  p.add_argument("--dp-grid-lr", default="0.5,2.0", help="DP-SGD tuning grid: learning rates")
  p.add_argument("--dp-grid-clip", default="0.1,1.0", help="DP-SGD tuning grid: clip norms")
  p.add_argument("--alibi-iterations", type=int, default=2,
                 help="rounds of the untuned ALIBI row (lr 0.1)")
  p.add_argument("--alibi-grid-iterations", default="1,2",
                 help="ALIBI tuning grid: rounds (x DP-SGD's learning rates)")
  p.add_argument("--no-baselines", action="store_true", help="skip DP-SGD and ALIBI training")
  p.add_argument("--out", default=None,
                 help="default benchmarks/results/idpdb_accuracy_adult_<2x50|conv>.json")
  a = p.parse_args(argv)
  a.arch = "conv" if a.hidden == "conv" else "2x50"
  a.idpdb_json = a.idpdb_json or str(RESULTS / f"idpdb_adult_{a.arch}.json")
  a.family_npz = a.family_npz or str(RESULTS / f"idpdb_adult_{a.arch}_family.npz")
  a.out = a.out or str(RESULTS / f"idpdb_accuracy_adult_{a.arch}.json")
  return a


def architecture(a):
  """N's Flax model: the 2x50 MLP or LUCID's CNN (``--hidden conv``)."""
  return Conv1dNet(channels=6, out=2) if a.hidden == "conv" else MLP(hidden=(50, 50), out=2)


def load_or_train(ds, a):
  """N, members (stacked, may be None), β and where they came from."""
  model = architecture(a)
  init = model.init(jax.random.PRNGKey(a.seed), jnp.zeros((1, ds.x_train.shape[1])))
  src = pathlib.Path(a.idpdb_json)
  if src.exists():
    rec = json.loads(src.read_text())
    npz = pathlib.Path(rec["family"]["family_npz"])
    if not npz.is_absolute():
      npz = ROOT / npz
    if npz.exists():
      ens = E.Ensemble.load(npz)
      members = jax.tree_util.tree_map(lambda v: np.asarray(v)[1:], ens.params)
      raw = {int(c): float(b) for c, b in rec["betas"].items()}   # 'inf' strings too
      return model, init, ens.full, members, raw, dict(
          source=str(src.relative_to(ROOT)) if src.is_relative_to(ROOT) else str(src),
          family=rec["family"]["note"], exact={c: rec["classes"][c]["exact"]
                                               for c in rec["classes"]},
          training=rec.get("training"))
    print(f"{npz} is missing (gitignored; rerun benchmarks/idpdb.py): training N here.")
  n = ds.x_train.shape[0]
  fam_npz = pathlib.Path(a.family_npz)
  if fam_npz.exists() and not a.beta:
    ens = E.Ensemble.load(fam_npz)
    members = jax.tree_util.tree_map(lambda v: np.asarray(v)[1:], ens.params)
    k = ens.n_members - 1
    print(f"no {src}: beta by milp.idpdb over N and the {k} leave-one-out networks of "
          f"{fam_npz.name}, {a.time_limit:.0f} s per class (anytime bound: sound, maybe loose).",
          flush=True)
    info = compute_betas(ens.full, members, method="idpdb", time_limit=a.time_limit,
                         node_time_limit=min(60.0, a.time_limit), progress=True)
    return model, init, ens.full, members, info.raw, dict(
        source=f"milp.idpdb in this script ({a.time_limit:.0f} s per class) on {fam_npz.name}",
        exact=info.exact, n_milps=info.n_milps, seconds=info.seconds,
        family=f"beta is sound for N and the {k} leave-one-out networks of {fam_npz.name} (a "
               f"random subset of the |D| = {n} points), NOT for all of D")
  t0 = time.perf_counter()
  order = np.random.default_rng(a.seed).permutation(n)
  k = a.members
  idx = np.sort(order[:k])
  ens = E.train_ensemble(model, init, E.sgd(0.1, weight_decay=1e-5), ds.x_train, ds.y_train,
                         E.leave_k_out(idx), epochs=a.epochs, batch_size=1024, seed=a.seed,
                         chunk_size=64)
  train_s = time.perf_counter() - t0
  members = jax.tree_util.tree_map(lambda v: np.asarray(v)[1:], ens.params)
  if a.beta:
    return model, init, ens.full, members, None, dict(source="--beta", train_s=train_s)
  print(f"no {src}: beta by milp.idpdb over N and {k} leave-one-out networks, "
        f"{a.time_limit:.0f} s per class (fallback).", flush=True)
  info = compute_betas(ens.full, members, method="idpdb", time_limit=a.time_limit,
                       node_time_limit=min(60.0, a.time_limit), progress=True)
  return model, init, ens.full, members, info.raw, dict(
      source="milp.idpdb (fallback in this script)", exact=info.exact, train_s=train_s,
      family=f"beta is sound for N and {k} leave-one-out networks (random subset of the "
             f"|D| = {n} points, seed {a.seed}), NOT for all of D")


def _floats(text: str, name: str) -> list[float]:
  try:
    vals = [float(v) for v in text.split(",") if v.strip()]
  except ValueError:
    raise ValueError(f"{name} must be comma-separated numbers, got {text!r}") from None
  if not vals or any(v <= 0 for v in vals):
    raise ValueError(f"{name} must hold positive numbers, got {text!r}")
  return vals


def alibi_grid(a) -> list[dict]:
  """ALIBI's tuning grid: DP-SGD's learning rates x ``--alibi-grid-iterations`` rounds, as many
  points as DP-SGD's grid (2 x 2 by default)."""
  lrs = _floats(a.dp_grid_lr, "--dp-grid-lr")
  its = [int(v) for v in _floats(a.alibi_grid_iterations, "--alibi-grid-iterations")]
  return [{"lr": lr, "iterations": it} for lr in lrs for it in its]


def train_baselines(model, init, x, y, xt, yt, a):
  """ALIBI and DP-SGD at every DP ε: DP-SGD at the pre-declared point and over the lr x clip
  grid (Poisson sampling, N's epochs). Returns ``trained`` for `accuracy_table` ("DP-SGD": the
  pre-declared point, "DP-SGD best": the grid's best by test accuracy), ``train_info`` and the
  grid rows."""
  from tqdm.auto import tqdm
  lrs, clips = _floats(a.dp_grid_lr, "--dp-grid-lr"), _floats(a.dp_grid_clip, "--dp-grid-clip")
  points = [(a.dp_lr, a.dp_clip)] + [(lr, c) for lr in lrs for c in clips
                                     if (lr, c) != (a.dp_lr, a.dp_clip)]
  n = x.shape[0]
  xs, ys = np.asarray(x, np.float32), np.asarray(y)
  predict = lambda p, v: np.argmax(np.asarray(model.apply(p, v)), -1)  # noqa: E731
  trained, info, grid = {}, {}, []
  bar = tqdm(total=len(L.DP_EPSILONS) * (len(points) + 1), desc="DP-SGD grid / ALIBI")
  for eps in L.DP_EPSILONS:
    runs = []
    for lr, clip in points:
      row, r = train_point(model.apply, init, xs, ys, xt, yt, predict, loss="cross_entropy",
                           lr=lr, clip=clip, epochs=a.dp_epochs, batch_size=1024, epsilon=eps,
                           delta=1.0 / n, seed=a.seed)
      runs.append((row["accuracy"], r))
      grid.append(dict(epsilon=eps, **row, in_grid=(lr in lrs and clip in clips)))
      bar.update()
    in_grid = [run for run, (lr, c) in zip(runs, points) if lr in lrs and c in clips]
    best = max(in_grid, key=lambda t: t[0])[1]
    trained.setdefault("DP-SGD", {})[eps] = (model.apply, runs[0][1].params)
    trained.setdefault("DP-SGD best", {})[eps] = (model.apply, best.params)
    info.setdefault("DP-SGD", {})[str(eps)] = dict(
        lr=a.dp_lr, clip=a.dp_clip, epsilon=runs[0][1].epsilon, delta=runs[0][1].delta,
        noise_multiplier=runs[0][1].noise_multiplier, sampling="poisson")
    alibi = L.train_alibi(model.apply, init, x, y, eps, epochs=a.epochs, batch_size=1024,
                          lr=0.1, weight_decay=1e-5, iterations=a.alibi_iterations,
                          key=jax.random.PRNGKey(a.seed))
    trained.setdefault("ALIBI untuned", {})[eps] = (model.apply, alibi.params)
    info.setdefault("ALIBI untuned", {})[str(eps)] = alibi.info()
    tuned, rows = L.tune_alibi(model.apply, init, x, y, eps, alibi_grid(a), epochs=a.epochs,
                               batch_size=1024, weight_decay=1e-5,
                               key=jax.random.PRNGKey(a.seed))
    trained.setdefault("ALIBI", {})[eps] = (model.apply, tuned.params)
    info.setdefault("ALIBI", {})[str(eps)] = dict(tuned.info(), grid=rows,
                                                  chosen=next(r for r in rows if r["chosen"]))
    bar.update()
  bar.close()
  return trained, info, grid


def row_labels(members, n: int, grid: list, beta_by_hand: bool) -> dict[str, tuple[str, str]]:
  """Mechanism -> (name, guarantee) printed in the table: what each row really is (the family
  β and Naive-iDP cover, the DP-SGD selection)."""
  k = 0 if members is None else int(jax.tree_util.tree_leaves(members)[0].shape[0])
  labels = {}
  if k < n:
    labels["Naive-iDP"] = (f"Naive-iDP ({k}/{n} nets)", f"eps-iDP over {k}/{n} nets only")
    labels["LUCID"] = ("LUCID", "eps-iDP if --beta is over all of D" if beta_by_hand else
                       f"eps-iDP over {k}/{n} nets only")
  g = len({(r["lr"], r["clip"]) for r in grid if r["in_grid"]}) or 1
  labels["DP-SGD"] = ("DP-SGD (no tuning)", "(eps, delta)-DP, Poisson")
  labels["ALIBI untuned"] = ("ALIBI (no tuning)", "eps-label-DP")
  labels["ALIBI"] = ("ALIBI", "eps-label-DP (tuned on its own noisy labels)")
  labels["DP-SGD best"] = (f"DP-SGD best of {g}", f"({g}eps, {g}delta)-DP: test-selected")
  return labels


def main(argv=None):
  a = parse(argv)
  t_all = time.perf_counter()
  ds = load_adult("sphynx")
  x, y, xt, yt = ds.x_train, ds.y_train, ds.x_test, ds.y_test
  model, init, params, members, raw, origin = load_or_train(ds, a)
  if a.beta:
    raw = {c: float(b) for c, b in enumerate(a.beta.split(","))}
    origin["source"] = "--beta"
    origin["family"] = (f"beta given by hand (--beta: {a.beta_note or 'no --beta-note'}); the "
                        "members (Naive-iDP only) are those of the family npz "
                        f"({origin.get('family', 'trained here')})")
  betas = {c: L.guard_beta(b) for c, b in raw.items()}
  print(f"beta (guard) = {betas} from {origin['source']}", flush=True)

  trained, train_info, grid = {}, {}, []
  if not a.no_baselines:
    trained, train_info, grid = train_baselines(model, init, x, y, xt, yt, a)

  table = L.accuracy_table(model.apply, params, betas, xt, yt, members=members,
                           trained=trained, repeats=a.repeats,
                           key=jax.random.PRNGKey(0))
  paper = L.PAPER_ADULT_CONV if a.hidden == "conv" else L.PAPER_ADULT_2X50
  labels = row_labels(members, x.shape[0], grid, bool(a.beta))
  majority = float(max(np.mean(np.asarray(yt) == c) for c in np.unique(np.asarray(yt))))
  base = [r.mechanism for r in table.rows]
  table.rows = [dataclasses.replace(r, mechanism=labels.get(r.mechanism, (r.mechanism,))[0],
                                    guarantee=labels.get(r.mechanism, (None, r.guarantee))[1])
                for r in table.rows]
  out = dict(
      provenance=record(),
      benchmark=f"idpdb_accuracy (LUCID Tables 1-3, Adult {a.arch})",
      args=vars(a), origin=origin, beta_raw={str(c): b for c, b in raw.items()},
      beta_guard={str(c): b for c, b in betas.items()},
      settings=dict(
          N=("LUCID's CNN (Conv1dNet, no dropout)" if a.hidden == "conv" else "MLP 21-50-50-2")
            + f", SGD lr 0.1, wd 1e-5, batch 1024, {a.epochs} epochs, seed {a.seed}",
          DP_SGD=f"Poisson sampling (expected batch 1024), {a.dp_epochs} epochs, delta 1/n, "
                 "noise calibrated by dp-accounting (RDP, exact for Poisson sampling); "
                 f"'DP-SGD (no tuning)' = pre-declared lr {a.dp_lr}, clip {a.dp_clip}; "
                 "'DP-SGD best of G' = best test accuracy over the grid lr "
                 f"{a.dp_grid_lr} x clip {a.dp_grid_clip}: non-private selection, (G eps, G "
                 "delta)-DP by basic composition (Dwork & Roth 2014, Thm 3.16); Liu & Talwar "
                 "2019 private selection would cost ~3 eps",
          ALIBI=f"Laplace(2/eps) on one-hot labels, posterior with a uniform prior (later "
                f"rounds: the model's), SGD wd 1e-5, batch 1024, {a.epochs} epochs; 'ALIBI' = "
                f"the best of the grid {alibi_grid(a)} (as many points as DP-SGD's) by agreement "
                "with the noisy-label posterior on a 20 % validation split of the training "
                "points, retrained on all of them (boundjax.privacy.tune_alibi: one release of "
                "the noisy labels, so eps-label-DP holds with no composition); 'ALIBI (no "
                f"tuning)' = lr 0.1, {a.alibi_iterations} round(s)",
          Naive_iDP="over the members available (the beta family), not all of D: labelled "
                    "with that family in the table"),
      majority_class_accuracy=majority, dpsgd_grid=grid, row_labels={k: list(v) for k, v in labels.items()},
      train_info=train_info, table=table.as_dict(), **{f"paper_adult_{a.arch}": paper},
      paper_headline=L.PAPER_HEADLINE, total_seconds=time.perf_counter() - t_all,
      device=str(jax.devices()[0]))
  path = pathlib.Path(a.out)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(out, indent=1, default=float))

  print()
  print(L.format_table(table))
  print(f"\nbeside the paper (Adult {a.arch}, accuracy %; the paper's DP-SGD settings are not "
        "given):")
  w = max(len(r.mechanism) for r in table.rows)
  print(f"{'mechanism':<{w}} {'eps':>5} {'ours':>7} {'paper':>7}")
  for b, r in zip(base, table.rows):
    e = f"{r.epsilon:g}"
    pv = paper.get(b, {}).get(e) if b != "DP-SGD best" else None
    print(f"{r.mechanism:<{w}} {e:>5} {100 * r.accuracy:>7.2f} "
          f"{'-' if pv is None else f'{pv:.1f}':>7}")
  print(f"majority class (a constant classifier): {100 * majority:.2f}% of the test set")
  print(f"N: ours {100 * table.acc_no_protection:.2f}, paper {paper['acc_no_protection']}; "
        f"paper's LUCID decrease at eps=0 averages 1.4 pp (Adult 2x50: 0.7, conv: -0.9), DP "
        "baselines 12.7 "
        f"pp; guard latency paper 0.16 ms")
  if grid:
    print(f"DP-SGD grid (test accuracy %; {a.dp_epochs} epochs, Poisson, expected batch 1024):")
    for g in grid:
      print(f"  eps {g['epsilon']:g}  lr {g['lr']:g}  clip {g['clip']:g}  sigma "
            f"{g['noise_multiplier']:.2f}  acc {100 * g['accuracy']:.2f}")
  if origin.get("family"):
    print(origin["family"] + ".")
  print(f"wrote {path}")


if __name__ == "__main__":
  main()

"""Certified accuracy under data poisoning (Sosnin et al., "Certified Robustness to Data
Poisoning in Gradient-Based Training", arXiv 2406.05670), with `boundjax.agt.poisoning`.

The paper's headline experiment is certified accuracy (the fraction of test points that are
classified correctly *and* whose prediction no poisoning within the budget can change) as the
budget grows: the number of poisoned samples per batch (``k_poison``) at a fixed radius, and
the radius ``epsilon`` (L-infinity feature perturbation) at a fixed number. Here, on data we
ship (the paper's UCI regression, OCT-MNIST and MNIST settings are not available offline):

* ``breast_cancer`` (scikit-learn, 455 / 114 points, 30 features in [0, 1]), logistic
  regression, batch 450 (one step per epoch), 10 epochs, no clipping;
* ``fashion_binary_pca16`` (Fashion-MNIST T-shirt vs shirt, the package's stand-in for
  OCT-MNIST, 12,000 / 2,000 images projected on 16 principal components as in the paper's
  "MNIST (PCA)" setting), logistic regression, batch 3,000, 5 epochs, clip_gamma 0.05;

and per setting: certified accuracy vs ``k_poison`` (at one epsilon), vs ``epsilon`` (at one
k), and vs ``label_k_poison`` (label flips). Beside each certified number, the accuracy of the
*attacked* model: plain training on a few datasets poisoned within the same budget
(`boundjax.agt.poison_attacks.make_poisoned`: gradient-sign and projected-gradient feature
attacks, loss-maximising label flips), the worst over them. Certified <= attacked always (the
certificate is a lower bound on the accuracy under every such attack); a gap is the price of
the interval relaxation.

Paper numbers: the poisoning paper is not among the papers shipped with this project
(/work/shared/papers holds the AGT privacy paper, which only cites it), so its figures are not
quoted here; the JSON says so (``paper``).

  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/agt_poisoning.py            # ~10 min
  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/agt_poisoning.py --quick    # < 2 min

``--quick``: breast_cancer only, with 3 / 2 / 1 budgets per sweep.

Results: benchmarks/results/agt_poisoning.json (``--quick``: agt_poisoning_quick.json) and
a plot agt_poisoning.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from boundjax import agt
from boundjax.agt import mlp, poison_attacks
from common import RESULTS, record

PAPER = {
    "title": "Certified Robustness to Data Poisoning in Gradient-Based Training",
    "arxiv": "2406.05670",
    "numbers": None,
    "note": "The paper's text is not in /work/shared/papers, so no paper numbers are quoted; "
            "its settings (UCI houseelectric regression, OCT-MNIST, MNIST with PCA) are not "
            "available offline and are replaced by breast_cancer and Fashion-MNIST (T-shirt vs "
            "shirt) on 16 principal components, with logistic regression.",
}


def _fashion_pca(n_components: int = 16) -> dict:
  """Fashion-MNIST T-shirt vs shirt in the space of its first ``n_components`` principal
  components (fitted on the training images, each divided by its largest training |value|):
  the poisoning paper's "MNIST (PCA)" preprocessing. Poisoning acts in the PCA space."""
  from sklearn.decomposition import PCA
  import boundjax.data as bd
  fm = bd.load("fashion_mnist_binary", flatten=True)
  pca = PCA(n_components, random_state=0).fit(fm.x_train)
  z = pca.transform(fm.x_train)
  scale = np.abs(z).max(0)
  return dict(x=z / scale, y=fm.y_train, x_test=pca.transform(fm.x_test) / scale,
              y_test=fm.y_test)


def _settings(quick: bool) -> list[dict]:
  """The datasets, models and AGT configurations (and the sweeps) of the run.

  Logistic regression (one Dense layer): with interval parameters the box of an MLP grows
  through the ReLU layers and, at these sizes, no test point stays certified even for the
  smallest budgets (also for the privacy certificate at k = 1), so the sweeps would be flat.
  """
  import boundjax.data as bd
  out = []
  bc = bd.load("breast_cancer")
  out.append(dict(
      name="breast_cancer", x=bc.x_train, y=bc.y_train, x_test=bc.x_test, y_test=bc.y_test,
      sizes=[bc.x_train.shape[1], 1],
      config=agt.Config(n_epochs=10, learning_rate=1.0, batch_size=450,
                        loss="binary_cross_entropy", fragsize=450),
      k_sweep=[0, 1, 2, 5, 10, 20] if not quick else [0, 1, 5],
      k_eps=0.01,
      eps_sweep=[0.0, 0.001, 0.002, 0.005, 0.01, 0.02] if not quick else [0.002, 0.01],
      eps_k=5,
      label_sweep=[0, 1, 2] if not quick else [1]))
  if bd.images.fashion_mnist_available() and not quick:
    out.append(dict(
        name="fashion_binary_pca16", sizes=[16, 1], **_fashion_pca(16),
        config=agt.Config(n_epochs=5, learning_rate=2.0, batch_size=3000, clip_gamma=0.05,
                          loss="binary_cross_entropy", fragsize=1000),
        k_sweep=[0, 10, 50, 100, 200, 500], k_eps=0.01,
        eps_sweep=[0.0, 0.005, 0.01, 0.02, 0.05, 0.1], eps_k=50,
        label_sweep=[0, 1, 10, 50, 100]))
  return out


def _certified_accuracy(params, bounds, x_test, y_test) -> tuple[float, float]:
  """(nominal accuracy, certified accuracy: correct and certified) on the test set."""
  pred = np.asarray(agt.predict(mlp.apply, params, x_test))
  ok = pred == np.asarray(y_test)
  cert = agt.certify(mlp.apply, params, bounds, x_test)
  return float(ok.mean()), float((ok & cert).mean())


def _attacked_accuracy(params0, final_params, s, cfg, n_sets: int, seed: int) -> float | None:
  """Worst test accuracy of plain training on ``n_sets`` datasets poisoned within ``cfg``'s
  budget (None without a budget)."""
  if not cfg.poisoning or (cfg.label_k_poison == 0 and cfg.epsilon == 0):
    return None
  pois = poison_attacks.make_poisoned(seed, mlp.apply, final_params, s["x"], s["y"], cfg,
                                      n_sets, n_classes=2, pgd_steps=5)
  rt = poison_attacks.retrain(mlp.apply, params0, pois.x, pois.y, cfg)
  finals = jax.tree_util.tree_map(lambda a: a[:, -1], rt)
  preds = np.asarray(jax.vmap(lambda p: agt.predict(mlp.apply, p, s["x_test"]))(finals))
  return float((preds == np.asarray(s["y_test"])[None]).mean(1).min())


def _sweep_configs(s: dict) -> list[tuple[str, float, agt.Config]]:
  base = s["config"]
  rows = [("k_poison", k, dataclasses.replace(base, k_poison=k, epsilon=s["k_eps"]))
          for k in s["k_sweep"]]
  rows += [("epsilon", e, dataclasses.replace(base, k_poison=s["eps_k"], epsilon=e))
           for e in s["eps_sweep"]]
  rows += [("label_k_poison", k, dataclasses.replace(base, label_k_poison=k))
           for k in s["label_sweep"]]
  return rows


def run(quick: bool, attack_sets: int) -> dict:
  out = {"provenance": record(), "paper": PAPER, "quick": quick, "settings": []}
  for s in _settings(quick):
    x, y = jnp.asarray(s["x"], jnp.float32), jnp.asarray(s["y"], jnp.float32)
    s["x"], s["y"] = x, y
    s["x_test"] = jnp.asarray(s["x_test"], jnp.float32)
    params0 = mlp.init(jax.random.PRNGKey(0), s["sizes"])
    rows = []
    for sweep, value, cfg in tqdm(_sweep_configs(s), desc=s["name"]):
      t0 = time.perf_counter()
      res = agt.fit(mlp.apply, params0, x, y, cfg, progress=False)
      secs = time.perf_counter() - t0
      acc, cacc = _certified_accuracy(res.params, res.bounds, s["x_test"], s["y_test"])
      att = _attacked_accuracy(params0, res.params, s, cfg, attack_sets, seed=len(rows))
      rows.append(dict(sweep=sweep, value=value, k_poison=cfg.k_poison, epsilon=cfg.epsilon,
                       label_k_poison=cfg.label_k_poison, nominal_accuracy=acc,
                       certified_accuracy=cacc, attacked_accuracy=att, fit_seconds=secs))
      if att is not None and cacc > att + 1e-9:
        raise AssertionError(f"{s['name']} {sweep}={value}: certified accuracy {cacc} exceeds "
                             f"the accuracy {att} of an attacked model: unsound.")
    c = s["config"]
    out["settings"].append(dict(
        name=s["name"], n_train=int(x.shape[0]), n_test=int(s["x_test"].shape[0]),
        model="-".join(map(str, s["sizes"])),
        config=dict(n_epochs=c.n_epochs, batch_size=c.batch_size, learning_rate=c.learning_rate,
                    lr_decay=c.lr_decay, clip_gamma=c.clip_gamma, loss=c.loss, dtype="float32",
                    sound=c.sound, paired_poison=c.paired_poison),
        attack_sets=attack_sets, rows=rows))
  return out


def _table(doc: dict) -> str:
  lines = []
  for s in doc["settings"]:
    lines.append(f"\n{s['name']}  (model {s['model']}, n={s['n_train']}, b="
                 f"{s['config']['batch_size']}, {s['config']['n_epochs']} epochs)")
    lines.append(f"{'sweep':>15} {'value':>7} {'k':>4} {'eps':>7} {'label_k':>7} "
                 f"{'nominal':>8} {'certified':>9} {'attacked':>9} {'fit s':>6}")
    for r in s["rows"]:
      att = "-" if r["attacked_accuracy"] is None else f"{r['attacked_accuracy']:.3f}"
      lines.append(f"{r['sweep']:>15} {r['value']:>7g} {r['k_poison']:>4} {r['epsilon']:>7g} "
                   f"{r['label_k_poison']:>7} {r['nominal_accuracy']:>8.3f} "
                   f"{r['certified_accuracy']:>9.3f} {att:>9} {r['fit_seconds']:>6.1f}")
  return "\n".join(lines)


def _plot(doc: dict, path: pathlib.Path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  sweeps = ("k_poison", "epsilon", "label_k_poison")
  fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
  for ax, sweep in zip(axes, sweeps):
    for s in doc["settings"]:
      rows = [r for r in s["rows"] if r["sweep"] == sweep]
      v = [r["value"] for r in rows]
      line, = ax.plot(v, [r["certified_accuracy"] for r in rows], "o-", label=s["name"])
      att = [(r["value"], r["attacked_accuracy"]) for r in rows if r["attacked_accuracy"]]
      if att:
        ax.plot(*zip(*att), "x--", color=line.get_color(), alpha=0.6)
    ax.set_xlabel(sweep)
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("certified accuracy (o), attacked (x)")
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--quick", action="store_true", help="breast_cancer only, short sweeps")
  ap.add_argument("--attack-sets", type=int, default=4,
                  help="poisoned datasets retrained per budget (worst accuracy reported)")
  args = ap.parse_args()
  if args.attack_sets < 1:
    raise ValueError(f"--attack-sets must be >= 1, got {args.attack_sets}.")
  warnings.simplefilter("ignore", agt.VacuousCertificateWarning)   # reported as certified = 0
  doc = run(args.quick, args.attack_sets)
  print(_table(doc))
  RESULTS.mkdir(exist_ok=True)
  name = "agt_poisoning_quick" if args.quick else "agt_poisoning"
  (RESULTS / f"{name}.json").write_text(json.dumps(doc, indent=1))
  _plot(doc, RESULTS / f"{name}.png")
  print(f"wrote {RESULTS / (name + '.json')}")


if __name__ == "__main__":
  main()

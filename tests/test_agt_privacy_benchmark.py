"""benchmarks/agt_privacy.py: merging ``--only`` runs into one JSON, the Fig. 5 check, and the
stored results (AGT, Figs. 2 and 5).

The JSON checks read `benchmarks/results/agt_privacy.json` and recompute what the script derives
from its own stored curves (certified fractions from the k_max histogram, the Fig. 5 verdict from
the budget table), so a hand edit or a stale merge shows up.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import agt_privacy as AP  # noqa: E402

RESULT = ROOT / "benchmarks" / "results" / "agt_privacy.json"
PROV_A = {"command": "python benchmarks/agt_privacy.py --only blobs,fashion", "commit": "a" * 40}
PROV_B = {"command": "python benchmarks/agt_privacy.py --only amazon", "commit": "b" * 40}


def _entry(name, **kw):
  return {"setting": name, "nominal_accuracy": 0.5, **kw}


def test_merge_keeps_other_entries_and_their_provenance():
  old = {"blobs": _entry("blobs"), "fashion": _entry("fashion"),
         "amazon": _entry("amazon", stale="not re-run"), "provenance": PROV_A}
  new = AP.merge_results(old, "amazon", _entry("amazon", nominal_accuracy=0.7), PROV_B)
  assert set(new) == {"blobs", "fashion", "amazon", "provenance"}
  # the regenerated entry: new numbers, own provenance, no stale mark
  assert new["amazon"]["nominal_accuracy"] == 0.7 and "stale" not in new["amazon"]
  assert new["amazon"]["provenance"] == PROV_B
  # the others keep their numbers and get the provenance of the run that made them
  for name in ("blobs", "fashion"):
    assert new[name]["nominal_accuracy"] == 0.5 and new[name]["provenance"] == PROV_A
  assert new["provenance"] == PROV_B
  # a second merge leaves the per-entry records alone
  again = AP.merge_results(new, "blobs", _entry("blobs", nominal_accuracy=0.9), PROV_A)
  assert again["amazon"]["provenance"] == PROV_B and again["fashion"]["provenance"] == PROV_A
  assert again["blobs"]["nominal_accuracy"] == 0.9
  assert old["amazon"]["stale"] == "not re-run"          # the input is not mutated


def test_merge_keeps_a_stale_mark_it_cannot_vouch_for():
  old = {"amazon": _entry("amazon", stale="old"), "provenance": PROV_A}
  new = AP.merge_results(old, "blobs", _entry("blobs"), PROV_B)
  assert new["amazon"]["stale"] == "old" and "provenance" not in new["amazon"]


def test_fig5_check_against_hand_computed_cases():
  budget = {"Q": [1, 10, 100], "single_gs": [0.80, 0.70, 0.55], "single_ss": [0.82, 0.60, 0.5],
            "ensemble_gs": [0.79, 0.75, 0.6], "ensemble_ss": [0.70, 0.65, 0.5]}
  c = AP.fig5_check(budget, nominal=0.83, ensemble_acc=0.80, dpsgd_acc=0.74)
  assert c["best_private_by_Q"] == [0.82, 0.75, 0.6]
  assert c["private_beats_dpsgd_at_Q"] == [1, 10]
  assert c["noise_free_ceiling"] == 0.83 and "below" in c["why"]
  c = AP.fig5_check(budget, nominal=0.83, ensemble_acc=0.80, dpsgd_acc=0.841)
  assert c["private_beats_dpsgd_at_Q"] == [] and "cannot beat it at any Q" in c["why"]


def test_eps_for_accuracy_needs_the_whole_tail():
  curve = np.ones(len(AP.EPS_GRID))
  curve[:5] = 0.0
  curve[7] = 0.0                      # a dip later on: the tail starts after it
  assert AP.eps_for_accuracy(curve, 0.5) == pytest.approx(AP.EPS_GRID[8])
  assert AP.eps_for_accuracy(np.zeros(len(AP.EPS_GRID)), 0.5) is None


def test_tuning_rule_picks_the_best_eligible_row():
  rows = [dict(val_accuracy=0.80, n_epochs=3, learning_rate=2.0, val_certified={0: 0.90, 2: 0.9}),
          dict(val_accuracy=0.75, n_epochs=2, learning_rate=8.0, val_certified={0: 0.99, 2: 0.4}),
          dict(val_accuracy=0.72, n_epochs=3, learning_rate=2.0, val_certified={0: 0.96, 2: 0.6}),
          dict(val_accuracy=0.72, n_epochs=2, learning_rate=8.0, val_certified={0: 0.97, 2: 0.5})]
  assert AP.choose_amazon(rows) is rows[3]       # tie on accuracy -> fewer epochs
  assert AP.choose_amazon(rows[:2]) is None


@pytest.fixture(scope="module")
def stored():
  return json.loads(RESULT.read_text())


def test_stored_json_holds_every_setting_with_its_own_provenance(stored):
  for name in ("blobs", "fashion", "amazon"):
    r = stored[name]
    assert "stale" not in r, f"{name} is marked stale"
    assert r["provenance"]["command"].startswith("python benchmarks/agt_privacy.py"), name
    cmd = r["provenance"]["command"]
    if "--only " in cmd:                  # without --only, the run made every setting
      assert cmd.split("--only ")[1].split()[0].count(name) == 1, name
    assert r["paper"] == AP.PAPER[name], name


def test_stored_certified_fractions_match_the_kmax_histogram(stored):
  """k_max(x) is the largest k of the grid at which x is certified, so P(k_max >= k) is at least
  the fraction certified at k, with equality at the largest k of the grid (the two are the same
  data seen twice)."""
  for name in ("blobs", "fashion", "amazon"):
    r = stored[name]
    hist = {int(k): c for k, c in r["kmax_hist"].items()}
    n = sum(hist.values())
    assert n == r["n_test"]
    frac = {int(k): f for k, f in r["certified_fraction"].items()}
    for k, f in frac.items():
      if k > 0:
        assert f <= sum(c for kk, c in hist.items() if kk >= k) / n + 1e-9, (name, k)
    top = max(frac)
    assert frac[top] == pytest.approx(hist.get(top, 0) / n, abs=1e-9), name


def test_stored_fig5_verdicts_follow_from_the_budget_table(stored):
  for name in ("blobs", "fashion", "amazon"):
    r = stored[name]
    want = AP.fig5_check(r["budget"], r["nominal_accuracy"], r["ensemble_majority_accuracy"],
                         r["dpsgd"]["accuracy"])
    assert r["fig5_check"] == want, name
  f = stored["fashion"]["fig5_check"]
  assert f["private_beats_dpsgd_at_Q"] == [] and f["dpsgd"] >= f["noise_free_ceiling"]


def test_stored_amazon_entry_certifies_and_decays(stored):
  r = stored["amazon"]
  frac = {int(k): v for k, v in r["certified_fraction"].items()}
  ks = sorted(frac)
  assert frac[0] >= 0.9
  assert all(frac[a] >= frac[b] for a, b in zip(ks, ks[1:]))   # monotone in k
  assert frac[ks[-1]] < frac[0]
  assert r["nominal_accuracy"] > 0.658 + 0.02                    # above the majority class
  assert r["config"]["batch_size"] == r["n_train"]               # full batch
  tune = json.loads((RESULT.parent / "agt_privacy_amazon_tuning.json").read_text())
  chosen = tune["chosen"]
  assert chosen == AP.choose_amazon(tune["rows"])
  for key in ("n_epochs", "learning_rate", "clip_gamma", "optimizer"):
    assert r["config"][key] == chosen[key], key
  assert r["sizes"][0] == chosen["dim"]


def test_reproduce_rows_state_the_fig5_verdict_and_no_stale_note(stored):
  from benchmarks import report as reproduce
  rows = {r[0]: r for r in reproduce.compare_agt_privacy(stored)}
  f5 = stored["fashion"]["fig5_check"]
  row = rows["fashion: Fig. 5, queries where private prediction beats DP-SGD"]
  assert row[1] == "Q < 100" and row[3] == f5["why"]
  beats = stored["amazon"]["fig5_check"]["private_beats_dpsgd_at_Q"]
  assert rows["amazon: Fig. 5, queries where private prediction beats DP-SGD"][2] == (
      ", ".join(map(str, beats)) or "none")
  assert not any(k.endswith(": stale") for k in rows)
  assert rows["amazon: nominal accuracy"][1] == AP.PAPER["amazon"]["nominal_accuracy"]


# ---------------------------------------------------------------------------------------------
# Amazon: DP-SGD tuned like AGT (same validation split, same number of settings)
# ---------------------------------------------------------------------------------------------

def test_dpsgd_grid_has_as_many_settings_as_the_agt_grid():
  pts = AP.amazon_dpsgd_points()
  g = AP.AMAZON_GRID
  n_agt = (len(g["dim"]) * len(g["learning_rate"]) * len(g["clip_gamma"]) * len(g["optimizer"])
           * len(g["n_epochs"]))
  assert len(pts) == n_agt == len(AP.amazon_agt_points()) == 12
  assert len({tuple(sorted(p.items())) for p in pts}) == len(pts)         # all distinct
  u = AP.AMAZON_DPSGD_GRID["untuned"]                                     # the public-code rule
  assert dict(lr=u["learning_rate"], clip=u["l2_norm_clip"], epochs=u["epochs"]) in pts
  assert AP.AMAZON_DPSGD_GRID["n_val"] == AP.AMAZON_GRID["n_val"]


def test_amazon_split_is_the_one_agt_tunes_on():
  X = np.arange(10.0)[:, None]
  y = np.arange(10)
  Xa, ya, Xv, yv = AP.amazon_split(X, y, 3)
  assert ya.tolist() == list(range(7)) and yv.tolist() == [7, 8, 9]
  with pytest.raises(ValueError, match="n_val"):
    AP.amazon_split(X, y, 10)


def test_dpsgd_choice_rule_against_hand_picked_rows():
  def row(acc, lr, clip, ep):
    return dict(val_accuracy=acc, lr=lr, clip=clip, epochs=ep)
  rows = [row(0.70, 8.0, 1.0, 30), row(0.72, 8.0, 1.0, 30), row(0.72, 2.0, 1.0, 10),
          row(0.72, 8.0, 0.2, 10), row(0.64, 2.0, 0.2, 3)]
  # tie at 0.72 -> fewer epochs (10) -> smaller lr (2.0)
  assert AP.choose_amazon_dpsgd(rows) is rows[2]
  assert AP.choose_amazon_dpsgd(rows[3:]) is rows[3]
  with pytest.raises(ValueError):
    AP.choose_amazon_dpsgd([])


def _toy_task(n, seed, flip=False):
  rng = np.random.default_rng(seed)
  X = rng.normal(size=(n, 4)).astype(np.float32)
  y = (X[:, 0] + 0.3 * rng.normal(size=n) > 0).astype(np.float32)
  return X, (1 - y if flip else y)


def test_dpsgd_selection_never_reads_the_test_set():
  """By construction: `tune_amazon_dpsgd` takes no test set, and `amazon_dpsgd_baseline` with a
  label-flipped test set (which ranks the two settings the other way round) keeps the same
  choice and the same validation rows; only the reported test accuracy changes (to 1 - acc)."""
  import inspect
  import jax
  from boundjax.agt import mlp
  assert set(inspect.signature(AP.tune_amazon_dpsgd).parameters) == {
      "params0", "X", "y", "grid", "progress"}
  X, y = _toy_task(600, 0)
  Xt, yt = _toy_task(400, 1)
  grid = dict(AP.AMAZON_DPSGD_GRID, learning_rate=[1e-4, 4.0], l2_norm_clip=[1.0], epochs=[3],
              n_val=200, untuned=dict(learning_rate=4.0, l2_norm_clip=1.0, epochs=3))
  p0 = mlp.init(jax.random.PRNGKey(0), [4, 8, 1])
  real, _ = AP.amazon_dpsgd_baseline(p0, X, y, Xt, yt, grid, progress=False)
  fake, _ = AP.amazon_dpsgd_baseline(p0, X, y, Xt, 1 - yt, grid, progress=False)
  assert real["chosen"]["lr"] == 4.0                      # learning beats a frozen init
  assert real["rows"] == [{**r, "seconds": a["seconds"]} for r, a in zip(fake["rows"],
                                                                           real["rows"])]
  assert fake["chosen"]["lr"] == real["chosen"]["lr"]
  assert real["final"]["test_accuracy"] > 0.8
  assert fake["final"]["test_accuracy"] == pytest.approx(1 - real["final"]["test_accuracy"])
  # a selection by the fake test set would have picked the other setting: the frozen-init
  # model scores higher on the flipped labels than the trained one
  other = AP._dpsgd_run(p0, X, y, Xt, 1 - yt, dict(lr=1e-4, clip=1.0, epochs=3), grid,
                        "test_accuracy")[0]
  assert other["test_accuracy"] > fake["final"]["test_accuracy"]


def test_stored_amazon_dpsgd_baseline_is_the_tuned_choice(stored):
  from boundjax.training import dpsgd
  d = stored["amazon"]["dpsgd"]
  t = d["tuning"]
  assert t["n_settings"] == len(t["rows"]) == t["n_agt_settings"] == 12
  pts = [dict(lr=r["lr"], clip=r["clip"], epochs=r["epochs"]) for r in t["rows"]]
  assert pts == AP.amazon_dpsgd_points()
  assert t["chosen"] == AP.choose_amazon_dpsgd(t["rows"])
  assert max(r["val_accuracy"] for r in t["rows"]) == t["chosen"]["val_accuracy"]
  assert all("test_accuracy" not in r for r in t["rows"])        # validation only
  c, f = t["chosen"], t["final"]
  assert (d["lr"], d["l2_norm_clip"], d["epochs"]) == (c["lr"], c["clip"], c["epochs"])
  assert d["accuracy"] == f["test_accuracy"]
  assert d["noise_multiplier"] == f["noise_multiplier"] == c["noise_multiplier"]
  # every setting spends the whole (10, 1e-5) and no more, at its own schedule (the accountant)
  n_tune = stored["amazon"]["n_train"] - t["grid"]["n_val"]
  for r in t["rows"]:
    assert r["batch_size"] == round(t["grid"]["sampling_rate"] * n_tune)
    eps = dpsgd.dpsgd_epsilon(r["noise_multiplier"], r["batch_size"], n_tune, r["epochs"], 1e-5)
    assert 9.9 <= eps <= 10.0 + 1e-9, r
  sig = {e: {r["noise_multiplier"] for r in t["rows"] if r["epochs"] == e}
         for e in {r["epochs"] for r in t["rows"]}}
  assert all(len(v) == 1 for v in sig.values()) and len(set().union(*sig.values())) == len(sig)
  assert sorted(sig, key=lambda e: next(iter(sig[e]))) == sorted(sig)   # more epochs, more noise
  assert "same validation split" in d["selection"]
  tune = json.loads((RESULT.parent / "agt_privacy_amazon_tuning.json").read_text())
  assert {k: v for k, v in tune["dpsgd"].items() if k != "provenance"} == t
  assert tune["dpsgd"]["provenance"] == stored["amazon"]["provenance"]


# --- Table 1 (teacher and student) and Fig. 4 (ensemble size) --------------------------------

def _toy_setting(n_test=400, seed=0):
  """Two separable blobs in 6 features, the blobs setting's architecture (6 -> 2)."""
  rng = np.random.default_rng(seed)
  y = rng.integers(0, 2, n_test)
  x = rng.normal(size=(n_test, 6)) * 0.3 + np.where(y[:, None] == 1, 1.0, -1.0)
  import jax.numpy as jnp
  return {"sizes": [6, 2], "Xt": jnp.asarray(x, jnp.float32), "yt": jnp.asarray(y)}


def test_teacher_labels_follow_each_mechanism_at_its_extremes():
  import jax
  pred = np.array([0, 1, 1, 0, 1] * 20)
  votes = np.stack([pred] * 5)
  kmem = np.full_like(votes, 1000)
  key = jax.random.PRNGKey(0)
  # a huge epsilon (or a huge certified k) returns the noise-free answer
  for mech in ("single_gs", "single_ss", "ensemble_gs", "ensemble_ss"):
    lab = np.asarray(AP.teacher_labels(mech, key, pred, np.full(100, 1000), votes, kmem,
                                       1 - pred, 1e4))
    assert (lab == pred).all(), mech
  assert (np.asarray(AP.teacher_labels("dpsgd", key, pred, None, votes, kmem, 1 - pred, 1.0))
          == 1 - pred).all()
  # a tiny epsilon with nothing certified: the global-sensitivity answer is near a coin flip
  lab = np.asarray(AP.teacher_labels("single_gs", key, pred, None, votes, kmem, None, 1e-3))
  assert 0.3 < np.mean(lab == pred) < 0.7
  with pytest.raises(ValueError):
    AP.teacher_labels("nonsense", key, pred, None, votes, kmem, None, 1.0)


def test_teacher_student_learns_from_true_labels_and_not_from_flipped_ones():
  s = _toy_setting()
  y = np.asarray(s["yt"])
  n = len(y)
  k_all = np.full(n, 10 ** 6)                    # certified far beyond any query budget
  votes = np.stack([y] * 5)
  out = AP.teacher_student(s, y, k_all, votes, np.full_like(votes, 10 ** 6), 1 - y, draws=2)
  assert out["Q"] == AP.TEACHER_Q and out["n_student_test"] == n - AP.TEACHER_Q
  m = out["mechanisms"]
  assert set(m) == {"single_gs", "single_ss", "ensemble_gs", "ensemble_ss", "dpsgd"}
  # the smooth-sensitivity teachers answer noise-free here, so their students learn the task
  for mech in ("single_ss", "ensemble_ss"):
    assert m[mech]["teacher_label_accuracy"] == 1.0
    assert m[mech]["student_accuracy"] > 0.95
  # a teacher that answers every query wrongly (the "DP-SGD" model here) trains a wrong student
  assert m["dpsgd"]["teacher_label_accuracy"] == 0.0 and m["dpsgd"]["student_accuracy"] < 0.05
  assert out["student_on_true_labels"] > 0.95
  # GS at eps_q of Q = 100 under (10, 1e-5) is noisy: its labels are worse than SS's
  assert m["single_gs"]["teacher_label_accuracy"] < 1.0


def test_fig4_check_against_hand_computed_rows():
  rows = [{"T": 1, "gs_eps1": 0.9, "ss_eps1": 0.95, "gs_eps0.1": 0.6, "ss_eps0.1": 0.5},
          {"T": 10, "gs_eps1": 0.9, "ss_eps1": 0.89, "gs_eps0.1": 0.6, "ss_eps0.1": 0.62},
          {"T": 50, "gs_eps1": 0.9, "ss_eps1": 0.5, "gs_eps0.1": 0.6, "ss_eps0.1": 0.1}]
  c = AP.fig4_check(rows, tol=0.02)
  assert c["eps1"]["holds"] and c["eps1"]["ss_minus_gs_T_le_20"] == pytest.approx([0.05, -0.01])
  assert not c["eps0.1"]["holds"]                  # T = 1: SS 0.1 below GS
  assert AP.fig4_check([r for r in rows if r["T"] > 20])["eps1"]["holds"] is False


def test_stored_table1_and_fig4_follow_from_their_rows(stored):
  for name, r in stored.items():
    if not isinstance(r, dict) or "setting" not in r:
      continue
    t1 = r.get("table1")
    assert t1 is not None, f"{name}: no Table 1 entry"
    assert t1["paper"] == {"dataset": AP.TABLE1_PAPER_DATASET[name], **AP.TABLE1_PAPER[name]}
    for m in t1["mechanisms"].values():
      assert 0.0 <= m["student_accuracy"] <= 1.0 and 0.0 <= m["teacher_label_accuracy"] <= 1.0
    if "fig4" in r:
      assert r["fig4"]["check"] == AP.fig4_check(r["fig4"]["rows"])
      assert [row["T"] for row in r["fig4"]["rows"]] == r["fig4"]["T"]

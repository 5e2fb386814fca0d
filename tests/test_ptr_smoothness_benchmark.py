"""benchmarks/ptr_smoothness.py: each variant changes one setting of ptr.py's obfuscator (or two,
where it says so), the separation measure is the nearest other-class distance, and the stored
results recompute: ``sep / (Δp R)`` from the row's own numbers, the Lipschitz ordering
∞→∞ <= ∞→1 <= 8 · ∞→∞ (the output has 8 entries), and the accuracy at ε = ∞ noise-free."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import ptr_smoothness as PS  # noqa: E402

from boundjax.ptr.pipeline import ARLConfig  # noqa: E402

RESULT = ROOT / "benchmarks" / "results" / "ptr_smoothness.json"


def test_each_variant_changes_what_its_name_says():
  base = ARLConfig(epochs=100, lr_obf=1e-3, lr_pred=1e-3, seed=2)
  changed = {}
  for name, (cfg, r) in PS.variants(base).items():
    diff = {f.name for f in dataclasses.fields(ARLConfig)
            if getattr(cfg, f.name) != getattr(base, f.name)}
    changed[name] = (diff, r)
  assert changed["ours (ptr.py)"] == (set(), 1.0)
  assert changed["contrastive on z (code: no-op)"] == ({"contrastive"}, 1.0)
  assert changed["margin 1 (was 25)"] == ({"margin"}, 1.0)
  assert changed["α = 0.5 (was 0.99)"] == ({"alpha"}, 1.0)
  assert changed["α = 0 (utility only)"] == ({"alpha"}, 1.0)
  assert changed["encoder (α = 0, no contrastive)"] == ({"alpha", "contrastive_lambda"}, 1.0)
  assert changed["no training noise"] == ({"noise_sigma"}, 1.0)
  assert changed["code optimiser (500 epochs, lr 1e-4)"] == ({"epochs", "lr_obf", "lr_pred"}, 1.0)
  assert changed["code: no-op contrastive + optimiser"][0] == {"contrastive", "epochs", "lr_obf",
                                                               "lr_pred"}
  assert changed["radius R / 2"] == (set(), 0.5) and changed["radius R × 2"] == (set(), 2.0)


def test_separation_is_the_nearest_other_class_distance():
  v = np.array([[0.0, 0.0], [10.0, 0.0]])
  y = np.array([0, 1])
  ref = np.array([[1.0, 0.0], [0.0, 3.0], [9.0, 1.0], [4.0, 0.0]])
  y_ref = np.array([0, 1, 1, 0])
  # point 0 (class 0): class-1 refs at ℓ1 3 and 10 -> 3; point 1 (class 1): class-0 refs 9, 6 -> 6
  assert PS.separation(v, y, ref, y_ref) == pytest.approx(4.5)
  # chunking over references gives the same answer
  big = np.repeat(ref, 700, axis=0)
  assert PS.separation(v, y, big, np.repeat(y_ref, 700)) == pytest.approx(4.5)


@pytest.mark.skipif(not RESULT.is_file(), reason="no stored ptr_smoothness.json")
def test_stored_rows_are_consistent():
  res = json.loads(RESULT.read_text())
  assert not res["provenance"]["commit"].endswith("+dirty")
  names = set(PS.variants(ARLConfig()))
  seen = set()
  for r in res["rows"]:
    assert r["variant"] in names
    seen.add((r["dataset"], r["variant"]))
    dp, dp_inf = r["delta_p_inf_to_1"], r["delta_p_inf_to_inf_code"]
    assert r["separation_over_noise"] == pytest.approx(r["separation_l1"] / (dp * r["radius"]))
    # ||G||_{∞→∞} <= ||G||_{∞→1} <= m ||G||_{∞→∞} per point (m = 8 outputs); the mean+3std
    # statistic of the bounds keeps the order up to the spread of the samples
    assert 0 < dp_inf <= dp * (1 + 1e-9) and dp <= 8 * dp_inf * 1.5
    assert 0 <= r["noiseless_accuracy"] <= 1
    code = PS.CODE_DELTA_P.get(r["variant"])
    assert r["code_delta_p"] == (code[1][r["dataset"].split(" ")[0]] if code else None)
  for data in {d for d, _ in seen}:
    if "full" not in data:
      assert {v for d, v in seen if d == data} == names, data


def test_the_earlier_commits_milp_oracle_cannot_hang_the_benchmark():
  """`ptr_oracles._OldMilp` (the MILP of an earlier commit, in a worker process): a worker that
  does not answer within ``CALL_SECONDS`` is killed and the call raises `TimeoutError`, instead
  of blocking the benchmark forever."""
  import subprocess
  import time
  import jax
  x64 = jax.config.jax_enable_x64
  try:
    import ptr_oracles as PO  # it turns on float64 for its whole process when imported
  finally:
    jax.config.update("jax_enable_x64", x64)  # not for the tests after this one
  old = object.__new__(PO._OldMilp)
  old.CALL_SECONDS = 0.5
  old.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
  t = time.perf_counter()
  with pytest.raises(TimeoutError, match="did not answer"):
    old(np.zeros(8), 0.5)
  assert time.perf_counter() - t < 10
  assert old.proc.wait(timeout=10) is not None  # killed, not left running

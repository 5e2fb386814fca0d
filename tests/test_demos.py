"""`boundjax demo`: every section run through the command line, its numbers checked.

The command runs once in a subprocess (as a user would type it: ``--quick`` in the fast suite,
the full demo in the slow one) and writes every section's numbers as JSON; each test checks a property that a wrong bound, a wrong certificate or a broken pipeline
would violate — never a copied output.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from boundjax import cli
from boundjax.demos import SECTIONS

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", params=["quick", pytest.param("full", marks=pytest.mark.slow)])
def demo_run(request, tmp_path_factory) -> tuple[dict, str]:
  """``boundjax demo --quick`` (fast suite) and ``boundjax demo`` (slow suite): the JSON of
  every section's numbers and the printed output."""
  out = tmp_path_factory.mktemp("demo") / "demo.json"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  quick = ["--quick"] if request.param == "quick" else []
  proc = subprocess.run([sys.executable, "-m", "boundjax.cli", "demo", *quick, "--json", str(out)],
                        capture_output=True, text=True, env=env, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  for name in SECTIONS:
    assert f"=== {name} ===" in proc.stdout
  return json.loads(out.read_text()), proc.stdout


@pytest.fixture(scope="module")
def demo(demo_run) -> dict:
  return demo_run[0]


def test_unknown_section_is_rejected():
  with pytest.raises(SystemExit, match="unknown demo section"):
    cli.main(["demo", "--only", "nope"])


def test_each_section_announces_its_expected_time_and_reports_the_elapsed_one(demo_run):
  record, stdout = demo_run
  lines = stdout.splitlines()
  for i, name in enumerate(SECTIONS, 1):
    [head] = [j for j, line in enumerate(lines) if line.startswith(f"=== {name} ===")]
    assert f"[{i}/{len(SECTIONS)}]" in lines[head]
    assert re.search(r"\(expected ~\d+ (s|min)\)$", lines[head]), lines[head]
    [tail] = [j for j, line in enumerate(lines) if line.startswith(f"[{name}: ")]
    assert tail > head + 1                     # the report is printed between the two
    seconds = float(re.match(rf"\[{name}: ([\d.]+) s, expected ~\d+ (s|min)", lines[tail])[1])
    assert seconds == pytest.approx(record[name]["seconds"], abs=0.051)
  assert re.match(r"boundjax demo: 9 section\(s\), .*expected ~\d+ (s|min) on a quiet 2-core CPU",
                  lines[0])


def test_quick_settings_are_arguments_of_run_and_expected_times_are_stored():
  total_quick = 0.0
  for name in SECTIONS:
    module = importlib.import_module(f"boundjax.demos.{name}")
    params = inspect.signature(module.run).parameters
    assert set(module.QUICK) <= set(params), name           # a misspelt setting would be lost
    for key, value in module.QUICK.items():
      default = params[key].default
      if isinstance(value, (int, float)) and not isinstance(value, bool):
        assert value <= default, (name, key)                # smaller, never larger
      elif isinstance(value, tuple):
        assert len(value) <= len(default), (name, key)
    assert 0 < module.SECONDS["quick"] <= module.SECONDS["full"], name
    total_quick += module.SECONDS["quick"]
  # the whole quick demo on a quiet 2-core CPU: about half a minute, against 85 s in full
  assert total_quick < 35
  assert total_quick < 0.5 * sum(importlib.import_module(f"boundjax.demos.{n}").SECONDS["full"]
                                 for n in SECTIONS)


def test_version_is_the_package_version():
  version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)[1]
  proc = subprocess.run([sys.executable, "-m", "boundjax.cli", "--version"], capture_output=True,
                        text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=120)
  assert proc.returncode == 0 and proc.stdout.strip() == f"boundjax {version}"


def test_every_section_ran_and_wrote_numbers(demo):
  assert set(demo) == set(SECTIONS)
  for name, rec in demo.items():
    assert rec["numbers"], name
    assert rec["seconds"] > 0


def test_data_section_sizes(demo):
  sets = demo["data"]["numbers"]["datasets"]
  assert sets["breast_cancer"]["train"] + sets["breast_cancer"]["test"] == 569
  assert sets["digits"]["train"] + sets["digits"]["test"] == 1797
  assert sets["breast_cancer"]["classes"] == 2 and sets["digits"]["classes"] == 10


def test_bounds_section_is_sound_and_crown_never_looser(demo):
  n = demo["bounds"]["numbers"]
  assert n["test_examples"] == 114            # breast_cancer's test split (569 points)
  assert n["violations"] == 0 and n["checked"] == n["samples"] * len(n["eps"]) * 2 * 114 * 2
  ibp, crown = np.asarray(n["robust_accuracy"]["IBP"]), np.asarray(n["robust_accuracy"]["CROWN"])
  assert np.all(ibp <= crown) and np.all(crown <= n["clean_accuracy"])
  assert np.all(np.diff(ibp) <= 0) and np.all(np.diff(crown) <= 0)   # shrinks as eps grows
  assert n["clean_accuracy"] > 0.9


def test_crown_section_orders_the_methods(demo):
  n = demo["crown"]["numbers"]
  w, c = n["mean_width"], n["certified"]
  assert n["violations"] == 0
  assert w["CROWN"] <= w["CROWN-IBP"] <= w["IBP"]
  assert c["IBP"] <= c["CROWN-IBP"] <= c["CROWN"] <= n["examples"]


def test_ensembles_section_family_inside_hypernetwork(demo):
  n = demo["ensembles"]["numbers"]
  assert n["contains_members"] is True
  assert 0 <= n["label_fixed"] <= n["points"]
  assert n["difference_width"] < n["subtraction_width"]   # bj.difference beats IBP(N#) - IBP(N)


def test_agt_section_retraining_inside_and_monotone(demo):
  n = demo["agt"]["numbers"]
  assert n["param_violations"] == 0 and n["prediction_changes"] == 0
  assert n["retrained_models"] > 0 or demo["agt"]["quick"]   # --quick skips the retraining
  cert = [n["certified"][k] for k in sorted(n["certified"], key=int)]
  assert cert[0] == 1.0                       # k = 0: the box is the nominal model itself
  assert all(a >= b for a, b in zip(cert, cert[1:]))
  acc = n["private_accuracy"]
  eps = sorted(acc, key=float)
  assert all(acc[a]["global"] <= acc[b]["global"] + 0.05 for a, b in zip(eps, eps[1:]))


def test_ldcp_section_never_claims_ldcp_wrongly(demo):
  n = demo["ldcp"]["numbers"]
  for kind, q in n["queries"].items():
    assert q["wrong"] == 0, kind
    assert q["proven"] <= q["true"] <= q["inputs"]


def test_barron_section_lower_bound_below_true_minimum(demo):
  for row in demo["barron"]["numbers"]["rows"]:
    assert row["C_fft"] == pytest.approx(row["C_eta"], rel=1e-3)   # C_eta = |mu| in closed form
    assert row["lower_bound"] == pytest.approx(row["L_emp"] - row["gap"], abs=1e-9)
    assert row["lower_bound"] <= row["L_true"]                      # holds w.p. 1 - delta


def test_idp_section_guard_noises_every_query_a_member_disagrees_on(demo):
  n = demo["idp"]["numbers"]
  assert n["exact"] is True and all(b >= 0 for b in n["betas"].values())
  rows = {(r["mechanism"], r["epsilon"]): r for r in n["table"]["rows"]}
  for eps in (0.0, 1.0):
    # an exact β noises at least every query on which some leave-one-out member disagrees
    assert rows["LUCID", eps]["noised_fraction"] >= rows["Naive-iDP", eps]["noised_fraction"]
    assert rows["Naive-Noise", eps]["noised_fraction"] == 1.0
  assert rows["Naive-Noise", 0.0]["expected_accuracy"] == pytest.approx(0.5)

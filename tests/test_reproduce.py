"""`boundjax reproduce`: finding the clone, running, resuming, falling back and rendering.

The fast tests build a tiny fake clone (a `benchmarks/` folder with scripts written here) so every
path of `benchmarks.report.execute` runs in well under a second per script; the slow test runs
the real ``boundjax reproduce --quick`` and opens its report.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import report as R

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = '''
import json, sys, pathlib
args = sys.argv[1:]
out = pathlib.Path(args[args.index("--out") + 1])
if "--fail" in args:
  print("something broke", file=sys.stderr); sys.exit(3)
n = int(args[args.index("--n") + 1])
counter = pathlib.Path("runs.txt")
counter.write_text(counter.read_text() + "x" if counter.exists() else "x")
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps({"provenance": {"command": "python " + " ".join(sys.argv),
                                          "commit": "a" * 40, "date": "2026-01-01T00:00:00",
                                          "machine": {"cpu_count": 2, "device": "cpu"}},
                           "setting": {"n": n}, "value": 2.0 * n, "paper_value": 7.0,
                           "markdown": "| cell | ours (paper) |"}))
'''


def fake_clone(tmp_path: Path) -> Path:
  (tmp_path / "benchmarks" / "results").mkdir(parents=True)
  (tmp_path / "benchmarks" / "common.py").write_text("")
  (tmp_path / "benchmarks" / "toy.py").write_text(SCRIPT)
  return tmp_path


def compare_toy(doc):
  return [("value", doc["paper_value"], doc["value"], "toy")]


def toy_run(paper="barron", quick=("--n", "3", "--out", "{out}"), script="benchmarks/toy.py",
            **kw) -> R.Run:
  return R.Run(paper, "Toy table", script, "toy.json", quick,
               ("--n", "5", "--out", "benchmarks/results/toy.json"), compare_toy, **kw)


def runs_done(root: Path) -> int:
  p = root / "runs.txt"
  return len(p.read_text()) if p.exists() else 0


def test_repo_root_finds_the_clone_and_refuses_elsewhere(tmp_path):
  assert R.repo_root(ROOT / "boundjax") == ROOT
  root = fake_clone(tmp_path / "clone")
  assert R.repo_root(root / "benchmarks") == root
  # outside any clone, the package's own location is tried next: this repository
  assert R.repo_root(tmp_path) == ROOT


def test_repo_root_error_names_the_problem(tmp_path, monkeypatch):
  monkeypatch.setattr(R, "__file__", str(tmp_path / "site-packages" / "boundjax" / "x.py"))
  with pytest.raises(R.NotAClone, match="clone of the repository"):
    R.repo_root(tmp_path)


def test_command_substitutes_the_output_path():
  run = toy_run()
  assert R.command_of(run, "quick", "report/quick/toy.json") == [
      "benchmarks/toy.py", "--n", "3", "--out", "report/quick/toy.json"]
  assert R.command_of(toy_run(quick=None), "quick", "x.json") is None
  assert R.output_path(run, "full") == "benchmarks/results/toy.json"


def test_quick_run_then_resume_skips_the_same_command(tmp_path):
  root = fake_clone(tmp_path)
  run = toy_run()
  first = R.execute(run, "quick", root)
  assert first.status == "ran" and first.label == "quick"
  assert 0 < first.cpu_seconds < 60 and first.seconds > 0
  doc = json.loads((root / "report/quick/toy.json").read_text())
  assert doc["value"] == 6.0 and runs_done(root) == 1
  again = R.execute(run, "quick", root)
  assert again.status == "reused" and runs_done(root) == 1
  # other settings are not the same result: it runs again
  changed = R.execute(toy_run(quick=("--n", "4", "--out", "{out}")), "quick", root)
  assert changed.status == "ran" and runs_done(root) == 2
  full = R.execute(run, "full", root)
  assert full.status == "ran" and (root / "benchmarks/results/toy.json").is_file()
  assert R.execute(run, "full", root).status == "reused" and runs_done(root) == 3


def test_missing_script_failed_run_and_no_quick_setting(tmp_path):
  root = fake_clone(tmp_path)
  missing = R.execute(toy_run(script="benchmarks/not_written_yet.py"), "quick", root)
  assert missing.status == "not yet available" and missing.json_path is None
  failed = R.execute(toy_run(quick=("--fail", "--out", "{out}")), "quick", root)
  assert failed.status == "failed" and "something broke" in failed.log
  no_quick = R.execute(toy_run(quick=None), "quick", root)
  assert no_quick.status == "no result yet"
  R.execute(toy_run(), "full", root)        # now a committed result exists
  shown = R.execute(toy_run(quick=None), "quick", root)
  assert shown.status == "committed" and shown.json_path.name == "toy.json"


def test_a_result_kept_only_in_legacy_is_not_read(tmp_path):
  """benchmarks/results/legacy/ holds results without provenance, which the report never reads:
  a result found only there renders as "No result" with the command that makes it."""
  root = fake_clone(tmp_path)
  (root / "benchmarks/results/legacy").mkdir()
  (root / "benchmarks/results/legacy/toy.json").write_text(json.dumps(
      {"paper_value": 7.0, "value": 5.0}))
  shown = R.execute(toy_run(quick=None), "quick", root)
  assert shown.status == "no result yet" and shown.json_path is None
  R.write_report([shown], ["barron"], root, "quick")
  [sec] = _sections((root / "report/README.md").read_text())
  assert "**No result.**" in sec and "| value |" not in sec and "legacy" not in sec
  assert "python benchmarks/toy.py --n 5 --out benchmarks/results/toy.json" in sec


def test_report_has_every_paper_numbers_side_by_side_and_failures(tmp_path):
  root = fake_clone(tmp_path)
  runs = (toy_run("barron"), toy_run("lucid", quick=("--fail", "--out", "{out}")),
          toy_run("ptr", script="benchmarks/ptr_not_yet.py"))
  path = R.reproduce("quick", root=root, runs=runs, progress=False)
  page = path.read_text()
  for key, title in R.PAPERS.items():
    assert f"id='{key}'" in page and title.split(":")[0] in page
  # the paper's number beside ours in one row, the command and the commit
  assert re.search(r"<td>value</td><td>7</td><td>6</td>", page.replace(".0<", "<"))
  assert "python benchmarks/toy.py --n 3 --out report/quick/toy.json" in page
  assert "a" * 40 in page
  assert "something broke" in page and "not yet available" in page
  assert "<b class='quick'>quick</b>" in page
  assert re.search(r"Status: ran in \d+ s wall, \d+ CPU s", page)
  assert "This invocation ran 2 script(s)" in page
  fig = root / "report" / "figures" / "quick_toy_vs_paper.png"
  assert fig.is_file() and fig.read_bytes()[:4] == b"\x89PNG"
  md = (root / "report" / "README.md").read_text()
  assert "| value | 7 | 6 | toy |" in md.replace(".0 |", " |")
  assert "## Barron" in md and "## PTR" in md and "| cell | ours (paper) |" in md
  assert "<pre>| cell | ours (paper) |</pre>" in page


def test_a_json_the_comparison_cannot_read_is_reported_not_fatal(tmp_path):
  root = fake_clone(tmp_path)
  (root / "benchmarks/results/toy.json").write_text(json.dumps({"paper_x": 1, "other": 2}))
  path = R.reproduce("render", root=root, runs=(toy_run(),), progress=False)
  page = path.read_text()
  assert "could not read the comparison" in page and "paper_x" in page


def test_render_only_runs_nothing(tmp_path):
  root = fake_clone(tmp_path)
  R.reproduce("render", root=root, runs=(toy_run(),), progress=False)
  assert runs_done(root) == 0


def test_bad_arguments_raise_naming_them(tmp_path):
  root = fake_clone(tmp_path)
  with pytest.raises(ValueError, match="mode"):
    R.reproduce("fast", root=root, runs=(), progress=False)
  with pytest.raises(ValueError, match="only"):
    R.reproduce("quick", only=["lucid", "nope"], root=root, runs=(), progress=False)


def test_provenance_of_reads_both_layouts():
  rec = {"command": "python x.py", "commit": "a" * 40, "date": "d", "machine": {}}
  assert R.provenance_of({"provenance": rec, "x": 1}) == rec
  assert R.provenance_of({**rec, "x": 1}) == rec
  assert R.provenance_of({"x": 1}) is None and R.provenance_of([1]) is None


def test_the_table_covers_five_papers_and_existing_scripts_take_its_arguments():
  assert {r.paper for r in R.RUNS} >= {"lucid", "agt", "ptr", "sphynx", "barron"}
  for run in R.RUNS:
    for mode in ("quick", "full"):
      argv = R.command_of(run, mode, R.output_path(run, mode))
      if argv is None or not (ROOT / run.script).is_file():
        continue
      source = (ROOT / run.script).read_text()
      for flag in (a for a in argv[1:] if a.startswith("--")):
        assert f'"{flag}"' in source, f"{run.script} has no option {flag}"
      if mode == "quick":
        assert "--out" in argv or "--results" in argv, f"{run.script}: quick must write in report/"


def test_cli_reports_a_bad_paper_name():
  from boundjax.cli import main
  with pytest.raises(SystemExit, match="unknown paper"):
    main(["reproduce", "--render-only", "--only", "nope"])


def test_cli_finds_the_report_of_the_clone_and_refuses_an_installed_wheel(tmp_path, monkeypatch):
  from boundjax import cli
  monkeypatch.chdir(tmp_path)
  assert Path(cli._benchmark_report().__file__) == ROOT / "benchmarks" / "report.py"
  monkeypatch.setattr(cli, "__file__", str(tmp_path / "site-packages" / "boundjax" / "cli.py"))
  with pytest.raises(SystemExit, match="clone of the repository"):
    cli.main(["reproduce", "--render-only"])


@pytest.mark.slow
def test_quick_reproduction_writes_a_report_with_all_papers():
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-m", "boundjax.cli", "reproduce", "--quick"],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  page = (ROOT / "report" / "index.html").read_text()
  for key in ("lucid", "agt", "ptr", "sphynx", "barron"):
    assert f"<h2 id='{key}'>" in page
  assert "failed" not in re.findall(r"Status: (\w+)", page)
  md = (ROOT / "report" / "README.md").read_text()
  for sec in _sections(md):   # every section: its table and its figure, or why not and how
    assert "**No result.**" in sec or (
        "| quantity |" in sec and _figures(sec, ROOT / "report" / "figures")), sec[:300]


def test_a_result_from_uncommitted_code_is_flagged_in_the_report(tmp_path):
  root = fake_clone(tmp_path)
  doc = {"provenance": {"command": "python benchmarks/toy.py --n 5", "commit": "b" * 40 + "+dirty",
                        "date": "2026-01-01T00:00:00", "machine": {"cpu_count": 2}},
         "value": 10.0, "paper_value": 7.0}
  (root / "benchmarks/results/toy.json").write_text(json.dumps(doc))
  page = R.reproduce("render", root=root, runs=(toy_run(),), progress=False).read_text()
  md = (root / "report" / "README.md").read_text()
  assert "Not reproducible" in page and "Not reproducible" in md and "b" * 40 + "+dirty" in md
  doc["provenance"]["commit"] = "b" * 40  # the same result from a clean commit is not flagged
  (root / "benchmarks/results/toy.json").write_text(json.dumps(doc))
  page = R.reproduce("render", root=root, runs=(toy_run(),), progress=False).read_text()
  assert "Not reproducible" not in page


def test_a_benchmark_run_on_uncommitted_code_says_so_on_stderr(monkeypatch, capsys):
  from benchmarks import common
  monkeypatch.setattr(common, "git_commit", lambda: "c" * 40 + "+dirty")
  rec = common.record(["benchmarks/toy.py"])
  assert rec["commit"].endswith("+dirty")
  assert "WARNING: uncommitted changes" in capsys.readouterr().err
  monkeypatch.setattr(common, "git_commit", lambda: "c" * 40)
  common.record(["benchmarks/toy.py"])
  assert "WARNING" not in capsys.readouterr().err


# ------------------------------------------------ every section shows its table and its figure

NESTED = '''
import json, sys, pathlib
args = sys.argv[1:]
out = pathlib.Path(args[args.index("--out") + 1])
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps({"provenance": {"command": "python " + " ".join(sys.argv),
                                          "commit": "b" * 40, "date": "2026-01-01T00:00:00",
                                          "machine": {"cpu_count": 2, "device": "cpu"}},
                           "setting": {"gammas": [0.5, 4.0]},
                           "results": [{"gamma": 0.5, "bound": 0.125},
                                       {"gamma": 4.0, "bound": 0.75}]}))
'''


def _sections(md: str) -> list[str]:
  """The report's Markdown cut into its result sections (each starts with its title); the
  tables at the top of a paper's part (Headlines, Not reproduced here) are not result
  sections."""
  parts = [p.split("\n## ")[0] for p in re.split(r"^### ", md, flags=re.M)[1:]]
  return [p for p in parts if not p.startswith(("Headlines", "Not reproduced here"))]


def _figures(section: str, folder: Path) -> list[Path]:
  return [folder / name for name in re.findall(r"!\[[^\]]*\]\(figures/([^)]+)\)", section)]


def test_a_result_with_only_its_own_numbers_gets_a_table_and_a_figure(tmp_path):
  root = fake_clone(tmp_path)
  (root / "benchmarks" / "nested.py").write_text(NESTED)
  run = R.Run("barron", "Nested audit", "benchmarks/nested.py", "nested.json",
              ("--out", "{out}"), ("--out", "benchmarks/results/nested.json"))
  R.reproduce("quick", root=root, runs=(run,), progress=False)
  md = (root / "report" / "README.md").read_text()
  [sec] = _sections(md)
  assert sec.startswith("Nested audit (benchmarks/nested.py)")
  # the results are numbers the JSON holds below its top level, not a setting
  assert re.search(r"^\| results\[gamma=0\.5\]\.bound \| - \| 0\.125 \|", sec, re.M)
  assert re.search(r"^\| results\[gamma=4(\.0)?\]\.bound \| - \| 0\.75 \|", sec, re.M)
  figs = _figures(sec, root / "report" / "figures")
  assert figs and all(f.read_bytes()[:4] == b"\x89PNG" for f in figs)
  assert "No result" not in sec


def test_a_missing_result_says_so_and_names_its_command(tmp_path):
  root = fake_clone(tmp_path)
  import dataclasses
  runs = (dataclasses.replace(toy_run("barron", quick=None), title="No quick setting"),
          dataclasses.replace(toy_run("lucid", script="benchmarks/not_written_yet.py"),
                              title="No script"),
          dataclasses.replace(toy_run("ptr", quick=("--fail", "--out", "{out}")),
                              title="A failed run"))
  R.reproduce("quick", root=root, runs=runs, progress=False)
  md = (root / "report" / "README.md").read_text()
  page = (root / "report" / "index.html").read_text()
  secs = {s.split(" (")[0]: s for s in _sections(md)}
  assert set(secs) == {"No quick setting", "No script", "A failed run"}
  for sec in secs.values():
    assert "**No result.**" in sec and "missing" in sec
    assert not _figures(sec, root / "report" / "figures")
  # each names the command that writes the result: the full run without a quick setting
  assert ("python benchmarks/toy.py --n 5 --out benchmarks/results/toy.json"
          in secs["No quick setting"])
  assert ("python benchmarks/not_written_yet.py --n 3 --out report/quick/toy.json"
          in secs["No script"])
  assert "--only lucid" in secs["No script"] and "not in this clone" in secs["No script"]
  assert "python benchmarks/toy.py --fail --out report/quick/toy.json" in secs["A failed run"]
  assert "something broke" in secs["A failed run"]
  assert page.count("<b>No result.</b>") == 3


@pytest.mark.parametrize("script", ["benchmarks/barron.py", "benchmarks/adult_audit.py"])
def test_barron_paper_sections_have_tables_and_figures(tmp_path, script):
  """The two Barron results (Figure 1 and the Adult audit) as a quick run leaves them: each
  section has a table with our numbers per setting and its figure."""
  run = next(r for r in R.RUNS if r.script == script)
  doc = json.loads((ROOT / "benchmarks" / "results" / run.result).read_text())
  (tmp_path / "q").mkdir()
  path = tmp_path / "q" / run.result
  path.write_text(json.dumps(doc))
  out = tmp_path / "report"
  R.write_report([R.Outcome(run, "ran", path, "quick", 1.0, 1.0)], ["barron"], ROOT, "quick",
                 out_dir=out)
  [sec] = _sections((out / "README.md").read_text())
  table = [line for line in sec.splitlines() if line.startswith("| ") and "quantity" not in line]
  ours = [line.split(" | ")[2] for line in table]
  assert sum(re.fullmatch(r"-?[\d.]+(e-?\d+)?", o) is not None for o in ours) >= 2, sec
  # one row per setting of the run: mu for Figure 1, the noise level gamma for the audit
  settings = ([r["mu"] for r in doc["rows"]] if "rows" in doc
              else [r["gamma"] for r in doc["representation"]])
  for v in settings:
    assert re.search(rf"(mu|gamma)={v:g}:", sec), v
  figs = _figures(sec, out / "figures")
  assert figs and all(f.is_file() and f.read_bytes()[:4] == b"\x89PNG" for f in figs)
  assert "No result" not in sec and "No figure" not in sec


# ------------------------------------ the papers' numbers, typed here from the papers' tables

# LUCID, Tables 1-3, Adult 2x50: accuracy (%) per (mechanism, epsilon).
LUCID_ADULT_2X50 = {("LUCID", 0.0): 82.4, ("LUCID", 0.2): 82.4, ("LUCID", 1.0): 82.5,
                    ("Naive-Noise", 0.0): 49.9, ("Naive-Noise", 0.2): 51.7,
                    ("Naive-Noise", 1.0): 58.2, ("Naive-iDP", 0.0): 83.1,
                    ("Naive-iDP", 0.2): 82.9, ("Naive-iDP", 1.0): 83.1,
                    ("DP-SGD", 0.02): 23.6, ("DP-SGD", 0.2): 76.3, ("DP-SGD", 1.0): 76.3,
                    ("ALIBI", 0.02): 67.4, ("ALIBI", 0.2): 77.4, ("ALIBI", 1.0): 82.2}
# our benchmark's names for variants of the paper's mechanisms
OUR_VARIANTS = {"DP-SGD (no tuning)": "DP-SGD", "DP-SGD best of 4": "DP-SGD",
                "ALIBI (no tuning)": "ALIBI",
                "Naive-iDP (200/32561 nets)": "Naive-iDP"}
# LUCID, Table 1: (hidden layers) -> Acc w/o-p, beta0, T0 (h), beta1, T1 (h)
LUCID_TABLE1 = {"50,50": (83.1, 0.55, 2.9, 0.63, 3.0), "100,100": (83.3, 0.93, 4.3, 0.91, 4.1),
                "conv": (79.2, 0.29, 0.2, 0.52, 0.1)}
# LUCID, Table 4, Adult conv: variant -> (beta0, beta1)
LUCID_TABLE4_CONV = {"H": (0.96, 0.58), "HM": (0.86, 0.58), "HMRiS": (0.87, 0.58),
                     "HMB": (0.33, 0.24), "LUCID": (0.40, 0.36)}
# Sphynx, Table 1, Adult: (TP, TN) of each kind out of 100 neighbourhoods
SPHYNX_TABLE1 = {"2x50": {"membership": (93, 0), "dp_robustness": (75, 21),
                          "sensitivity": (85, 10)},
                 "2x100": {"membership": (82, 1), "dp_robustness": (54, 39),
                           "sensitivity": (75, 10)},
                 "4x50": {"membership": (93, 0), "dp_robustness": (11, 86),
                          "sensitivity": (1, 97)}}
# Sphynx, Table 4, Adult 2x50: network abstraction rate and overcoverage, Int. Abs. and Sphynx
SPHYNX_TABLE4 = {("int_abs", "network_abstraction_rate"): 77.04, ("int_abs", "overcoverage"): 1.0,
                 ("predint", "network_abstraction_rate"): 94.55,
                 ("predint", "overcoverage"): 4.52}
# PTR supplement, Table 1: (data set, method) -> accuracy at eps 1, 2, 5, 7, inf
PTR_TABLE1 = {("mnist", "LDP-Image"): (0.1, 0.1, 0.1, 0.3, 0.99),
              ("mnist", "LDP-Embedding"): (0.1075, 0.1319, 0.1927, 0.3107, 0.9096),
              ("mnist", "Adversarial"): (0.514, 0.751, 0.891, 0.912, 0.9291),
              ("fmnist", "LDP-Image"): (0.1, 0.1, 0.1, 0.1, 0.92),
              ("fmnist", "LDP-Embedding"): (0.1012, 0.1251, 0.1708, 0.2420, 0.7798),
              ("fmnist", "Adversarial"): (0.371, 0.554, 0.678, 0.722, 0.781)}
# AGT, Table 1: student accuracy (%) per teacher mechanism and data set
AGT_TABLE1 = {"Blobs": {"single_gs": 82.8, "single_ss": 99.8, "ensemble_gs": 99.5,
                        "ensemble_ss": 98.1, "dpsgd": 1.0},
              "OctMNIST": {"single_gs": 12.7, "single_ss": 18.7, "ensemble_gs": 14.1,
                           "ensemble_ss": 19.8, "dpsgd": 81.2},
              "IMDB": {"single_gs": 54.4, "single_ss": 73.5, "ensemble_gs": 73.0,
                       "ensemble_ss": 71.7, "dpsgd": 70.5}}
# headline numbers: (paper, a words of the claim, the number the paper states)
HEADLINE_NUMBERS = [("lucid", "at eps = 0 ", 1.4), ("lucid", "at eps = 0.2 ", 1.3),
                    ("lucid", "at eps = 1 ", 1.1), ("lucid", "DP baselines", 12.7),
                    ("lucid", "T0 + T1", 4.8), ("agt", "Cost of an AGT run", 2),
                    ("agt", "SS keeps", 10), ("agt", "beats DP-SGD", 100),
                    ("ptr", "LDP-Embedding", 0.41), ("sphynx", "Share of the networks", 7),
                    ("sphynx", "Training-time", 13.6), ("sphynx", "Verification-time", 1.7e4),
                    ("sphynx", "TP + TN", 93.3), ("sphynx", "False positive", 1.1),
                    ("sphynx", "False negative", 5.5), ("sphynx", "abstraction", 90),
                    ("barron", "Lower bound", 89)]


def _committed(name: str) -> dict:
  return json.loads((ROOT / "benchmarks" / "results" / name).read_text())


def test_lucid_accuracy_rows_show_the_papers_numbers_also_for_our_variants():
  rows = R.compare_idpdb_accuracy(_committed("idpdb_accuracy_adult_2x50.json"))
  seen = set()
  for q, paper, _, _ in rows:
    m = re.fullmatch(r"(.+) accuracy \(%\), eps=(\S+)", q)
    if not m:
      continue
    key = (OUR_VARIANTS.get(m.group(1), m.group(1)), float(m.group(2)))
    assert paper == LUCID_ADULT_2X50.get(key), (q, paper)
    seen.add(key)
  assert set(LUCID_ADULT_2X50) <= seen     # every paper cell is shown, DP-SGD's included
  # an unknown variant gets no paper number rather than a guess
  assert R.paper_mechanism("DP-SGD something else", {}) is None


def test_a_dp_baseline_beating_lucid_is_stated_with_both_numbers():
  doc = _committed("idpdb_accuracy_adult_2x50.json")
  acc = {(r["mechanism"], r["epsilon"]): 100 * r["accuracy"] for r in doc["table"]["rows"]}
  rows = {q: (p, o) for q, p, o, _ in R.dp_beats_lucid_rows(doc)}
  # exactly the DP baselines at the same epsilon whose accuracy is above LUCID's are listed
  # (the test-selected DP-SGD is (4 eps)-DP: not compared at eps)
  same_eps = ("DP-SGD (no tuning)", "ALIBI (no tuning)", "ALIBI")
  want = {f"eps={e:g}: {m} beats LUCID" for (m, e), a in acc.items()
          if m in same_eps and a > acc[("LUCID", e)]}
  assert set(rows) == want and want, (set(rows), want)
  assert not any("best of" in q for q in rows)
  for q, (paper, ours) in rows.items():
    m, e = q.split(": ", 1)[1].rsplit(" beats", 1)[0], float(q.split(":")[0][4:])
    assert ours == f"{m} {acc[(m, e)]:.2f} vs LUCID {acc[('LUCID', e)]:.2f}"
    base = R.paper_mechanism(m, doc["row_labels"])
    p_b, p_l = LUCID_ADULT_2X50[(base, e)], LUCID_ADULT_2X50[("LUCID", e)]
    assert f"{base} {p_b:g} vs LUCID {p_l:g}" in paper
    assert ("does not beat" in paper) == (p_b <= p_l)


def test_lucid_table1_sphynx_and_barron_rows_show_the_papers_numbers():
  for hidden, (acc, b0, t0, b1, t1) in LUCID_TABLE1.items():
    doc = {"args": {"hidden": hidden}, "betas": {"0": 0.1, "1": 0.2}, "n": {"test_accuracy": 0.8},
           "classes": {"0": {"seconds": 36.0}, "1": {"seconds": 72.0}}, "family": {}}
    rows = {q: p for q, p, _, _ in R.compare_idpdb(doc)}
    assert rows == {"beta_0": b0, "beta_1": b1, "T_0 (hours)": t0, "T_1 (hours)": t1,
                    "N test accuracy (%)": acc}
  variants = {**{v: {"beta": 0.1, "seconds": 1.0} for v in LUCID_TABLE4_CONV},
              "Naive": {"beta": None, "seconds": 1.0}, "Screen": {"beta": 0.1, "seconds": 1.0}}
  abl = {"members": 10, "time_limit_s": 100.0, "classes": {"0": variants, "1": variants}}
  for hidden in ("conv", "50,50"):
    for q, paper, _, _ in R.compare_ablation({"args": {"hidden": hidden}, "ablation": abl}):
      c, variant = int(q.split(":")[0].split()[1]), q.split(": ")[1].split()[0]
      want = LUCID_TABLE4_CONV[variant][c] if hidden == "conv" and variant in LUCID_TABLE4_CONV \
          else None          # the paper's ablation is not on Adult 2x50; Naive has no bound
      assert paper == want, (hidden, q, paper)
  kinds = {"membership", "dp_robustness", "sensitivity"}
  doc = {"results": [{"arch": arch, "kinds": {k: {"confusion_sphynx": {
      "TP": 1, "TN": 0, "FP": 0, "FN": 0}} for k in kinds}} for arch in SPHYNX_TABLE1]}
  for q, paper, _, _ in R.compare_ldcp(doc):
    arch, kind = q.split(":")[0].split()
    assert paper == sum(SPHYNX_TABLE1[arch][kind]), q
  for q, paper, _, _ in R.compare_hypernet(_committed("hypernet_adult_2x50.json")):
    variant, metric = q.split(": ")
    assert paper == SPHYNX_TABLE4[(variant, metric)], q
  [(_, paper, _, _)] = R.compare_barron({"ratio_range": [0.5, 0.6]})
  assert paper == "0.89-0.97"


def test_ptr_rows_show_the_papers_table1_also_for_our_variants():
  eps = ("1", "2", "5", "7", "inf")
  seen = set()
  for q, paper, _, _ in R.compare_ptr(_committed("ptr.json")):
    m = re.fullmatch(r"(\w+) (.+) accuracy, eps=(\S+)", q)
    if not m:
      assert paper is None, q          # the release rows: no paper number
      continue
    ds, method, e = m.groups()
    method = method.split(" (")[0]      # our variants: the authors' code's sensitivity
    assert paper == PTR_TABLE1[(ds, method)][eps.index(e)], q
    seen.add((ds, method))
  assert seen == set(PTR_TABLE1)


def test_headlines_state_the_papers_numbers():
  for paper, words, value in HEADLINE_NUMBERS:
    [h] = [h for h in R.HEADLINES if h.paper_key == paper and words in h.claim]
    nums = [float(x) for x in re.findall(r"\d+(?:\.\d+)?(?:e\d+)?", h.paper)]
    assert value in nums, (paper, words, h.paper)
  assert {h.paper_key for h in R.HEADLINES} == {"lucid", "agt", "ptr", "sphynx", "barron"}


def test_headlines_read_ours_from_the_results_and_name_the_command_when_missing(tmp_path):
  rows = {q: o for q, _, o, _ in R.headline_rows("lucid", ROOT, {})}
  acc = {(r["mechanism"], r["epsilon"]): r["accuracy"]
         for r in _committed("idpdb_accuracy_adult_2x50.json")["table"]["rows"]}
  n_acc = _committed("idpdb_adult_2x50.json")["n"]["test_accuracy"]
  [eps0] = [o for q, o in rows.items() if "at eps = 0 " in q]
  assert eps0.startswith(f"{100 * (n_acc - acc[('LUCID', 0.0)]):.2f} pp")
  [beats] = [o for q, o in rows.items() if "more accurate than LUCID" in q]
  eps_beat = [e for (m, e), a in acc.items()
              if m == "DP-SGD (no tuning)" and a > acc[("LUCID", e)]]
  assert eps_beat
  for e in eps_beat:
    dp, lucid = 100 * acc[("DP-SGD (no tuning)", e)], 100 * acc[("LUCID", e)]
    assert f"{dp:.2f} vs LUCID {lucid:.2f}" in beats
  # a clone without the results: every headline says so and names the command
  root = fake_clone(tmp_path)
  for _, _, ours, source in R.headline_rows("sphynx", root, {}):
    assert ours == "No result" and "benchmarks/ldcp.py" in source
  R.reproduce("render", root=root, runs=(toy_run("lucid"),), only=["lucid"], progress=False)
  md = (root / "report" / "README.md").read_text()
  part = md.split("\n## ", 1)[1]
  assert part.index("### Headlines") < part.index("### Toy table")


def _vnncomp_doc(cat, statuses, commit="c" * 40, timeout=60.0):
  inst = [{"category": cat, "onnx_rel": f"{cat}/n.onnx", "vnnlib_rel": f"{cat}/p{i}.vnnlib",
           "status": s, "timeout": timeout} for i, s in enumerate(statuses)]
  solved = sum(s in ("sat", "unsat") for s in statuses)
  return {"provenance": {"command": "python benchmarks/vnncomp.py", "commit": commit},
          "summary": {cat: {"instances": len(statuses), "solved": solved, "wrong": 0}},
          "instances": inst}


def test_vnncomp_table_has_a_row_per_category_with_abcrown_and_missing_ones(tmp_path):
  root = fake_clone(tmp_path / "clone")
  res = root / "benchmarks" / "results"
  (res / "vnncomp_acasxu.json").write_text(json.dumps(
      _vnncomp_doc("acasxu", ["unsat", "timeout", "sat"])))
  shared = tmp_path / "shared" / "benchmarks" / "vnncomp2021"
  shared.mkdir(parents=True)
  lines = ["category,onnx,vnnlib,verdict,timeout,abcrown_2021,abcrown_2021_s",
           "acasxu,acasxu/n.onnx,acasxu/p0.vnnlib,unsat,116,timeout,116",
           "acasxu,acasxu/n.onnx,acasxu/p1.vnnlib,unsat,116,unsat,1",
           "acasxu,acasxu/n.onnx,acasxu/p2.vnnlib,sat,116,unknown,116",
           "acasxu,acasxu/n.onnx,acasxu/p9.vnnlib,sat,116,sat,1",   # not run by us
           "mnistfc,mnistfc/m.onnx,mnistfc/q.vnnlib,unsat,120,unsat,2"]
  (shared / "instances.csv").write_text("\n".join(lines) + "\n")
  t = R.vnncomp_table(root)
  rows = {r[0]: r for r in t.rows}
  assert set(R.VNNCOMP_CATEGORIES) <= set(rows)
  assert rows["acasxu"][1:6] == ("2 / 3", 0, "60 s", "`cccccccccccc`", "1 / 3")
  assert rows["mnistfc"][1] == "No result" and rows["mnistfc"][5] == "1 / 1"
  assert ("python benchmarks/vnncomp.py --category mnistfc --csv-timeouts --out "
          "benchmarks/results/vnncomp_mnistfc.json") in rows["mnistfc"][6]
  md = "\n".join(R.markdown_table(t))
  assert "| acasxu | 2 / 3 | 0 | 60 s |" in md
  page = "\n".join(R.html_table(t))
  assert "<td><code>python benchmarks/vnncomp.py --category mnistfc --csv-timeouts" in page


def test_vnncomp_table_reads_every_committed_category():
  rows = {r["category"]: r for r in R.vnncomp_category_rows(ROOT)}
  for cat in R.VNNCOMP_CATEGORIES:
    path = ROOT / "benchmarks" / "results" / f"vnncomp_{cat}.json"
    if not path.is_file():
      assert rows[cat]["solved"] is None and f"--category {cat}" in rows[cat]["command"]
      continue
    s = json.loads(path.read_text())["summary"][cat]
    assert (rows[cat]["solved"], rows[cat]["instances"], rows[cat]["wrong"]) == (
        s["solved"], s["instances"], s["wrong"])
  assert not any(r.result == "vnncomp.json" for r in R.RUNS)   # the old 8-instance run


# ------------------------------------------- README's measured numbers come from the report

def test_readme_blocks_equal_what_the_committed_results_give():
  """README.md quotes measured numbers only between report markers; a stale block (a number
  that no longer matches its JSON) fails here: `boundjax reproduce --render-only --readme`."""
  text = (ROOT / "README.md").read_text()
  blocks = R.readme_blocks(ROOT / "benchmarks" / "results")
  assert set(blocks) == set(R.README_BLOCKS)
  for name, body in blocks.items():
    held = R.readme_block_text(text, name)
    assert held is not None, f"README.md has no report:{name} block"
    assert held.strip() == body.strip(), f"README.md's report:{name} block is stale"
  # the numbers found wrong or in no JSON are gone from the prose
  for stale in ("1.1-1.7×", "within 0.04 of", "majority 0.658"):
    assert stale not in text


def test_update_readme_replaces_inline_and_table_blocks_and_names_a_missing_one():
  text = ("A fit takes <!-- report:a -->old<!-- /report:a --> here.\n\n"
          "<!-- report:t -->\n| x |\n|---|\n| 1 |\n<!-- /report:t -->\nend\n")
  new = R.update_readme(text, {"a": "0.67-1.69×", "t": "| x |\n|---|\n| 2 |"})
  assert "A fit takes <!-- report:a -->0.67-1.69×<!-- /report:a --> here." in new
  assert "<!-- report:t -->\n| x |\n|---|\n| 2 |\n<!-- /report:t -->\nend" in new
  assert R.readme_block_text(new, "t").strip().endswith("| 2 |")
  with pytest.raises(ValueError, match="report:nope"):
    R.update_readme(text, {"nope": "x"})


def test_readme_crown_block_reads_the_range_over_every_run():
  rows = [{"net": "6-64-64-2", "k": k, "interval_fit_s": 10.0, "crown_fit_s": c,
           "interval_box_width": 1.0, "crown_box_width": w, "interval_certified": 0.5,
           "crown_certified": 0.75} for k, c, w in ((1, 5.0, 0.5), (5, 12.0, 0.25),
                                                    (10, 10.0, 0.5))]
  rows.append({"net": "6-128-2", "k": 1, "interval_fit_s": 4.0, "crown_fit_s": 8.0,
               "interval_box_width": 1.0, "crown_box_width": 1.0, "interval_certified": 1.0,
               "crown_certified": 1.0})
  text = R.readme_agt_crown({"rows": rows})
  assert "0.50 / 0.50 / 0.50 (interval) to 0.75 / 0.75 / 0.75 (CROWN) at k = 1 / 5 / 10" in text
  assert "0.25-0.50 times as wide" in text
  assert "0.50-2.00× the interval one over the 4 runs" in text


def test_render_only_with_readme_rewrites_the_clones_readme(tmp_path, monkeypatch):
  root = fake_clone(tmp_path)
  (root / "README.md").write_text("x <!-- report:a -->old<!-- /report:a --> y\n")
  (root / "benchmarks/results/a.json").write_text(json.dumps({"v": 3}))
  monkeypatch.setattr(R, "README_BLOCKS", {"a": ("a.json", lambda d: f"v = {d['v']}")})
  R.reproduce("render", root=root, runs=(toy_run(),), progress=False, readme=True)
  assert (root / "README.md").read_text() == "x <!-- report:a -->v = 3<!-- /report:a --> y\n"


def test_agt_table1_rows_show_the_papers_values_for_the_stand_in_data_set():
  t1 = {"Q": 100, "draws": 3, "paper": {"dataset": "OctMNIST", **AGT_TABLE1["OctMNIST"]},
        "mechanisms": {m: {"student_accuracy": 0.5, "teacher_label_accuracy": 0.6}
                       for m in AGT_TABLE1["OctMNIST"]}}
  f4 = {"T": [1, 5], "eps": [1.0, 0.1], "check": {"tolerance": 0.02, "eps1": {"holds": True},
                                                   "eps0.1": {"holds": False}}}
  rows = R.compare_agt_privacy({"fashion": {"certified_fraction": {}, "nominal_accuracy": 0.8,
                                            "table1": t1, "fig4": f4}})
  t1_rows = [r for r in rows if "Table 1" in r[0]]
  assert len(t1_rows) == 5
  for q, paper, ours, note in t1_rows:
    assert ours == "50.0" and "OctMNIST" in note
  # the stored setting's paper values are the paper's (typed here from its Table 1)
  sys.path.insert(0, str(ROOT / "benchmarks"))
  import agt_privacy as AP
  for name, ds in AP.TABLE1_PAPER_DATASET.items():
    assert AP.TABLE1_PAPER[name] == AGT_TABLE1[ds]
  assert sorted(p for _, p, _, _ in t1_rows) == sorted(AGT_TABLE1["OctMNIST"].values())
  f4_rows = {q: o for q, _, o, _ in rows if "Fig. 4" in q}
  assert sorted(f4_rows.values()) == ["no", "yes"]


def test_alibi_is_tuned_on_as_many_points_as_dp_sgd_and_both_rows_meet_the_paper():
  sys.path.insert(0, str(ROOT / "benchmarks"))
  import idpdb_accuracy as IA
  a = IA.parse([])
  dp_points = len(IA._floats(a.dp_grid_lr, "lr")) * len(IA._floats(a.dp_grid_clip, "clip"))
  grid = IA.alibi_grid(a)
  assert len(grid) == dp_points and all({"lr", "iterations"} == set(p) for p in grid)
  labels = IA.row_labels(None, 100, [], False)
  assert labels["ALIBI untuned"][0] == "ALIBI (no tuning)" and labels["ALIBI"][0] == "ALIBI"
  # both ALIBI rows are compared with the paper's ALIBI, at their own epsilon (unlike DP-SGD's
  # test-selected best, whose guarantee is a multiple of epsilon)
  assert R.paper_mechanism("ALIBI (no tuning)", labels) == "ALIBI"
  assert R.paper_mechanism("ALIBI", labels) == "ALIBI"
  assert "ALIBI (no tuning)" not in R.other_epsilon_rows(labels)


def test_what_is_not_reproduced_is_listed_with_its_reason_in_the_paper_part(tmp_path):
  for paper, items in R.NOT_REPRODUCED.items():
    assert paper in R.PAPERS and items
    tables = {t.title: t for t in R.paper_tables(paper, ROOT, {})}
    t = tables["Not reproduced here"]
    assert [w for w, _ in t.rows] == [w for w, _ in items], t.rows
    assert all(why.strip() and "{" not in why for _, why in t.rows), t.rows
  # the whole families' training time is computed from ldcp.json's measured time per network
  doc = json.loads((ROOT / "benchmarks/results/ldcp.json").read_text())
  sphynx = dict(R.paper_tables("sphynx", ROOT, {})[-1].rows)
  why = sphynx["Table 1 on Adult 2x100 and 4x50 against their whole families (32,562 networks "
               "each)"]
  for r in doc["results"]:
    hours = r["per_network_s"] * r["family_size"] / 3600
    assert f"{r['arch']} ({r['epochs']} epochs) {r['per_network_s']:.2f} s" in why, why
    assert f"about {hours:.1f} h" in why, why
  out = tmp_path / "report"
  R.write_report([], ["agt"], ROOT, "render", out_dir=out)
  text = (out / "README.md").read_text()
  assert "Not reproduced here" in text and "Fig. 9" in text


def test_ldcp_reports_no_training_time_for_a_pool_loaded_without_one(monkeypatch):
  """A pool loaded from a checkpoint that recorded no training time has no training time in
  ``ldcp.py``'s results (None, ``-`` in its table), not the loading's few seconds as before
  (``ldcp_2x50_full.json`` reported 2.7 s for 32,562 networks); the report's training speed-up
  is ``(n + 1) / K``, which needs no time."""
  monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
  import ldcp as L
  doc = json.loads((ROOT / "benchmarks/results/ldcp.json").read_text())
  r = doc["results"][0]
  untimed = dict(r, train_pool_s=None, per_network_s=None, train_sphynx_s_est=None,
                 train_naive_full_s_est=None)
  lines = [ln for ln in L.table([untimed]).splitlines() if ln.startswith(r["arch"])]
  timed = [ln for ln in L.table([r]).splitlines() if ln.startswith(r["arch"])]
  assert lines != timed and any(" - " in ln for ln in lines), lines
  src = (ROOT / "benchmarks/ldcp.py").read_text()
  assert "train_s = None" in src and "else:  # loaded from a checkpoint whose" in src
  h = next(h for h in R.HEADLINES if "Training-time speed-up" in h.claim)
  full = json.loads((ROOT / "benchmarks/results/ldcp_2x50_full.json").read_text())
  rf = full["results"][0]
  assert h.ours(full).startswith(f"{rf['family_size'] / rf['K']:.1f}x"), h.ours(full)


def test_lucid_table1_states_the_pgd_leak_beside_beta():
  """The PGD lower bound on beta* is shown (no paper number), with the interval it gives;
  an attack that found nothing (-inf, stored as a string) adds no row."""
  doc = {"args": {"hidden": "conv"}, "betas": {"0": 1.5, "1": 1.25}, "family": {},
         "classes": {"0": {"attack_lower": 0.099, "attack_member": 50},
                     "1": {"attack_lower": "-inf", "attack_member": None}}}
  rows = {q: (p, o, n) for q, p, o, n in R.compare_idpdb(doc)}
  q = "beta_0: largest leaking confidence found by PGD"
  assert rows[q][:2] == (None, 0.099) and "[0.099, 1.5]" in rows[q][2]
  assert not any(k.startswith("beta_1: largest") for k in rows)

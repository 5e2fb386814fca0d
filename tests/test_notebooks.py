"""Every notebook in notebooks/ executes without a cell error (what CI runs).

Each notebook runs in a fresh Jupyter kernel started from *this* interpreter (the project's
.venv), whatever kernelspecs the machine has: the tests write a private kernelspec whose argv is
``sys.executable -m ipykernel_launcher`` and put it first on ``JUPYTER_PATH``. The working
directory is notebooks/, as when a notebook is opened in Jupyter.

Fast mode: the tests set ``BOUNDJAX_NOTEBOOK_FAST=1``. Notebooks whose full run takes more than
about a minute read it in their first cell and shrink their sizes; the outputs stored in the
repository come from the full run. Notebooks are found by globbing, so a new one is tested
without touching this file. Notebooks listed in `SLOW` run only with ``-m slow``.

After a notebook runs, `CHECKS` reads its printed outputs and checks a few key numbers (soundness
counts that must be 0, verdicts that must agree, accuracies above the majority rate, bounds
ordered as the theory says). Every notebook must have an entry in `CHECKS`: a new notebook fails
`test_every_notebook_has_output_checks` until its numbers are checked too.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys
import time
from typing import Callable

import pytest

import ipykernel  # noqa: F401  (the kernel the notebooks run in; a dev dependency)
import nbclient
import nbformat

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
KERNEL = "boundjax-tests"
TIMEOUT_S = 600        # per cell
SLOW: set[str] = set()  # notebook file names too slow for the fast suite even in fast mode


def _params():
  out = []
  for path in sorted(NOTEBOOKS.glob("*.ipynb")):
    marks = [pytest.mark.slow] if path.name in SLOW else []
    out.append(pytest.param(path, id=path.stem, marks=marks))
  return out


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
  """A JUPYTER_PATH holding a kernelspec that starts this very interpreter."""
  root = tmp_path_factory.mktemp("jupyter")
  spec_dir = root / "kernels" / KERNEL
  spec_dir.mkdir(parents=True)
  spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
          "display_name": "boundjax (tests)", "language": "python"}
  (spec_dir / "kernel.json").write_text(json.dumps(spec))
  return str(root)


def _execute(nb, kernel_env: str, monkeypatch, cwd: pathlib.Path, fast: bool = True):
  monkeypatch.setenv("JUPYTER_PATH", kernel_env)
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
  if fast:
    monkeypatch.setenv("BOUNDJAX_NOTEBOOK_FAST", "1")
  client = nbclient.NotebookClient(nb, timeout=TIMEOUT_S, startup_timeout=180, kernel_name=KERNEL,
                                   allow_errors=False, resources={"metadata": {"path": str(cwd)}})
  client.execute()
  return nb


# ---------------------------------------------------------------------------------------------
# What each notebook must print (read from its executed text outputs)
# ---------------------------------------------------------------------------------------------

def _text(nb) -> str:
  """Every stream and text/plain output of the executed notebook, in order."""
  parts = []
  for cell in nb.cells:
    for out in cell.get("outputs", []):
      if out.get("output_type") == "stream":
        parts.append(out.get("text", ""))
      elif "data" in out and "text/plain" in out["data"]:
        parts.append(out["data"]["text/plain"])
  return "\n".join(parts)


def _find(pattern: str, text: str, conv=float) -> tuple:
  m = re.search(pattern, text)
  assert m, f"output not found: {pattern!r}"
  return tuple(conv(g) for g in m.groups())


def _findall(pattern: str, text: str) -> list:
  rows = re.findall(pattern, text)
  assert rows, f"output not found: {pattern!r}"
  return rows


def _check_01_bounds(nb):
  t = _text(nb)
  (acc,) = _find(r"training loss [\d.]+, accuracy ([\d.]+)", t)
  assert acc >= 0.9, acc
  ibp, crown = _find(r"certified by IBP (\d+)%, by CROWN (\d+)%", t)
  assert 0 < ibp <= crown <= 100, (ibp, crown)              # CROWN is at least as tight
  rows = [tuple(map(float, r)) for r in _findall(r"\n\s*([\d.]+)\s+(\d+)%\s+(\d+)%", t)]
  assert len(rows) >= 4
  for (e0, i0, c0), (e1, i1, c1) in zip(rows, rows[1:]):
    assert e0 < e1 and i1 <= i0 and c1 <= c0                # certified share falls with eps
  assert all(i <= c for _, i, c in rows)
  outside = [int(n) for n in _findall(r"margins, (\d+) outside", t)]
  assert len(outside) >= 3 and set(outside) == {0}, outside  # sampled soundness: nothing outside
  dis, und = _find(r"disagrees with the trained one: ([\d.]+)% \(bound's undecided share: "
                   r"([\d.]+)%\)", t)
  assert dis <= und, (dis, und)                             # disagreement only where undecided


def _check_02_ensembles(nb):
  t = _text(nb)
  (acc,) = _find(r"N's test accuracy ([\d.]+)", t)
  assert acc > 0.7, acc
  assert "every member lies in the exact hyper-network: True" in t
  fixed, total = _find(r"label fixed for every network in the box at (\d+) of (\d+)", t, int)
  assert 0 < fixed <= total
  minmax = _find(r"Int\. Abs\. \(min/max of sample\)\s+([\d.]+)\s+[\d.]+\s+([\d.]+)\s+([\d.]+)",
                 t)
  pred = _find(r"PredInt \(Sphynx\)\s+([\d.]+)\s+[\d.]+\s+([\d.]+)\s+([\d.]+)", t)
  assert pred[0] >= minmax[0] and pred[2] >= minmax[2]     # wider intervals abstract more
  assert minmax[1] == pytest.approx(1.0)                    # min/max never overcovers
  for diff, sub in _findall(r"difference ([\d.]+)\s+vs\s+IBP subtraction ([\d.]+)", t):
    assert float(diff) < float(sub)                         # the difference bound is tighter


def _check_03_agt_private_prediction(nb):
  t = _text(nb)
  (acc,) = _find(r"nominal test accuracy ([\d.]+)", t)
  assert acc >= 0.95, acc                                   # separable blobs
  (viol,) = _find(r"param_violations=(\d+)", t, int)
  (certified,) = _find(r"certified_points=(\d+)", t, int)
  (changes,) = _find(r"prediction_changes=(\d+)", t, int)
  assert viol == 0 and changes == 0 and certified > 0
  (viol2,) = _find(r"'violations': (\d+)", t, int)
  assert viol2 == 0
  rows = _findall(r"\n\s*(\d+)\s+[\d.]+\s+(?:standard|advanced)\s+[\d.]+\s+([\d.]+)\s+([\d.]+)", t)
  assert len(rows) >= 3
  q_acc = [(int(q), float(gs), float(ss)) for q, gs, ss in rows]
  for q, gs, ss in q_acc:
    assert ss >= gs - 0.02, (q, gs, ss)                     # smooth sensitivity helps
  assert q_acc[0][2] >= q_acc[-1][2]                        # more queries, less accuracy
  (pviol, pchanges) = _find(r"box_violations=(\d+) certified=\d+ certified_changes=(\d+)", t, int)
  assert pviol == 0 and pchanges == 0                       # poisoning box sound
  for cs in _findall(r"poisoning eps=[\d.]+: certified fraction ((?:k=\d+: [\d.]+,? ?)+)", t):
    fr = [float(v) for v in re.findall(r"k=\d+: ([\d.]+)", cs)]
    assert fr[0] == 1.0 and fr == sorted(fr, reverse=True)  # k = 0 certifies all; monotone


def _check_04_ldcp(nb):
  t = _text(nb)
  (acc,) = _find(r"test accuracy of N: ([\d.]+)", t)
  assert acc > 0.7, acc
  k, inside, pool = _find(r"K = (\d+) networks, \d+ rounds?; it contains (\d+)/(\d+) pool", t,
                          int)
  assert k <= inside <= pool                                # its own K networks are inside
  verdicts = _find(r"(\{'ibp': \[.*?\], 'crown': \[.*?\]\})", t, str)[0]
  statuses = set(re.findall(r"'([A-Z_]+)'", verdicts))
  assert statuses <= {"VERIFIED", "NOT_VERIFIED", "FALSIFIED", "UNKNOWN"}, statuses


def _check_05_idp_label_only(nb):
  t = _text(nb)
  assert "guard's mask == band: True" in t
  exact = re.search(r"exact \{0: (True|False), 1: (True|False)\}", t)
  assert exact
  if "fast=False" in t:  # the full run solves beta exactly; fast mode's time limit gives a bound
    assert exact.groups() == ("True", "True")
  leak, band = _find(r"grid: ([\d.]+)% leaking .*?, ([\d.]+)% in the band", t)
  assert leak <= band                                       # the guard noises a superset
  (n_acc,) = _find(r"N without protection: ([\d.]+)%", t)
  assert n_acc > 70.0
  rows = _findall(r"\n(LUCID|Naive-Noise|Naive-iDP)\s+\S+\s+([\d.]+)\s+([\d.]+)\s+[-+][\d.]+"
                  r"\s+([\d.]+)", t)
  first = {}
  for mech, eps, acc, noised in rows:                       # the first (toy) table only
    first.setdefault((mech, float(eps)), (float(acc), float(noised)))
  epss = sorted({e for m, e in first if m == "LUCID"})
  assert epss
  for e in epss:
    lucid, naive = first[("LUCID", e)], first[("Naive-Noise", e)]
    assert lucid[0] > naive[0] + 10 and naive[1] == 100.0
    if ("Naive-iDP", e) in first:
      assert lucid[1] >= first[("Naive-iDP", e)][1]         # guard's noise covers every leak


def _check_06_barron_auditing(nb):
  t = _text(nb)
  errs = [float(e) for e in _findall(r"\n\s*\w+\s+[\d.]+\s+[\d.]+\s+(-?[\d.]+e[-+]\d+)", t)]
  assert len(errs) >= 6 and max(abs(e) for e in errs) < 1e-3, errs   # closed form == FFT
  lo, hi, plo, phi = _find(r"ratio range: \[([\d.]+), ([\d.]+)\]\s+paper: \[([\d.]+), ([\d.]+)\]",
                           t)
  assert abs(lo - plo) <= 0.01 and abs(hi - phi) <= 0.01
  for pat in (r"MMSE\(S \| Yhat\) >= ([\d.]+) - ([\d.]+) = ([\d.]+)",
              r"H\(S \| Yhat\) >= ([\d.]+) - ([\d.]+) = ([\d.]+) nats"):
    a, b, c = _find(pat, t)
    assert c == pytest.approx(a - b, abs=2e-4) and c > 0
  h_lb, h_s = _find(r"= ([\d.]+) nats \(H\(S\) = ([\d.]+)\)", t)
  assert h_lb <= h_s                                        # conditioning cannot add entropy


def _check_08_verify_onnx(nb):
  t = _text(nb)
  diffs = [float(d) for d in _findall(r"max \|boundjax - onnxruntime\|[^:]*: ([\d.e+-]+)", t)]
  assert max(diffs) < 1e-4, diffs                           # same function as onnxruntime
  pairs = _findall(r"boundjax (sat|unsat|unknown|timeout)\b[^|\n]*\| competition verdict: (\w+)",
                   t)
  for ours, theirs in pairs:
    if ours in ("sat", "unsat"):
      assert ours == theirs, (ours, theirs)
  toy = dict(re.findall(r"\n\s*(near|cross): (sat|unsat)\s+in", t))
  assert toy == {"near": "unsat", "cross": "sat"}, toy
  # the verdicts agree with a grid search: class 1 is reached only where "sat" was answered
  grid = dict(re.findall(r"grid check, (near|cross): class 1 reached on the grid: (True|False)", t))
  assert grid == {"near": "False", "cross": "True"}, grid


def _check_07_ptr(nb):
  t = _text(nb)
  mse, mean_mse = _find(r"held-out MSE ([\d.]+) vs mean image ([\d.]+)", t)
  assert mse < mean_mse                                     # the embedder carries information
  (acc,) = _find(r"ARL noiseless test accuracy ([\d.]+)", t)
  assert acc > 0.3, acc                                     # chance is 0.1
  assert re.search(r"U\(lo\) = [\d.e+]+ <= Δp: True", t)    # the certified radius is certified
  ans, acc_ans, acc_bot = _find(r"\n\s*inf\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", t)
  assert ans == 1.0 and acc_ans == acc_bot == pytest.approx(acc, abs=1e-3)   # ε = ∞: f(z) exactly
  ssim = {e: float(v) for e, v in re.findall(r"attack ε=(\S+): noise scale [\d.e+]+, SSIM ([\d.]+)",
                                             t)}
  assert ssim["∞"] >= ssim["1"], ssim                       # noise can only hurt the attacker


#: notebook stem -> a check of its executed outputs (see `_text`).
CHECKS: dict[str, Callable] = {
    "01_bounds": _check_01_bounds,
    "02_ensembles": _check_02_ensembles,
    "03_agt_private_prediction": _check_03_agt_private_prediction,
    "04_ldcp": _check_04_ldcp,
    "05_idp_label_only": _check_05_idp_label_only,
    "06_barron_auditing": _check_06_barron_auditing,
    "07_ptr": _check_07_ptr,
    "08_verify_onnx": _check_08_verify_onnx,
}


def test_every_notebook_has_output_checks():
  missing = [p.stem for p in NOTEBOOKS.glob("*.ipynb") if p.stem not in CHECKS]
  assert not missing, f"notebooks without output checks in CHECKS: {missing}"


@pytest.mark.parametrize("stem", sorted(CHECKS))
def test_checks_pass_on_the_stored_outputs(stem):
  """The checks hold on the outputs stored in the repository (the full runs): cheap, and it keeps
  the checks in step with what the notebooks print."""
  path = NOTEBOOKS / f"{stem}.ipynb"
  assert path.is_file(), f"CHECKS names {stem!r} but {path.name} is absent"
  CHECKS[stem](nbformat.read(path, as_version=4))


def test_checks_fail_on_wrong_outputs():
  """The checks have teeth: one wrong number in a stored output is caught."""
  nb = nbformat.read(NOTEBOOKS / "01_bounds.ipynb", as_version=4)
  for cell in nb.cells:
    for out in cell.get("outputs", []):
      if out.get("output_type") == "stream" and "0 outside" in out.get("text", ""):
        out["text"] = out["text"].replace("0 outside", "3 outside", 1)
  with pytest.raises(AssertionError):
    _check_01_bounds(nb)


def test_there_are_notebooks():
  names = [p.name for p in NOTEBOOKS.glob("*.ipynb")]
  assert "01_bounds.ipynb" in names, names


def test_kernel_runs_this_interpreter(kernel_env, monkeypatch, tmp_path):
  """The kernel the notebooks get is this venv's python, and it sees the fast switch."""
  nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
      "import sys, os, boundjax\nprint(sys.executable)\nprint(os.environ['BOUNDJAX_NOTEBOOK_FAST'])")])
  _execute(nb, kernel_env, monkeypatch, tmp_path)
  text = nb.cells[0].outputs[0]["text"].split()
  assert pathlib.Path(text[0]).resolve() == pathlib.Path(sys.executable).resolve()
  assert text[1] == "1"


def test_a_failing_cell_fails_the_run(kernel_env, monkeypatch, tmp_path):
  nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("raise ValueError('boom')")])
  with pytest.raises(nbclient.exceptions.CellExecutionError, match="boom"):
    _execute(nb, kernel_env, monkeypatch, tmp_path)


@pytest.mark.parametrize("path", _params())
def test_notebook_executes(path, kernel_env, monkeypatch):
  nb = nbformat.read(path, as_version=4)
  t0 = time.perf_counter()
  _execute(nb, kernel_env, monkeypatch, path.parent)
  print(f"{path.name}: executed in {time.perf_counter() - t0:.1f} s (fast mode)")
  CHECKS[path.stem](nb)  # KeyError: add the notebook's checks to CHECKS

"""Every notebook in notebooks/ executes without a cell error (what CI runs).

Each notebook runs in a fresh Jupyter kernel started from *this* interpreter (the project's
.venv), whatever kernelspecs the machine has: the tests write a private kernelspec whose argv is
``sys.executable -m ipykernel_launcher`` and put it first on ``JUPYTER_PATH``. The working
directory is notebooks/, as when a notebook is opened in Jupyter.

Fast mode: the tests set ``BOUNDJAX_NOTEBOOK_FAST=1``. Notebooks whose full run takes more than
about a minute read it in their first cell and shrink their sizes; the outputs stored in the
repository come from the full run. Notebooks are found by globbing, so a new one is tested
without touching this file. Notebooks listed in `SLOW` run only with ``-m slow``.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

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

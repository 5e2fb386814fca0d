"""The documentation: docstring references that point to where the text is, the README's
glossary, and (slow) the documentation site built from the docstrings with mkdocs."""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import boundjax as bj

ROOT = Path(__file__).resolve().parents[1]

# The public packages the documentation site has a page for (docs/api/*.md).
PACKAGES = ("boundjax", "boundjax.core", "boundjax.domains", "boundjax.nn", "boundjax.verify",
            "boundjax.agt", "boundjax.privacy", "boundjax.ptr", "boundjax.io", "boundjax.data",
            "boundjax.training", "boundjax.ensembles", "boundjax.hypernet", "boundjax.barron",
            "boundjax.auditing", "boundjax.executor", "milp", "milp.ldcp", "milp.idpdb")


def _public_callables():
  for name in PACKAGES:
    module = importlib.import_module(name)
    for attr in getattr(module, "__all__", []):
      obj = getattr(module, attr, None)
      if callable(obj) and inspect.getdoc(obj):
        yield f"{name}.{attr}", obj


def test_a_docstring_that_points_to_its_module_docstring_finds_one():
  """"See the module docstring" must lead somewhere: the module ``help(obj)`` names (the one
  defining it, not the package re-exporting it) has a docstring of more than a few lines."""
  bad = []
  for qualname, obj in _public_callables():
    if not re.search(r"module\s+docstring", inspect.getdoc(obj)):
      continue
    home = sys.modules[obj.__module__]
    if len((inspect.getdoc(home) or "").splitlines()) < 5:
      bad.append(f"{qualname} (defined in {obj.__module__})")
  assert not bad, f"these docstrings point to a module docstring of a few lines: {bad}"


def test_crown_points_to_paragraphs_that_exist():
  doc = inspect.getdoc(bj.crown)
  refs = re.findall(r"\*([A-Z][^*]+)\*\s+in\s+`([\w.]+)`'s\s+docstring", doc)
  assert len(refs) >= 3, doc[:500]
  for paragraph, module in refs:
    target = inspect.getdoc(importlib.import_module(module))
    paragraph = " ".join(paragraph.split())     # the reference may wrap over lines
    assert re.search(rf"^{re.escape(paragraph)}\b", target, re.M), (paragraph, module)


def test_readme_glossary_names_a_paper_and_section_for_each_term():
  readme = (ROOT / "README.md").read_text()
  glossary = readme.split("\n## Glossary\n", 1)[1].split("\n## ", 1)[0]
  entries = {m.group(1): m.group(2) for m in
             re.finditer(r"^\* \*\*(.+?)\*\* — (.+?)(?=^\* |\Z)", glossary, re.M | re.S)}
  for term in ("Thm 4.6", "Alg. 1", "SEMin", "iDP-DB", "LDCP", '`calib="code"`'):
    key = next((k for k in entries if k.startswith(term)), None)
    assert key is not None, f"{term} is not in the glossary"
    text = entries[key]
    assert re.search(r"\b(AGT|LUCID|Sphynx|PTR)\b", text), term
    assert re.search(r"§\d|App\. [A-Z]", text), term


@pytest.mark.slow
def test_documentation_site_builds_with_the_docstrings_and_notebooks(tmp_path):
  pytest.importorskip("mkdocs")
  pytest.importorskip("mkdocstrings")
  pytest.importorskip("mkdocs_jupyter")
  site = tmp_path / "site"
  proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                         str(ROOT / "mkdocs.yml"), "-d", str(site)],
                        cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  # the front page is the README
  index = (site / "index.html").read_text()
  assert "Glossary" in index and "Two commands" in index
  # an API page per package in the navigation, each with rendered docstrings
  pages = sorted(p.stem for p in (ROOT / "docs" / "api").glob("*.md"))
  assert {"boundjax", "domains", "verify", "agt", "ptr", "io", "milp"} <= set(pages)
  for page in pages:
    html = (site / "api" / page / "index.html").read_text()
    assert "doc doc-heading" in html, page
  # bj.crown's own docstring, and the package docstring it points to
  api = (site / "api" / "boundjax" / "index.html").read_text()
  first = inspect.getdoc(bj.crown).splitlines()[0].split("`")[0].strip()
  assert first and first in api
  for option in ("intermediate", "batch_axis", "unstable_rows"):
    assert option in api
  domains = (site / "api" / "domains" / "index.html").read_text()
  assert "Interval fallback" in domains and "Sound floating point" in domains
  # the notebooks, rendered with their stored outputs (plots), not executed
  for nb in (ROOT / "notebooks").glob("*.ipynb"):
    html = (site / "notebooks" / nb.stem / "index.html").read_text()
    assert "<img" in html or "data:image" in html, nb.name

"""mkdocs hooks of the boundjax documentation site (`mkdocs.yml`, ``hooks:``).

The site's front page is the repository's README.md and its notebooks are the repository's
``notebooks/*.ipynb`` (rendered by mkdocs-jupyter without running them): both are read where
they live at build time, so the site never holds a stale copy.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]


@event_priority(100)   # before mkdocs-jupyter's on_files, which turns notebooks into pages
def on_files(files, config):
  """Adds README.md as ``index.md`` and every notebook as ``notebooks/NAME.ipynb``."""
  readme = (ROOT / "README.md").read_text(encoding="utf-8")
  files.append(File.generated(config, "index.md", content=readme))
  for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
    files.append(File(f"notebooks/{nb.name}", src_dir=str(ROOT), dest_dir=config["site_dir"],
                      use_directory_urls=config["use_directory_urls"]))
  return files

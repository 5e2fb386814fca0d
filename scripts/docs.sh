#!/usr/bin/env bash
# Builds the documentation site (mkdocs.yml): README.md as the front page, an API page per public
# package from the docstrings (mkdocstrings), the notebooks with their stored outputs
# (mkdocs-jupyter; nothing is executed). Strict: a broken reference or docstring fails the build.
#   bash scripts/docs.sh              into build/site (open build/site/index.html)
#   bash scripts/docs.sh DIR          into DIR
#   bash scripts/docs.sh --serve      a live preview on http://127.0.0.1:8000
# Needs the package's [docs] extra; installs it into .venv (via scripts/setup.sh --docs) if absent.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import mkdocs, mkdocstrings, mkdocs_jupyter" 2>/dev/null; then
  bash scripts/setup.sh --docs
fi
if [ "${1:-}" = "--serve" ]; then
  exec .venv/bin/python -m mkdocs serve -f mkdocs.yml
fi
exec .venv/bin/python -m mkdocs build --strict -f mkdocs.yml -d "$(realpath -m "${1:-build/site}")"

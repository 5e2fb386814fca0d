#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the test suite on the CPU.
#   bash scripts/test.sh           fast suite (CI)
#   bash scripts/test.sh --slow    only the long tests (marked `slow`)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
if [ "${1:-}" = "--slow" ]; then
  shift
  exec .venv/bin/python -m pytest -m slow "$@"
fi
exec .venv/bin/python -m pytest -m "not slow" -n 2 "$@"

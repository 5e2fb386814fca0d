#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the test suite on the CPU.
#   bash scripts/test.sh           fast suite (CI)
#   bash scripts/test.sh --slow    only the long tests (marked `slow` in the code, or listed in
#                                  tests/slow.txt by measurement: scripts/slow_tests.py), with
#                                  the [docs] extra installed for the documentation-site build
set -euo pipefail
cd "$(dirname "$0")/.."
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
if [ "${1:-}" = "--slow" ]; then
  shift
  bash scripts/setup.sh --docs   # the slow suite also builds the documentation site
  exec .venv/bin/python -m pytest -m slow -n 2 --durations=40 "$@"
fi
bash scripts/setup.sh
# Most of the fast suite's time is XLA compiling small programs (LLVM optimising each fused
# kernel), not running them, so it compiles without LLVM's optimisation passes (a third less CPU
# time measured on tests/test_crown.py); the slow suite runs at XLA's defaults, as users do.
# Set XLA_FLAGS to override.
export XLA_FLAGS=${XLA_FLAGS:---xla_backend_optimization_level=0}
exec .venv/bin/python -m pytest -m "not slow" -n 2 --durations=40 "$@"

# Old -> new module paths of the package restructuring ("the folder shows the layer").
# Apply to Python, Markdown and notebook sources written against the old layout:
#   sed -E -i -f scripts/module_moves.sed FILE...
# Idempotent: running it twice changes nothing more.
#
# Merging this layout into a branch that still has the old one (git follows the renames):
#   git merge <layout-branch>
#   for f in $(git diff --name-only --diff-filter=U); do git checkout --ours -- "$f"; done
#   git ls-files '*.py' '*.md' '*.ipynb' | grep -v module_moves | xargs sed -E -i -f scripts/module_moves.sed
# (a file the other branch added under milp/complete/ is placed in boundjax/verify/ by git; the
# sed then rewrites every import of the old paths, in conflicted and auto-merged files alike).
# Taking the other side is right only where the layout change was this sed alone. These files
# changed by hand as well; resolve a conflict in them by hand: README.md, boundjax/__init__.py,
# boundjax/cli.py, boundjax/core/transforms.py, milp/__init__.py, benchmarks/common.py,
# benchmarks/report.py, the `RESULTS` import lines of benchmarks/*.py, tests/test_layering.py,
# tests/test_reproduce.py, notebooks/07_ptr.ipynb (its import of data and lipschitz).

# --- core: Interval, rounding, validation, errors and the transforms live in boundjax/core/
s/^(\s*)from boundjax import nn, rounding$/\1from boundjax import nn\n\1from boundjax.core import rounding/
s/^(\s*"?)from boundjax import (interval|rounding|validation|errors|transforms)\b/\1from boundjax.core import \2/
s/\bboundjax\.(interval|rounding|validation|errors|transforms)\b/boundjax.core.\1/g
s#\bboundjax/(interval|rounding|validation|errors|transforms)\.py\b#boundjax/core/\1.py#g

# --- training: boundjax/training.py is the package boundjax/training/ (its __init__), DP-SGD inside
s/^(\s*)from boundjax import agt, dpsgd, privacy$/\1from boundjax import agt, privacy\n\1from boundjax.training import dpsgd/
s/^(\s*)from boundjax import agt, dpsgd$/\1from boundjax import agt\n\1from boundjax.training import dpsgd/
s/^(\s*"?)from boundjax import dpsgd\b/\1from boundjax.training import dpsgd/
s/\bboundjax\.dpsgd\b/boundjax.training.dpsgd/g
s#\bboundjax/dpsgd\.py\b#boundjax/training/dpsgd.py#g
s#\bboundjax/training\.py\b#boundjax/training/__init__.py#g

# --- the complete verifier: milp/complete/ -> boundjax/verify/
s/\bmilp\.complete\b/boundjax.verify/g
s#\bmilp/complete/#boundjax/verify/#g
s#\bmilp/complete\b#boundjax/verify#g

# --- PTR in one folder: Lipschitz bounds, the release mechanism, the pipeline
s/^(\s*)from boundjax import data, lipschitz as lip$/\1from boundjax import data\n\1from boundjax.ptr import lipschitz as lip/
s/^(\s*"?)from boundjax import lipschitz\b/\1from boundjax.ptr import lipschitz/
s/\bboundjax\.lipschitz\b/boundjax.ptr.lipschitz/g
s#\bboundjax/lipschitz\.py\b#boundjax/ptr/lipschitz.py#g
s/^(\s*"?)from boundjax\.privacy import ptr\b/\1from boundjax.ptr import release as ptr/
s/\bboundjax\.privacy\.ptr\b/boundjax.ptr.release/g
s#\bboundjax/privacy/ptr\.py\b#boundjax/ptr/release.py#g
s/\bboundjax\.ptr_pipeline\b/boundjax.ptr.pipeline/g
s#\bboundjax/ptr_pipeline/#boundjax/ptr/pipeline/#g
s#\bboundjax/ptr_pipeline\b#boundjax/ptr/pipeline#g

# --- reproduce beside the benchmarks; provenance -> common
s/^(\s*)from boundjax import reproduce as R$/\1from benchmarks import report as R/
s/^(\s*)from boundjax import reproduce$/\1from benchmarks import report as reproduce/
s/\bboundjax\.reproduce\b/benchmarks.report/g
s#\bboundjax/reproduce\.py\b#benchmarks/report.py#g
s/^(\s*"?)from provenance import /\1from common import /
s#\bbenchmarks/provenance\.py\b#benchmarks/common.py#g
s#\bbenchmarks/provenance\.record\b#benchmarks/common.record#g

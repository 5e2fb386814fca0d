"""The ``data`` section of ``boundjax demo``: a table of the datasets."""

from __future__ import annotations

from typing import Sequence

from boundjax.data import NAMES, DatasetNotFoundError, TextDataset, load
from boundjax.demos.common import Section


# Printed by ``boundjax demo`` before the section runs.
TITLE = "a table of the embedded datasets"
# ``boundjax demo --quick``: smaller sizes and fewer steps (keyword arguments of `run`).
QUICK: dict = {}
# Wall seconds of the section on a quiet 2-core CPU, full and ``--quick``: the CPU seconds it
# took (``boundjax demo --json``, 2026-11-27, a shared 2-core machine) scaled by the ratio of
# the full demo's quiet wall time (85 s) to its CPU seconds. Printed as the expected time.
SECONDS = {"full": 0.5, "quick": 0.3}


def run(names: Sequence[str] | None = ("breast_cancer", "digits", "blobs")) -> Section:
  """A plain-text table of the datasets: sizes, input shape, classes and feature range.

  Loads each dataset in ``names`` (``None``: every installed one except ``csv`` and the embedded
  reviews, which would compute embeddings); a missing one shows its install hint. Takes a few
  seconds (Adult, Fashion-MNIST and MNIST 5k are parsed once, then cached).
  """
  if names is None:
    names = [n for n in NAMES if n not in ("csv", "amazon_reviews_embedded")]
  sizes: dict[str, dict] = {}
  rows = [("dataset", "train", "test", "input", "classes", "x range", "sensitive")]
  for n in names:
    try:
      ds = load(n)
    except DatasetNotFoundError as e:
      rows.append((n, "-", "-", "-", "-", "missing", str(e).split(". ")[-1][:60]))
      continue
    if isinstance(ds, TextDataset):
      rows.append((n, str(ds.n_train), str(ds.n_test), "text", str(ds.num_classes), "-", "-"))
      continue
    sizes[n] = {"train": ds.n_train, "test": ds.n_test, "classes": ds.num_classes}
    lo = min(float(ds.x_train.min()), float(ds.x_test.min()))
    hi = max(float(ds.x_train.max()), float(ds.x_test.max()))
    sens = "-" if ds.sensitive is None else f"{ds.sensitive.name} cols {list(ds.sensitive.columns)}"
    rows.append((n, str(ds.n_train), str(ds.n_test), "x".join(map(str, ds.input_shape)),
                 str(ds.num_classes), f"[{lo:.2g}, {hi:.2g}]", sens))
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
  lines = ["Datasets (boundjax.data; features in [0, 1], labels int32)", fmt(rows[0]),
           fmt(tuple("-" * w for w in widths))] + [fmt(r) for r in rows[1:]]
  return Section("\n".join(lines), {"datasets": sizes})

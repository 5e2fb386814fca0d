"""Properties in the VNNLIB sense: input boxes (regions), each with a disjunction of unsafe
conjunctions ``C y <= d`` over the network's outputs ``y``.

A property is violated (``sat``) iff for some region, some ``x`` in its box and some disjunct
``(C, d)``: every row holds, ``C f(x) <= d``. It holds (``unsat``) iff every disjunct of every
region is unreachable; a disjunct is unreachable on a box as soon as one of its rows has a
certified lower bound ``min_x C_i f(x) - d_i > 0``.

`as_regions` accepts the reader's output (`boundjax.io.vnnlib.read_vnnlib`) and the plain forms
``[((lower, upper), [(C, d), ...]), ...]`` or objects with ``lower``/``upper``/``disjuncts``
attributes, and returns a tuple of `Region`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from boundjax.io.vnnlib import Disjunct, Region  # the one property type (the VNNLIB reader's)


def _disjunct(item: Any) -> Disjunct:
  if hasattr(item, "C") and hasattr(item, "d"):
    C, d = item.C, item.d
  else:
    C, d = item
  C = np.atleast_2d(np.asarray(C, dtype=np.float64))
  d = np.asarray(d, dtype=np.float64).reshape(-1)
  if C.shape[0] != d.shape[0]:
    raise ValueError(f"disjunct: C has {C.shape[0]} rows but d has {d.shape[0]} entries.")
  return Disjunct(C, d)


def _region(item: Any) -> Region:
  if hasattr(item, "disjuncts"):
    lower, upper = (item.lower, item.upper) if hasattr(item, "lower") else item.box
    disjuncts = item.disjuncts
  else:
    box, disjuncts = item
    lower, upper = box
  lower = np.asarray(lower, dtype=np.float64).reshape(-1) + 0.0  # -0.0 -> +0.0
  upper = np.asarray(upper, dtype=np.float64).reshape(-1) + 0.0
  if lower.shape != upper.shape:
    raise ValueError(f"region: lower {lower.shape} and upper {upper.shape} differ.")
  if not (np.all(np.isfinite(lower)) and np.all(np.isfinite(upper))):
    raise ValueError("region: every input needs finite bounds.")
  if np.any(lower > upper):
    raise ValueError("region: a lower input bound exceeds its upper bound.")
  return Region(lower, upper, tuple(_disjunct(c) for c in disjuncts))


def as_regions(prop: Any) -> tuple[Region, ...]:
  """Normalises a property (see the module docstring) to a tuple of `Region` (flattened float64
  boxes with finite, ordered bounds; float64 ``C``, ``d`` of matching rows)."""
  if isinstance(prop, Region):
    prop = (prop,)
  if hasattr(prop, "regions"):
    prop = prop.regions
  regions = tuple(_region(r) for r in prop)
  if not regions:
    raise ValueError("property: no region.")
  return regions


def violates(regions: Sequence[Region], x: np.ndarray, y: np.ndarray, tol: float = 0.0) -> bool:
  """True iff ``x`` lies in some region's box and ``y`` satisfies one of its disjuncts."""
  x = np.asarray(x, dtype=np.float64).reshape(-1)
  y = np.asarray(y, dtype=np.float64).reshape(-1)
  for r in regions:
    if x.size == r.dim and np.all(x >= r.lower) and np.all(x <= r.upper):
      if any(bool(c.violated_by(y, tol)) for c in r.disjuncts):
        return True
  return False


def split_boxes(lo: np.ndarray, hi: np.ndarray, sensitivity: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """Bisects each box ``[lo_i, hi_i]`` (rows) along the input with the largest
  ``width × |sensitivity|`` (the widest input where every score is 0).

  Returns ``(lo, hi_1, lo_2, hi)``: the lower halves ``[lo, hi_1]`` and the upper halves
  ``[lo_2, hi]``; together they cover every box exactly.
  """
  width = hi - lo
  score = width * np.abs(sensitivity)
  score = np.where(np.all(score <= 0, axis=1, keepdims=True), width, score)
  dim = np.argmax(score, axis=1)
  rows = np.arange(len(lo))
  mid = (lo[rows, dim] + hi[rows, dim]) / 2
  lo2, hi1 = lo.copy(), hi.copy()
  hi1[rows, dim] = mid
  lo2[rows, dim] = mid
  return lo, hi1, lo2, hi

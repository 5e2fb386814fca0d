"""Encoding of mixed tabular attributes into features in ``[0, 1]``.

Two encodings, as the papers use them:

* ``"sphynx"`` (Sphynx, §6):
    - continuous attribute: min–max to ``[0, 1]``, fitted on the training split;
    - binary attribute (2 categories): one feature, 0 for the first category, 1 for the second;
    - categorical attribute with ``m >= 3`` categories, category index ``i in {0..m-1}``: two
      features ``(cos(pi/2 * i/(m-1)), sin(pi/2 * i/(m-1)))``, points on the quarter circle, so both
      lie in ``[0, 1]``.
* ``"onehot"``: continuous and binary attributes as above; a categorical attribute with ``m >= 3``
  categories becomes ``m`` indicator columns. A binary attribute stays one 0/1 column (a two-column
  one-hot with one column dropped), so the sensitive attribute ``sex`` is one column in both.

Decisions the papers leave open, recorded here:

* Category order is the order given by the caller (for Adult: the order listed in ``adult.names``);
  when not given, the sorted distinct values of train ∪ test (numeric values by value).
* Missing values: in a binary/categorical attribute, missing entries (``NaN`` or ``"?"``) become one
  extra category ``"?"``, placed last; rows are kept (Sphynx's Adult has all 32,561 rows). In a
  continuous attribute they are replaced by the training median. Both counts go into the metadata.
* Test values of a continuous attribute outside the training range are clipped into ``[0, 1]``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np
import pandas as pd

from boundjax.data.base import BINARY, CATEGORICAL, CONTINUOUS, FeatureGroup, minmax_apply

ENCODINGS = ("sphynx", "onehot")
MISSING = "?"


@dataclasses.dataclass(frozen=True)
class AttributeSpec:
  """How one raw column is encoded.

  Attributes:
    name: the column name in the raw table.
    kind: ``"continuous"`` or ``"categorical"`` (a categorical attribute with two categories is
      encoded as binary).
    categories: the category order; empty means sorted distinct values of train ∪ test.
  """
  name: str
  kind: str
  categories: tuple[str, ...] = ()

  def __post_init__(self):
    if self.kind not in (CONTINUOUS, CATEGORICAL):
      raise ValueError(f"AttributeSpec {self.name!r}: kind must be 'continuous' or 'categorical', "
                       f"got {self.kind!r}.")


def sphynx_circle(m: int) -> np.ndarray:
  """The ``(m, 2)`` points ``(cos(pi/2 * i/(m-1)), sin(pi/2 * i/(m-1)))``, Sphynx, §6."""
  if m < 2:
    raise ValueError(f"sphynx_circle: need at least 2 categories, got {m}.")
  t = 0.5 * np.pi * np.arange(m) / (m - 1)
  return np.stack([np.cos(t), np.sin(t)], axis=1)


def _is_missing(values: pd.Series) -> np.ndarray:
  s = values.astype(object)
  return (s.isna() | (s.astype(str).str.strip() == MISSING)).to_numpy()


def _category_key(value: str) -> tuple:
  """Sort key: numbers by value (so "2" < "10"), before strings in lexicographic order."""
  try:
    return (0, float(value), value)
  except ValueError:
    return (1, 0.0, value)


def _categorical_codes(name: str, train: pd.Series, test: pd.Series, order: Sequence[str]
                       ) -> tuple[np.ndarray, np.ndarray, tuple[str, ...], int]:
  """Integer codes of train/test values in the category order (missing → trailing ``"?"``)."""
  miss_tr, miss_te = _is_missing(train), _is_missing(test)
  tr = train.astype(object).where(~miss_tr, MISSING).astype(str).str.strip().to_numpy()
  te = test.astype(object).where(~miss_te, MISSING).astype(str).str.strip().to_numpy()
  if order:
    cats = [str(c) for c in order]
  else:
    cats = sorted(set(tr[~miss_tr]) | set(te[~miss_te]), key=_category_key)
  n_missing = int(miss_tr.sum() + miss_te.sum())
  if n_missing and MISSING not in cats:
    cats.append(MISSING)
  index = {c: i for i, c in enumerate(cats)}
  unknown = sorted((set(tr) | set(te)) - set(index))
  if unknown:
    raise ValueError(f"Attribute {name!r}: values {unknown[:5]} are not among its categories "
                     f"{tuple(cats)}.")
  return (np.array([index[v] for v in tr], np.int64), np.array([index[v] for v in te], np.int64),
          tuple(cats), n_missing)


def _as_float(name: str, values: pd.Series) -> np.ndarray:
  try:
    return pd.to_numeric(values, errors="raise").to_numpy(dtype=np.float64)
  except (ValueError, TypeError) as e:
    raise ValueError(f"Continuous attribute {name!r} has non-numeric values: {e}") from None


def encode_table(train: pd.DataFrame, test: pd.DataFrame, specs: Sequence[AttributeSpec],
                 encoding: str = "sphynx"
                 ) -> tuple[np.ndarray, np.ndarray, tuple[str, ...], tuple[FeatureGroup, ...],
                            dict[str, Any]]:
  """Encodes the attributes ``specs`` of ``train`` and ``test`` into float32 features in ``[0, 1]``.

  Returns:
    ``(x_train, x_test, feature_names, groups, info)`` where ``groups`` has one `FeatureGroup` per
    attribute and ``info`` counts missing and clipped values per attribute.
  """
  if encoding not in ENCODINGS:
    raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}.")
  names = [s.name for s in specs]
  absent = [n for n in names if n not in train.columns or n not in test.columns]
  if absent:
    raise ValueError(f"encode_table: columns {absent} are missing from the table "
                     f"(columns: {list(train.columns)}).")
  blocks_tr, blocks_te, feature_names, groups = [], [], [], []
  missing, clipped = {}, {}
  col = 0
  for spec in specs:
    if spec.kind == CONTINUOUS:
      v_tr, v_te = _as_float(spec.name, train[spec.name]), _as_float(spec.name, test[spec.name])
      n_nan = int(np.isnan(v_tr).sum() + np.isnan(v_te).sum())
      if n_nan:
        if np.isnan(v_tr).all():
          raise ValueError(f"Continuous attribute {spec.name!r} has no training values.")
        med = float(np.nanmedian(v_tr))
        v_tr, v_te = np.where(np.isnan(v_tr), med, v_tr), np.where(np.isnan(v_te), med, v_te)
        missing[spec.name] = n_nan
      lo, hi = float(v_tr.min()), float(v_tr.max())
      z_tr, _ = minmax_apply(v_tr[:, None], lo, hi)
      z_te, n_clip = minmax_apply(v_te[:, None], lo, hi)
      if n_clip:
        clipped[spec.name] = n_clip
      blocks_tr.append(z_tr), blocks_te.append(z_te)
      feature_names.append(spec.name)
      groups.append(FeatureGroup(spec.name, CONTINUOUS, (col,), raw_range=(lo, hi)))
      col += 1
      continue
    c_tr, c_te, cats, n_missing = _categorical_codes(
        spec.name, train[spec.name], test[spec.name], spec.categories)
    if n_missing:
      missing[spec.name] = n_missing
    m = len(cats)
    if m == 1:
      raise ValueError(f"Categorical attribute {spec.name!r} has a single category {cats}; "
                       "drop it (it carries no information).")
    if m == 2:
      kind, table, fnames = BINARY, np.array([[0.0], [1.0]]), [spec.name]
    elif encoding == "sphynx":
      kind, table = CATEGORICAL, sphynx_circle(m)
      fnames = [f"{spec.name}_cos", f"{spec.name}_sin"]
    else:
      kind, table = CATEGORICAL, np.eye(m)
      fnames = [f"{spec.name}={c}" for c in cats]
    width = table.shape[1]
    blocks_tr.append(table[c_tr].astype(np.float32))
    blocks_te.append(table[c_te].astype(np.float32))
    feature_names.extend(fnames)
    groups.append(FeatureGroup(spec.name, kind, tuple(range(col, col + width)), cats, table))
    col += width
  x_tr = np.concatenate(blocks_tr, axis=1).astype(np.float32)
  x_te = np.concatenate(blocks_te, axis=1).astype(np.float32)
  info = {"encoding": encoding, "missing_values": missing, "test_values_clipped": clipped}
  return x_tr, x_te, tuple(feature_names), tuple(groups), info

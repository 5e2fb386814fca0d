"""A loader for a user-supplied CSV file, for data sets that do not ship offline.

Bank Marketing (UCI, Moro et al.; Sphynx), Default of Credit Card Clients (UCI, Yeh & Lien; Sphynx
and LUCID), Twitter Spam Accounts and Cryptojacking (LUCID), and the array data sets MedMNIST
(OctMNIST) and IMDB (AGT) cannot be installed from PyPI or Debian: download them yourself and load
them with `load_csv` (tabular data). Usage for the Sphynx sets (Sphynx, §6):

    load_csv("bank-full.csv", "y", positive="yes", sensitive="age", sep=";")   # sensitive: age
    load_csv("credit.csv", "default payment next month", positive=1, sensitive="SEX",
             categorical=["SEX", "EDUCATION", "MARRIAGE"], drop=["ID"])        # sensitive: sex

Columns in ``categorical`` and every non-numeric column are encoded as categorical (Sphynx
(cos, sin) pair or one-hot; two categories → one 0/1 column), the rest min–max (see
`boundjax.data.encoding`). Without ``test_path`` the rows are split by a seeded stratified split.

Missing values (empty cells, ``NaN`` or ``"?"``) in feature columns are never handled silently:
``missing="impute"`` (default) imputes them as `boundjax.data.encoding` documents (categorical: an
extra category ``"?"``; continuous: the training median) and warns, naming each column and its
count; ``missing="drop"`` drops the rows that have any (and warns how many); ``missing="error"``
raises.
"""

from __future__ import annotations

import pathlib
import warnings
from typing import Any, Sequence

import pandas as pd

from boundjax.data.base import CATEGORICAL, Dataset, DatasetNotFoundError, FeatureGroup, as_tuple
from boundjax.data.encoding import MISSING
from boundjax.data.tabular import table_dataset

MISSING_MODES = ("impute", "drop", "error")

NOT_OFFLINE = ("bank_marketing", "credit_card_clients", "twitter_spam", "cryptojacking",
               "octmnist", "imdb")


def _read(path: str | pathlib.Path, what: str, **read_kw) -> pd.DataFrame:
  path = pathlib.Path(path)
  if not path.is_file():
    raise DatasetNotFoundError(
        f"{what} {path} was not found. Data sets such as Bank Marketing, Credit Card Clients, "
        "Twitter Spam and Cryptojacking do not ship offline: download the CSV and pass its path.")
  return pd.read_csv(path, **read_kw)


def _missing_mask(table: pd.DataFrame, label_column: str) -> pd.DataFrame:
  """Per cell of the feature columns: empty/``NaN`` or ``"?"`` (as `encode_table` treats it)."""
  feats = table.drop(columns=[label_column])
  as_obj = feats.astype(object)
  return as_obj.isna() | as_obj.apply(lambda c: c.astype(str).str.strip() == MISSING)


def _describe(counts: dict[str, int]) -> str:
  return ", ".join(f"{c!r}: {n}" for c, n in counts.items())


def load_csv(path: str | pathlib.Path, label_column: str, *, categorical: Sequence[str] = (),
             sensitive: str | None = None, test_fraction: float = 0.2, seed: int = 0,
             encoding: str | None = None, positive: Any = None, drop: Sequence[str] = (),
             test_path: str | pathlib.Path | None = None, name: str | None = None,
             missing: str = "impute", **read_kw) -> Dataset:
  """Loads a CSV table into a `Dataset` (features in ``[0, 1]``, int32 labels).

  Args:
    path: the CSV file (header row with column names).
    label_column: the label's column. Labels become ``positive`` → 1, others → 0, or, with
      ``positive=None``, the index of each value among its sorted distinct values.
    categorical: columns to encode as categorical even though they are numeric.
    sensitive: the name of the sensitive attribute (its `FeatureGroup` becomes
      ``Dataset.sensitive``).
    test_fraction, seed: the seeded stratified split, when ``test_path`` is not given; ``seed``
      also fixes the (shuffled) row order of each split.
    encoding: ``"sphynx"`` (a categorical column of m > 2 categories becomes the two features
      ``<column>_cos``, ``<column>_sin``: category i at angle ``2πi/m`` on the unit circle) or
      ``"onehot"``. None (default): ``"sphynx"``, with one `UserWarning` naming every such
      column and its encoding.
    drop: columns to ignore (e.g. an id column).
    test_path: a second CSV with the test split (same columns).
    name: the dataset's name (default: the file's stem).
    missing: what to do with missing feature values (empty, ``NaN`` or ``"?"``): ``"impute"``
      (default; categorical → extra category ``"?"``, continuous → training median, with a
      `UserWarning` naming each column and its count), ``"drop"`` (drop those rows, with a
      warning giving how many) or ``"error"`` (raise ``ValueError`` naming the columns).
    **read_kw: passed to ``pandas.read_csv`` (e.g. ``sep=";"``).

  Raises:
    DatasetNotFoundError: a file does not exist.
    ValueError: a named column is absent, the label has missing values, ``missing`` is unknown,
      or ``missing="error"`` and a feature value is missing.
  """
  if missing not in MISSING_MODES:
    raise ValueError(f"load_csv: missing must be one of {MISSING_MODES}, got {missing!r}.")
  df = _read(path, "CSV file", **read_kw)
  test_df = None if test_path is None else _read(test_path, "Test CSV file", **read_kw)
  drop = as_tuple(drop)
  for table, what in ((df, "CSV file"), (test_df, "test CSV file")):
    if table is None:
      continue
    absent = [c for c in (label_column, *drop) if c not in table.columns]
    if absent:
      raise ValueError(f"load_csv: columns {absent} not in the {what}; columns: "
                       f"{list(table.columns)}.")
  df = df.drop(columns=list(drop))
  if test_df is not None:
    test_df = test_df.drop(columns=list(drop))
  masks = {"train": _missing_mask(df, label_column)}
  if test_df is not None:
    masks["test"] = _missing_mask(test_df, label_column)
  counts = {}
  for m in masks.values():
    for c, n in m.sum().items():
      if n:
        counts[str(c)] = counts.get(str(c), 0) + int(n)
  where = f"{path}" + (f" and {test_path}" if test_path is not None else "")
  dropped = 0
  if counts and missing == "error":
    raise ValueError(f"load_csv: missing values in {where}, by column: {_describe(counts)}. "
                     "Pass missing='drop' to drop those rows or missing='impute' to impute them.")
  if counts and missing == "drop":
    keep = ~masks["train"].any(axis=1)
    dropped = int((~keep).sum())
    df = df[keep.to_numpy()]
    if test_df is not None:
      keep_te = ~masks["test"].any(axis=1)
      dropped += int((~keep_te).sum())
      test_df = test_df[keep_te.to_numpy()]
    warnings.warn(f"load_csv: dropped {dropped} rows with missing values in {where} (by column: "
                  f"{_describe(counts)}).", UserWarning, stacklevel=2)
  elif counts:
    warnings.warn(f"load_csv: imputing missing values in {where}, by column: {_describe(counts)} "
                  "(categorical: an extra category '?'; continuous: the training median). Pass "
                  "missing='drop' or missing='error' to avoid imputation.", UserWarning,
                  stacklevel=2)
  data = table_dataset(name or pathlib.Path(path).stem, df, label_column, positive=positive,
                       categorical=categorical, sensitive=sensitive,
                       encoding=encoding or "sphynx", test_fraction=test_fraction, seed=seed,
                       test_df=test_df,
                       meta={"source": f"CSV file {path}"
                                       + (f" (test: {test_path})" if test_path else ""),
                             "missing": missing, "missing_by_column": counts,
                             "rows_dropped": dropped})
  if encoding is None:
    note = encoding_note(data.groups, as_tuple(categorical))
    if note:
      warnings.warn(f"load_csv: {path}: {note}", UserWarning, stacklevel=2)
  return data


def encoding_note(groups: Sequence[FeatureGroup], named: Sequence[str] = ()) -> str:
  """One clause per categorical column with more than two categories (two become one 0/1
  feature): its name, why it is categorical (listed in ``categorical``, or non-numeric) and the
  features it became (Sphynx's (cos, sin) point on the unit circle); ``""`` when there is none."""
  parts = []
  for g in groups:
    if g.kind != CATEGORICAL:
      continue
    why = "listed in categorical" if g.name in named else "non-numeric"
    parts.append(f"column {g.name!r} ({why}, {len(g.categories)} categories) became the features "
                 f"{g.name}_cos, {g.name}_sin (Sphynx's encoding: category i at angle "
                 f"2πi/{len(g.categories)} on the unit circle)")
  if not parts:
    return ""
  return ("; ".join(parts) + ". Pass encoding='sphynx' to keep this encoding without this "
          "warning, or encoding='onehot' for one 0/1 feature per category.")

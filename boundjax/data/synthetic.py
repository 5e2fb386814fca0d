"""AGT's "blobs" generator (AGT, App. E.1; public code ``scripts/privacy_paper/datasets.py``).

Two isotropic Gaussian blobs in 2-D, centres ``+(c, c)`` (label 0) and ``-(c, c)`` (label 1),
standard deviation ``s`` (scikit-learn ``make_blobs``), ``n = int(1.25 * n_train)`` points, an
80/20 split (``train_test_split(test_size=0.2, random_state=seed)``, as in the code), and the
polynomial feature map ``[x1, x2, x1^2, x2^2, x1^3, x2^3]`` (6 features).

Settings (from the authors' public code; AGT, App. E.1, does not give the values):

* ``"separable"`` (the code's "far"): ``c = 1.25``, ``s = 0.35``.
* ``"overlapping"`` (the code's "close"): ``c = 1.0``, ``s = 0.75``.

Sizes: Figs. 2/4/5 and Table 1 use ``n_train = 5000`` (test 1,250, the default); Fig. 3 uses
``n_train = 3000``.

Scaling (a boundjax addition; AGT's code feeds the raw features): with ``scale=True`` (default)
the 6 features are min–max mapped to ``[0, 1]``, fitted on the training split, test clipped, so
the data follows the library's ``[0, 1]`` domain. ``scale=False`` returns AGT's raw features (not
in ``[0, 1]``). `blob_features` applies the same map to any 2-D points (e.g. AGT's heat-map grid
on ``[-3.8, 3.8]^2``).
"""

from __future__ import annotations

import functools

import numpy as np

from boundjax.data.base import CONTINUOUS, Dataset, FeatureGroup, minmax_apply, minmax_fit

BLOB_SETTINGS = {"separable": (1.25, 0.35), "overlapping": (1.0, 0.75)}
_ALIASES = {"far": "separable", "close": "overlapping"}
FEATURE_NAMES = ("x1", "x2", "x1^2", "x2^2", "x1^3", "x2^3")


def blob_features(points: np.ndarray, dataset: Dataset | None = None) -> np.ndarray:
  """The feature map ``[x, x^2, x^3]`` of 2-D points ``(n, 2)`` → ``(n, 6)`` float32.

  With ``dataset`` (from `make_blobs` with ``scale=True``) the features are also mapped by that
  dataset's min–max scaling and clipped to ``[0, 1]``, exactly as its test split was.
  """
  p = np.asarray(points, np.float64)
  if p.ndim != 2 or p.shape[1] != 2:
    raise ValueError(f"blob_features: points must have shape (n, 2), got {p.shape}.")
  f = np.hstack([p, p ** 2, p ** 3])
  if dataset is None or not dataset.meta.get("scaled", False):
    return f.astype(np.float32)
  lo = np.array([g.raw_range[0] for g in dataset.groups])
  hi = np.array([g.raw_range[1] for g in dataset.groups])
  return minmax_apply(f, lo, hi)[0]


def make_blobs(setting: str = "separable", n_train: int = 5000, seed: int = 0,
               scale: bool = True) -> Dataset:
  """AGT's blobs: ``int(1.25 * n_train)`` points, 80/20 split, 6 polynomial features.

  Args:
    setting: ``"separable"`` (alias ``"far"``) or ``"overlapping"`` (alias ``"close"``).
    n_train: training-set size ``b`` (AGT uses the full batch); test has ``n - n_train`` points.
    seed: seeds both the sampling and the split (AGT's ``random_state``).
    scale: min–max the features to ``[0, 1]`` (fitted on train); ``False`` = AGT's raw features.
  """
  key = _ALIASES.get(setting, setting)
  if key not in BLOB_SETTINGS:
    raise ValueError(f"make_blobs: unknown setting {setting!r}; choose one of "
                     f"{tuple(BLOB_SETTINGS) + tuple(_ALIASES)}.")
  if n_train < 4:
    raise ValueError(f"make_blobs: n_train must be at least 4, got {n_train}.")
  return _make_blobs(key, int(n_train), int(seed), bool(scale))


@functools.lru_cache(maxsize=8)
def _make_blobs(key: str, n_train: int, seed: int, scale: bool) -> Dataset:
  from sklearn.datasets import make_blobs as sk_make_blobs
  from sklearn.model_selection import train_test_split
  c, s = BLOB_SETTINGS[key]
  centers = np.array([[c, c], [-c, -c]])
  pts, y = sk_make_blobs(n_samples=int(1.25 * n_train), n_features=2, centers=centers,
                         cluster_std=[s, s], random_state=seed)
  p_tr, p_te, y_tr, y_te = train_test_split(pts, y, test_size=0.2, random_state=seed)
  f_tr, f_te = blob_features(p_tr), blob_features(p_te)
  clipped = 0
  if scale:
    lo, hi = minmax_fit(f_tr)
    f_tr, _ = minmax_apply(f_tr, lo, hi)
    f_te, clipped = minmax_apply(f_te, lo, hi)
  else:
    lo, hi = f_tr.min(axis=0), f_tr.max(axis=0)
  p_tr, p_te = p_tr.astype(np.float32), p_te.astype(np.float32)
  p_tr.setflags(write=False), p_te.setflags(write=False)
  groups = tuple(FeatureGroup(n, CONTINUOUS, (i,), raw_range=(float(lo[i]), float(hi[i])))
                 for i, n in enumerate(FEATURE_NAMES))
  return Dataset(
      name="blobs", x_train=f_tr, y_train=y_tr, x_test=f_te, y_test=y_te,
      feature_names=FEATURE_NAMES, groups=groups, sensitive=None, num_classes=2,
      meta={"source": "AGT blobs (sklearn make_blobs)", "setting": key, "center": c, "std": s,
            "seed": seed, "scaled": scale, "test_values_clipped": clipped,
            "points_train": p_tr, "points_test": p_te,
            "split": f"train_test_split(test_size=0.2, random_state={seed})",
            "classes": (f"+({c}, {c})", f"-({c}, {c})"), "source": "AGT, App. E.1"})

"""Branching of the branch-and-bound: k-means over the members' parameters, k by the elbow rule
(LUCID, §5.3 and §6.1).
"""

from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np

from milp.idpdb.config import IdpDbConfig


def elbow_k(ks: Sequence[int], distortions: Sequence[float]) -> int:
  """The knee of a decreasing distortion curve (the Kneedle idea, Satopää et al. 2011).

  Both axes are scaled to [0, 1]; for a decreasing convex curve the knee is where the scaled
  curve lies furthest below the chord from the first to the last point, i.e. the argmax of
  ``(1 - y_n) - x_n``. With fewer than three candidates, or a flat curve, the first ``k`` is
  returned (LUCID's code falls back to 2).
  """
  ks = np.asarray(ks, np.float64)
  ds = np.asarray(distortions, np.float64)
  if ks.size < 3 or not np.isfinite(ds).all() or ds.max() - ds.min() <= 0:
    return int(ks[0])
  xn = (ks - ks[0]) / (ks[-1] - ks[0])
  yn = (ds - ds.min()) / (ds.max() - ds.min())
  gain = (1.0 - yn) - xn
  return int(ks[int(np.argmax(gain))])


def partition(features: np.ndarray, rows: np.ndarray, cfg: IdpDbConfig) -> list[np.ndarray]:
  """Splits member ``rows`` into clusters by k-means on their parameters (LUCID, §6.1).

  ``k`` is the elbow over the candidates ``cfg.kmeans_ks`` below ``|S|``, capped at
  ``cfg.max_k``, raised to ``cfg.workers``, capped at ``|S|``; two members split into
  singletons. Empty clusters are dropped; if k-means puts every member in one cluster (identical parameters) the set is halved.
  """
  from sklearn.cluster import KMeans

  rows = np.asarray(rows)
  n = rows.size
  if n <= 2:
    return [rows[i:i + 1] for i in range(n)]
  X = features[rows]
  cands = sorted({int(k) for k in cfg.kmeans_ks if int(k) < n}) or [min(2, n)]
  fits = {}
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # ConvergenceWarning on duplicate members
    for k in cands:
      fits[k] = KMeans(n_clusters=k, random_state=cfg.key, n_init="auto").fit(X)
    k = elbow_k(cands, [fits[k].inertia_ for k in cands])
    if cfg.max_k is not None:
      k = min(k, cfg.max_k)
    k = min(max(k, cfg.workers), n)
    km = fits.get(k) or KMeans(n_clusters=k, random_state=cfg.key, n_init="auto").fit(X)
  groups = [rows[km.labels_ == j] for j in range(k)]
  groups = [g for g in groups if g.size]
  if len(groups) < 2:
    groups = [g for g in np.array_split(rows, 2) if g.size]
  return groups

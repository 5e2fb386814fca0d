"""The rows of the node MILP (LUCID, §6.2, Eq. 3) on a `milp.encode.Encoding`.

* `pair_rows` — ``lo <= v_a - v_b <= hi``: the matching dependencies between N# and N (LUCID, §5.4).
* `add_hyper` — N# with interval weights (Eq. 3e), some unstable neurons relaxed (LUCID, §5.4).
* `confidence_rows` — ``C^c_N(x) >= beta`` (Eq. 3c, left part).
* `disagreement_rows` — ``C^c_{N#}(x) <= 0`` (Eq. 3c), big-M over binaries for > 2 classes.
"""

from __future__ import annotations

import numpy as np

from milp.encode import Encoding
from milp.network import Network


def pair_rows(enc: Encoding, a: np.ndarray, b: np.ndarray, lo: np.ndarray, hi: np.ndarray
               ) -> int:
  """Rows ``lo <= v_a - v_b <= hi`` where an id of -1 is the constant 0; returns rows added."""
  a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
  keep = ((a >= 0) | (b >= 0)) & (np.isfinite(lo) | np.isfinite(hi))
  idx = np.flatnonzero(keep)
  if idx.size == 0:
    return 0
  rows, cols, vals = [], [], []
  for r, k in enumerate(idx):
    if a[k] >= 0:
      rows.append(r), cols.append(a[k]), vals.append(1.0)
    if b[k] >= 0:
      rows.append(r), cols.append(b[k]), vals.append(-1.0)
  enc.add_rows(rows, cols, vals, lo[idx], hi[idx])
  return int(idx.size)


def add_hyper(enc: Encoding, hyper: Network, x: np.ndarray, in_lo: np.ndarray,
               in_hi: np.ndarray, hb: list[tuple[np.ndarray, np.ndarray]],
               relax_masks: list[np.ndarray]):
  """Encodes N# on ``x`` with its refined bounds ``hb``; unstable neurons in ``relax_masks``
  get the triangle relaxation instead of a binary (relax-if-similar, LUCID, §5.4). Returns (pre ids,
  post ids, bins).

  The interval layers use the two-inequality form of Eq. 3e, exact only for non-negative layer
  inputs: hidden inputs are post-ReLU, so only the input box is checked.
  """
  if not hyper.layers[0].is_point and np.any(in_lo < 0):
    raise ValueError(
        f"idpdb: layer 0 of the hyper-network has interval parameters but an input whose lower "
        f"bound is {float(in_lo.min()):g} < 0; the two-inequality encoding (Eq. 3e) is exact "
        "only for non-negative inputs (use inputs in [0, 1]).")
  nv = enc.add_network(hyper, x, in_lo, in_hi, bounds=list(hb), relax=relax_masks)
  return nv.pre, nv.post, nv.binaries


def confidence_rows(enc: Encoding, net: Network, outs: np.ndarray, label: int, beta: int) -> None:
  """``C^c_N(x) >= beta``: ``z_c - z_c' - beta >= 0`` for every ``c' != c`` (sign: ``±z``)."""
  if net.output == "sign":
    s = 1.0 if label == 1 else -1.0
    enc.add_rows([0, 0], [outs[0], beta], [s, -1.0], [0.0], [np.inf])
    return
  others = [k for k in range(net.num_outputs) if k != label]
  n = len(others)
  r = np.arange(n)
  enc.add_rows(np.r_[r, r, r], np.r_[np.full(n, outs[label]), outs[others], np.full(n, beta)],
               np.r_[np.ones(n), -np.ones(n), -np.ones(n)], np.zeros(n), np.full(n, np.inf))


def disagreement_rows(enc: Encoding, hyper: Network, outs: np.ndarray, label: int,
                       hb_out: tuple[np.ndarray, np.ndarray]) -> None:
  """``C^c_{N#}(x) <= 0`` (Eq. 3c right): one row for 2 classes, big-M over ``alpha`` otherwise.

  ``M_c' = max(0, u#_c - l#_c')`` from the hyper-network's sound output bounds, so the row is
  vacuous exactly when ``alpha_c' = 0``.
  """
  L, U = hb_out
  if hyper.output == "sign":
    s = 1.0 if label == 1 else -1.0
    enc.add_rows([0], [outs[0]], [s], [-np.inf], [0.0])
    return
  others = [k for k in range(hyper.num_outputs) if k != label]
  if len(others) == 1:
    enc.add_rows([0, 0], [outs[label], outs[others[0]]], [1.0, -1.0], [-np.inf], [0.0])
    return
  n = len(others)
  M = np.maximum(U[label] - L[others], 0.0)
  alpha = enc.add_binaries(n)
  impossible = L[label] - U[others] > 0   # N# can never prefer c' over c here
  r = np.arange(n)
  # z_c - z_c' + M alpha_c' <= M
  enc.add_rows(np.r_[r, r, r], np.r_[np.full(n, outs[label]), outs[others], alpha],
               np.r_[np.ones(n), -np.ones(n), M], np.full(n, -np.inf), M)
  enc.add_rows(np.zeros(n), alpha, np.ones(n), [1.0], [np.inf])
  if impossible.any():
    idx = np.flatnonzero(impossible)
    enc.add_rows(np.arange(idx.size), alpha[idx], np.ones(idx.size), np.zeros(idx.size),
                 np.zeros(idx.size))

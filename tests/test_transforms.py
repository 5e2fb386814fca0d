"""`boundjax.core.transforms.affine_image`: the sound float64 image of boxes under ``x W^T + b``.

The exact extremes of an affine map over a box are at the corner picked by the signs of ``W``;
computed in rational arithmetic they must lie inside the returned bounds, and 10^4 sampled points
per box (float64) too.
"""

from fractions import Fraction

import numpy as np

from boundjax.core.transforms import affine_image


def _exact_extremes(W, b, lo, hi):
  """min and max of ``x W^T + b`` over ``[lo, hi]``, one row, in exact rational arithmetic."""
  mins, maxs = [], []
  for w, bj in zip(W, b):
    lo_sum, hi_sum = Fraction(bj), Fraction(bj)
    for wk, l, h in zip(w, lo, hi):
      a, c = Fraction(wk) * Fraction(l), Fraction(wk) * Fraction(h)
      lo_sum += min(a, c)
      hi_sum += max(a, c)
    mins.append(lo_sum)
    maxs.append(hi_sum)
  return mins, maxs


def test_affine_image_contains_the_exact_extremes_and_samples():
  rng = np.random.default_rng(0)
  W = rng.normal(size=(6, 40)) * 10.0 ** rng.integers(-3, 4, size=(6, 40))
  b = rng.normal(size=6)
  lo = rng.normal(size=(5, 40))
  hi = lo + rng.uniform(0, 1, size=(5, 40)) * (rng.uniform(size=(5, 40)) > 0.3)  # some points
  L, U = affine_image(W, b, lo, hi)
  assert L.shape == U.shape == (5, 6) and L.dtype == np.float64
  for r in range(5):
    mins, maxs = _exact_extremes(W, b, lo[r], hi[r])
    for j in range(6):
      assert Fraction(L[r, j]) <= mins[j] and maxs[j] <= Fraction(U[r, j])
      # tight: the outward step is a few ulps of the magnitude, not a fixed slack
      mag = float(np.abs(W[j]) @ np.maximum(np.abs(lo[r]), np.abs(hi[r])) + abs(b[j]))
      assert float(mins[j] - Fraction(L[r, j])) <= 1e-12 * mag
  xs = lo[:, None] + rng.uniform(size=(5, 10_000, 40)) * (hi - lo)[:, None]
  y = np.einsum("rnk,mk->rnm", xs, W) + b
  assert (y >= L[:, None]).all() and (y <= U[:, None]).all()


def test_affine_image_of_one_box_keeps_its_rank():
  W, b = np.eye(3), np.zeros(3)
  L, U = affine_image(W, b, np.zeros(3), np.ones(3))
  assert L.shape == (3,) and (L <= 0).all() and (U >= 1).all() and (U < 1 + 1e-12).all()

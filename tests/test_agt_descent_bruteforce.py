"""Thm 4.6 (AGT) by brute force: every neighbouring batch of a tiny batch lies inside the bound.

For batches of b <= 6 points, per-sample clipped gradient bounds ``[delta_L, delta_U]`` (random,
and the adversarial all-negative / all-positive cases), every removal set of size r <= k and
every multiset of a <= k additions with each coordinate at +-gamma (so r != a is covered) is
enumerated; the kept points take the extreme gradients ``delta_L`` / ``delta_U`` (the batch
mean is increasing in each of them, so these are the extremes over the boxes) and random
vertex mixtures. The descent direction is computed by the stated convention:

* "actual": true SGD on the changed batch, ``sum / |B~|`` (AGT, Thm 4.6 and Alg. 1);
* "nominal": the fixed ``1/b`` convention, ``sum / b``.

Gradients on a dyadic grid (multiples of 1/64, gamma = 1/2) make every sum exact in float64, so
the only rounding left is the final division (XLA may divide by b as a product with 1/b, one
ulp off). Every check is therefore zero-tolerance against the bound widened by its documented
rounding margin (``sound=True``, `descent.rounding_margin`), and, without the margin, the
largest excess must be at the rounding level (a few ulp), not a real gap: before the fix, the
fixed-1/b convention left the bound by up to 0.315 in 13,748 of 215,616 grid cases.
"""

from __future__ import annotations

import functools
import itertools
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boundjax.agt import descent


@pytest.fixture(autouse=True)
def x64():
  with jax.enable_x64(True):
    yield


GAMMA = 0.5
D = 2          # coordinates: additions range over all 2^D sign patterns


def _neighbour_sums(dl: np.ndarray, du: np.ndarray, k: int, gamma: float, additions: bool,
                    rng: np.random.Generator) -> Iterator[tuple[int, int, np.ndarray, str]]:
  """Every modified batch: ``(r, a, sums of the changed batches (m, D), bound they test)``.

  Removal sets of size r <= k (all of them), addition multisets of size a <= k over the
  ``2^D`` vectors in {-gamma, +gamma}^D (all of them, one row each; none when ``additions`` is
  False); the kept points take ``delta_L`` (tested against the lower bound), ``delta_U``
  (upper) and two random vertex mixtures (both bounds).
  """
  b = dl.shape[0]
  patterns = np.array(list(itertools.product([-gamma, gamma], repeat=dl.shape[1])))
  add_sums = {0: np.zeros((1, dl.shape[1]))}
  for a in range(1, k + 1 if additions else 1):
    combos = itertools.combinations_with_replacement(range(len(patterns)), a)
    add_sums[a] = np.array([patterns[list(c)].sum(0) for c in combos])
  for r in range(k + 1):
    for removed in itertools.combinations(range(b), r):
      keep = np.array([i for i in range(b) if i not in removed], dtype=int)
      mixes = [(dl[keep], "lower"), (du[keep], "upper")]
      for _ in range(2):
        pick = rng.integers(0, 2, size=(keep.size, dl.shape[1])).astype(bool)
        mixes.append((np.where(pick, du[keep], dl[keep]), "both"))
      for a, sums in add_sums.items():
        for g, side in mixes:
          yield r, a, g.sum(0)[None] + sums, side


def _violations(dl, du, k, gamma, convention, lo, hi, *, additions=True, seed=0
                ) -> tuple[int, int, float]:
  """Brute force: ``(cases checked, cases outside [lo, hi], largest excess)``."""
  rng = np.random.default_rng(seed)
  b = dl.shape[0]
  lo, hi = np.asarray(lo), np.asarray(hi)
  checked = bad = 0
  worst = 0.0
  for r, a, tot, side in _neighbour_sums(dl, du, k, gamma, additions, rng):
    n = b - r + a if convention == "actual" else b
    direction = tot / n
    excess = np.zeros_like(direction)
    if side in ("lower", "both"):
      excess = np.maximum(excess, lo - direction)
    if side in ("upper", "both"):
      excess = np.maximum(excess, direction - hi)
    checked += direction.shape[0]
    bad += int(np.sum(np.any(excess > 0, axis=1)))
    worst = max(worst, float(excess.max()))
  return checked, bad, worst


def _grid_batch(rng: np.random.Generator, b: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
  """Clipped per-sample bounds on the dyadic grid (multiples of 1/64 in [-gamma, gamma])."""
  steps = int(GAMMA * 64)
  if kind == "negative":        # the adversarial case of the issue: every gradient < 0
    lo_i = rng.integers(-steps, 0, size=(b, D))
    hi_i = np.minimum(lo_i + rng.integers(0, 8, size=(b, D)), -1)
  elif kind == "positive":
    lo_i = rng.integers(1, steps + 1, size=(b, D))
    hi_i = np.minimum(lo_i + rng.integers(0, 8, size=(b, D)), steps)
  else:
    lo_i = rng.integers(-steps, steps + 1, size=(b, D))
    hi_i = np.minimum(lo_i + rng.integers(0, 16, size=(b, D)), steps)
  return lo_i / 64.0, hi_i / 64.0


CASES = [(b, k) for b in range(2, 7) for k in range(1, b)]
KINDS = ["random", "negative", "positive"]


VARIANTS = list(itertools.product(["actual", "nominal"], [False, True], [False, True]))


def _variants(dl, du, k, gamma, neighbourhood="add_remove", variants=tuple(VARIANTS)) -> dict:
  """Bounds of every (convention, sound, streaming) variant, as numpy arrays.

  The bounds are per coordinate, so batches of several kinds are stacked along a coordinate
  axis, shape (b, kinds, D): one call per variant covers them all.
  """
  out = {}
  dl, du = jnp.asarray(dl), jnp.asarray(du)
  for conv, margin, stream in variants:
    kw = dict(normalise=conv, neighbourhood=neighbourhood, sound=margin)
    if stream:
      res = descent.descent_bounds(dl, du, k, gamma, fragsize=2, **kw)
    else:
      res = descent.descent_bounds_dense(dl, du, k, gamma, **kw)
    out[conv, margin, stream] = tuple(np.asarray(x) for x in res)
  return out


@functools.lru_cache(maxsize=None)
def _case(b: int, k: int, neighbourhood: str = "add_remove"):
  """The grid batches of every kind for (b, k), shape (b, kinds, D), and their bounds."""
  rng = np.random.default_rng(100 * b + k + (50 if neighbourhood == "remove" else 0))
  pairs = [_grid_batch(rng, b, kind) for kind in KINDS]
  dl, du = (np.stack(v, axis=1) for v in zip(*pairs))
  gamma = GAMMA
  if neighbourhood == "remove":     # beyond gamma: the remove-only rule needs no clipping
    dl, du, gamma = dl * 8, du * 8, float("inf")
  return dl, du, _variants(dl, du, k, gamma, neighbourhood)


def _bounds(dl, du, k, convention, sound=False, stream=False):
  """One variant for one batch."""
  kw = dict(normalise=convention, sound=sound)
  if stream:
    return descent.descent_bounds(jnp.asarray(dl), jnp.asarray(du), k, GAMMA, fragsize=2, **kw)
  return descent.descent_bounds_dense(jnp.asarray(dl), jnp.asarray(du), k, GAMMA, **kw)


ROUNDING = 4 * float(np.finfo(np.float64).eps) * GAMMA   # a few ulp of the largest direction


@pytest.mark.parametrize("convention", ["actual", "nominal"])
def test_bound_covers_every_neighbour(convention):
  """Every removal set and addition pattern, both conventions, dense and streaming forms:
  zero violations of the bound with its rounding margin, only rounding-level ones without."""
  total = 0
  for b, k in CASES:
    dl, du, bounds = _case(b, k)
    for i, kind in enumerate(KINDS):
      for stream in (False, True):
        lo, hi = (x[i] for x in bounds[convention, True, stream])
        checked, bad, worst = _violations(dl[:, i], du[:, i], k, GAMMA, convention, lo, hi)
        assert bad == 0, (b, k, kind, stream, bad, worst)
        lo, hi = (x[i] for x in bounds[convention, False, stream])
        _, _, worst = _violations(dl[:, i], du[:, i], k, GAMMA, convention, lo, hi)
        assert worst <= ROUNDING, (b, k, kind, stream, worst)
        total += checked
  assert total > 400_000


@pytest.mark.parametrize("convention", ["actual", "nominal"])
def test_remove_only_bound_covers_every_neighbour(convention):
  """Unlearning (``neighbourhood="remove"``): removals only, values beyond any clipping."""
  for b, k in CASES:
    dl, du, bounds = _case(b, k, "remove")
    for i, kind in enumerate(KINDS):
      for stream in (False, True):
        lo, hi = (x[i] for x in bounds[convention, True, stream])
        checked, bad, worst = _violations(dl[:, i], du[:, i], k, GAMMA, convention, lo, hi,
                                          additions=False)
        assert checked > 0 and bad == 0, (b, k, kind, stream, bad, worst)


def test_arbitrary_floats_within_the_rounding_margin():
  """Non-grid values: covered up to the documented floating-point margin (`rounding_margin`)."""
  rng = np.random.default_rng(2)
  for b, k in CASES:
    g = rng.uniform(-1.5, 1.5, (b, len(KINDS), D))   # the shapes of `_case`: no new compilations
    dl = np.clip(g, -GAMMA, GAMMA)
    du = np.clip(g + rng.uniform(0, 0.3, g.shape), -GAMMA, GAMMA)
    with_margin = [v for v in VARIANTS if v[1]]
    bounds = _variants(dl, du, k, GAMMA, variants=with_margin)
    for (conv, _, _), (lo, hi) in bounds.items():
      for i in range(len(KINDS)):
        _, bad, worst = _violations(dl[:, i], du[:, i], k, GAMMA, conv, lo[i], hi[i])
        assert bad == 0, (b, k, conv, worst)


def test_default_thm46_bound_covers_fixed_b_only_when_no_batch_grows():
  """The paper's bound (default ``normalise="actual"``) covers ``sum / b`` iff a <= r.

  The issue's counterexample: every gradient negative, k additions at -gamma, no removal;
  the fixed-1/b mean is below Thm 4.6's lower bound.
  """
  rng = np.random.default_rng(3)
  b, k = 6, 2
  dl, du = _grid_batch(rng, b, "negative")
  lo, hi = _bounds(dl, du, k, "actual")
  worst_case = (dl.sum(0) - k * GAMMA) / b         # r = 0, a = k, all at -gamma
  assert np.all(worst_case < np.asarray(lo) - 0.01)
  # restricted to a <= r the default bound does cover the fixed-1/b convention
  rs = np.random.default_rng(0)
  for r, a, tot, side in _neighbour_sums(dl, du, k, GAMMA, True, rs):
    if a <= r:
      d_ = tot / b
      if side != "upper":
        assert np.all(np.asarray(lo) - ROUNDING <= d_)
      if side != "lower":
        assert np.all(d_ <= np.asarray(hi) + ROUNDING)
    elif side == "lower" and r == 0:
      assert np.any(d_ < np.asarray(lo) - 0.01 for d_ in tot / b)
  # and the fixed-1/b bound is wider only where it must be
  lo_n, hi_n = _bounds(dl, du, k, "nominal")
  assert np.all(np.asarray(lo_n) <= np.asarray(lo)) and np.all(np.asarray(hi) <= np.asarray(hi_n))


def test_nominal_bound_equals_actual_when_the_removals_cannot_help():
  """With every upper bound < 0 no removal raises the fixed-1/b sum, so its upper bound is
  Thm 4.6's; likewise the lower bound when every lower bound is > 0."""
  rng = np.random.default_rng(4)
  dl, du = _grid_batch(rng, 6, "negative")
  _, hi = _bounds(dl, du, 2, "actual")
  _, hi_n = _bounds(dl, du, 2, "nominal")
  np.testing.assert_array_equal(np.asarray(hi), np.asarray(hi_n))
  dl, du = _grid_batch(rng, 6, "positive")
  lo, _ = _bounds(dl, du, 2, "actual")
  lo_n, _ = _bounds(dl, du, 2, "nominal")
  np.testing.assert_array_equal(np.asarray(lo), np.asarray(lo_n))


def test_bound_is_attained_for_each_convention():
  """The bounds are the exact worst cases (tightness), so the brute-force maximum reaches them."""
  rng = np.random.default_rng(5)
  for kind in KINDS:
    dl, du = _grid_batch(rng, 5, kind)
    for conv in ("actual", "nominal"):
      lo, hi = map(np.asarray, _bounds(dl, du, 2, conv))
      best_lo, best_hi = np.full(D, np.inf), np.full(D, -np.inf)
      for r, a, tot, side in _neighbour_sums(dl, du, 2, GAMMA, True, np.random.default_rng(0)):
        d_ = tot / (5 - r + a if conv == "actual" else 5)
        if side == "lower":
          best_lo = np.minimum(best_lo, d_.min(0))
        elif side == "upper":
          best_hi = np.maximum(best_hi, d_.max(0))
      np.testing.assert_allclose(best_lo, lo, rtol=0, atol=ROUNDING)
      np.testing.assert_allclose(best_hi, hi, rtol=0, atol=ROUNDING)

"""Tests of `boundjax.core.rounding`: γ_n, one-step rounding and outward widening, and an attempt to
break the error model on float32 dot products and sums computed by XLA."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boundjax.core import rounding

F32 = st.floats(min_value=float(np.float32(-1e30)), max_value=float(np.float32(1e30)), allow_nan=False, allow_infinity=False, width=32)


def test_gamma_values_and_limits():
  u = 2.0 ** -24
  assert rounding.unit_roundoff(jnp.float32) == u
  assert rounding.gamma(1, jnp.float32) == pytest.approx(u / (1 - u), rel=1e-12)
  assert rounding.gamma(1000, jnp.float64) == pytest.approx(1000 * 2.0 ** -53, rel=1e-9)
  assert rounding.gamma(10, jnp.float32) < rounding.gamma(11, jnp.float32)
  # past n·u >= 1 the analysis gives no finite bound: +inf (sound), never an exception
  assert rounding.gamma(2 ** 24, jnp.float32) == float("inf")
  assert rounding.gamma(300, jnp.bfloat16) == float("inf")
  assert 0 < rounding.gamma(100, jnp.bfloat16) < 1


def _ulp_steps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """How many representable float32 numbers lie from a to b (b > a, same sign or zero)."""
  ia = a.view(np.int32).astype(np.int64)
  ib = b.view(np.int32).astype(np.int64)
  ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
  ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
  return ib - ia


@settings(max_examples=200, deadline=None)
@given(st.lists(F32, min_size=1, max_size=8))
def test_round_up_down_move_at_least_one_ulp_and_at_most_four(xs):
  x = np.asarray(xs, np.float32)
  x = x[np.abs(x) >= np.finfo(np.float32).tiny * 2**40]  # where |x|·eps dwarfs the 2λ term
  if x.size == 0:
    return
  up, down = np.asarray(rounding.round_up(x)), np.asarray(rounding.round_down(x))
  assert np.all(up >= np.nextafter(x, np.float32(np.inf)))
  assert np.all(down <= np.nextafter(x, np.float32(-np.inf)))
  assert np.all(_ulp_steps(x, up) <= 4) and np.all(_ulp_steps(down, x) <= 4)


def test_round_up_down_on_10k_values_of_every_magnitude():
  """≥ 10⁴ float32 values from 1e-38 to 3e38, both signs, zeros, ±tiny, ±max and ±inf: the
  result is strictly past the value (by ≥ one ulp) and never NaN."""
  rng = np.random.default_rng(0)
  mag = np.exp(rng.uniform(np.log(1e-38), np.log(3e38), 20_000)).astype(np.float32)
  fi = np.finfo(np.float32)
  special = np.asarray([0.0, fi.tiny, 2 * fi.tiny, fi.max, fi.eps, 1.0], np.float32)
  x = np.concatenate([mag, -mag, special, -special])
  up, down = np.asarray(rounding.round_up(x)), np.asarray(rounding.round_down(x))
  assert not np.any(np.isnan(up)) and not np.any(np.isnan(down))
  assert np.all(up.astype(np.float64) > x) and np.all(down.astype(np.float64) < x)
  assert np.all(up >= np.nextafter(x, np.float32(np.inf)))
  assert np.all(down <= np.nextafter(x, np.float32(-np.inf)))
  inf = np.asarray([np.inf, -np.inf], np.float32)
  np.testing.assert_array_equal(np.asarray(rounding.round_down(inf)), [fi.max, -np.inf])
  np.testing.assert_array_equal(np.asarray(rounding.round_up(inf)), [np.inf, -fi.max])


@pytest.mark.parametrize("ulps", [0, 1, 4])
def test_outward_covers_its_budget_exactly_in_float64(ulps):
  """``outward(lo, hi, ulps, abs_err)`` lies strictly past ``x ∓ ulps·eps·|x|``, ``x = lo ∓
  abs_err`` computed exactly (float64; the ratio of the two is kept below 2^29, so the
  difference of two float32 numbers is exact), for ≥ 10⁴ random ends and errors, including
  errors that cancel most of ``lo`` and errors that make the float32 subtraction round."""
  rng = np.random.default_rng(ulps)
  n = 20_000
  lo = (rng.standard_normal(n) * np.exp(rng.uniform(-80, 80, n))).astype(np.float32)
  err = (np.abs(lo) * np.exp(rng.uniform(-20, 0, n))).astype(np.float32)
  lo2, hi2 = rounding.outward(jnp.asarray(lo), jnp.asarray(lo), ulps=ulps,
                              abs_err=jnp.asarray(err))
  eps = float(np.finfo(np.float32).eps)
  x_lo = lo.astype(np.float64) - err
  x_hi = lo.astype(np.float64) + err
  assert np.all(np.asarray(lo2, np.float64) < x_lo - ulps * eps * np.abs(x_lo))
  assert np.all(np.asarray(hi2, np.float64) > x_hi + ulps * eps * np.abs(x_hi))


def test_round_at_zero_and_subnormals():
  z = jnp.zeros(2, jnp.float32)
  assert float(rounding.round_up(z)[0]) > 0 and float(rounding.round_down(z)[0]) < 0


def test_outward_widens_strictly():
  lo = jnp.asarray([-1.0, 0.0, 3.0], jnp.float32)
  hi = jnp.asarray([1.0, 0.0, 4.0], jnp.float32)
  lo2, hi2 = rounding.outward(lo, hi, ulps=1, abs_err=jnp.asarray([0.5, 0.0, 0.0]))
  assert bool(jnp.all(lo2 < lo)) and bool(jnp.all(hi2 > hi))
  assert float(lo2[0]) <= -1.5 and float(hi2[0]) >= 1.5


@pytest.mark.parametrize("n", [10, 1000, 20000])
def test_gamma_bounds_float32_dot_products(n):
  """|fl32(a·b) − a·b| <= γ_n Σ|a_k b_k| for XLA's float32 dot, including heavy cancellation
  (the exact value is computed in float64, where products of float32 numbers are exact)."""
  rng = np.random.default_rng(n)
  a = rng.normal(size=(64, n)).astype(np.float32)
  b = rng.normal(size=(n,)).astype(np.float32)
  # cancellation: rows that sum to almost zero
  a[:16] = np.concatenate([a[:16, : n // 2], -a[:16, : n // 2] * (1 + 1e-3)], axis=1)[:, :n]
  got = np.asarray(jnp.dot(jnp.asarray(a), jnp.asarray(b)), np.float64)
  exact = a.astype(np.float64) @ b.astype(np.float64)
  bound = rounding.gamma(n, jnp.float32) * (np.abs(a).astype(np.float64) @ np.abs(b))
  assert np.all(np.abs(got - exact) <= bound)
  # reduce_sum too
  s = np.asarray(jnp.sum(jnp.asarray(a), axis=1), np.float64)
  assert np.all(np.abs(s - a.astype(np.float64).sum(1))
                <= rounding.gamma(n, jnp.float32) * np.abs(a).astype(np.float64).sum(1))


def test_outward_moves_past_float_error_of_a_sum():
  """A float32 sum widened by γ_n Σ|x| and rounded out contains the exact sum."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(200, 5000)).astype(np.float32) * 1e3
  s = jnp.sum(jnp.asarray(x), axis=1)
  err = rounding.gamma(5000, jnp.float32) * jnp.sum(jnp.abs(jnp.asarray(x)), axis=1)
  lo, hi = rounding.outward(s, s, ulps=1, abs_err=err)
  exact = x.astype(np.float64).sum(1)
  assert np.all(np.asarray(lo, np.float64) <= exact) and np.all(exact <= np.asarray(hi, np.float64))


def test_subnormals_recognised_by_bits_and_snapped_outward():
  """XLA CPU compares subnormals as 0 (DAZ): `is_subnormal` reads the bits, `snap_outward` moves
  subnormal ends to 0 / ±tiny, outward."""
  tiny = float(np.finfo(np.float32).tiny)
  x = jnp.asarray(np.array([1e-40, -1e-40, 0.0, -0.0, 1e-45, tiny, -2 * tiny, 1.0], np.float32))
  np.testing.assert_array_equal(np.asarray(rounding.is_subnormal(x)),
                                [True, True, False, False, True, False, False, False])
  lo, hi = rounding.snap_outward(x, x)
  lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
  x64 = np.asarray(x, np.float64)
  assert np.all(lo <= x64) and np.all(x64 <= hi)
  assert not np.any(np.asarray(rounding.is_subnormal(jnp.asarray(lo, jnp.float32))))
  assert not np.any(np.asarray(rounding.is_subnormal(jnp.asarray(hi, jnp.float32))))


def test_outward_never_returns_nan_or_subnormal_and_handles_overflowed_ends():
  big = np.finfo(np.float32).max
  lo = jnp.asarray([jnp.inf, 0.0, -1e-39, 1.0, -jnp.inf], jnp.float32)
  hi = jnp.asarray([jnp.inf, 0.0, 1e-39, -jnp.inf, jnp.inf], jnp.float32)
  lo2, hi2 = rounding.outward(lo, hi, ulps=4, abs_err=jnp.asarray(jnp.inf))
  assert not np.isnan(np.asarray(lo2)).any() and not np.isnan(np.asarray(hi2)).any()
  lo3, hi3 = rounding.outward(lo, hi, ulps=4)
  # an overflowed lower end (+inf) may stand for a finite value near the maximum
  assert float(lo3[0]) < big and np.isfinite(float(lo3[0]))
  assert float(hi3[3]) > -big and np.isfinite(float(hi3[3]))
  for a in (lo3, hi3):
    assert not np.any(np.asarray(rounding.is_subnormal(a)))


def test_sum_error_covers_flushed_products():
  """Products that underflow are flushed to zero: sum_error adds 2n·tiny."""
  a = np.full(1000, 1e-20, np.float32)
  b = np.full(1000, 1e-20, np.float32)
  got = float(jnp.dot(jnp.asarray(a), jnp.asarray(b)))
  exact = float(a.astype(np.float64) @ b.astype(np.float64))
  err = float(rounding.sum_error(1000, np.float32(got), jnp.float32))
  assert abs(got - exact) <= err
  assert rounding.sum_error(10, 0.0, jnp.float32) >= 20 * float(np.finfo(np.float32).tiny)

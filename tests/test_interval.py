"""The Interval type: construction, validation, pytree behaviour, product kernels."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import boundjax as bj
from boundjax.interval import bilinear_midrad, bilinear_signsplit, mul_bounds


def test_properties():
  iv = bj.Interval(jnp.array([0.0, 1.0]), jnp.array([2.0, 1.5]))
  np.testing.assert_allclose(iv.center, [1.0, 1.25])
  np.testing.assert_allclose(iv.radius, [1.0, 0.25])
  assert iv.shape == (2,) and iv.dtype == jnp.float32 and iv.ndim == 1


def test_constructors():
  x = jnp.array([0.2, 0.9])
  np.testing.assert_array_equal(bj.Interval.point(x).lower, x)
  box = bj.Interval.around(x, 0.3, domain=(0.0, 1.0))
  np.testing.assert_allclose(box.lower, [0.0, 0.6], atol=1e-7)
  np.testing.assert_allclose(box.upper, [0.5, 1.0], atol=1e-7)
  cr = bj.Interval.from_center_radius(x, 0.1)
  np.testing.assert_allclose(cr.center, x, atol=1e-7)
  h = bj.Interval.hull(bj.Interval(jnp.zeros(2), jnp.ones(2)), jnp.array([2.0, -1.0]))
  np.testing.assert_allclose(h.lower, [0.0, -1.0])
  np.testing.assert_allclose(h.upper, [2.0, 1.0])


@pytest.mark.parametrize("lower,upper,message", [
    ([0.0, 2.0], [1.0, 1.0], r"lower > upper at index \(1,\)"),
    ([0.0, np.nan], [1.0, 1.0], "lower bound is not finite"),
    ([0.0, 0.0], [1.0, np.inf], "upper bound is not finite"),
    ([0.0, 0.0], [1.0, 1.0, 1.0], "equal shapes"),
])
def test_validation_errors(lower, upper, message):
  with pytest.raises(ValueError, match=message):
    bj.Interval(np.array(lower), np.array(upper))


def test_negative_radius_rejected():
  with pytest.raises(ValueError, match="eps must be >= 0"):
    bj.Interval.around(jnp.zeros(2), -0.1)
  with pytest.raises(ValueError, match="radius must be >= 0"):
    bj.Interval.from_center_radius(jnp.zeros(2), -jnp.ones(2))


def test_validation_skipped_under_jit():
  @jax.jit
  def make(lo, hi):
    return bj.Interval(lo, hi).upper  # would be invalid, but values are unknown when tracing
  make(jnp.ones(2), jnp.zeros(2))


def test_pytree_roundtrip_and_vmap():
  iv = bj.Interval(jnp.zeros((3, 2)), jnp.ones((3, 2)))
  leaves, tree = jax.tree_util.tree_flatten(iv)
  assert len(leaves) == 2
  back = jax.tree_util.tree_unflatten(tree, leaves)
  assert isinstance(back, bj.Interval)
  widths = jax.vmap(lambda b: b.width.sum())(iv)
  np.testing.assert_allclose(widths, [2.0, 2.0, 2.0])


def _boxes(draw, shape):
  a = draw(hnp.arrays(np.float32, shape, elements=st.floats(-4, 4, width=32)))
  b = draw(hnp.arrays(np.float32, shape, elements=st.floats(-4, 4, width=32)))
  return bj.Interval(np.minimum(a, b), np.maximum(a, b))


@st.composite
def box_pairs(draw):
  m, k, n = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
  return _boxes(draw, (m, k)), _boxes(draw, (k, n))


@settings(max_examples=60, deadline=None)
@given(box_pairs(), st.integers(0, 2**31 - 1))
def test_product_kernels_contain_samples(pair, seed):
  """Rump, sign-split and four-corner products each contain A·B for sampled A, B (incl. vertices)."""
  a, b = pair
  rng = np.random.default_rng(seed)
  mid = bilinear_midrad(jnp.matmul, a, b)
  sgn = bilinear_signsplit(jnp.matmul, a, b)
  for _ in range(200):
    pick = lambda box: np.where(rng.random(box.shape) < 0.5,
                                rng.uniform(box.lower, box.upper),
                                np.where(rng.random(box.shape) < 0.5, box.lower, box.upper))
    prod = pick(a).astype(np.float64) @ pick(b).astype(np.float64)
    for lo, hi in (mid, sgn):
      assert np.all(prod >= np.asarray(lo) - 1e-4) and np.all(prod <= np.asarray(hi) + 1e-4)
  lo, hi = mul_bounds(a.lower, a.upper, b.lower[:1, :1], b.upper[:1, :1])
  assert np.all(np.asarray(lo) <= np.asarray(hi))


def test_signsplit_exact_for_nonnegative_operand_and_midrad_not():
  """With a non-negative operand, sign-split is exact while midpoint-radius over-approximates."""
  a = bj.Interval(jnp.array([[0.0, 1.0]]), jnp.array([[2.0, 3.0]]))       # >= 0
  b = bj.Interval(jnp.array([[-1.0], [0.5]]), jnp.array([[1.0], [2.0]]))
  # exact: a0*b0 in [-2, 2], a1*b1 in [0.5, 6] -> [-1.5, 8]
  lo, hi = bilinear_signsplit(jnp.matmul, a, b)
  np.testing.assert_allclose([lo[0, 0], hi[0, 0]], [-1.5, 8.0])
  lo2, hi2 = bilinear_midrad(jnp.matmul, a, b)
  assert lo2[0, 0] < -1.5 and hi2[0, 0] >= 8.0


def test_tree_contains():
  box = {"w": bj.Interval(jnp.zeros(2), jnp.ones(2)), "b": jnp.array(3.0)}
  assert bj.tree_contains(box, {"w": jnp.array([0.5, 1.0]), "b": jnp.array(3.0)})
  assert not bj.tree_contains(box, {"w": jnp.array([0.5, 1.1]), "b": jnp.array(3.0)})

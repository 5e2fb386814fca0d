"""The Interval type: construction, validation, pytree behaviour, product kernels."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import boundjax as bj
from boundjax.core.interval import bilinear_midrad, bilinear_signsplit, mul_bounds


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


# ----------------------------------------------------------------------------------------------
# BoundError, stricter construction, overflow-free views
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("lower,upper,message", [
    ([0.0, 2.0], [1.0, 1.0], r"lower > upper at index \(1,\)"),
    ([0.0, np.nan], [1.0, 1.0], "lower bound is not finite"),
    ([0.0, 0.0], [1.0, -np.inf], "upper bound is not finite"),
    ([0.0, 0.0], [1.0, 1.0, 1.0], "equal shapes"),
])
def test_invalid_box_raises_bound_error_at_user_line(lower, upper, message):
  with pytest.raises(bj.BoundError, match=message) as err:
    bj.Interval(np.array(lower), np.array(upper))
  assert "at test_interval.py:" in str(err.value)
  assert "(test_invalid_box_raises_bound_error_at_user_line)" in str(err.value)
  assert isinstance(err.value, ValueError)


def test_complex_interval_rejected():
  with pytest.raises(bj.BoundError, match="complex dtype"):
    bj.Interval(jnp.zeros(2, jnp.complex64), jnp.ones(2, jnp.complex64))
  with pytest.raises(bj.BoundError, match="complex dtype"):
    bj.Interval(np.zeros(2), np.ones(2) + 0j)


def test_bool_mixed_with_float_rejected():
  with pytest.raises(bj.BoundError, match="bool mixed with numbers"):
    bj.Interval(np.zeros(2, bool), np.ones(2, np.float32))
  with pytest.raises(bj.BoundError, match="bool mixed with numbers"):
    bj.Interval(jnp.zeros(2), jnp.ones(2, bool))


def test_integer_and_bool_intervals_allowed():
  assert bj.Interval(jnp.array([0, 1]), jnp.array([2, 1])).dtype == jnp.int32
  assert bj.Interval(np.array([False, True]), np.array([True, True])).shape == (2,)
  with pytest.raises(bj.BoundError, match="lower > upper"):
    bj.Interval(np.array([True]), np.array([False]))


def test_around_rejects_inverted_or_nan_domain_and_nan_eps():
  x = jnp.array([0.2, 0.9])
  with pytest.raises(bj.BoundError, match="low <= high"):
    bj.Interval.around(x, 0.1, domain=(1, 0))
  with pytest.raises(bj.BoundError, match="domain must not contain NaN"):
    bj.Interval.around(x, 0.1, domain=(0.0, float("nan")))
  with pytest.raises(bj.BoundError, match="eps must not be NaN"):
    bj.Interval.around(x, float("nan"))
  with pytest.raises(bj.BoundError, match="eps must not be NaN"):
    bj.Interval.around(x, jnp.array([0.1, jnp.nan]), domain=(0.0, 1.0))
  with pytest.raises(bj.BoundError, match="radius must not be NaN"):
    bj.Interval.from_center_radius(x, jnp.nan)
  with pytest.raises(bj.BoundError, match="eps must be >= 0"):
    bj.Interval.around(x, -0.1)
  box = bj.Interval.around(x, 0.1, domain=(0.5, 0.5))          # low == high is a point
  np.testing.assert_array_equal(box.lower, [0.5, 0.5])


def test_around_domain_skipped_under_jit():
  @jax.jit
  def make(x, low, high):
    return bj.Interval.around(x, 0.1, domain=(low, high)).lower
  np.testing.assert_allclose(make(jnp.zeros(2), -1.0, 1.0), [-0.1, -0.1], atol=1e-7)


F32_MAX = float(np.finfo(np.float32).max)


@pytest.mark.parametrize("lower,upper", [
    ([-F32_MAX, 3.0e38, -F32_MAX, 1.0], [F32_MAX, F32_MAX, -3.0e38, 1.0]),
    ([-3.4e38, 0.0], [3.4e38, 3.4e38]),
])
def test_center_and_radius_finite_near_float32_max(lower, upper):
  iv = bj.Interval(jnp.array(lower, jnp.float32), jnp.array(upper, jnp.float32))
  c, r = np.asarray(iv.center), np.asarray(iv.radius)
  lo, hi = np.asarray(iv.lower, np.float64), np.asarray(iv.upper, np.float64)
  assert c.dtype == np.float32 and r.dtype == np.float32
  assert np.all(np.isfinite(c)) and np.all(np.isfinite(r))
  assert np.all(lo <= c) and np.all(c <= hi)
  np.testing.assert_allclose(c, (lo + hi) / 2, rtol=1e-6, atol=1e-30)
  np.testing.assert_allclose(r, (hi - lo) / 2, rtol=1e-6)
  # width is documented to overflow to +inf (a sound bound) where u - l exceeds the max
  w = np.asarray(iv.width)
  assert np.all((w == np.inf) | np.isclose(w, hi - lo, rtol=1e-6))


def test_center_radius_under_jit_near_float32_max():
  iv = bj.Interval(jnp.full((3,), -F32_MAX, jnp.float32), jnp.full((3,), F32_MAX, jnp.float32))
  c, r = jax.jit(lambda b: (b.center, b.radius))(iv)
  np.testing.assert_array_equal(c, np.zeros(3, np.float32))
  np.testing.assert_array_equal(r, np.full(3, F32_MAX, np.float32))


# ----------------------------------------------------------------------------------------------
# Unflattening validates boxes built by user tree operations, tolerates JAX's placeholders
# ----------------------------------------------------------------------------------------------

def _box():
  return bj.Interval(jnp.array([0.0, 1.0]), jnp.array([1.0, 2.0]))


def test_tree_map_identity_rejects_bad_interval():
  bad = bj.Interval(jnp.array([1.0, 0.0]), jnp.array([0.0, 1.0]), validate=False)
  with pytest.raises(bj.BoundError, match=r"lower > upper at index \(0,\)") as err:
    jax.tree_util.tree_map(lambda a: a, bad)
  assert "at test_interval.py:" in str(err.value)
  nan = bj.Interval(np.array([0.0, np.nan]), np.array([1.0, 1.0]), validate=False)
  with pytest.raises(bj.BoundError, match="lower bound is NaN"):
    jax.tree_util.tree_map(lambda a: a, nan)


def test_tree_map_building_inverted_or_nan_box_raises():
  with pytest.raises(bj.BoundError, match="lower > upper"):
    jax.tree_util.tree_map(lambda a: -a, {"w": _box()})
  with pytest.raises(bj.BoundError, match="lower > upper"):
    jax.tree.map(lambda a: -a, [_box()])
  with pytest.raises(bj.BoundError, match="NaN"):
    jax.tree_util.tree_map(lambda a: a * jnp.nan, _box())
  treedef = jax.tree_util.tree_structure(_box())
  with pytest.raises(bj.BoundError, match="equal shapes"):
    jax.tree_util.tree_unflatten(treedef, [np.zeros(2), np.ones(3)])
  with pytest.raises(bj.BoundError, match="lower > upper"):
    other = bj.Interval(jnp.array([0.0, 0.0]), jnp.array([1.0, 3.0]))
    jax.tree_util.tree_map(lambda a, b: a - b, _box(), other)   # [l-l', u-u'] is not a box


def test_tree_map_keeping_a_box_passes_and_allows_inf():
  out = jax.tree_util.tree_map(lambda a: 2 * a + 1, {"w": _box()})
  np.testing.assert_allclose(out["w"].lower, [1.0, 3.0])
  big = jax.tree_util.tree_map(lambda a: a * jnp.inf, bj.Interval(jnp.ones(2), 2 * jnp.ones(2)))
  assert np.all(np.isinf(big.upper))                     # overflowed bounds stay sound
  ints = jax.tree_util.tree_map(lambda a: a.astype(jnp.int32), _box())
  assert ints.dtype == jnp.int32


def test_tree_ops_tolerate_placeholders():
  box = {"a": _box(), "b": jnp.ones(3)}
  flags = jax.tree_util.tree_map(lambda x: x is None, box)
  assert flags["a"].lower is False
  below = jax.tree_util.tree_map(lambda x: x < 0.5, box)       # bool placeholders: [True, False]
  assert bool(below["a"].lower[0]) and not bool(below["a"].upper[0])
  nones = jax.tree_util.tree_map(lambda x: None, box)
  assert nones["a"].lower is None
  treedef = jax.tree_util.tree_structure(box)
  objs = jax.tree_util.tree_unflatten(treedef, [object()] * treedef.num_leaves)
  assert isinstance(objs["a"], bj.Interval)
  shapes = jax.eval_shape(lambda b: b, box)
  assert isinstance(shapes["a"].lower, jax.ShapeDtypeStruct)
  structs = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), box)
  assert structs["a"].lower.shape == (2,)
  avals = jax.tree_util.tree_map(lambda x: jax.core.ShapedArray(x.shape, x.dtype), box)
  assert avals["a"].upper.shape == (2,)
  paths = jax.tree_util.tree_map_with_path(lambda p, x: jax.tree_util.keystr(p), box)
  assert isinstance(paths["a"].lower, str)


def test_jit_vmap_scan_still_work_on_intervals():
  box = bj.Interval(jnp.zeros((3, 2)), jnp.ones((3, 2)))
  double = jax.jit(lambda b: bj.Interval(2 * b.lower, 2 * b.upper))
  for _ in range(3):                                       # first call and the C++ fast path
    np.testing.assert_allclose(double(box).upper, 2 * np.ones((3, 2)))
  swapped = jax.jit(lambda b: bj.Interval(b.upper, b.lower, validate=False))
  for _ in range(3):                                       # jit outputs are not re-checked
    assert np.all(np.asarray(swapped(box).lower) == 1.0)
  widths = jax.vmap(lambda b: b.width.sum())(box)
  np.testing.assert_allclose(widths, [2.0, 2.0, 2.0])
  rows = jax.vmap(lambda b: bj.Interval(b.lower - 1, b.upper))(box)
  assert isinstance(rows, bj.Interval) and rows.shape == (3, 2)

  def step(carry, b):
    return bj.Interval(carry.lower + b.lower, carry.upper + b.upper), b.width.sum()
  total, ws = jax.lax.scan(step, bj.Interval(jnp.zeros(2), jnp.zeros(2)), box)
  np.testing.assert_allclose(total.upper, [3.0, 3.0])
  np.testing.assert_allclose(ws, [2.0, 2.0, 2.0])


def test_grad_with_respect_to_intervals_returns_cotangents():
  """A gradient w.r.t. an Interval has lower-cotangent > upper-cotangent: not a box, not checked."""
  box = {"w": _box()}
  loss = lambda t: -t["w"].width.sum()
  g = jax.grad(loss)(box)
  np.testing.assert_allclose(g["w"].lower, [1.0, 1.0])
  np.testing.assert_allclose(g["w"].upper, [-1.0, -1.0])
  jg = jax.jit(jax.grad(loss))
  for _ in range(3):
    np.testing.assert_allclose(jg(box)["w"].upper, [-1.0, -1.0])
  _, vjp = jax.vjp(loss, box)
  np.testing.assert_allclose(vjp(jnp.float32(2.0))[0]["w"].lower, [2.0, 2.0])
  vg = jax.vmap(jax.grad(lambda b: -b.width.sum()))(bj.Interval(jnp.zeros((2, 3)), jnp.ones((2, 3))))
  np.testing.assert_allclose(vg.upper, -np.ones((2, 3)))


def test_optax_and_flax_tree_ops_over_intervals():
  import optax
  from flax import nnx
  params = {"w": _box(), "b": jnp.zeros(2)}
  loss = lambda p: jnp.sum(p["w"].lower ** 2) - jnp.sum(p["w"].upper) + jnp.sum(p["b"])
  for opt in (optax.sgd(0.1), optax.adam(0.1)):
    state = opt.init(params)
    grads = jax.grad(loss)(params)
    updates, state = opt.update(grads, state, params)
    new = optax.apply_updates(params, updates)
    assert isinstance(new["w"], bj.Interval)
    assert optax.global_norm(grads) > 0

  class M(nnx.Module):
    def __init__(self, rngs):
      self.l1 = nnx.Linear(3, 2, rngs=rngs)

  graphdef, state = nnx.split(M(nnx.Rngs(0)))
  sbox = jax.tree_util.tree_map(lambda w: bj.Interval.around(w, 0.02), state)
  merged = nnx.merge(graphdef, sbox)
  assert isinstance(merged.l1.kernel.value, bj.Interval)
  _, again = nnx.split(merged)
  assert len(jax.tree_util.tree_leaves(again)) == 4

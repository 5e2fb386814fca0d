"""The faster AGT paths against their references: two-level top-k, batched nominal gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boundjax.agt import descent, mlp, train


@pytest.fixture(autouse=True)
def x64():
  with jax.enable_x64(True):
    yield


@pytest.mark.parametrize("f, d, k", [(37, 5, 3), (2000, 7, 10), (101, 3, 1), (500, 4, 10),
                                     (12, 3, 11), (997, 6, 10), (250, 2, 4)])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_leading_equals_lax_top_k(f, d, k, largest):
  rng = np.random.default_rng(f * 31 + d * 7 + k)
  # rounded values give many ties; a block of equal values stresses the group choice
  v = np.round(rng.normal(size=(f, d)), 1)
  v[: f // 3, 0] = 0.5
  extra = rng.normal(size=(d, k))
  s = 1 if largest else -1
  ref = s * jax.lax.top_k(s * jnp.concatenate([jnp.asarray(extra), jnp.asarray(v).T], -1), k)[0]
  got = descent.topk_leading(jnp.asarray(v), k, jnp.asarray(extra), largest=largest)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))
  got3 = descent.topk_leading(jnp.asarray(v).reshape(f, d, 1), k, largest=largest)
  ref3 = s * jax.lax.top_k(s * jnp.asarray(v).T, k)[0]
  np.testing.assert_array_equal(np.asarray(got3)[:, 0], np.asarray(ref3))


@pytest.mark.parametrize("f, k", [(2000, 10), (1000, 10), (500, 10), (997, 10), (5000, 50)])
def test_group_size_splits_into_more_than_k_groups(f, k):
  g = descent._group_size(f, k)
  assert 1 <= g and -(-f // g) > k


@pytest.mark.parametrize("loss, sizes", [("binary_cross_entropy", [5, 7, 3, 1]),
                                         ("cross_entropy", [4, 6, 3]), ("mse", [3, 5, 2])])
def test_batched_nominal_grads_equal_vmap_grad(loss, sizes):
  rng = np.random.default_rng(len(sizes))
  p = mlp.init(jax.random.PRNGKey(1), sizes, jnp.float64)
  x = jnp.asarray(rng.normal(size=(9, sizes[0])))
  if loss == "cross_entropy":
    y = jnp.asarray(rng.integers(0, sizes[-1], 9))
  elif loss == "mse":
    y = jnp.asarray(rng.normal(size=(9, sizes[-1])))
  else:
    y = jnp.asarray(rng.integers(0, 2, 9)).astype(jnp.float64)
  ref = train.nominal_grad_fn(mlp.apply, loss)(p, x, y)
  got = mlp.per_sample_grads(p, x, y, loss)
  for a, b in zip(jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(got)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("b, frag", [(60, 60), (60, 17), (60, 25)])
def test_streaming_sums_equal_dense_with_remainder_fragment(b, frag):
  rng = np.random.default_rng(b + frag)
  dl = rng.uniform(-1, 1, (b, 40, 3))
  du = dl + rng.uniform(0, 0.5, (b, 40, 3))
  lo, hi = descent.descent_bounds(jnp.asarray(dl), jnp.asarray(du), 4, 1.0, fragsize=frag)
  rl, rh = descent.descent_bounds_dense(jnp.asarray(dl), jnp.asarray(du), 4, 1.0)
  np.testing.assert_allclose(np.asarray(lo), np.asarray(rl), rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(np.asarray(hi), np.asarray(rh), rtol=1e-12, atol=1e-12)

"""Tests of boundjax.models helpers."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from boundjax.models import MLP, fit_full_batch


def test_fit_full_batch_equals_an_explicit_loop_and_learns():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(64, 3)), jnp.float32)
  y = jnp.asarray((x[:, 0] + x[:, 1] > 0).astype(np.int32))
  model = MLP(hidden=(8,), out=2)
  p0 = model.init(jax.random.PRNGKey(0), x[:1])
  opt = optax.adam(1e-2)
  fitted = fit_full_batch(model.apply, p0, x, y, opt, 50)
  p, s = p0, opt.init(p0)
  loss = lambda q: optax.softmax_cross_entropy_with_integer_labels(model.apply(q, x), y).mean()
  for _ in range(50):
    u, s = opt.update(jax.grad(loss)(p), s, p)
    p = optax.apply_updates(p, u)
  for a, b in zip(jax.tree_util.tree_leaves(fitted), jax.tree_util.tree_leaves(p)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  assert float(loss(fitted)) < 0.5 * float(loss(p0))


def test_banded_conv1d_equals_flax_conv_and_refuses_what_it_does_not_compute():
  """`BandedConv1d` (one product with the banded matrix) against `flax.linen.Conv` on the same
  parameters: same initial parameters, and outputs within float32 rounding for several kernel
  sizes, channel counts and batch shapes."""
  import flax.linen as nn

  from boundjax.models import BandedConv1d
  rng = np.random.default_rng(0)
  for k, c_in, c_out, n, batch in ((3, 1, 6, 21, (5,)), (3, 6, 6, 19, (2, 3)), (1, 2, 4, 7, ()),
                                   (5, 3, 2, 9, (4,))):
    x = jnp.asarray(rng.normal(size=batch + (n, c_in)), jnp.float32)
    ours = BandedConv1d(c_out, (k,), padding="VALID", name="c")
    ref = nn.Conv(c_out, (k,), padding="VALID", name="c")
    p = ours.init(jax.random.PRNGKey(k), x)
    q = ref.init(jax.random.PRNGKey(k), x)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(p),
                                                    jax.tree_util.tree_leaves(q)))
    p = jax.tree_util.tree_map(lambda a: jnp.asarray(rng.normal(size=a.shape), a.dtype), p)
    got, want = ours.apply(p, x), ref.apply(p, x)
    assert got.shape == want.shape == batch + (n - k + 1, c_out)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  x = jnp.zeros((1, 9, 1))
  for bad in (dict(strides=2), dict(padding="SAME"), dict(kernel_dilation=2),
              dict(kernel_size=(3, 3))):
    kw = dict(features=3, kernel_size=(3,), padding="VALID") | bad
    with pytest.raises(ValueError, match="BandedConv1d"):
      BandedConv1d(**kw).init(jax.random.PRNGKey(0), x if len(kw["kernel_size"]) == 1
                              else jnp.zeros((1, 9, 9, 1)))

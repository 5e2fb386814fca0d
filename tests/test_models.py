"""Tests of boundjax.models helpers."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

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

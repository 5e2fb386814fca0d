"""Tests of the DP-SGD baseline (boundjax.dpsgd)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boundjax import agt, dpsgd
from boundjax.agt import mlp
from boundjax.training import Schedule


def test_epsilon_decreases_with_noise_and_calibration_hits_target():
  e1 = dpsgd.dpsgd_epsilon(0.8, 100, 5000, 5, 1e-5)
  e2 = dpsgd.dpsgd_epsilon(1.6, 100, 5000, 5, 1e-5)
  assert e2 < e1
  s = dpsgd.calibrate_noise(2.0, 1e-5, 100, 5000, 5)
  e = dpsgd.dpsgd_epsilon(s, 100, 5000, 5, 1e-5)
  assert e <= 2.0 + 1e-6 and e > 1.9


def test_epsilon_matches_dp_accounting_directly():
  import dp_accounting
  acc = dp_accounting.rdp.RdpAccountant()
  acc.compose(dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)), 300))
  np.testing.assert_allclose(dpsgd.dpsgd_epsilon(1.1, 50, 5000, 3, 1e-5),
                             acc.get_epsilon(1e-5), rtol=0.05)


def _data(n=400):
  rng = np.random.default_rng(0)
  X = rng.normal(size=(n, 3))
  y = (X[:, 0] + X[:, 1] > 0).astype(np.float32)
  return jnp.asarray(X, jnp.float32), jnp.asarray(y)


def test_train_learns_with_little_noise_and_reports_epsilon():
  X, y = _data()
  p0 = mlp.init(jax.random.PRNGKey(0), [3, 8, 1])
  r = dpsgd.train(mlp.apply, p0, X, y, loss="binary_cross_entropy", learning_rate=0.5, epochs=5,
                  batch_size=50, l2_norm_clip=1.0, noise_multiplier=0.3)
  acc = float(jnp.mean((mlp.apply(r.params, X)[:, 0] > 0) == (y > 0)))
  assert acc > 0.85 and r.noise_multiplier == 0.3 and r.epsilon > 0
  assert r.schedule == Schedule(400, 50, 5, shuffle="epoch", last_batch="drop")
  r = dpsgd.train(mlp.apply, p0, X, y, loss="binary_cross_entropy", learning_rate=0.5,
                  schedule=Schedule(400, 100, 2, last_batch="drop"), l2_norm_clip=1.0,
                  epsilon=1.0)
  assert r.epsilon <= 1.0 + 1e-6 and r.noise_multiplier > 0.3


def test_train_with_zero_noise_and_huge_clip_is_sgd_on_the_schedule():
  """sigma -> 0 and a clip no gradient reaches: DP-SGD is plain SGD on the mean loss."""
  X, y = _data(40)
  p0 = mlp.init(jax.random.PRNGKey(0), [3, 4, 1])
  sched = Schedule(40, 10, 2, seed=3, last_batch="drop")
  r = dpsgd.train(mlp.apply, p0, X, y, loss="binary_cross_entropy", learning_rate=0.3,
                  schedule=sched, l2_norm_clip=1e6, noise_multiplier=1e-12)
  lf = jax.vmap(agt.losses.per_sample_loss("binary_cross_entropy"))
  p = p0
  for idx in sched.batches_np():
    g = jax.grad(lambda q: jnp.mean(lf(mlp.apply(q, X[idx]), y[idx])))(p)
    p = jax.tree_util.tree_map(lambda a, b: a - 0.3 * b, p, g)
  for a, b in zip(jax.tree_util.tree_leaves(r.params), jax.tree_util.tree_leaves(p)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_old_train_dpsgd_warns_and_returns_the_tuple():
  X, y = _data(40)
  p0 = mlp.init(jax.random.PRNGKey(0), [3, 2, 1])
  with pytest.warns(DeprecationWarning, match="dpsgd.train"):
    p, eps, sigma = dpsgd.train_dpsgd(mlp.apply, p0, X, y, loss="binary_cross_entropy",
                                      learning_rate=0.1, epochs=1, batch_size=10,
                                      l2_norm_clip=1.0, noise_multiplier=1.0)
  assert eps > 0 and sigma == 1.0


def test_train_dpsgd_input_errors():
  X, y = _data(40)
  p0 = mlp.init(jax.random.PRNGKey(0), [3, 2, 1])
  with pytest.raises(ValueError, match="exactly one"):
    dpsgd.train(mlp.apply, p0, X, y, loss="mse", learning_rate=0.1, epochs=1,
                batch_size=10, l2_norm_clip=1.0)
  with pytest.raises(ValueError, match="batch_size"):
    dpsgd.dpsgd_epsilon(1.0, 100, 40, 1, 1e-5)

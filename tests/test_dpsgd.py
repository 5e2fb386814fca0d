"""Tests of the DP-SGD baseline (boundjax.dpsgd)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boundjax import dpsgd
from boundjax.agt import mlp


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


def test_train_dpsgd_learns_with_little_noise_and_reports_eps():
  X, y = _data()
  p0 = mlp.init(jax.random.PRNGKey(0), [3, 8, 1])
  p, eps, sigma = dpsgd.train_dpsgd(mlp.apply, p0, X, y, loss="binary_cross_entropy",
                                    learning_rate=0.5, epochs=5, batch_size=50,
                                    l2_norm_clip=1.0, noise_multiplier=0.3)
  acc = float(jnp.mean((mlp.apply(p, X)[:, 0] > 0) == (y > 0)))
  assert acc > 0.85 and sigma == 0.3 and eps > 0
  p, eps, sigma = dpsgd.train_dpsgd(mlp.apply, p0, X, y, loss="binary_cross_entropy",
                                    learning_rate=0.5, epochs=2, batch_size=100,
                                    l2_norm_clip=1.0, target_eps=1.0)
  assert eps <= 1.0 + 1e-6 and sigma > 0.3


def test_train_dpsgd_input_errors():
  X, y = _data(40)
  p0 = mlp.init(jax.random.PRNGKey(0), [3, 2, 1])
  with pytest.raises(ValueError, match="exactly one"):
    dpsgd.train_dpsgd(mlp.apply, p0, X, y, loss="mse", learning_rate=0.1, epochs=1,
                      batch_size=10, l2_norm_clip=1.0)
  with pytest.raises(ValueError, match="batch_size"):
    dpsgd.dpsgd_epsilon(1.0, 100, 40, 1, 1e-5)

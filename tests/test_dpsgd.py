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
                             acc.get_epsilon(1e-5), rtol=1e-9)  # the same call: exact


def _rdp_sampled_gaussian(q, sigma, order):
  """RDP of the Poisson-subsampled Gaussian at an integer order (Mironov, Talwar & Zhang 2019,
  Sec. 3.3): log(sum_k C(a,k) (1-q)^(a-k) q^k exp((k^2 - k) / (2 sigma^2))) / (a - 1)."""
  from scipy.special import gammaln, logsumexp
  k = np.arange(order + 1)
  terms = (gammaln(order + 1) - gammaln(k + 1) - gammaln(order - k + 1)
           + (order - k) * np.log1p(-q) + k * np.log(q) + (k * k - k) / (2 * sigma ** 2))
  return float(logsumexp(terms)) / (order - 1)


def _epsilon_independent(sigma, batch, n, epochs, delta, conversion):
  """(eps, delta) over integer orders 2..256, computed here from the formula above:
  "classic" eps = T rdp + log(1/delta)/(a-1) (Mironov 2017, Prop. 3), or "improved"
  eps = T rdp + log(1 - 1/a) - (log delta + log a)/(a-1) (Balle et al. 2020, Thm. 21)."""
  steps = epochs * int(np.ceil(n / batch))
  best = np.inf
  for a in range(2, 257):
    r = steps * _rdp_sampled_gaussian(batch / n, sigma, a)
    extra = (np.log(1 / delta) / (a - 1) if conversion == "classic" else
             np.log1p(-1 / a) - (np.log(delta) + np.log(a)) / (a - 1))
    best = min(best, r + extra)
  return best


@pytest.mark.parametrize("sigma,batch,n,epochs", [(1.1, 50, 5000, 3), (1.1, 256, 60000, 60),
                                                  (0.8, 100, 10000, 10)])
def test_epsilon_against_an_independent_rdp_computation(sigma, batch, n, epochs):
  """dpsgd_epsilon (dp-accounting, integer and fractional orders, improved conversion) is at most
  the same conversion over integer orders only, within 3 % of it, and below the classic
  conversion ((1.1, 256, 60000, 60): the MNIST setting of Abadi et al. 2016)."""
  eps = dpsgd.dpsgd_epsilon(sigma, batch, n, epochs, 1e-5)
  improved = _epsilon_independent(sigma, batch, n, epochs, 1e-5, "improved")
  classic = _epsilon_independent(sigma, batch, n, epochs, 1e-5, "classic")
  assert 0.97 * improved <= eps <= improved + 1e-9, (eps, improved)
  assert eps < classic


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

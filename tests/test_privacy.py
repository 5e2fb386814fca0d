"""Tests of boundjax.privacy: mechanisms, ensembles, accounting."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boundjax import privacy
from boundjax.privacy import mechanisms as mech


# ---------------------------------------------------------------------------------------------
# Mechanism distributions (check 13) and arithmetic (check 11)
# ---------------------------------------------------------------------------------------------

N = 200_000


@pytest.mark.parametrize("eps", [0.3, 1.0, 3.0])
def test_global_sensitivity_response_distribution(eps):
  key = jax.random.PRNGKey(0)
  r1 = privacy.global_sensitivity_response(key, jnp.ones(N, jnp.int32), eps)
  r0 = privacy.global_sensitivity_response(key, jnp.zeros(N, jnp.int32), eps)
  p1 = 1 - 0.5 * math.exp(-0.5 * eps)
  assert abs(float(r1.mean()) - p1) < 5 * math.sqrt(p1 * (1 - p1) / N)
  assert abs(float(r0.mean()) - (1 - p1)) < 5 * math.sqrt(p1 * (1 - p1) / N)
  np.testing.assert_allclose(privacy.response_probability(1, 1 / eps, "laplace"), p1)
  # the likelihood ratio of the outputs for f = 1 and f = 0 is within e^eps (eps-DP)
  assert p1 / (1 - p1) <= math.exp(eps) + 1e-12


@pytest.mark.parametrize("k, eps", [(0, 1.0), (5, 1.0), (30, 0.5)])
def test_cauchy_response_distribution(k, eps):
  key = jax.random.PRNGKey(k)
  s = float(privacy.cauchy_scale(k, eps))
  np.testing.assert_allclose(s, 6 * math.exp(-eps * k / 6) / eps)
  r = privacy.cauchy_response(key, jnp.ones(N, jnp.int32), jnp.full(N, k), eps)
  p = 0.5 + math.atan(0.5 / s) / math.pi
  assert abs(float(r.mean()) - p) < 5 * math.sqrt(p * (1 - p) / N) + 1e-4
  np.testing.assert_allclose(privacy.response_probability(1, s, "cauchy"), p)


def test_laplace_smooth_parameters():
  eps, delta, k = 1.0, 1e-5, 20
  beta = eps / (2 * math.log(2 / delta))
  np.testing.assert_allclose(privacy.smooth_sensitivity_bound(k, beta), math.exp(-beta * k))
  key = jax.random.PRNGKey(1)
  r = privacy.laplace_smooth_response(key, jnp.zeros(N, jnp.int32), jnp.full(N, k), eps, delta)
  s = 2 * math.exp(-beta * k) / eps
  p = float(privacy.response_probability(0, s, "laplace"))
  assert abs(float(r.mean()) - p) < 5 * math.sqrt(p * (1 - p) / N) + 1e-4


def test_smooth_bound_is_global_at_k0_and_decreasing():
  ss = np.asarray(privacy.smooth_sensitivity_bound(jnp.arange(10), 0.1))
  assert ss[0] == 1.0 and np.all(np.diff(ss) < 0)


def test_mechanism_input_errors():
  key = jax.random.PRNGKey(0)
  with pytest.raises(ValueError, match="beta <= eps/6"):
    privacy.cauchy_scale(1, 1.0, beta=0.5)
  with pytest.raises(ValueError, match="epsilon"):
    privacy.global_sensitivity_response(key, jnp.ones(3, jnp.int32), 0.0)
  with pytest.raises(ValueError, match="binary"):
    privacy.global_sensitivity_response(key, jnp.array([0, 2]), 1.0)
  with pytest.raises(ValueError, match="k_cert"):
    privacy.private_predict(key, jnp.ones(3, jnp.int32), 1.0, mechanism="cauchy")
  with pytest.raises(ValueError, match="mechanism"):
    privacy.private_predict(key, jnp.ones(3, jnp.int32), 1.0, mechanism="exp")


def test_private_predict_defaults_to_global_sensitivity():
  key = jax.random.PRNGKey(3)
  p = jnp.ones(1000, jnp.int32)
  a = privacy.private_predict(key, p, 1.0, k_cert=jnp.full(1000, 100))
  b = privacy.global_sensitivity_response(key, p, 1.0)
  np.testing.assert_array_equal(a, b)


def test_noisy_argmax_follows_large_margins():
  key = jax.random.PRNGKey(0)
  counts = jnp.array([[20, 0]] * 1000 + [[0, 20]] * 1000)
  out = privacy.noisy_argmax(key, counts, 2.0)
  assert float(jnp.mean(out[:1000] == 0)) > 0.99 and float(jnp.mean(out[1000:] == 1)) > 0.99
  v = jnp.array([[0, 1, 1], [1, 1, 0], [1, 0, 0]])
  np.testing.assert_array_equal(privacy.vote_counts(v), [[1, 2], [1, 2], [2, 1]])


# ---------------------------------------------------------------------------------------------
# Ensemble stable distance (check 12) by brute force
# ---------------------------------------------------------------------------------------------

def _min_flip_cost(votes, ks):
  """Fewest dataset changes that flip g = 1[n1 >= n0], member i flipping after k_i + 1 changes."""
  T = len(votes)
  g = int(2 * sum(votes) >= T)
  best = math.inf
  for r in range(1, T + 1):
    for S in itertools.combinations(range(T), r):
      v = list(votes)
      for i in S:
        v[i] = 1 - v[i]
      if int(2 * sum(v) >= T) != g:
        best = min(best, sum(ks[i] + 1 for i in S))
  return best


def test_ensemble_stable_k_brute_force():
  rng = np.random.default_rng(0)
  checked = 0
  for _ in range(300):
    T = int(rng.integers(1, 8))
    votes = rng.integers(0, 2, T)
    ks = rng.integers(0, 6, T)
    K = privacy.ensemble_stable_k(votes[:, None], ks[:, None])[0]
    K2 = privacy.ensemble_stable_k(votes[:, None], ks[:, None], plus_n_minus_1=True)[0]
    true_stable = _min_flip_cost(votes, ks) - 1     # stable at every distance <= this
    assert K <= K2 <= true_stable
    checked += 1
  assert checked == 300


def test_ensemble_response_uses_majority_and_K():
  votes = jnp.array([[1], [1], [1], [0]])
  ks = jnp.array([[3], [5], [7], [1]])
  assert privacy.ensemble_stable_k(votes, ks)[0] == 1    # n = 1, smallest k overall
  key = jax.random.PRNGKey(0)
  r = privacy.ensemble_cauchy_response(key, jnp.tile(votes, (1, 20000)),
                                       jnp.tile(ks, (1, 20000)), 1.0)
  p = float(privacy.response_probability(1, privacy.cauchy_scale(1, 1.0), "cauchy"))
  assert abs(float(r.mean()) - p) < 0.02


def test_smoothness_diagnostic_counts_jumps():
  d = privacy.smoothness_diagnostic(np.array([3, 0, 5]), np.array([[3, 1, 5], [0, 0, 7]]))
  assert d == {"pairs": 6, "violations": 2, "max_jump": 3}
  with pytest.raises(ValueError, match="shape"):
    privacy.smoothness_diagnostic(np.zeros(3), np.zeros((2, 4)))


# ---------------------------------------------------------------------------------------------
# Accounting (check 15)
# ---------------------------------------------------------------------------------------------

def test_composition_hand_values():
  s = privacy.standard_composition(0.1, 10)
  assert s == privacy.Budget(1.0, 0.0, "standard")
  a = privacy.advanced_composition(0.1, 100, delta_prime=1e-5)
  want = math.sqrt(200 * math.log(1e5)) * 0.1 + 100 * 0.1 * (math.exp(0.1) - 1)
  assert math.isclose(a.eps, want) and a.delta == 1e-5
  assert privacy.compose(0.1, 100).method == "advanced"
  assert privacy.compose(0.1, 2).method == "standard"
  z = privacy.zcdp_composition(0.1, 100)
  assert math.isclose(z.eps, 100 * 0.01 / 2 + 0.1 * math.sqrt(200 * math.log(1e5)))
  assert z.eps < a.eps


@pytest.mark.parametrize("Q", [1, 10, 100, 1000])
@pytest.mark.parametrize("method", ["standard", "advanced", "min", "zcdp"])
def test_inverse_then_compose_within_budget(Q, method):
  b = privacy.per_query_budget(10.0, 1e-5, Q, method)
  assert b.delta == 0.0
  back = privacy.compose(b.eps, Q, 0.0, 1e-5, "zcdp" if b.method == "zcdp" else b.method)
  assert back.eps <= 10.0 + 1e-9
  assert back.eps >= 10.0 * (1 - 1e-6) or b.method == "standard"


def test_zcdp_inverse_matches_public_code_formula():
  Q, et, d = 100, 10.0, 1e-5
  L = math.log(1 / d)
  want = max(math.sqrt(2 / Q) * (math.sqrt(L + et) - math.sqrt(L)), et / Q)
  assert math.isclose(privacy.per_query_budget(et, d, Q, "zcdp").eps, want)
  assert privacy.per_query_budget(et, d, Q, "zcdp").eps >= privacy.per_query_budget(et, d, Q).eps


def test_pld_inverse_for_laplace_is_within_budget_and_tighter():
  b = privacy.per_query_budget(10.0, 1e-5, 100, "pld")
  assert privacy.laplace_pld_epsilon(b.eps, 100, 1e-5) <= 10.0
  assert b.eps >= privacy.per_query_budget(10.0, 1e-5, 100, "zcdp").eps


def test_accounting_errors():
  with pytest.raises(ValueError, match="pure"):
    privacy.compose(0.1, 10, delta=1e-6, method="zcdp")
  with pytest.raises(ValueError, match="Q"):
    privacy.compose(0.1, 0)
  with pytest.raises(ValueError, match="method"):
    privacy.per_query_budget(1.0, 1e-5, 10, "renyi")

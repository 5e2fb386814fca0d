"""Auditing gaps and finite adversaries (Barron), each checked against sampling,
retraining or an independent formula."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.stats

from boundjax import auditing as A
from boundjax.auditing import adversary
from boundjax import barron

MUS = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1)

# Barron: mu, L (eq. 50), Hoeffding term, total gap (eq. 49), ratio
TABLE_72 = [
    (0.0, 1.000000, 0.019194, 0.019194, 0.9808),
    (0.01, 0.999903, 0.020363, 0.027956, 0.9720),
    (0.02, 0.999611, 0.021566, 0.036760, 0.9632),
    (0.04, 0.998445, 0.024077, 0.054493, 0.9454),
    (0.06, 0.996508, 0.026726, 0.072392, 0.9274),
    (0.08, 0.993808, 0.029513, 0.090459, 0.9090),
    (0.10, 0.990357, 0.032438, 0.108693, 0.8902),
]


# --- geometry -----------------------------------------------------------------------------------

def test_diameter_and_enclosing_ball():
  assert A.diameter((-3.0, 3.0)) == 6.0
  assert A.radius_term((np.zeros(2), np.ones(2))) == pytest.approx(math.sqrt(2))
  tri = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, math.sqrt(3) / 2]])
  assert A.diameter(tri) == pytest.approx(1.0)
  r, c = A.enclosing_radius(tri)
  assert np.all(np.linalg.norm(tri - c, axis=1) <= r + 1e-12)  # really encloses
  assert r == pytest.approx(1 / math.sqrt(3), rel=1e-3)
  assert A.radius_term(tri) > A.diameter(tri)  # Jung: Dia(K) under-states 2 r_enc
  pts = np.random.default_rng(0).normal(size=(3000, 3))
  r, c = A.enclosing_radius(pts)
  assert np.all(np.linalg.norm(pts - c, axis=1) <= r + 1e-12)
  d = A.diameter(pts)
  assert d <= 2 * r + 1e-12 and 2 * r <= d * math.sqrt(2 * 3 / 4) * 1.05
  with pytest.raises(ValueError, match="lower > upper"):
    A.diameter((1.0, 0.0))


# --- 4. eta identity ----------------------------------------------------------------------------

@pytest.mark.parametrize("mu", [0.01, 0.1, 0.7, -0.4])
def test_eta_identity_truncated(mu):
  t = np.linspace(-3, 3, 2001)
  fp, fm = A.truncated_densities(t, mu)
  eta = A.eta_from_densities(fp, fm)
  np.testing.assert_allclose(eta, np.tanh(mu * t), atol=1e-12, rtol=0)
  # both conditionals integrate to one on K
  for f in (fp, fm):
    assert scipy.integrate.trapezoid(f, t) == pytest.approx(1.0, abs=1e-5)


def test_equal_cov_formula_matches_eq23():
  rng = np.random.default_rng(1)
  for _ in range(5):
    q = int(rng.integers(1, 4))
    mp, mm = rng.normal(size=q), rng.normal(size=q)
    M = rng.normal(size=(q, q))
    cov = M @ M.T + 0.3 * np.eye(q)
    lam = rng.uniform(0.1, 0.9)
    a, b = A.equal_cov_eta(mp, mm, cov, lam)
    t = rng.normal(size=(50, q)) * 2
    fp = scipy.stats.multivariate_normal(mp, cov).pdf(t)
    fm = scipy.stats.multivariate_normal(mm, cov).pdf(t)
    np.testing.assert_allclose(np.tanh(t @ a + b), A.eta_from_densities(fp, fm, lam),
                               atol=1e-10)
    # C_eta = ||a|| via the ridge closed form, independent of b and the prior
    assert float(barron.closed_form("tanh", a=a)) == pytest.approx(
        0.5 * np.linalg.norm(np.linalg.solve(cov, mp - mm)), rel=1e-10)


def test_paper_eta_barron_constant_is_abs_mu():
  for mu in (0.05, -0.3):
    c = float(barron.fft_1d(dh=lambda t: mu / jnp.cosh(mu * t) ** 2, L=40 / abs(mu) + 40,
                            N=2 ** 21))
    assert c == pytest.approx(abs(mu), rel=1e-6)


# --- 5. true loss -------------------------------------------------------------------------------

def test_true_loss_forms_agree_and_properties():
  vals = []
  for mu in (0.0,) + MUS + (0.5, 1.0):
    L = A.true_min_loss(mu)
    assert L == pytest.approx(A.true_min_loss_sech2(mu), abs=1e-10)
    assert L <= 1.0 + 1e-12
    vals.append(L)
  assert vals[0] == pytest.approx(1.0, abs=1e-12)
  assert all(x > y for x, y in zip(vals, vals[1:]))
  assert A.true_min_loss(-0.3) == pytest.approx(A.true_min_loss(0.3), abs=1e-12)


def test_true_loss_matches_monte_carlo():
  for mu in (0.1, 0.8):
    T, S = A.sample_gaussian_example(jax.random.key(7), 400_000, mu)
    assert float(jnp.max(jnp.abs(T))) <= 3.0
    se = np.asarray((S - jnp.tanh(mu * T[:, 0])) ** 2, float)
    m, s = se.mean(), se.std() / math.sqrt(se.size)
    assert abs(m - A.true_min_loss(mu)) <= 4 * s
    # sampler really produces N(S mu, 1) truncated: KS test per class
    t = np.asarray(T[:, 0])
    pos = t[np.asarray(S) > 0][:20000]
    z = scipy.stats.norm.cdf(3 - mu) - scipy.stats.norm.cdf(-3 - mu)
    cdf = lambda x: (scipy.stats.norm.cdf(x - mu) - scipy.stats.norm.cdf(-3 - mu)) / z
    assert scipy.stats.kstest(pos, cdf).pvalue > 1e-3


# --- 6. gap formulas and the reproduction tables ------------------------------------------------

def test_thm1_equals_eq49_and_table_72():
  for mu, L, hoeff, gap, ratio in TABLE_72:
    g1 = A.thm1_gap(1e5, 1e3, 0.01, 6.0, abs(mu))
    assert g1 == pytest.approx(A.eq49_gap(mu, 1e5, 1e3, 0.01), abs=1e-12)
    assert A.eq49_gap(-mu, 1e5, 1e3, 0.01) == pytest.approx(g1, abs=1e-15)
    C0, _, _ = A.thm1_constants(6.0, abs(mu))
    assert C0 * math.sqrt(math.log(100) / 2e5) == pytest.approx(hoeff, abs=1e-6)
    assert g1 == pytest.approx(gap, abs=1e-6)
    assert A.true_min_loss(mu) == pytest.approx(L, abs=1e-6)
    assert (A.true_min_loss(mu) - g1) / A.true_min_loss(mu) == pytest.approx(ratio, abs=1e-4)


def test_fig1_ratio_range_and_eq31_variant():
  r22 = [(A.true_min_loss(m) - A.thm1_gap(1e5, 1e3, 0.01, 6.0, m)) / A.true_min_loss(m)
         for m in MUS]
  r31 = [(A.true_min_loss(m) - A.thm1_gap(1e5, 1e3, 0.01, 6.0, m, "eq31")) / A.true_min_loss(m)
         for m in MUS]
  assert min(r22) == pytest.approx(0.8902, abs=5e-5) and max(r22) == pytest.approx(0.9720, abs=5e-5)
  assert min(r31) == pytest.approx(0.8767, abs=5e-5) and max(r31) == pytest.approx(0.9636, abs=5e-5)


def test_classification_table_73():
  rows = [(1e3, 0.19194, 0.30889, 0.43443), (1e4, 0.06070, 0.13242, 0.19735),
          (1e5, 0.01919, 0.05265, 0.08074)]
  for n, t2, t3d2, t3d10 in rows:
    assert A.thm2_gap(n, 0.01) == pytest.approx(t2, abs=1e-5)
    assert A.thm3_gap(n, 2, 0.01) == pytest.approx(t3d2, abs=1e-5)
    assert A.thm3_gap(n, 10, 0.01) == pytest.approx(t3d10, abs=1e-5)
    assert A.thm3_gap(n, 10, 0.01, "weissman") < A.thm3_gap(n, 10, 0.01)


def test_gap_errors():
  with pytest.raises(ValueError, match="n >= 4"):
    A.thm3_gap(40, 5, 0.05)
  A.thm3_gap(math.ceil(A.thm3_min_n(5, 0.05)), 5, 0.05)  # at the threshold: fine
  with pytest.raises(ValueError, match=r"\|<v, v0>\|"):
    A.thm1_gap(100, 10, 0.01, 6.0, -0.1)
  with pytest.raises(ValueError, match="delta"):
    A.thm2_gap(100, 1.5)
  with pytest.raises(ValueError, match="hoeffding"):
    A.thm1_gap(100, 10, 0.01, 6.0, 0.1, "eq99")
  with pytest.raises(ValueError, match="gap >= 0"):
    A.certify(0.9, -0.1, True)


# --- 8, 9. classification coverage -------------------------------------------------------------

def _coverage(loss, gap, P, n=1000, reps=2000, seed=0):
  """Fraction of simulated samples with ERM_emp - inf_h L > gap, for a joint P [2d]."""
  rng = np.random.default_rng(seed)
  d = P.size // 2
  counts = rng.multinomial(n, P, size=reps) / n
  emp = A.conditional_losses(counts[:, :d], counts[:, d:], loss)
  true = A.conditional_losses(P[:d], P[d:], loss)
  return np.mean(emp - true > gap), np.max(emp - true)


def _joints(d=5, seed=0):
  rng = np.random.default_rng(seed)
  Ps = [rng.dirichlet(np.ones(2 * d)) for _ in range(4)]
  Ps.append(np.full(2 * d, 1 / (2 * d)))                  # S independent of T, balanced
  Ps.append(np.r_[np.full(d, 0.98 / d), np.full(d, 0.02 / d)])  # nearly deterministic S
  return Ps


def test_thm2_coverage():
  gap = A.thm2_gap(1000, 0.05)
  for i, P in enumerate(_joints()):
    frac, worst = _coverage("sq", gap, P, seed=i)
    assert frac <= 0.05, (i, frac)


def test_thm3_coverage():
  gap = A.thm3_gap(1000, 5, 0.05)
  for i, P in enumerate(_joints()):
    frac, worst = _coverage("log", gap, P, seed=10 + i)
    assert frac <= 0.05, (i, frac)


def test_classification_erm_is_the_minimum():
  rng = np.random.default_rng(4)
  d, n = 4, 500
  T = rng.integers(0, d, n)
  S = np.where(rng.random(n) < 0.3 + 0.1 * T, 1.0, -1.0)
  sq = A.classification_erm(S, T, d, "sq")
  lg = A.classification_erm(S, T, d, "log")
  m = np.array([S[T == i].mean() for i in range(d)])
  p = (1 + m) / 2
  assert sq == pytest.approx(np.mean((S - m[T]) ** 2), abs=1e-12)
  ll = lambda pr: np.mean(-(1 + S) / 2 * np.log(pr[T]) - (1 - S) / 2 * np.log(1 - pr[T]))
  assert lg == pytest.approx(ll(p), abs=1e-12)
  for _ in range(50):  # no other h does better
    delta = rng.normal(size=d) * 0.05
    assert np.mean((S - (m + delta)[T]) ** 2) >= sq - 1e-12
    assert ll(np.clip(p + delta, 1e-6, 1 - 1e-6)) >= lg - 1e-12
  with pytest.raises(ValueError, match="-1, \\+1"):
    A.classification_erm((S + 1) / 2, T, d)


# --- 7. Barron approximation rate ---------------------------------------------------------------

@pytest.mark.parametrize("mu", [0.05, 0.5, 2.0])
def test_barron_approximation_rate(mu):
  t = np.linspace(-3, 3, 60001)
  fp, fm = A.truncated_densities(t, mu)
  pdf = 0.5 * (fp + fm)
  eta = np.tanh(mu * t)
  for k in (8, 32, 128, 1024):
    net = barron.staircase_network_1d(lambda s: jnp.tanh(mu * s),
                                      lambda s: mu / jnp.cosh(mu * s) ** 2, -3.0, 3.0, k)
    hk = np.asarray(A.adversary_apply(net, jnp.asarray(t[:, None], jnp.float32)), float)
    err = math.sqrt(scipy.integrate.trapezoid((eta - hk) ** 2 * pdf, t))
    assert err <= 6 * abs(mu) / math.sqrt(k), (mu, k, err)
    assert np.sum(np.abs(net["c"])) <= 6 * abs(mu) + 1e-6


# --- finite adversaries: 10, 11 ----------------------------------------------------------------

def test_erm_sanity_trained_beats_bayes_rule_on_sample():
  mu = 0.5
  T, S = A.sample_gaussian_example(jax.random.key(3), 4000, mu)
  bayes = float(jnp.mean((S - jnp.tanh(mu * T[:, 0])) ** 2))
  cfg = A.AdversaryConfig(k=16, trials=4, epochs=20, batch=256, lr_adam=1e-2, lr_sgd=5e-2)
  res = A.fit_finite_adversary(jax.random.key(4), T, S, cfg)
  assert res.best_loss <= bayes + 1e-3, (res.best_loss, bayes)
  assert res.curves.shape == (4, 20) and res.optimizer.count("adam") == 2
  # the reported best is a real network's whole-sample loss
  again = float(jnp.mean((S - A.adversary_apply(res.best_params, T)) ** 2))
  assert again == pytest.approx(res.best_loss, rel=1e-5)
  assert res.best_loss == pytest.approx(res.curves.min(), rel=1e-7)


def test_vmapped_equals_loop():
  T, S = A.sample_gaussian_example(jax.random.key(5), 1000, 0.3)
  cfg = A.AdversaryConfig(k=8, trials=3, epochs=2, batch=128, optimizers=("sgd",))
  v = A.fit_finite_adversary(jax.random.key(6), T, S, cfg)
  l = A.fit_finite_adversary(jax.random.key(6), T, S, cfg, vmapped=False)
  np.testing.assert_allclose(v.curves, l.curves, rtol=1e-4, atol=1e-6)
  assert v.optimizer == l.optimizer


def _thm1_coverage(reps, restarts, epochs):
  mu, n, k, delta = 0.3, 2000, 16, 0.05
  keys = jax.random.split(jax.random.key(11), reps)
  T, S = jax.vmap(lambda kk: A.sample_gaussian_example(kk, n, mu))(keys)
  cfg = A.AdversaryConfig(k=k, trials=restarts, epochs=epochs, batch=250, lr_adam=1e-2)
  tk = jax.random.split(jax.random.key(12), (reps, restarts))
  best, _, _ = jax.jit(jax.vmap(lambda kk, t, s: adversary._train_many(kk, t, s, cfg, "adam")))(tk, T, S)
  L_emp = np.asarray(best).min(axis=1)
  gap = A.thm1_gap(n, k, delta, 6.0, mu)
  L = A.true_min_loss(mu)
  return np.mean(L_emp - L > gap), L_emp


def test_thm1_coverage_indicative_small():
  frac, L_emp = _thm1_coverage(reps=16, restarts=4, epochs=5)
  assert frac <= 0.05
  assert np.all(L_emp < 1.0)  # the adversaries learnt something


@pytest.mark.slow
def test_thm1_coverage_indicative_full():
  frac, _ = _thm1_coverage(reps=200, restarts=32, epochs=30)
  assert frac <= 0.05


def test_adversary_input_errors_and_certificate():
  with pytest.raises(ValueError, match="2 S - 1"):
    A.fit_finite_adversary(jax.random.key(0), np.zeros((10, 1)), np.ones(10) * 0.0)
  with pytest.raises(ValueError, match="T \\[n, q\\]"):
    A.fit_finite_adversary(jax.random.key(0), np.zeros((10, 1)), np.ones(9))
  with pytest.raises(ValueError, match="optimiser"):
    A.AdversaryConfig(optimizers=("rmsprop",))
  cert = A.certify(0.99, 0.1, erm_exact=False)
  assert not cert.certified and cert.lower_bound == pytest.approx(0.89)
  assert any("not a certificate" in a for a in cert.assumptions)

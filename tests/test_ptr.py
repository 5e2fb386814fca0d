"""boundjax.ptr.release: radius search, statistic sensitivity, test and release calibration.

Properties 7 (bisection postconditions), 8 (sensitivity, clamp regression), 9 (φ* <= γ̂),
10 (unsafe => δ/2; closed-form pass rate), 11 (Laplace calibration), 12 (release uses Δp),
13 (ε = ∞), 14 (batched = per-sample).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boundjax.ptr import release as ptr
from tests.helpers import mlp_apply, random_mlp


@pytest.fixture(autouse=True)
def x64():
  with jax.enable_x64(True):
    yield


def kink(params, z):
  """f(z) = a relu(z - t): Lipschitz constant a on boxes reaching past t, 0 before."""
  return params["a"] * jax.nn.relu(z - params["t"])


KINK = {"a": jnp.asarray([2.0]), "t": jnp.asarray([0.0])}
NET = random_mlp(0, (2, 6, 2))


def test_bisection_postconditions():
  """Property 7, both searches, traced and eager."""
  oracle = ptr.make_oracle(mlp_apply, NET)
  rng = np.random.default_rng(0)
  R, R_max, zeta = 0.2, 1.4, 0.01
  for x in rng.normal(size=(6, 2)):
    u_R = float(oracle(jnp.asarray(x), R))
    for prop in (0.5 * u_R, 1.2 * u_R, 2.0 * u_R):
      for search in ("bisect", "grid"):
        for kw in ({}, {"oracle": oracle}):
          res = ptr.radius_search(mlp_apply, NET, jnp.asarray(x), radius=R, proposal=prop,
                                  radius_max=R_max, zeta=zeta, search=search, **kw)
          if u_R > prop:
            assert not res.feasible and res.statistic == 0.0
            continue
          assert res.feasible and float(oracle(jnp.asarray(x), res.lo)) <= prop
          assert res.hi == pytest.approx(R_max) or float(oracle(jnp.asarray(x), res.hi)) >= prop
          assert res.hi - res.lo <= zeta + 1e-12
          assert res.statistic == pytest.approx(res.lo / 2)


def test_statistic_sensitivity_and_clamp_regression():
  """Property 8: |φ(z) - φ(z')| < R + ζ (paper) and |φ*(z) - φ*(z')| <= d + ζ (sound) for
  d <= R; and the clamp boundary where the printed Lemma A.3 (|φ - φ'| <= d) fails."""
  R, zeta = 0.3, 0.01
  oracle = ptr.make_oracle(mlp_apply, NET)
  prop = 1.3 * float(oracle(jnp.zeros(2), R))
  rng = np.random.default_rng(1)
  for _ in range(25):
    x = rng.normal(size=2)
    y = x + R * rng.uniform(-1, 1, 2)
    d = float(np.abs(x - y).max())
    for mode, bound in (("paper", R + zeta), ("sound", d + zeta)):
      s = [ptr.radius_search(mlp_apply, NET, jnp.asarray(p), radius=R, proposal=prop,
                             zeta=zeta, mode=mode).statistic for p in (x, y)]
      assert abs(s[0] - s[1]) <= bound + 1e-12 if mode == "sound" else abs(s[0] - s[1]) < bound
  # clamp boundary: f = 2 relu(z), Δp = 1, so ρ(x) = -x for x < 0
  x, y = jnp.asarray([-(R + 0.001)]), jnp.asarray([-(R - 0.001)])
  kw = dict(radius=R, proposal=1.0, radius_max=1.0, zeta=1e-3)
  phi = [ptr.radius_search(kink, KINK, p, mode="paper", **kw).statistic for p in (x, y)]
  assert phi[0] >= R / 2 - 1e-3 and phi[1] == 0.0
  assert abs(phi[0] - phi[1]) > 0.002   # > d: the printed Lemma A.3 does not hold
  star = [ptr.radius_search(kink, KINK, p, mode="sound", **kw).statistic for p in (x, y)]
  assert abs(star[0] - star[1]) <= 0.002 + 1e-3


def test_sound_statistic_below_distance_to_unsafe():
  """Property 9: φ* <= γ̂, the distance to the nearest grid point that the oracle calls unsafe."""
  R, zeta = 0.2, 0.01
  oracle = ptr.make_oracle(mlp_apply, NET)
  prop = 1.1 * float(oracle(jnp.zeros(2), R))
  g = np.linspace(-3, 3, 61)
  grid = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
  from boundjax.ptr import lipschitz as lip
  unsafe = grid[np.asarray(lip.ibp_upper_batch(mlp_apply, NET, jnp.asarray(grid), R)) > prop]
  assert len(unsafe)
  for x in np.random.default_rng(2).uniform(-1, 1, (8, 2)):
    star = ptr.radius_search(mlp_apply, NET, jnp.asarray(x), radius=R, proposal=prop,
                             zeta=zeta, mode="sound", radius_max=3.0).statistic
    assert star <= np.abs(unsafe - x).max(-1).min() + 1e-12


def test_unsafe_answers_with_probability_half_delta():
  """Property 10: an unsafe point is answered with probability δ/2 (99.9% binomial interval);
  a safe one with the closed-form probability."""
  n, delta = 200_000, 0.1
  kw = dict(epsilon=2.0, delta=delta, radius=0.5, radius_max=1.0, zeta=0.05)
  unsafe = jnp.tile(jnp.asarray([[0.0]]), (n, 1))          # f's kink inside N(0, R)
  _, answered, stat = ptr.ptr_release_batch(jax.random.PRNGKey(0), kink, KINK, unsafe,
                                            proposal=1.0, **kw)
  assert float(jnp.max(stat)) == 0.0
  p, freq = delta / 2, float(jnp.mean(answered))
  assert abs(freq - p) <= 3.29 * math.sqrt(p * (1 - p) / n)
  # safe at every radius (ρ = R_max): s = R_max / 2 = 0.5
  for eps in (1.0, 2.0, 5.0):
    safe = jnp.tile(jnp.asarray([[-5.0]]), (n, 1))
    _, answered, stat = ptr.ptr_release_batch(jax.random.PRNGKey(1), kink, KINK, safe,
                                              proposal=1.0, **dict(kw, epsilon=eps))
    p = ptr.pass_probability(0.5, epsilon=eps, delta=delta, radius=0.5, zeta=kw["zeta"])
    assert float(stat[0]) == 0.5
    assert abs(float(jnp.mean(answered)) - p) <= 3.29 * math.sqrt(p * (1 - p) / n) + 1e-12


def test_pass_probability_examples():
  """The closed form's worked examples (code calibration R = 0.5, δ = 0.1; unit δ = 0.05)."""
  for eps, want in ((1, 0.2028), (2, 0.6959), (5, 0.9954), (7, 0.9997)):
    assert ptr.pass_probability(0.7, epsilon=eps, delta=0.1, radius=0.5,
                                calib="code") == pytest.approx(want, abs=1e-4)
  for eps, want in ((1, 0.0503), (2, 0.1014), (5, 0.6980), (7, 0.9255)):
    assert ptr.pass_probability(0.7, epsilon=eps, delta=0.05, radius=0.5,
                                calib="unit") == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("calib", ["total", "code", "unit"])
def test_laplace_calibration(calib):
  """Property 11: mean |noise| = b; the exact Laplace log-density ratio of the release for safe
  neighbours is <= ε/2 (total: the release's half, d <= R), <= ε (code, d <= R) or <= ε d
  (unit)."""
  R, eps, prop = 0.5, 2.0, 1.0
  x = jnp.tile(jnp.asarray([[-5.0]]), (50_000, 1))
  out, answered, _ = ptr.ptr_release_batch(jax.random.PRNGKey(3), kink, KINK, x, proposal=prop,
                                           epsilon=eps, delta=0.1, radius=R, calib=calib)
  b = ptr.release_scale(prop, eps, R, calib)
  noise = np.asarray(out)[np.asarray(answered)] - np.asarray(kink(KINK, x[0]))
  assert np.mean(np.abs(noise)) == pytest.approx(b, rel=0.03)
  # safe neighbours: ||f(x) - f(x')||_1 <= Δp d; log p(y|x) - log p(y|x') over y
  rng = np.random.default_rng(4)
  for _ in range(20):
    xa = rng.uniform(-3, -R - 0.5, 1)
    d = rng.uniform(0, R)
    xb = xa + d * rng.choice([-1, 1])
    fa, fb = np.asarray(kink(KINK, xa)), np.asarray(kink(KINK, xb))
    ys = np.concatenate([fa[None], fb[None], fa + b * rng.laplace(size=(100, 1))])
    log_ratio = (np.abs(ys - fb).sum(-1) - np.abs(ys - fa).sum(-1)) / b
    bound = {"total": eps / 2, "code": eps, "unit": eps * d}[calib]
    assert log_ratio.max() <= bound + 1e-12


def test_release_uses_the_proposal():
  """Property 12: the release noise does not depend on the oracle's value (mocked)."""
  x = jnp.asarray([0.3, -0.2])
  outs = []
  for value in (0.1, 0.5, 0.9):
    a = ptr.ptr_query(jax.random.PRNGKey(5), mlp_apply, NET, x, proposal=1.0, epsilon=50.0,
                      delta=0.1, radius=0.5, oracle=lambda z, r, v=value: v)
    assert a.answered and a.release_scale == pytest.approx(2 * 1.0 * 0.5 / 50.0)   # 2ΔpR/ε
    outs.append(np.asarray(a.output))
  np.testing.assert_array_equal(outs[0], outs[1])
  np.testing.assert_array_equal(outs[0], outs[2])
  # unsafe under the mock: ⊥ is None (the test noise is tiny at ε = 50)
  assert ptr.ptr_release(jax.random.PRNGKey(5), mlp_apply, NET, x, proposal=1.0, epsilon=50.0,
                         delta=0.1, radius=0.5, oracle=lambda z, r: 2.0) is None


def test_epsilon_infinity_is_exact():
  """Property 13: ε = ∞ releases f(x) bit for bit, so accuracy is the noiseless accuracy."""
  xs = jnp.asarray(np.random.default_rng(6).normal(size=(32, 2)))
  out, answered, _ = ptr.ptr_release_batch(jax.random.PRNGKey(0), mlp_apply, NET, xs,
                                           proposal=0.01, epsilon=math.inf, delta=0.1, radius=0.5)
  f = np.asarray(mlp_apply(NET, xs))
  assert bool(jnp.all(answered))
  assert np.asarray(out).tobytes() == f.tobytes()
  assert np.array_equal(np.argmax(np.asarray(out), -1), np.argmax(f, -1))
  one = ptr.ptr_release(jax.random.PRNGKey(0), mlp_apply, NET, xs[0], proposal=0.01,
                        epsilon=math.inf, delta=0.1, radius=0.5)
  assert np.asarray(one).tobytes() == f[0].tobytes()


@pytest.mark.parametrize("search", ["bisect", "grid"])
def test_batched_equals_per_sample(search):
  """Property 14: with fixed keys, the vmapped path equals ptr_query per sample."""
  xs = jnp.asarray(np.random.default_rng(7).normal(size=(6, 2)))
  kw = dict(proposal=1.5, epsilon=3.0, delta=0.1, radius=0.3, search=search, mode="sound")
  out, answered, stat = ptr.ptr_release_batch(jax.random.PRNGKey(9), mlp_apply, NET, xs, **kw)
  keys = jax.random.split(jax.random.PRNGKey(9), 6)
  for i in range(6):
    a = ptr.ptr_query(keys[i], mlp_apply, NET, xs[i], **kw)
    assert a.answered == bool(answered[i])
    assert a.statistic == pytest.approx(float(stat[i]), abs=1e-12)
    if a.answered:
      np.testing.assert_allclose(np.asarray(a.output), np.asarray(out[i]), rtol=1e-12)


def test_proposal_rules_and_statements():
  from boundjax.ptr import lipschitz as lip
  pub = jnp.asarray(np.random.default_rng(8).normal(size=(20, 2)))
  u = np.asarray(lip.ibp_upper_batch(mlp_apply, NET, pub, 0.5))
  assert ptr.propose_bound(mlp_apply, NET, pub, radius=0.5) == pytest.approx(
      u.mean() + 3 * u.std(ddof=1))
  assert ptr.propose_bound(mlp_apply, NET, pub, radius=0.5, rule="quantile",
                           q=0.9) == pytest.approx(np.quantile(u, 0.9))
  s = ptr.privacy_statement(epsilon=1.0, delta=0.1, radius=0.5, calib="code", mode="paper",
                            zeta=0.0 + 1e-9)
  assert s.delta == 0.05 and s.eps_per_unit * 0.5 + s.eps_constant == pytest.approx(2.0, rel=1e-6)
  assert ptr.privacy_statement(epsilon=1.0, delta=0.1, radius=0.5, mode="sound").metric


def test_bad_input():
  kw = dict(proposal=1.0, epsilon=1.0, delta=0.1, radius=0.5)
  x = jnp.zeros(2)
  for bad, match in ((dict(epsilon=0.0), "epsilon"), (dict(epsilon=-1.0), "epsilon"),
                     (dict(delta=1.0), "delta"), (dict(delta=0.0), "delta"),
                     (dict(radius=-0.1), "radius"), (dict(proposal=0.0), "proposal"),
                     (dict(calib="x"), "calib"), (dict(mode="x"), "mode")):
    with pytest.raises(ValueError, match=match):
      ptr.ptr_release(jax.random.PRNGKey(0), mlp_apply, NET, x, **dict(kw, **bad))


def test_traced_bisection_equals_eager_reference():
  """The jitted search (the halvings in one lax.fori_loop) returns the same feasible, lo, hi
  (where feasible) and call count as the eager reference loop (Python control flow, the same
  oracle) on 20 points of an 8→10→8 network, for proposals that make the test fail, bisect, and
  pass at R_max."""
  params = random_mlp(3, (8, 10, 8))
  oracle = ptr.make_oracle(mlp_apply, params)
  xs = np.random.default_rng(12).normal(size=(20, 8))
  kw = dict(radius=0.5, radius_max=1.4, zeta=0.01)
  u_R = np.array([float(oracle(jnp.asarray(x), 0.5)) for x in xs])
  u_max = np.array([float(oracle(jnp.asarray(x), 1.4)) for x in xs])
  kinds = set()
  for x, a, b in zip(xs, u_R, u_max):
    for prop in (0.9 * a, (a + b) / 2, 1.1 * b):
      traced = ptr.radius_search(mlp_apply, params, jnp.asarray(x), proposal=prop, **kw)
      eager = ptr.radius_search(mlp_apply, params, jnp.asarray(x), proposal=prop, oracle=oracle,
                                **kw)
      assert (traced.feasible, traced.lo) == (eager.feasible, eager.lo)
      assert traced.statistic == eager.statistic
      if traced.feasible:            # (hi is not meaningful when the test fails at R)
        assert traced.hi == eager.hi
      kinds.add((traced.feasible, traced.lo == 1.4))
      if traced.feasible and traced.lo < 1.4:
        assert eager.evaluations == traced.evaluations == 2 + ptr.bisection_steps(0.5, 1.4, 0.01)
  assert kinds == {(False, False), (True, False), (True, True)}


# ------------------------------------------------------------------------------------------------
# The default calibration delivers the ε asked for; ⊥ says why
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["paper", "sound"])
def test_default_calibration_states_the_epsilon_asked_for(mode):
  for eps, R, zeta in ((1.0, 0.5, 0.01), (3.0, 0.2, 0.05), (0.5, 1.0, 0.001)):
    s = ptr.privacy_statement(epsilon=eps, delta=0.1, radius=R, mode=mode, zeta=zeta)
    assert s.epsilon_at_radius == pytest.approx(eps, rel=1e-12) and s.delta == 0.05
    # the code's calibration stays available by name, and spends 2ε(1 + ζ/2R) (paper mode)
    code = ptr.privacy_statement(epsilon=eps, delta=0.1, radius=R, calib="code", mode=mode,
                                 zeta=zeta)
    if mode == "paper":
      assert code.epsilon_at_radius == pytest.approx(2 * eps * (1 + zeta / (2 * R)), rel=1e-12)


def test_default_release_noise_spends_epsilon():
  """From the scales the mechanism actually used: ε_test = (R + ζ)/b_test (the statistic's
  sensitivity over R-neighbours is < R + ζ) and ε_release = Δp R/b_release add up to ε."""
  x = jnp.asarray([0.3, -0.2])
  for eps, R, zeta, prop in ((1.0, 0.5, 0.01, 2.0), (4.0, 0.3, 0.02, 0.7)):
    a = ptr.ptr_query(jax.random.PRNGKey(0), mlp_apply, NET, x, proposal=prop, epsilon=eps,
                      delta=0.1, radius=R, zeta=zeta)
    spent = (R + zeta) / a.test_scale + prop * R / a.release_scale
    assert spent == pytest.approx(eps, rel=1e-9)
    assert a.threshold == pytest.approx(math.log(1 / 0.1) * a.test_scale)
    code = ptr.ptr_query(jax.random.PRNGKey(0), mlp_apply, NET, x, proposal=prop, epsilon=eps,
                         delta=0.1, radius=R, zeta=zeta, calib="code")
    assert (R + zeta) / code.test_scale + prop * R / code.release_scale == pytest.approx(
        2 * eps + eps * zeta / R, rel=1e-9)


def test_a_refusal_says_why_with_the_numbers():
  x = jnp.asarray([0.3, -0.2])
  kw = dict(epsilon=2.0, delta=0.1, radius=0.5, radius_max=1.4, zeta=0.01)
  # not certified at R: the oracle's bound exceeds Δp
  a = ptr.ptr_query(jax.random.PRNGKey(1), mlp_apply, NET, x, proposal=1.0,
                    oracle=lambda z, r: 2.0, **kw)
  assert not a.answered and a.output is None
  assert "not certified at the radius R = 0.5" in a.reason and "Δp = 1" in a.reason
  assert f"{a.noisy_statistic:.4g}" in a.reason and f"τ = {a.threshold:.4g}" in a.reason
  # certified up to ρ = 0.9 (oracle below Δp until 0.9): below the radius τ asks for, 2τ
  oracle = lambda z, r: 0.5 if r <= 0.9 else 2.0
  for seed in range(20):
    a = ptr.ptr_query(jax.random.PRNGKey(seed), mlp_apply, NET, x, proposal=1.0, oracle=oracle,
                      **kw)
    if not a.answered:
      break
  assert not a.answered
  need = 2 * a.threshold
  assert a.search.lo < need
  assert f"certified radius ρ = {a.search.lo:.4g} is below the radius {need:.4g}" in a.reason
  assert "radius_max = 1.4" in a.reason            # 2τ > R_max: only the noise can pass
  assert f"noisy statistic {a.noisy_statistic:.4g}" in a.reason
  # answered queries carry no reason
  b = ptr.ptr_query(jax.random.PRNGKey(0), mlp_apply, NET, x, proposal=1.0, epsilon=math.inf,
                    delta=0.1, radius=0.5, oracle=lambda z, r: 0.5)
  assert b.answered and b.reason == ""

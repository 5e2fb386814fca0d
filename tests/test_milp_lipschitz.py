"""milp.lipschitz: the LipMIP MILP against enumeration, IBP and sampled lower bounds.

Properties 1 (upper >= sampled ratios), 3 (sandwich with the MILP exact on small nets), 4 (linear
exactness), 5 (norm choice: ℓ1-ball c gives max_i ||J_i||_1), 6 (radius monotonicity of the exact
MILP); a time limit gives a sound answer; non-ReLU networks are refused.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boundjax.ptr import lipschitz as lip
from boundjax.ptr import release as ptr
from milp import lipschitz as mlip
from milp.solve import SolveConfig
from tests.helpers import mlp_apply, random_mlp


@pytest.fixture(autouse=True)
def x64():
  with jax.enable_x64(True):
    yield


def _exact_is_truthful(res):
  """``exact`` is what `LipschitzBound` documents: upper and lower agree to 1e-9 relative."""
  return res.exact == (res.upper - res.lower <= 1e-9 * max(1.0, abs(res.upper)))


def test_sandwich_one_hidden_layer():
  """Property 3: lower <= MILP <= enum <= IBP <= cheap (1e-6), the MILP brackets the constant
  to its solver pad and equals enumeration; and property 1 for the MILP (10^4 pairs)."""
  params = random_mlp(1, (8, 10, 8))
  z = np.random.default_rng(1).normal(size=8)
  net = mlip.network_of(mlp_apply, params, z)
  for r in (0.05, 0.3):
    m = mlip.lipschitz_milp(net, z, r)
    e = lip.local_lipschitz(mlp_apply, params, jnp.asarray(z), r, method="enumerate",
                            n_samples=128)
    i = lip.local_lipschitz(mlp_apply, params, jnp.asarray(z), r, method="ibp", n_samples=128)
    c = lip.local_lipschitz(mlp_apply, params, jnp.asarray(z), r, method="ibp_cheap",
                            n_samples=128)
    assert e.exact and _exact_is_truthful(m)
    assert m.lower <= m.upper <= m.lower + 2e-6 * max(1.0, m.lower)
    assert m.upper == pytest.approx(e.upper, rel=1e-5)
    assert max(e.lower, i.lower) <= m.upper + 1e-6
    assert m.upper <= e.upper + 1e-5 and e.upper <= i.upper + 1e-6 <= c.upper + 2e-6
    rng = np.random.default_rng(2)
    a, b = z + r * rng.uniform(-1, 1, (2, 10_000, 8))
    fa, fb = np.asarray(mlp_apply(params, a)), np.asarray(mlp_apply(params, b))
    assert (np.abs(fa - fb).sum(-1) / np.abs(a - b).max(-1)).max() <= m.upper


def test_sandwich_deep():
  """Property 3 for a deeper net (8→8→8→8): lower <= MILP <= IBP."""
  params = random_mlp(5, (8, 8, 8, 8))
  z = jnp.zeros(8)
  m = mlip.local_lipschitz(mlp_apply, params, z, 0.1)
  i = lip.local_lipschitz(mlp_apply, params, z, 0.1, method="ibp", n_samples=128)
  assert i.lower <= m.upper + 1e-6 and m.lower <= m.upper <= i.upper + 1e-6


def test_linear_exactness():
  """Property 4: a linear network's MILP value is ||A||_{inf->1} (brute force)."""
  rng = np.random.default_rng(3)
  A = rng.normal(size=(4, 5))
  params = [{"kernel": jnp.asarray(A.T), "bias": jnp.asarray(rng.normal(size=4))}]
  want = max(float(np.abs(A.T @ np.array(c)).sum()) for c in itertools.product((-1, 1), repeat=4))
  m = mlip.local_lipschitz(mlp_apply, params, jnp.zeros(5), 0.5)
  assert m.upper == pytest.approx(want, rel=1e-5) and m.exact and _exact_is_truthful(m)


def test_norm_choice():
  """Property 5: the ℓ1-ball c (the authors' code) gives max_i ||J_i||_1; the ∞→1 value is
  between it and m times it."""
  params = random_mlp(2, (8, 10, 8))
  z = np.random.default_rng(2).normal(size=8)
  net = mlip.network_of(mlp_apply, params, z)
  l1 = mlip.lipschitz_milp(net, z, 0.05)
  code = mlip.lipschitz_milp(net, z, 0.05, out_norm="linf_as_code")
  e = lip.local_lipschitz(mlp_apply, params, jnp.asarray(z), 0.05, method="enumerate",
                          out_norm="linf_as_code", n_samples=64)
  assert code.upper == pytest.approx(e.upper, rel=1e-5)
  assert code.upper <= l1.upper <= 8 * code.upper


def test_radius_monotone_time_limit_and_errors():
  """Property 6 for the exact MILP; a time limit stays sound; tanh is refused."""
  params = random_mlp(2, (8, 10, 8))
  z = np.random.default_rng(2).normal(size=8)
  net = mlip.network_of(mlp_apply, params, z)
  vals = [mlip.lipschitz_milp(net, z, r).upper for r in (0.0, 0.02, 0.05)]
  assert vals[0] <= vals[1] * (1 + 1e-9) and vals[1] <= vals[2] * (1 + 1e-9)
  cfg = SolveConfig(solver="highs", time_limit=1e-3)
  fast = mlip.lipschitz_milp(net, z, 0.05, config=cfg)
  assert fast.upper >= vals[2] - 1e-5
  with pytest.raises(ValueError, match="ReLU network"):
    mlip.local_lipschitz(lambda p, x: jnp.tanh(mlp_apply(p, x)), params, jnp.asarray(z), 0.1)
  auto = mlip.local_lipschitz(mlp_apply, params, jnp.asarray(z), 0.05, method="auto",
                              n_samples=64)
  assert auto.method == "auto:enumerate" and auto.upper == pytest.approx(vals[2], rel=1e-5)


def test_milp_oracle_in_radius_search():
  """Property 7 with the MILP oracle (eager search): postconditions hold."""
  params = random_mlp(4, (2, 4, 2))
  oracle = mlip.milp_oracle(mlp_apply, params, jnp.zeros(2))
  x = jnp.asarray([0.2, -0.1])
  prop = 1.05 * oracle(x, 0.2)
  res = ptr.radius_search(mlp_apply, params, x, radius=0.2, proposal=prop, radius_max=1.0,
                          zeta=0.05, oracle=oracle)
  assert res.feasible and oracle(x, res.lo) <= prop and res.hi - res.lo <= 0.05 + 1e-12
  assert res.hi == pytest.approx(1.0) or oracle(x, res.hi) >= prop


def _sampled_norms(params, z, r, n, seed=0):
  """Brute force: the exact ∞→1 norm of the Jacobian at n uniform points and all box corners
  (float64 numpy, every sign vector c in {±1}^m tried; one Jacobian per distinct activation
  pattern among the points)."""
  W = [np.asarray(l["kernel"], np.float64).T for l in params]
  b = [np.asarray(l["bias"], np.float64) for l in params]
  rng = np.random.default_rng(seed)
  corners = np.array(list(itertools.product((-1.0, 1.0), repeat=z.size)))
  pts = np.concatenate([z + r * rng.uniform(-1, 1, (n, z.size)), z + r * corners])
  h, gates = pts, []
  for Wi, bi in zip(W[:-1], b[:-1]):
    pre = h @ Wi.T + bi
    gates.append(pre > 0)
    h = np.maximum(pre, 0)
  patterns, inverse = np.unique(np.concatenate(gates, axis=1), axis=0, return_inverse=True)
  sizes = np.cumsum([0] + [Wi.shape[0] for Wi in W[:-1]])
  cs = np.array(list(itertools.product((-1.0, 1.0), repeat=W[-1].shape[0])))
  norms = []
  for pat in patterns:
    J = W[-1]
    for i in range(len(W) - 2, -1, -1):
      J = (J * pat[sizes[i]:sizes[i + 1]][None, :]) @ W[i]
    norms.append(np.abs(cs @ J).sum(-1).max())
  return np.asarray(norms)[inverse.reshape(-1)]


def test_fast_milp_equals_enumeration_on_random_boxes():
  """The MILP (vertex big-M constants, c_0 = 1, constant-Jacobian shortcut) is tight and equals
  pattern enumeration with LP pruning (exact for one hidden layer) on 24 random boxes of
  8→10→8 networks; both are >= the Jacobian norms at 10^4 sampled points and the corners."""
  rng = np.random.default_rng(11)
  done = 0
  for seed in range(3):
    params = random_mlp(20 + seed, (8, 10, 8))
    W1, b1, W2 = (np.asarray(params[0]["kernel"]).T, np.asarray(params[0]["bias"]),
                  np.asarray(params[1]["kernel"]).T)
    net = mlip.network_of(mlp_apply, params, np.zeros(8))
    for r in (0.02, 0.05, 0.1, 0.1, 0.2, 0.3, 0.4, 0.5):
      z = rng.normal(size=8)
      m = mlip.lipschitz_milp(net, z, r)
      up, low, _ = lip.enumerate_patterns(W1, b1, W2, z, r)
      assert low == pytest.approx(up, rel=1e-9), "enumeration not exact on this box"
      assert _exact_is_truthful(m) and m.lower <= m.upper <= m.lower + 2e-6 * max(1.0, m.lower)
      assert m.upper == pytest.approx(up, rel=2e-6)
      assert _sampled_norms(params, z, r, 10_000, seed).max() <= m.upper
      done += 1
  assert done >= 20


def test_backward_bounds_contain_sampled_backward_passes():
  """`backward_bounds` (hull of per-vertex interval passes) contains q_i and γ = J(z)^T c at
  10^4 sampled points z and directions c (c_0 = 1, c in [-1, 1]^m for ∞→1; the ℓ1 ball with
  c_0 >= 0 for the authors' norm), on a deeper net."""
  params = random_mlp(5, (6, 8, 8, 5))
  W = [np.asarray(l["kernel"], np.float64).T for l in params]
  b = [np.asarray(l["bias"], np.float64) for l in params]
  z0, r = np.random.default_rng(3).normal(size=6), 0.4
  net = mlip.network_of(mlp_apply, params, z0)
  from milp import bounds as bounds_lib
  pre = bounds_lib.compute(net, z0 - r, z0 + r, "crown")
  rng = np.random.default_rng(4)
  n = 10_000
  for out_norm in ("l1", "linf_as_code"):
    q_bounds, (glo, ghi) = mlip.backward_bounds(W, pre, out_norm)
    if out_norm == "l1":
      c = np.concatenate([np.ones((n, 1)), rng.uniform(-1, 1, (n, 4))], 1)
      c[: n // 2, 1:] = np.sign(c[: n // 2, 1:])
    else:
      c = rng.dirichlet(np.ones(5), n) * rng.choice([-1.0, 1.0], (n, 5))
      c[:, 0] = np.abs(c[:, 0])
    zs = z0 + r * rng.uniform(-1, 1, (n, 6))
    zs[: n // 4] = z0 + r * np.sign(zs[: n // 4] - z0)
    h, gates = zs, []
    for Wi, bi in zip(W[:-1], b[:-1]):
      pre_act = h @ Wi.T + bi
      gates.append(pre_act > 0)
      h = np.maximum(pre_act, 0)
    g = c
    for i in range(len(W) - 2, -1, -1):
      q = g @ W[i + 1]
      lq, uq = q_bounds[i]
      assert np.all(q >= lq) and np.all(q <= uq), (out_norm, i)
      g = q * gates[i]
    gamma = g @ W[0]
    assert np.all(gamma >= glo) and np.all(gamma <= ghi), out_norm


def test_time_limited_run_is_sound_not_exact():
  """A MILP stopped by a time limit is not exact, and its upper (dual bound, or the interval
  bound if smaller) still dominates the Jacobian norms at 10^4 sampled points and the corners."""
  params = random_mlp(7, (8, 24, 24, 8))
  z, r = np.random.default_rng(8).normal(size=8), 0.5
  net = mlip.network_of(mlp_apply, params, z)
  fast = mlip.lipschitz_milp(net, z, r, config=SolveConfig(solver="highs", time_limit=0.05))
  assert not fast.exact and fast.lower <= fast.upper
  assert _sampled_norms(params, z, r, 10_000).max() <= fast.upper


def test_all_stable_box_skips_the_solver(monkeypatch):
  """A box where every ReLU is stable: the norm of the one Jacobian, by enumeration, exact,
  without calling the solver (brute force over c in {±1}^m)."""
  params = random_mlp(9, (8, 10, 8))
  z = np.random.default_rng(9).normal(size=8)
  net = mlip.network_of(mlp_apply, params, z)
  monkeypatch.setattr(mlip, "solve", lambda *a, **k: pytest.fail("solver called"))
  res = mlip.lipschitz_milp(net, z, 1e-4)
  want = _sampled_norms(params, z, 1e-4, 16).max()
  assert res.exact and res.lower == pytest.approx(want, rel=1e-12)
  assert want <= res.upper <= want * (1 + 1e-9)      # float64 rounding only: no solver pad


def test_exact_means_upper_and_lower_agree_to_1e_9():
  """`exact` was True for a solved MILP whose upper is the dual bound plus a 1e-6 relative pad:
  now a solve (optimal, witness at the dual bound) is tight to the pad but not exact; the
  all-stable box, computed without a solver, is exact to 1e-9."""
  params = random_mlp(1, (8, 10, 8))
  z = np.random.default_rng(1).normal(size=8)
  net = mlip.network_of(mlp_apply, params, z)
  solved = mlip.lipschitz_milp(net, z, 0.3)
  gap = (solved.upper - solved.lower) / solved.upper
  assert 1e-9 < gap <= 2e-6 and not solved.exact
  stable = mlip.lipschitz_milp(net, z, 1e-4)
  assert stable.exact and stable.upper - stable.lower <= 1e-9 * stable.upper
  for res in (solved, stable):
    assert _exact_is_truthful(res)
    assert mlip.jacobian_norm_at(mlip._check_point_network(net), res.argmax)[0] == pytest.approx(
        res.lower, rel=1e-12)
  for t in (0.9 * solved.upper, 1.01 * solved.upper):
    assert _exact_is_truthful(mlip.lipschitz_decide(net, z, 0.3, t))


@pytest.mark.parametrize("method, time_limit", [("auto", 1e-3), ("milp", 1e-3), ("auto", None)])
def test_lower_is_the_jacobian_norm_at_argmax(method, time_limit):
  """With method="auto" a stopped MILP is intersected with the IBP result: `lower` was the
  sampled value (1.59) while `argmax` stayed the MILP's point (norm 1.26 there). Now `lower`
  and `argmax` come from the same source: the Jacobian norm at `argmax` is `lower`."""
  params = random_mlp(7, (8, 24, 24, 8))
  z, r = np.random.default_rng(8).normal(size=8), 0.5
  net = mlip.network_of(mlp_apply, params, z)
  res = mlip.local_lipschitz(mlp_apply, params, jnp.asarray(z), r, method=method,
                             time_limit=time_limit, n_samples=128, network=net)
  at, _ = mlip.jacobian_norm_at(mlip._check_point_network(net), res.argmax)
  assert at == pytest.approx(res.lower, rel=1e-9)
  assert np.all(np.abs(res.argmax - z) <= r + 1e-12)
  assert res.lower <= res.upper and _exact_is_truthful(res)
  assert _sampled_norms(params, z, r, 1000).max() <= res.upper


def test_decide_oracle_agrees_with_min_ibp_milp():
  """`lipschitz_decide` (IBP or sampled Jacobians first, the MILP only when they leave it open)
  is on the same side of the threshold as min(IBP, exact MILP), for <= and <, on 6 boxes x 3
  thresholds, is >= every sampled Jacobian norm (10^4 points + corners), and the radius search
  with milp_oracle(proposal=Δp) returns the same result as with the exact oracle."""
  params = random_mlp(21, (8, 10, 8))
  net = mlip.network_of(mlp_apply, params, np.zeros(8))
  W = mlip._check_point_network(net)
  rng = np.random.default_rng(13)
  from milp import bounds as bounds_lib
  methods = set()
  for r in (0.1, 0.2, 0.3):
    for _ in range(2):
      z = rng.normal(size=8)
      exact = mlip.lipschitz_milp(net, z, r)
      ibp = mlip._interval_bound(W, bounds_lib.compute(net, z - r, z + r, "crown"), "l1")
      ref = min(exact.upper, ibp)
      brute = _sampled_norms(params, z, r, 10_000).max()
      for t in (0.9 * exact.upper, 1.01 * exact.upper, 1.05 * ibp):
        d = mlip.lipschitz_decide(net, z, r, t)
        methods.add(d.method)
        assert (d.upper <= t) == (ref <= t) and (d.upper < t) == (ref < t), (r, t, d, ref)
        assert d.upper >= brute
  assert methods == {"milp", "milp:ibp", "milp:sampled"}
  x = jnp.asarray(rng.normal(size=8))
  exact_oracle = mlip.milp_oracle(mlp_apply, params, x)
  prop = 1.02 * exact_oracle(x, 0.1)
  kw = dict(radius=0.1, proposal=prop, radius_max=0.5, zeta=0.02)
  a = ptr.radius_search(mlp_apply, params, x, oracle=lambda z, r: min(
      exact_oracle(z, r), mlip._interval_bound(W, bounds_lib.compute(
          net, np.asarray(z) - r, np.asarray(z) + r, "crown"), "l1")), **kw)
  b = ptr.radius_search(mlp_apply, params, x,
                        oracle=mlip.milp_oracle(mlp_apply, params, x, proposal=prop), **kw)
  assert (a.feasible, a.lo, a.hi, a.evaluations) == (b.feasible, b.lo, b.hi, b.evaluations)
  with pytest.raises(ValueError, match="proposal"):
    mlip.milp_oracle(mlp_apply, params, x, proposal=-1.0)
  with pytest.raises(ValueError, match="threshold"):
    mlip.lipschitz_decide(net, np.zeros(8), 0.1, float("nan"))

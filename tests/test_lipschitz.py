"""boundjax.ptr.lipschitz: soundness, exactness and monotonicity of the local Lipschitz oracles.

Properties (PTR test oracles, ∞→1 norm): 1 upper >= sampled ratios (incl. PGD pairs), 2 upper >=
sampled Jacobian norms, 3 the sandwich lower <= enum <= IBP <= cheap IBP (the MILP part is in
test_milp_lipschitz), 4 linear exactness, 6 radius and inclusion monotonicity, 14 batched =
per-sample.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boundjax.ptr import lipschitz as lip
from tests.helpers import mlp_apply


@pytest.fixture(autouse=True)
def x64():
  with jax.enable_x64(True):
    yield


def random_mlp(seed: int, sizes) -> list[dict]:
  rng = np.random.default_rng(seed)
  return [{"kernel": jnp.asarray(rng.uniform(-1, 1, (a, b)) / np.sqrt(a)),
           "bias": jnp.asarray(rng.uniform(-1, 1, b) / np.sqrt(a))}
          for a, b in zip(sizes[:-1], sizes[1:])]


def brute_inf_to_1(A: np.ndarray) -> float:
  """max over c in {±1}^m, s in {±1}^q of c^T A s (no symmetry shortcut)."""
  m, q = A.shape
  return max(float(np.abs(A.T @ np.array(c)).sum()) for c in itertools.product((-1, 1), repeat=m))


def sample_pairs(rng, z, r, n):
  a = z + r * rng.uniform(-1, 1, (n, z.size))
  b = z + r * rng.uniform(-1, 1, (n, z.size))
  corners = np.array(list(itertools.product((-1.0, 1.0), repeat=z.size)))[:256]
  a = np.concatenate([a, z + r * corners])
  b = np.concatenate([b, z + r * corners[::-1]])
  return a, b


def ratios(params, a, b):
  fa = np.asarray(mlp_apply(params, jnp.asarray(a)))
  fb = np.asarray(mlp_apply(params, jnp.asarray(b)))
  return np.abs(fa - fb).sum(-1) / np.abs(a - b).max(-1)


def pgd_pairs(params, z, r, steps=40, starts=64, seed=0):
  """Sign-gradient ascent of the ratio ||f(a) - f(b)||_1 / ||a - b||_inf over pairs in the box."""
  rng = np.random.default_rng(seed)
  a0, b0 = sample_pairs(rng, z, r, starts)
  lo, hi = z - r, z + r

  def ratio(a, b):
    return jnp.sum(jnp.abs(mlp_apply(params, a) - mlp_apply(params, b))) / (
        jnp.max(jnp.abs(a - b)) + 1e-12)

  @jax.jit
  def run(a, b):
    def step(i, ab):
      a, b = ab
      ga, gb = jax.grad(ratio, argnums=(0, 1))(a, b)
      eta = r * 0.1 * 0.9 ** i
      return jnp.clip(a + eta * jnp.sign(ga), lo, hi), jnp.clip(b + eta * jnp.sign(gb), lo, hi)
    return jax.lax.fori_loop(0, steps, step, (a, b))

  a, b = jax.vmap(run)(jnp.asarray(a0), jnp.asarray(b0))
  a, b = np.asarray(a), np.asarray(b)
  keep = np.abs(a - b).max(-1) > 1e-9
  return a[keep], b[keep]


NETS = {"one_hidden": (8, 10, 8), "deep": (8, 8, 8, 8)}


@pytest.mark.parametrize("name,r", [("one_hidden", 0.05), ("one_hidden", 0.4), ("deep", 0.4),
                                    pytest.param("deep", 0.05, marks=pytest.mark.slow)])
def test_upper_dominates_sampled_ratios_and_jacobians(name, r):
  """Properties 1 and 2: 10^4 random pairs, the corners, PGD pairs, 10^4 Jacobians."""
  params = random_mlp(1, NETS[name])
  rng = np.random.default_rng(2)
  z = rng.normal(size=8)
  a, b = sample_pairs(rng, z, r, 10_000)
  pa, pb = pgd_pairs(params, z, r)
  emp = max(ratios(params, a, b).max(), ratios(params, pa, pb).max())
  pts = z + r * rng.uniform(-1, 1, (10_000, 8))
  jac = float(np.max(np.asarray(lip.jacobian_norms(mlp_apply, params, jnp.asarray(pts)))))
  methods = ["ibp", "ibp_cheap"] + (["enumerate"] if name == "one_hidden" else [])
  for method in methods:
    res = lip.local_lipschitz(mlp_apply, params, jnp.asarray(z), r, method=method, n_samples=256)
    assert res.upper >= (1 - 1e-9) * emp, (method, res.upper, emp)
    assert res.upper >= (1 - 1e-9) * jac, (method, res.upper, jac)
    assert res.lower <= res.upper
    # the witness is in the box and attains `lower`
    assert np.all(np.abs(res.argmax - z) <= r + 1e-12)
    at = float(lip.jacobian_norms(mlp_apply, params, jnp.asarray(res.argmax)[None])[0])
    assert at == pytest.approx(res.lower, rel=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sandwich_one_hidden_layer(seed):
  """Property 3 (without the MILP): lower <= enum <= IBP <= cheap IBP; enumeration exact."""
  params = random_mlp(seed, (8, 10, 8))
  z = jnp.asarray(np.random.default_rng(seed).normal(size=8))
  for r in (0.05, 0.3, 1.0):
    e = lip.local_lipschitz(mlp_apply, params, z, r, method="enumerate", n_samples=256)
    i = lip.local_lipschitz(mlp_apply, params, z, r, method="ibp", n_samples=256)
    c = lip.local_lipschitz(mlp_apply, params, z, r, method="ibp_cheap", n_samples=256)
    assert e.exact
    assert e.lower <= e.upper + 1e-6 <= i.upper + 2e-6 <= c.upper + 3e-6
    assert i.lower <= e.upper + 1e-6   # sampled lower never exceeds the exact constant


def test_sandwich_deep():
  """Property 3, deeper nets: only lower <= IBP is guaranteed."""
  params = random_mlp(3, (8, 8, 8, 8))
  z = jnp.asarray(np.random.default_rng(3).normal(size=8))
  for r in (0.05, 0.5):
    for method in ("ibp", "ibp_cheap"):
      res = lip.local_lipschitz(mlp_apply, params, z, r, method=method, n_samples=256)
      assert res.lower <= res.upper


def test_linear_exactness():
  """Property 4: f = A z + b. IBP and enumeration give ||A||_{inf->1} exactly (brute-force sign
  enumeration); the cheap variant gives sum |A_kj|."""
  rng = np.random.default_rng(5)
  A = rng.normal(size=(6, 5))
  params = [{"kernel": jnp.asarray(A.T), "bias": jnp.asarray(rng.normal(size=6))}]
  want = brute_inf_to_1(A)
  z = jnp.asarray(rng.normal(size=5))
  ibp = lip.local_lipschitz(mlp_apply, params, z, 0.7, method="ibp", n_samples=64)
  cheap = lip.local_lipschitz(mlp_apply, params, z, 0.7, method="ibp_cheap", n_samples=64)
  assert ibp.upper == pytest.approx(want, rel=1e-12) and ibp.exact
  assert cheap.upper == pytest.approx(np.abs(A).sum(), rel=1e-12)
  assert float(lip.operator_norm(A)) == pytest.approx(want, rel=1e-12)
  # a one-hidden-layer net that is linear on the box (every unit active): enumeration is exact
  W1 = rng.normal(size=(7, 5))
  W2 = rng.normal(size=(6, 7))
  lin = [{"kernel": jnp.asarray(W1.T), "bias": jnp.full(7, 100.0)},
         {"kernel": jnp.asarray(W2.T), "bias": jnp.zeros(6)}]
  e = lip.local_lipschitz(mlp_apply, lin, z, 0.7, method="enumerate", n_samples=64)
  assert e.upper == pytest.approx(brute_inf_to_1(W2 @ W1), rel=1e-12) and e.exact


def test_norm_choice_linf_as_code():
  """Property 5 (oracle side): the ∞→∞ value is max_i ||J_i||_1, below the ∞→1 value and at
  least 1/m of it."""
  params = random_mlp(4, (8, 10, 8))
  z = jnp.asarray(np.random.default_rng(4).normal(size=8))
  for method in ("ibp", "enumerate"):
    l1 = lip.local_lipschitz(mlp_apply, params, z, 0.3, method=method, n_samples=128)
    li = lip.local_lipschitz(mlp_apply, params, z, 0.3, method=method, out_norm="linf_as_code",
                             n_samples=128)
    assert li.upper <= l1.upper <= 8 * li.upper + 1e-9
  J = np.random.default_rng(0).normal(size=(4, 3))
  assert float(lip.operator_norm(J, "linf_as_code")) == pytest.approx(np.abs(J).sum(1).max())


@pytest.mark.parametrize("method", ["ibp", "ibp_cheap", "enumerate"])
def test_radius_and_inclusion_monotone(method):
  """Property 6: U(z, r1) <= U(z, r2) for r1 <= r2, and U(z', r') <= U(z, r) when
  ||z - z'||_inf + r' <= r."""
  params = random_mlp(6, (8, 10, 8))
  rng = np.random.default_rng(6)
  z = rng.normal(size=8)

  def U(c, r):
    if method == "enumerate":
      W1, b1, W2 = lip.one_hidden_layer(mlp_apply, params, c, r)
      return lip.enumerate_patterns(W1, b1, W2, c, r)[0]
    return float(lip.ibp_upper_batch(mlp_apply, params, jnp.asarray(c)[None], r,
                                     method=method)[0])

  radii = np.linspace(0.0, 1.2, 9)
  vals = [U(z, r) for r in radii]
  assert all(a <= b * (1 + 1e-12) for a, b in zip(vals, vals[1:]))
  for _ in range(8):
    r = rng.uniform(0.1, 1.0)
    d = rng.uniform(0, r)
    z2 = z + d * rng.uniform(-1, 1, 8)
    r2 = r - np.abs(z2 - z).max()
    assert U(z2, r2) <= U(z, r) * (1 + 1e-12)


def test_batched_equals_per_sample_and_differentiable():
  """Property 14 (oracle side): ibp_upper_batch = ibp_upper per box; the unsound (plain float)
  bound has a gradient in the weights."""
  params = random_mlp(7, (8, 10, 8))
  rng = np.random.default_rng(7)
  zs = jnp.asarray(rng.normal(size=(6, 8)))
  radii = jnp.asarray(rng.uniform(0, 1, 6))
  batch = np.asarray(lip.ibp_upper_batch(mlp_apply, params, zs, radii))
  one = jax.jit(lambda z, r: lip.ibp_upper(mlp_apply, params, z, r))
  single = np.array([float(one(z, r)) for z, r in zip(zs, radii)])
  np.testing.assert_allclose(batch, single, rtol=1e-13)
  grad = jax.grad(lambda p: lip.ibp_upper(mlp_apply, p, zs[0], 0.3, method="ibp_cheap",
                                         sound=False))(params)
  leaves = jax.tree_util.tree_leaves(grad)
  assert all(np.all(np.isfinite(g)) for g in leaves) and any(np.any(g != 0) for g in leaves)


def test_any_jax_function_for_ibp():
  """The IBP oracles take any traceable function (here tanh); the bound dominates Jacobians."""
  params = random_mlp(8, (4, 6, 3))

  def tanh_net(p, z):
    return jnp.tanh(z @ p[0]["kernel"] + p[0]["bias"]) @ p[1]["kernel"] + p[1]["bias"]

  z = jnp.asarray(np.random.default_rng(8).normal(size=4))
  res = lip.local_lipschitz(tanh_net, params, z, 0.5, method="ibp", n_samples=512, pgd_steps=20)
  assert res.lower <= res.upper
  with pytest.raises(ValueError, match="ReLU network"):
    lip.local_lipschitz(tanh_net, params, z, 0.5, method="enumerate")


def test_bad_input():
  params = random_mlp(0, (8, 10, 8))
  z = jnp.zeros(8)
  with pytest.raises(ValueError, match="radius"):
    lip.local_lipschitz(mlp_apply, params, z, -0.1)
  with pytest.raises(ValueError, match="milp.lipschitz"):
    lip.local_lipschitz(mlp_apply, params, z, 0.1, method="milp")
  with pytest.raises(ValueError, match="out_norm"):
    lip.local_lipschitz(mlp_apply, params, z, 0.1, out_norm="l2")
  with pytest.raises(ValueError, match="one hidden layer"):
    lip.local_lipschitz(mlp_apply, random_mlp(0, (8, 8, 8, 8)), z, 0.1, method="enumerate")

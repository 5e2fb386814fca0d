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

from boundjax import lipschitz as lip
from boundjax.privacy import ptr
from milp import lipschitz as mlip
from milp.solve import SolveConfig
from tests.helpers import mlp_apply, random_mlp


@pytest.fixture(autouse=True)
def x64():
  with jax.enable_x64(True):
    yield


def test_sandwich_one_hidden_layer():
  """Property 3: lower <= MILP <= enum <= IBP <= cheap (1e-6), MILP exact, = enumeration; and
  property 1 for the MILP (10^4 pairs)."""
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
    assert m.exact and e.exact
    assert m.lower <= m.upper and m.upper == pytest.approx(e.upper, rel=1e-5)
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
  assert m.upper == pytest.approx(want, rel=1e-5) and m.exact


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

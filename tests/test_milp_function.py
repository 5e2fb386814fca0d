"""`milp.network.from_function` (networks from any JAX function) and `milp.property` (exact
checks of VNN-COMP-style properties), against direct evaluation and exhaustive grids."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

from milp import bounds as B
from milp import network as N
from milp.property import check_disjunction, check_property


def reference(apply_fn, params, xs):
  """``apply_fn`` in float64 (parameters cast) on each input of ``xs``, flattened."""
  with jax.enable_x64(True):
    p64 = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    return np.stack([np.asarray(apply_fn(p64, jnp.asarray(x, jnp.float64)), np.float64)
                     .reshape(-1) for x in xs])


def assert_reproduces(net, apply_fn, params, input_shape, n=8, seed=0, scale=2.0):
  xs = np.random.default_rng(seed).uniform(-scale, scale, (n,) + tuple(input_shape))
  ref = reference(apply_fn, params, xs)
  got = N.forward_batch(net, xs)
  np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-9 * (1 + np.abs(ref).max()))


# ------------------------------------------------------------------------------------------------
# from_function
# ------------------------------------------------------------------------------------------------

class MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Dense(12)(x))
    x = nn.relu(nn.Dense(10)(x))
    return nn.Dense(4)(x)


class ConvNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(4, (3, 3))(x))
    x = nn.relu(nn.Conv(6, (3, 3), strides=2, padding="VALID")(x))
    x = x.reshape((x.shape[0], -1))
    return nn.Dense(3)(x)


class BatchNormNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Dense(6)(x)
    x = nn.BatchNorm(use_running_average=True)(x)
    x = nn.relu(x)
    return nn.Dense(3)(x)


def test_flax_mlp_matches_and_equals_from_params():
  model = MLP()
  params = model.init(jax.random.PRNGKey(0), jnp.ones((1, 7)))
  net = N.from_function(model.apply, params, (1, 7))
  assert [l.shape for l in net.layers] == [(12, 7), (10, 12), (4, 10)]
  assert net.output == "logits" and net.input_shape == (1, 7)
  assert_reproduces(net, model.apply, params, (1, 7))
  ref = N.from_params(params)
  for a, b in zip(net.layers, ref.layers):  # a single Dense: every entry is one kernel entry
    np.testing.assert_array_equal(N._dense(a.w_lower), b.w_lower)
    np.testing.assert_array_equal(a.b_lower, b.b_lower)


def test_conv_net_sparse_and_matches():
  model = ConvNet()
  params = model.init(jax.random.PRNGKey(1), jnp.ones((1, 8, 8, 2)))
  net = N.from_function(model.apply, params, (1, 8, 8, 2))
  assert [l.shape for l in net.layers] == [(256, 128), (54, 256), (3, 54)]
  assert sp.issparse(net.layers[0].w_lower) and sp.issparse(net.layers[1].w_lower)
  assert_reproduces(net, model.apply, params, (1, 8, 8, 2))


def test_flax_batchnorm_inference_folds():
  model = BatchNormNet()
  variables = model.init(jax.random.PRNGKey(2), jnp.ones((1, 5)))
  rng = np.random.default_rng(2)
  stats = variables["batch_stats"]["BatchNorm_0"]
  variables = {"params": variables["params"], "batch_stats": {"BatchNorm_0": {
      "mean": rng.normal(size=stats["mean"].shape), "var": rng.uniform(0.5, 2, stats["var"].shape)}}}
  net = N.from_function(model.apply, variables, (1, 5))
  assert len(net.layers) == 2
  assert_reproduces(net, model.apply, variables, (1, 5))


def test_scale_shift_reshape_transpose_pad_function():
  rng = np.random.default_rng(3)
  params = {"w1": rng.normal(size=(12, 8)), "b1": rng.normal(size=8),
            "mean": rng.normal(size=8), "var": rng.uniform(0.5, 2.0, 8),
            "gamma": rng.normal(size=8), "beta": rng.normal(size=8),
            "w2": rng.normal(size=(2, 4, 3)), "b2": rng.normal(size=3)}

  def fn(p, x):                                    # x: (1, 2, 3, 2)
    h = jnp.transpose(x, (0, 3, 1, 2)).reshape(1, -1)          # transpose + flatten
    h = h @ p["w1"] + p["b1"]
    h = (h - p["mean"]) / jnp.sqrt(p["var"] + 1e-5) * p["gamma"] + p["beta"]  # batch norm
    h = jax.nn.relu(h).reshape(1, 4, 2).transpose(0, 2, 1)     # (1, 2, 4)
    h = jnp.pad(h, ((0, 0), (0, 0), (1, 0)))[:, :, 1:]        # pad then slice back
    out = jnp.einsum("bij,ijk->bk", h, p["w2"]) + p["b2"]
    return 2.0 * out - out.sum(-1, keepdims=True) / 3.0        # constants and a sum

  net = N.from_function(fn, params, (1, 2, 3, 2))
  assert [l.shape for l in net.layers] == [(8, 12), (3, 8)]
  assert_reproduces(net, fn, params, (1, 2, 3, 2))


def test_acas_like_input_shape_and_clipping():
  rng = np.random.default_rng(4)
  params = {"mu": rng.normal(size=5), "sd": rng.uniform(0.5, 2, 5),
            "w": [rng.normal(size=(5, 6)), rng.normal(size=(6, 6)), rng.normal(size=(6, 5))],
            "b": [rng.normal(size=6), rng.normal(size=6), rng.normal(size=5)]}

  def body(p, x):                                  # x: (1, 1, 1, 5) like the ONNX ACAS Xu nets
    h = (x.reshape(1, 5) - p["mu"]) / p["sd"]
    h = jnp.maximum(h @ p["w"][0] + p["b"][0], 0.0)
    h = jnp.clip(h @ p["w"][1] + p["b"][1], -0.5, 1.0)          # two ReLU-like layers
    return h @ p["w"][2] + p["b"][2]

  def fn(p, x):  # casts to float32 and back (as an ONNX Cast might): evaluated in float64
    return body(p, x.astype(jnp.float32)).astype(jnp.float32)

  net = N.from_function(fn, params, (1, 1, 1, 5))
  assert net.input_size == 5 and net.num_outputs == 5 and len(net.layers) == 4
  assert_reproduces(net, body, params, (1, 1, 1, 5))


@pytest.mark.parametrize("fn, shape, words", [
    (lambda p, x: jnp.tanh(x @ p), (1, 3), ["'tanh'", "test_milp_function.py"]),
    (lambda p, x: nn.max_pool(x @ p, (2,), (2,)), (1, 4, 3), ["reduce_window_max", "not encodable"]),
    (lambda p, x: jnp.maximum(x @ p, x), (1, 3), ["max pooling", "not encodable"]),
    (lambda p, x: (x @ p) * x, (1, 3), ["'mul'", "product"]),
    (lambda p, x: jax.nn.relu(x @ p) + x, (1, 3), ["not a chain", "skip connection"]),
])
def test_non_affine_segments_raise_naming_primitive_and_line(fn, shape, words):
  with pytest.raises(ValueError) as err:
    N.from_function(fn, np.eye(3), shape)
  for w in words:
    assert w in str(err.value)


# ------------------------------------------------------------------------------------------------
# check_property against exhaustive grids
# ------------------------------------------------------------------------------------------------

def random_mlp(rng, sizes):
  params = [(rng.normal(size=(a, b)) / np.sqrt(a), rng.normal(size=b) * 0.3)
            for a, b in zip(sizes[:-1], sizes[1:])]

  def fn(p, x):
    for i, (w, b) in enumerate(p):
      x = x @ w + b
      if i < len(p) - 1:
        x = jax.nn.relu(x)
    return x

  return N.from_function(fn, params, (1, sizes[0]), check=False)


def grid(lo, hi, n_per_axis):
  axes = [np.linspace(l, h, n_per_axis) for l, h in zip(lo, hi)]
  return np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(lo))


def test_check_property_against_exhaustive_grid():
  rng = np.random.default_rng(5)
  seen = {"sat": 0, "unsat": 0, "milp_sat": 0, "milp_unsat": 0}
  for trial in range(16):
    d_in = 2 + trial % 2
    net = random_mlp(rng, [d_in, 8, 8, 3])
    lo = rng.uniform(-1.0, 0.0, d_in)
    hi = lo + rng.uniform(0.5, 1.5, d_in)
    pts = grid(lo, hi, 101 if d_in == 2 else 22)             # >= 10^4 points, corners included
    ys = N.forward_batch(net, pts)
    k = 1 + trial % 3
    C = rng.normal(size=(k, 3))
    d = np.quantile(ys @ C.T, rng.uniform(0.0, 0.3), axis=0) - 0.05 * (trial % 4 == 0)
    truth = np.all(ys @ C.T <= d, axis=1).any()
    res = check_property(net, lo, hi, C, d, time_limit=20, samples=0 if trial % 2 else 16)
    assert res.status in ("sat", "unsat"), res
    if truth:
      assert res.status == "sat", (trial, res)
    if res.status == "sat":
      x = res.counterexample
      assert np.all(lo <= x) and np.all(x <= hi)
      y = N.forward(net, x)
      np.testing.assert_array_equal(y, res.output)
      assert np.all(C @ y <= d)
    seen[res.status] += 1
    seen[f"{res.method}_{res.status}"] = seen.get(f"{res.method}_{res.status}", 0) + 1
  assert seen["sat"] >= 3 and seen["unsat"] >= 3, seen
  assert seen["milp_sat"] >= 1 and seen["milp_unsat"] >= 1, seen


def test_check_property_bounds_argument_and_disjunction():
  rng = np.random.default_rng(6)
  net = random_mlp(rng, [2, 8, 8, 3])
  lo, hi = -np.ones(2), np.ones(2)
  ys = N.forward_batch(net, grid(lo, hi, 101))
  C = np.array([[1.0, -1.0, 0.0]])
  lowest = (ys @ C.T).min()
  unsat = (C, np.array([lowest - 0.2]))   # below the minimum on the grid: unsat (checked below)
  sat = (C, np.array([lowest + 1e-3]))
  given = B.crown(net, lo, hi)
  r1 = check_property(net, lo, hi, *unsat, time_limit=20, bounds=given, samples=0)
  r2 = check_property(net, lo, hi, *unsat, time_limit=20, bounds="ibp", samples=0)
  assert r1.status == r2.status == "unsat"
  r3 = check_property(net, lo, hi, *sat, time_limit=20, bounds=given, samples=0)
  assert r3.status == "sat" and np.all(C @ N.forward(net, r3.counterexample) <= sat[1])
  both = check_disjunction(net, lo, hi, [unsat, sat], time_limit=20, samples=0)
  assert both.status == "sat" and both.disjunct == 1
  assert check_disjunction(net, lo, hi, [unsat, unsat], time_limit=20).status == "unsat"
  empty = check_property(net, lo, hi, np.zeros((0, 3)), np.zeros(0), time_limit=5)
  assert empty.status == "sat"
  with pytest.raises(ValueError, match="not sound"):
    check_property(net, lo, hi, *sat, time_limit=5,
                   bounds=[(L + 1e3, U + 1e3) for L, U in given])
  with pytest.raises(ValueError, match="shape"):
    check_property(net, lo, hi, np.ones((1, 2)), [0.0], time_limit=5)

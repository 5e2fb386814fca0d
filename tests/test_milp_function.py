"""`milp.network.from_function` (networks from any JAX function) and `milp.property` (exact
checks of VNN-COMP-style properties), against direct evaluation and exhaustive grids."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

from boundjax.core.interval import Interval
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


class PoolNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(3, (3, 3))(x))
    x = nn.max_pool(x, (2, 2), (2, 2))                         # after a ReLU: x >= 0
    x = nn.Conv(4, (2, 2))(x)
    x = nn.max_pool(x, (3, 3), (2, 2), padding="SAME")         # odd windows, clipped borders
    x = nn.relu(nn.avg_pool(x, (2, 2)))
    return nn.Dense(3)(x.reshape((x.shape[0], -1)))


def test_max_pooling_as_relu_tournament():
  model = PoolNet()
  params = model.init(jax.random.PRNGKey(5), jnp.ones((1, 6, 6, 2)))
  net = N.from_function(model.apply, params, (1, 6, 6, 2))
  # conv+relu, 2 levels of 2x2 pooling (nonneg: 4 then 2 neurons per cell), conv, 2 levels of
  # the 3x3 pooling (its windows on the 3x3 map hold 4 entries after padding), avg pool + relu,
  # dense
  assert len(net.layers) == 1 + 2 + 2 + 1 + 1
  assert net.layers[1].shape[0] == 3 * 3 * 3 * 4
  assert_reproduces(net, model.apply, params, (1, 6, 6, 2))


def test_skip_connections_branches_and_elementwise_max_min():
  rng = np.random.default_rng(6)
  p = {k: rng.normal(size=shape) for k, shape in [
      ("a", (4, 5)), ("b", (5, 5)), ("c", (4, 5)), ("d", (5, 3)), ("e", (4, 5)), ("f", (4, 5))]}

  def residual(p, x):                              # x: (1, 4)
    h = jax.nn.relu(x @ p["a"])
    y = jax.nn.relu(h @ p["b"] + x @ p["c"]) + h   # reads x and h after later ReLUs
    return y @ p["d"]

  def branches(p, x):
    a, b = jax.nn.relu(x @ p["a"]), jax.nn.relu(x @ p["c"] - 1.0)
    m = jnp.maximum(x @ p["e"], x @ p["f"])        # max of two input-dependent values
    lo = jnp.min(jnp.stack([x @ p["a"], x @ p["f"]]), axis=0)  # reduce_min
    top = jnp.max((x @ p["e"]).reshape(1, 5, 1), axis=1)      # reduce_max (global max pool)
    return jnp.concatenate([a + b, m - lo, top], axis=1)

  for fn in (residual, branches):
    net = N.from_function(fn, p, (1, 4))
    assert_reproduces(net, fn, p, (1, 4), n=16)


def _members(rng, box, n):
  """``n`` parameter trees drawn from a tree of `Interval`s: uniform inside, and box corners."""
  leaves, tree = jax.tree_util.tree_flatten(box, is_leaf=lambda a: isinstance(a, Interval))
  out = []
  for k in range(n):
    picked = []
    for l in leaves:
      lo, hi = np.asarray(l.lower, np.float64), np.asarray(l.upper, np.float64)
      t = rng.integers(0, 2, lo.shape) if k % 4 == 0 else rng.uniform(size=lo.shape)
      picked.append(lo + t * (hi - lo))
    out.append(jax.tree_util.tree_unflatten(tree, picked))
  return out


def _iv(rng, p, width):
  return jax.tree_util.tree_map(
      lambda a: Interval(a - width * rng.uniform(size=np.shape(a)),
                         a + width * rng.uniform(size=np.shape(a))), p)


def test_interval_parameters_enclose_every_member_of_the_box():
  """A hyper-network from any function: every layer's matrix and bias are bounded over the
  parameter box. Checked two ways on members drawn inside the box and at its corners: the
  member's own chain (extracted as a point network) lies in the hyper-network, and the
  hyper-network's interval outputs at an input contain the member's float64 output there.
  Products of two interval parameters (a kernel times a scale, as a folded normalisation), a
  carried skip value times a scale that is positive at the midpoint but not over the box (it
  must be carried both ways), and convolutions included; Dense layers give the kernel's box to
  a few ulps (as `from_params`)."""
  rng = np.random.default_rng(40)
  p = {k: rng.normal(size=shape) for k, shape in [
      ("a", (4, 5)), ("s", (5,)), ("b", (5, 5)), ("c", (4, 5)), ("t", (5,)), ("d", (5, 3))]}
  p["t"] = np.array([0.5, 0.05, 0.01, 1.0, 0.2])  # positive; 0.01 straddles 0 once widened

  def scaled_skip(p, x):                            # x: (1, 4)
    h = jax.nn.relu(x @ (p["a"] * p["s"]))          # kernel times scale: a product of boxes
    y = jax.nn.relu(h @ p["b"] + x @ p["c"]) + h * p["t"]
    return y @ p["d"]

  def carried_scaled(p, x):
    g = jax.nn.relu(x @ p["a"]) * p["t"]            # read again after the next ReLU
    return (jax.nn.relu(g @ p["b"]) + g) @ p["d"]

  conv, conv_params = ConvNet(), ConvNet().init(jax.random.PRNGKey(41), jnp.ones((1, 6, 6, 2)))
  mlp_box = _iv(rng, MLP().init(jax.random.PRNGKey(42), jnp.ones((1, 7))), 0.03)
  cases = [(scaled_skip, _iv(rng, p, 0.05), (1, 4), True),
           (carried_scaled, _iv(rng, p, 0.05), (1, 4), False),
           (conv.apply, _iv(rng, conv_params, 0.02), (1, 6, 6, 2), True),
           (MLP().apply, mlp_box, (1, 7), True)]
  members = outputs = 0
  hypers = []
  for fn, box, shape, same_structure in cases:
    hyper = N.from_function(fn, box, shape)
    hypers.append(hyper)
    assert not hyper.is_point
    xs = rng.uniform(-2, 2, (8,) + shape)
    ends = [B.ibp(hyper, x.reshape(-1), x.reshape(-1))[-1] for x in xs]
    with jax.enable_x64(True):
      outs = jax.jit(jax.vmap(fn, in_axes=(None, 0)))
      for member in _members(rng, box, 24):
        if same_structure:
          assert N.contains(hyper, N.from_function(fn, member, shape, check=False)), fn
          members += 1
        ref = np.asarray(outs(member, jnp.asarray(xs)), np.float64).reshape(len(xs), -1)
        for (lo, hi), y in zip(ends, ref):
          assert np.all(lo <= y) and np.all(y <= hi), fn
          outputs += 1
  assert members == 3 * 24 and outputs == 4 * 24 * 8
  fn, box, shape, _ = cases[0]  # one Interval over the parameter trees gives the same network
  lo_tree, hi_tree = (jax.tree_util.tree_map(lambda a: getattr(a, end), box,
                                             is_leaf=lambda a: isinstance(a, Interval))
                      for end in ("lower", "upper"))
  whole = N.from_function(fn, Interval(lo_tree, hi_tree, validate=False), shape)
  for a, b in zip(whole.layers, hypers[0].layers):
    np.testing.assert_array_equal(N._dense(a.w_lower), N._dense(b.w_lower))
  ref = N.from_params(mlp_box)
  for a, b in zip(hypers[-1].layers, ref.layers):
    for got, want in ((a.w_lower, b.w_lower), (a.w_upper, b.w_upper), (a.b_lower, b.b_lower)):
      np.testing.assert_allclose(N._dense(got), want, rtol=0, atol=1e-14)
    assert np.all(N._dense(a.w_lower) <= b.w_lower) and np.all(N._dense(a.w_upper) >= b.w_upper)


def test_interval_parameter_in_a_clip_bound_is_refused():
  p = {"w": np.ones((3, 2)), "c": np.array(0.5)}
  box = {"w": Interval(p["w"] - 0.1, p["w"] + 0.1), "c": Interval(0.4, 0.6)}
  fn = lambda p, x: jnp.clip(x @ p["w"], 0.0, p["c"])
  assert N.from_function(fn, p, (1, 3)).layers  # concrete: fine
  with pytest.raises(ValueError, match="structural constant depends on an interval parameter"):
    N.from_function(fn, box, (1, 3))


def test_same_architecture_reuses_compilation_with_its_own_weights():
  model = MLP()
  for seed in range(3):  # the second and third reuse the first's compiled segments
    params = model.init(jax.random.PRNGKey(10 + seed), jnp.ones((1, 7)))
    net = N.from_function(model.apply, params, (1, 7), check=False)
    assert_reproduces(net, model.apply, params, (1, 7), seed=seed)


def test_plain_chain_has_one_layer_per_relu_and_nothing_carried():
  rng = np.random.default_rng(7)
  w = [rng.normal(size=(3, 6)), rng.normal(size=(6, 2))]
  net = N.from_function(lambda p, x: jax.nn.relu(x @ p[0]) @ p[1], w, (1, 3))
  assert [l.shape for l in net.layers] == [(6, 3), (2, 6)]


@pytest.mark.parametrize("fn, words", [
    (lambda p, x: jnp.tanh(x @ p), ["'tanh'", "test_milp_function.py"]),
    (lambda p, x: x @ p + jnp.argmax(x), ["'argmax'", "not encodable"]),
    (lambda p, x: jnp.sort(x @ p), ["'sort'", "not encodable"]),
    (lambda p, x: (x @ p) * x, ["'mul'", "product"]),
    (lambda p, x: p[0] / (x + 3.0), ["'div'", "not affine"]),
])
def test_non_affine_segments_raise_naming_primitive_and_line(fn, words):
  with pytest.raises(ValueError) as err:
    N.from_function(fn, np.eye(3), (1, 3))
  for w in words:
    assert w in str(err.value)


# ------------------------------------------------------------------------------------------------
# check_property against exhaustive grids
# ------------------------------------------------------------------------------------------------

def random_net(rng, d_in, kind="mlp"):
  """A small random network through `from_function`: an MLP, or one with a max pool (a
  tournament of ReLU layers) and a skip connection (carried values)."""
  p = {"a": rng.normal(size=(d_in, 8)) / np.sqrt(d_in), "ab": rng.normal(size=8) * 0.3,
       "b": rng.normal(size=(8, 8)) / np.sqrt(8), "bb": rng.normal(size=8) * 0.3,
       "c": rng.normal(size=(8, 3)) / np.sqrt(8), "cb": rng.normal(size=3) * 0.3,
       "d": rng.normal(size=(4, 3)) / 2}

  def mlp(p, x):
    h = jax.nn.relu(x @ p["a"] + p["ab"])
    h = jax.nn.relu(h @ p["b"] + p["bb"])
    return h @ p["c"] + p["cb"]

  def pooled(p, x):
    h = jax.nn.relu(x @ p["a"] + p["ab"])
    g = h @ p["b"] + p["bb"]
    m = jnp.max(g.reshape(1, 4, 2), axis=2)       # max pooling over pairs, signed inputs
    return jax.nn.relu(m) @ p["d"] + h @ p["c"]   # h is carried past the pooling layers

  return N.from_function(mlp if kind == "mlp" else pooled, p, (1, d_in), check=False)


def grid(lo, hi, n_per_axis):
  axes = [np.linspace(l, h, n_per_axis) for l, h in zip(lo, hi)]
  return np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(lo))


def random_spec(rng, ys, trial):
  """A random conjunction ``C y <= d`` that some grid outputs satisfy or nearly do."""
  k = 1 + trial % 3
  C = rng.normal(size=(k, ys.shape[1]))
  d = np.quantile(ys @ C.T, rng.uniform(0.0, 0.3), axis=0) - 0.05 * (trial % 4 == 0)
  return C, d


def test_check_property_against_exhaustive_grid():
  # time limits include the engine's first compilation for each network shape (10-20 s on a
  # loaded 2-core machine); the MILP itself takes well under a second here
  rng = np.random.default_rng(5)
  seen = {"sat": 0, "unsat": 0, "milp_sat": 0, "milp_unsat": 0}
  for trial in range(20):
    d_in = 2 + trial % 2
    net = random_net(rng, d_in, "pooled" if trial % 4 == 1 else "mlp")
    lo = rng.uniform(-1.0, 0.0, d_in)
    hi = lo + rng.uniform(0.5, 1.5, d_in)
    pts = grid(lo, hi, 101 if d_in == 2 else 22)             # >= 10^4 points, corners included
    ys = N.forward_batch(net, pts)
    samples = 0 if trial % 2 else 16
    if trial % 5 == 4:  # a disjunction of 2-3 conjunctions, one MILP
      specs = [random_spec(rng, ys, trial + j) for j in range(2 + trial % 2)]
      for C, d in specs:  # make each disjunct harder to reach
        d -= 0.1
      res = check_disjunction(net, lo, hi, specs, time_limit=60, samples=samples)
    else:
      specs = [random_spec(rng, ys, trial)]
      res = check_property(net, lo, hi, *specs[0], time_limit=60, samples=samples)
    truth = any(np.all(ys @ C.T <= d, axis=1).any() for C, d in specs)
    assert res.status in ("sat", "unsat"), res
    if truth:
      assert res.status == "sat", (trial, res)
    if res.status == "sat":
      x = res.counterexample
      assert np.all(lo <= x) and np.all(x <= hi)
      y = N.forward(net, x)
      np.testing.assert_array_equal(y, res.output)
      C, d = specs[res.disjunct]
      assert np.all(C @ y <= d)
    seen[res.status] += 1
    seen[f"{res.method}_{res.status}"] = seen.get(f"{res.method}_{res.status}", 0) + 1
  assert seen["sat"] >= 3 and seen["unsat"] >= 3, seen
  assert seen["milp_sat"] >= 1 and seen["milp_unsat"] >= 1, seen


def test_check_property_bounds_argument_and_disjunction():
  rng = np.random.default_rng(6)
  net = random_net(rng, 2)
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

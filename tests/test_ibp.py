"""Soundness and behaviour of `bj.ibp`: every rule, real Flax networks, transformations, errors.

Soundness tests sample concrete points (uniformly and at box vertices) and check every value
lies inside the bound. The sample counts are tallied in `SAMPLES` and printed at the end.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import boundjax as bj
from boundjax.core.errors import MemoryBudgetError
from tests.helpers import assert_inside, sample_box, sample_tree

SAMPLES = {"cases": 0, "points": 0}
RAN: list[str] = []  # tests of this module run in this process (under xdist, a share of them)


@pytest.fixture(autouse=True)
def _tally_ran(request):
  yield
  RAN.append(request.node.originalname)


def _check(fn, boxes, n=2000, tol=1e-5, seed=0, what="", **ibp_kw):
  """Bounds ``fn`` on ``boxes`` (a tuple of args, Intervals or arrays) and samples ``n`` points."""
  bound = bj.ibp(fn, **ibp_kw)(*boxes)
  pts = sample_tree(jax.random.PRNGKey(seed), tuple(boxes), n)
  values = jax.vmap(lambda *a: fn(*a))(*pts)
  SAMPLES["cases"] += 1
  SAMPLES["points"] += n
  jax.tree_util.tree_map(lambda b, v: assert_inside(b, v, tol, what), bound, values,
                         is_leaf=bj.is_interval)
  return bound


def _box(key, shape, low=-2.0, high=2.0, max_width=1.0):
  k1, k2 = jax.random.split(key)
  lo = jax.random.uniform(k1, shape, minval=low, maxval=high)
  w = jax.random.uniform(k2, shape, maxval=max_width)
  return bj.Interval(lo, lo + w)


KEY = jax.random.PRNGKey(42)
POS = _box(KEY, (3, 4), 0.1, 2.0)
ANY = _box(jax.random.PRNGKey(1), (3, 4))
ANY2 = _box(jax.random.PRNGKey(2), (3, 4))
STRADDLE = bj.Interval(-jnp.ones((3, 4)) * 0.7, jnp.ones((3, 4)) * 0.4)

UNARY = {
    "exp": (jnp.exp, ANY), "log": (jnp.log, POS), "log1p": (jnp.log1p, POS),
    "tanh": (jnp.tanh, ANY), "logistic": (jax.nn.sigmoid, ANY), "sqrt": (jnp.sqrt, POS),
    "rsqrt": (jax.lax.rsqrt, POS), "erf": (jax.scipy.special.erf, ANY), "abs": (jnp.abs, STRADDLE),
    "neg": (jnp.negative, ANY), "square": (jnp.square, STRADDLE), "pow2": (lambda x: x**2, STRADDLE),
    "pow3": (lambda x: x**3, ANY), "pow-2": (lambda x: x**-2, POS), "relu": (jax.nn.relu, STRADDLE),
    "gelu": (jax.nn.gelu, ANY), "softplus": (jax.nn.softplus, ANY), "silu": (jax.nn.silu, STRADDLE),
    "leaky_relu": (jax.nn.leaky_relu, STRADDLE), "elu": (jax.nn.elu, STRADDLE),
    "self_mul": (lambda x: x * x, STRADDLE), "self_sub": (lambda x: x - x, ANY),
    "clip": (lambda x: jnp.clip(x, -0.5, 0.3), ANY), "sign": (jnp.sign, STRADDLE),
    "floor": (jnp.floor, ANY), "sum": (jnp.sum, ANY), "sum_axis": (lambda x: x.sum(1), ANY),
    "mean": (lambda x: x.mean(0), ANY), "max": (lambda x: x.max(1), ANY),
    "min": (lambda x: x.min(0), ANY), "cumsum": (lambda x: jnp.cumsum(x, 1), ANY),
    "sort": (lambda x: jnp.sort(x, axis=1), ANY), "reshape": (lambda x: x.reshape(4, 3), ANY),
    "transpose": (lambda x: x.T, ANY), "slice": (lambda x: x[1:, ::2], ANY),
    "gather": (lambda x: x[jnp.array([2, 0, 2])], ANY), "take": (lambda x: x[:, jnp.array([3, 1])], ANY),
    "dynamic_slice": (lambda x: jax.lax.dynamic_slice(x, (1, 1), (2, 2)), ANY),
    "concat": (lambda x: jnp.concatenate([x, 2 * x, jnp.ones((3, 1))], 1), ANY),
    "pad": (lambda x: jnp.pad(x, 1), ANY), "expand_squeeze": (lambda x: x[None, :, None].squeeze(), ANY),
    "broadcast": (lambda x: jnp.broadcast_to(x, (2, 3, 4)), ANY), "flip": (lambda x: x[::-1], ANY),
    "where_uncertain": (lambda x: jnp.where(x > 0, x**2, -x), STRADDLE),
    "where_certain": (lambda x: jnp.where(x > -5, jnp.exp(x), 0.0), ANY),
    "compare_cast": (lambda x: (x > 0).astype(jnp.float32), STRADDLE),
    "argmax": (lambda x: jnp.argmax(x, axis=1).astype(jnp.float32), ANY),
    "stop_gradient": (jax.lax.stop_gradient, ANY), "astype64": (lambda x: x.astype(jnp.int32), ANY),
    "norm": (lambda x: jnp.linalg.norm(x, axis=1), ANY),
    "softmax_jax": (lambda x: jax.nn.softmax(x, axis=1), ANY),
    "softmax_bj": (lambda x: bj.nn.softmax(x, axis=1), ANY),
    "softmax_bj_axis0": (lambda x: bj.nn.softmax(x, axis=0), ANY),
    "log_softmax_jax": (jax.nn.log_softmax, ANY), "log_softmax_bj": (bj.nn.log_softmax, ANY),
    "logsumexp_bj": (bj.nn.logsumexp, ANY), "logsumexp_jax": (jax.nn.logsumexp, ANY),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_rules_sound(name):
  fn, box = UNARY[name]
  _check(fn, (box,), what=name)


BINARY = {
    "add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "maximum": jnp.maximum,
    "minimum": jnp.minimum, "div_pos": lambda a, b: a / (jnp.abs(b) + 0.5),
    "matmul": lambda a, b: a @ b.T, "where": lambda a, b: jnp.where(a < b, a, b),
    "clamp": lambda a, b: jax.lax.clamp(a - 1.0, b, a + 1.0),
    "einsum": lambda a, b: jnp.einsum("ij,kj->ik", a, b),
    "dot_batch": lambda a, b: jnp.einsum("ij,ij->i", a, b),
}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("which", ["both", "left", "right"])
def test_binary_rules_sound(name, which):
  fn = BINARY[name]
  a = ANY if which != "right" else ANY.center
  b = ANY2 if which != "left" else ANY2.center
  _check(fn, (a, b), what=f"{name}/{which}")


def test_division_by_box_containing_zero_is_unbounded_not_wrong():
  out = bj.ibp(lambda a, b: a / b)(jnp.ones(2), bj.Interval(-jnp.ones(2), jnp.ones(2)))
  assert np.all(np.isneginf(out.lower)) and np.all(np.isposinf(out.upper))


@pytest.mark.parametrize("mode", ["midrad", "signsplit", "exact", "best"])
def test_matmul_modes_sound_and_ordered(mode):
  a = _box(jax.random.PRNGKey(3), (5, 6))
  b = _box(jax.random.PRNGKey(4), (6, 4), 0.0, 1.0)  # non-negative operand, like post-ReLU
  out = _check(lambda x, y: x @ y, (a, b), matmul=mode, what=mode)
  exact = bj.ibp(lambda x, y: x @ y, matmul="exact")(a, b)
  assert np.all(np.asarray(out.lower) <= np.asarray(exact.lower) + 1e-5)
  assert np.all(np.asarray(out.upper) >= np.asarray(exact.upper) - 1e-5)


def test_exact_product_in_chunks_is_the_same_bound_and_within_its_budget():
  """matmul="exact" materialises every term; a budget below one pass's temporaries makes it
  take x's rows in chunks (odd sizes: a last partial chunk). The bound is the same sum of the
  same terms, holds on 10^4 samples, batch axes and several free and contracted axes included;
  a budget below one row raises MemoryBudgetError naming the bytes needed."""
  dims = (((2, 3), (1, 2)), ((0,), (0,)))  # x (B, F, C1, C2) . y (B, C1, C2, G): batch B
  f = lambda x, y: jax.lax.dot_general(x, y, dims)
  x = _box(jax.random.PRNGKey(20), (2, 7, 3, 2))
  y = _box(jax.random.PRNGKey(21), (2, 3, 2, 5))
  whole = bj.ibp(f, matmul="exact")(x, y)
  itemsize, per_row = 4, 8 * 4 * 2 * 5 * 6  # EXACT_LIVE * itemsize * B * G * C
  for budget in (per_row, 2 * per_row, 3 * per_row):
    part = _check(f, (x, y), n=10_000, matmul="exact", memory_bytes=budget,
                  what=f"exact in chunks of {budget // per_row}")
    np.testing.assert_allclose(part.lower, whole.lower, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(part.upper, whole.upper, rtol=1e-6, atol=1e-6)
  jitted = jax.jit(bj.ibp(f, matmul="exact", memory_bytes=2 * per_row))(x, y)
  np.testing.assert_allclose(jitted.lower, whole.lower, rtol=1e-6, atol=1e-6)
  chunked = str(jax.make_jaxpr(bj.ibp(f, matmul="exact", memory_bytes=2 * per_row))(x, y))
  assert "scan" in chunked and "scan" not in str(jax.make_jaxpr(bj.ibp(f, matmul="exact"))(x, y))
  with pytest.raises(MemoryBudgetError, match=str(per_row)):
    bj.ibp(f, matmul="exact", memory_bytes=per_row - 1)(x, y)
  with pytest.raises(ValueError, match="memory_bytes"):
    bj.ibp(f, matmul="exact", memory_bytes=0)


def test_matmul_mode_tightness_report():
  """Which product of boxes is tighter: exact <= best <= min(midrad, signsplit) in width."""
  widths = {}
  for mode in ["midrad", "signsplit", "exact", "best"]:
    for name, b_low in (("signed", -1.0), ("nonneg", 0.0)):
      a = _box(jax.random.PRNGKey(5), (16, 32))
      b = _box(jax.random.PRNGKey(6), (32, 8), b_low, 1.0)
      widths[(mode, name)] = float(bj.ibp(lambda x, y: x @ y, matmul=mode)(a, b).width.mean())
  for name in ("signed", "nonneg"):
    assert widths[("exact", name)] <= widths[("best", name)] + 1e-5
    assert widths[("best", name)] <= min(widths[("midrad", name)], widths[("signsplit", name)]) + 1e-5
  # sign-split is exact when one operand is sign-definite; midpoint-radius is not.
  assert widths[("signsplit", "nonneg")] == pytest.approx(widths[("exact", "nonneg")], rel=1e-5)
  assert widths[("midrad", "nonneg")] > widths[("exact", "nonneg")]
  print("mean widths:", widths)


def test_conv_with_interval_weights_modes_sound_and_ordered():
  """Conv with interval weights (point and box inputs) in every product mode; "best" is never
  wider than midpoint-radius or sign-split, and sign-split is the tighter of the two when the
  activations are non-negative (as after a ReLU)."""
  conv = lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "VALID",
                                                   dimension_numbers=("NHWC", "HWIO", "NHWC"))
  # same shapes and sample counts as test_conv_and_pooling_sound (shares compiled samplers)
  x = _box(jax.random.PRNGKey(14), (2, 8, 8, 3), 0.0, 1.0, 0.3)
  w = bj.Interval.around(jax.random.normal(jax.random.PRNGKey(15), (3, 3, 3, 4)), 0.1)
  _check(conv, (x.center, w), n=1000, what="conv point input, interval weights")
  widths = {}
  for mode in ("midrad", "signsplit", "best"):
    widths[mode] = _check(conv, (x, w), n=1000, matmul=mode, what=f"conv {mode}").width
  assert np.all(np.asarray(widths["best"]) <= np.minimum(widths["midrad"], widths["signsplit"]) + 1e-5)
  assert float(widths["signsplit"].mean()) < float(widths["midrad"].mean())


def test_conv_and_pooling_sound():
  x = _box(jax.random.PRNGKey(7), (2, 8, 8, 3), 0.0, 1.0, 0.3)
  w = jax.random.normal(jax.random.PRNGKey(8), (3, 3, 3, 4))
  conv = lambda x, w: jax.lax.conv_general_dilated(x, w, (2, 1), "SAME",
                                                   dimension_numbers=("NHWC", "HWIO", "NHWC"))
  _check(conv, (x, w), n=1000, what="conv input")
  _check(conv, (x, bj.Interval.around(w, 0.1)), n=1000, what="conv both")
  _check(lambda x: nn.max_pool(x, (2, 2), (2, 2)), (x,), n=1000, what="max_pool")
  _check(lambda x: nn.avg_pool(x, (2, 2), (2, 2)), (x,), n=1000, what="avg_pool")


# ----------------------------------------------------------------------------------------------
# real networks
# ----------------------------------------------------------------------------------------------


class MLP(nn.Module):
  widths: tuple = (16, 16, 3)
  act: str = "relu"

  @nn.compact
  def __call__(self, x):
    act = {"relu": nn.relu, "tanh": nn.tanh, "sigmoid": nn.sigmoid}[self.act]
    for w in self.widths[:-1]:
      x = act(nn.Dense(w)(x))
    return nn.Dense(self.widths[-1])(x)


class CNN(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(4, (3, 3), strides=(2, 2))(x))
    x = nn.avg_pool(nn.relu(nn.Conv(6, (3, 3))(x)), (2, 2), (2, 2))
    x = x.reshape(x.shape[0], -1)
    x = nn.relu(nn.Dense(12)(x))
    return nn.Dense(3)(x)


def _network(kind, seed):
  key = jax.random.PRNGKey(seed)
  if kind == "mlp":
    model = MLP(act=["relu", "tanh", "sigmoid"][seed % 3])
    x = jax.random.uniform(key, (4, 5))
  else:
    model = CNN()
    x = jax.random.uniform(key, (2, 8, 8, 1))
  params = model.init(key, x)
  return model, params, x


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("what", ["input", "params", "both"])
def test_network_bounds_contain_10k_samples(kind, seed, what):
  model, params, x = _network(kind, seed)
  eps = [0.02, 0.1, 0.3][seed]
  x_arg = bj.Interval.around(x, eps, domain=(0.0, 1.0)) if what != "params" else x
  p_arg = params
  if what != "input":
    p_arg = jax.tree_util.tree_map(lambda w: bj.Interval.around(w, eps * 0.2 * jnp.abs(w) + 1e-3),
                                   params)
  bound = bj.ibp(model.apply)(p_arg, x_arg)
  total = 0
  for chunk in range(5):  # 5 x 2,000 = 10,000 joint samples of (params, input)
    pts = sample_tree(jax.random.PRNGKey(100 + chunk), (p_arg, x_arg), 2000)
    values = jax.jit(jax.vmap(model.apply))(*pts)
    total += assert_inside(bound, values, 1e-5, f"{kind}/{what}/{seed}")
  SAMPLES["cases"] += 1
  SAMPLES["points"] += total
  assert total == 10_000


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_point_intervals_reproduce_function(kind):
  model, params, x = _network(kind, 0)
  out = bj.ibp(model.apply)(params, bj.Interval.point(x))
  np.testing.assert_allclose(out.lower, model.apply(params, x), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(out.upper, model.apply(params, x), rtol=1e-6, atol=1e-6)
  pparams = jax.tree_util.tree_map(bj.Interval.point, params)
  out = bj.ibp(model.apply)(pparams, x)
  np.testing.assert_allclose(out.lower, model.apply(params, x), rtol=1e-5, atol=1e-6)


def test_concrete_arguments_pass_through():
  model, params, x = _network("mlp", 0)
  out = bj.ibp(lambda p, x: (model.apply(p, x), x.sum()))(params, bj.Interval.around(x, 0.1))
  assert isinstance(out[0], bj.Interval) and isinstance(out[1], bj.Interval)
  out = bj.ibp(lambda p, x, y: (model.apply(p, x), y * 2))(params, bj.Interval.around(x, 0.1),
                                                          jnp.ones(3))
  assert not isinstance(out[1], bj.Interval)


def test_jit_of_ibp_matches_eager():
  model, params, x = _network("cnn", 1)
  box = bj.Interval.around(x, 0.05)
  eager = bj.ibp(model.apply)(params, box)
  jitted = jax.jit(bj.ibp(model.apply))(params, box)
  np.testing.assert_allclose(eager.lower, jitted.lower, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(eager.upper, jitted.upper, rtol=1e-5, atol=1e-6)


def test_one_nan_guard_per_box_and_nan_input_boxes_widen_under_jit():
  """Every box the interval domain builds passes one NaN guard (two ``x != x`` tests, one per
  end): in its rule, not again after the rule nor at the output (each repeat is an element-wise
  pass over the box); a product, whose rule maps ``0 · inf`` to 0, needs no other. An input box
  with a NaN end, which ``jit`` cannot validate, is the full line even after a mere reshape."""
  x = bj.Interval(jnp.zeros((3, 4)), jnp.ones((3, 4)))
  w = bj.Interval(-jnp.ones((4, 2)), jnp.ones((4, 2)))
  jaxpr = jax.make_jaxpr(bj.ibp(lambda a, b: (a @ b) * 2.0 + 1.0))(x, w).jaxpr
  nan_tests = [e for e in jaxpr.eqns if e.primitive.name == "ne" and e.invars[0] is e.invars[1]]
  assert len(nan_tests) == 2 * 2 + 3 * 2, jaxpr    # two input boxes, three operations
  f = jax.jit(bj.ibp(lambda a: a.reshape(-1)))
  out = f(bj.Interval(jnp.array([0.0, 1.0]), jnp.array([jnp.nan, 2.0]), validate=False))
  np.testing.assert_array_equal(out.lower, [-np.inf, 1.0])
  np.testing.assert_array_equal(out.upper, [np.inf, 2.0])


def test_grad_wrt_endpoints_and_params_matches_finite_differences():
  model, params, x = _network("mlp", 1)

  def width(lo, hi, p):
    out = bj.ibp(model.apply)(p, bj.Interval(lo, hi))
    return jnp.sum(out.upper - out.lower)

  lo, hi = x - 0.05, x + 0.05
  g_lo, g_hi, g_p = jax.grad(width, argnums=(0, 1, 2))(lo, hi, params)
  assert np.all(np.isfinite(g_lo)) and np.all(np.isfinite(g_hi))
  d = jnp.zeros_like(hi).at[0, 0].set(1e-2)
  fd = (width(lo, hi + d, params) - width(lo, hi - d, params)) / 2e-2
  np.testing.assert_allclose(g_hi[0, 0], fd, rtol=0.05, atol=1e-3)
  assert any(np.any(g != 0) for g in jax.tree_util.tree_leaves(g_p))


def test_nested_jit_custom_vjp_and_closed_over_constants():
  const = jnp.array([1.0, -2.0, 0.5])

  @jax.custom_vjp
  def f(x):
    return jnp.tanh(x) * 2.0

  f.defvjp(lambda x: (f(x), x), lambda x, g: (g * 2 * (1 - jnp.tanh(x) ** 2),))

  @jax.jit
  def inner(x):
    return jax.nn.relu(x) + const

  def g(x):
    return jax.jit(lambda y: f(inner(y)) * const)(x)

  _check(g, (_box(jax.random.PRNGKey(9), (3,)),), what="nested")


def test_nnx_module_through_split_merge():
  class M(nnx.Module):
    def __init__(self, rngs):
      self.l1 = nnx.Linear(3, 8, rngs=rngs)
      self.l2 = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
      return self.l2(nnx.relu(self.l1(x)))

  graphdef, state = nnx.split(M(nnx.Rngs(0)))
  apply = lambda s, x: nnx.merge(graphdef, s)(x)
  x = jax.random.uniform(jax.random.PRNGKey(0), (4, 3))
  _check(apply, (state, bj.Interval.around(x, 0.1)), what="nnx input")
  sbox = jax.tree_util.tree_map(lambda w: bj.Interval.around(w, 0.02), state)
  _check(apply, (sbox, x), what="nnx params")


# ----------------------------------------------------------------------------------------------
# composites: soundness and gain
# ----------------------------------------------------------------------------------------------


def test_tight_softmax_is_tighter_than_composition_and_exact():
  z = _box(jax.random.PRNGKey(10), (64, 10), -3, 3, 1.0)
  tight = _check(bj.nn.softmax, (z,), what="softmax")
  composed = lambda v: jnp.exp(v) / jnp.sum(jnp.exp(v), -1, keepdims=True)
  loose = bj.ibp(composed)(z)
  assert np.all(np.asarray(tight.width) <= np.asarray(loose.width) + 1e-6)
  # jax.nn.softmax's own body is recognised and gets the tight rule too
  np.testing.assert_allclose(bj.ibp(jax.nn.softmax)(z).width, tight.width, rtol=1e-6, atol=1e-7)
  gain = float(loose.width.mean() / tight.width.mean())
  assert gain > 1.5, gain
  # Each bound is attained at a vertex: own logit at its lower bound, the others at their upper.
  i = 3
  v = z.upper.at[:, i].set(z.lower[:, i])
  np.testing.assert_allclose(tight.lower[:, i], jax.nn.softmax(v)[:, i], rtol=1e-5)
  print(f"softmax width gain over composition: {gain:.2f}x")


def test_tight_log_softmax_and_logsumexp_are_exact_and_tighter():
  """log_softmax: each bound attained at a vertex, narrower than composing exp/sum/log; logsumexp:
  exact ``[lse(l), lse(u)]`` (it is monotone), narrower than jax.nn.logsumexp's max-shifted form."""
  z = _box(jax.random.PRNGKey(13), (64, 10), -3, 3, 1.0)
  tight = _check(bj.nn.log_softmax, (z,), what="log_softmax")
  composed = bj.ibp(lambda x: x - jnp.log(jnp.sum(jnp.exp(x), -1, keepdims=True)))(z)
  assert np.all(np.asarray(tight.width) <= np.asarray(composed.width) + 1e-5)
  assert float(composed.width.mean()) > 1.05 * float(tight.width.mean())
  i = 7
  v = z.upper.at[:, i].set(z.lower[:, i])
  np.testing.assert_allclose(tight.lower[:, i], jax.nn.log_softmax(v)[:, i], rtol=1e-5, atol=1e-6)
  lse = _check(bj.nn.logsumexp, (z,), what="logsumexp")
  np.testing.assert_allclose(lse.lower, jax.nn.logsumexp(z.lower, -1), rtol=1e-6)
  np.testing.assert_allclose(lse.upper, jax.nn.logsumexp(z.upper, -1), rtol=1e-6)
  shifted = bj.ibp(jax.nn.logsumexp)(z)  # max-subtraction loses the correlation: sound, loose
  gain = float(shifted.width.mean() / lse.width.mean())
  assert gain > 2, gain
  print(f"log_softmax gain {float(composed.width.mean() / tight.width.mean()):.2f}x, "
        f"logsumexp gain over jax.nn.logsumexp {gain:.2f}x")


@pytest.mark.parametrize("loss", ["bj_sce", "optax_sce", "bj_sce_int", "bj_bce", "mse"])
def test_loss_value_and_gradient_bounds(loss):
  z = _box(jax.random.PRNGKey(11), (32, 4), -3, 3, 1.0)
  labels = jax.random.randint(jax.random.PRNGKey(12), (32,), 0, 4)
  onehot = jax.nn.one_hot(labels, 4)
  fns = {
      "bj_sce": lambda z: bj.nn.softmax_cross_entropy(z, onehot),
      "optax_sce": lambda z: optax.softmax_cross_entropy(z, onehot),
      "bj_sce_int": lambda z: bj.nn.softmax_cross_entropy_with_integer_labels(z, labels),
      "bj_bce": lambda z: bj.nn.sigmoid_binary_cross_entropy(z, (onehot > 0).astype(jnp.float32)),
      "mse": lambda z: jnp.mean((z - onehot) ** 2, -1),
  }
  fn = fns[loss]
  _check(fn, (z,), what=f"{loss} value")
  grad_fn = jax.grad(lambda z: jnp.sum(fn(z)))
  g = _check(grad_fn, (z,), what=f"{loss} grad")
  if loss == "bj_sce":
    p_lo, p_hi = bj.nn.softmax_bounds(z.lower, z.upper)
    np.testing.assert_allclose(g.lower, p_lo - onehot, atol=1e-6)
    np.testing.assert_allclose(g.upper, p_hi - onehot, atol=1e-6)
    composed = bj.ibp(jax.grad(lambda z: jnp.sum(-jnp.sum(onehot * jnp.log(jax.nn.softmax(z)), -1))))(z)
    print(f"CE-gradient width gain: {float(composed.width.mean() / g.width.mean()):.2f}x")
    assert float(composed.width.mean()) > float(g.width.mean())


def test_per_sample_parameter_gradient_bounds():
  """What AGT needs: bounds on per-example gradients for every parameter in a box."""
  model = MLP(widths=(8, 8, 3))
  x = jax.random.uniform(jax.random.PRNGKey(0), (6, 4))
  y = jax.random.randint(jax.random.PRNGKey(1), (6,), 0, 3)
  params = model.init(jax.random.PRNGKey(2), x)
  pbox = jax.tree_util.tree_map(lambda w: bj.Interval.around(w, 0.02), params)

  def loss(p, xi, yi):
    return bj.nn.softmax_cross_entropy_with_integer_labels(model.apply(p, xi[None])[0], yi)

  per_sample = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))
  bound = bj.ibp(per_sample)(pbox, x, y)
  for chunk in range(5):
    ps = sample_tree(jax.random.PRNGKey(50 + chunk), pbox, 400)
    grads = jax.jit(jax.vmap(per_sample, in_axes=(0, None, None)))(ps, x, y)
    jax.tree_util.tree_map(lambda b, v: assert_inside(b, v, 1e-5, "param grads"), bound, grads,
                           is_leaf=bj.is_interval)
  SAMPLES["cases"] += 1
  SAMPLES["points"] += 2000


# ----------------------------------------------------------------------------------------------
# sound floating point
# ----------------------------------------------------------------------------------------------


def test_sound_mode_contains_float64_truth_with_zero_tolerance():
  """float32 sound-mode bounds contain the float64 value of the float32 network exactly."""
  model = MLP(widths=(256, 256, 10), act="tanh")
  x = jax.random.uniform(jax.random.PRNGKey(0), (8, 128))
  params = model.init(jax.random.PRNGKey(1), x)
  box = bj.Interval.around(x, 1e-3)
  sound = bj.ibp(model.apply, sound=True)(params, box)
  plain = bj.ibp(model.apply)(params, box)
  assert np.all(np.asarray(sound.lower) <= np.asarray(plain.lower))
  assert np.all(np.asarray(sound.upper) >= np.asarray(plain.upper))
  pts = np.asarray(sample_box(jax.random.PRNGKey(3), box, 200), dtype=np.float64)
  p64 = jax.tree_util.tree_map(lambda w: np.asarray(w, np.float64), params)
  ws = [(p64["params"][f"Dense_{i}"]["kernel"], p64["params"][f"Dense_{i}"]["bias"]) for i in range(3)]
  h = pts
  for i, (w, b) in enumerate(ws):
    h = h @ w + b
    if i < 2:
      h = np.tanh(h)
  assert np.all(h >= np.asarray(sound.lower, np.float64))
  assert np.all(h <= np.asarray(sound.upper, np.float64))
  widen = float((sound.width.mean() - plain.width.mean()) / plain.width.mean())
  print(f"sound mode widens bounds by {widen:.2e} (relative)")


# ----------------------------------------------------------------------------------------------
# errors
# ----------------------------------------------------------------------------------------------


def test_unsupported_primitive_names_primitive_and_source_line():
  def fn(x):
    return jnp.sin(x)  # no rule for sin

  with pytest.raises(bj.UnsupportedPrimitiveError, match=r"'sin'.*test_ibp.py"):
    bj.ibp(fn)(bj.Interval(jnp.zeros(2), jnp.ones(2)))


def test_unsupported_primitive_inside_flax_module_names_the_users_line():
  class M(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(2)(jnp.sin(nn.Dense(4)(x)))  # no rule for sin

  x = jnp.ones((2, 3))
  params = M().init(jax.random.PRNGKey(0), x)
  with pytest.raises(bj.UnsupportedPrimitiveError, match=r"'sin'.*test_ibp.py:\d+.*M.__call__"):
    bj.ibp(M().apply)(params, bj.Interval.around(x, 0.1))
  with pytest.raises(bj.UnsupportedPrimitiveError, match=r"'sin'.*test_ibp.py"):
    jax.jit(bj.ibp(lambda p, x: jax.jit(M().apply)(p, x)))(params, bj.Interval.around(x, 0.1))


def test_bad_interval_inputs_raise():
  with pytest.raises(ValueError, match="lower > upper"):
    bj.ibp(jnp.exp)(bj.Interval(jnp.ones(2), jnp.zeros(2)))
  with pytest.raises(ValueError, match="not finite"):
    bj.ibp(jnp.exp)(bj.Interval(jnp.array([jnp.nan, 0.0]), jnp.ones(2)))
  with pytest.raises(ValueError, match="matmul must be one of"):
    bj.ibp(jnp.exp, matmul="fast")


def test_sample_count_reported(request):
  """Runs after the soundness tests: reports how many cases and samples they used, and checks
  that none was vacuous (every case sampled >= 500 points; each network test 10,000 that all
  lay inside) and that every network test that ran before this one in this process (under
  xdist the others run elsewhere) was tallied."""
  print(f"IBP soundness: {SAMPLES['cases']} cases, {SAMPLES['points']} sampled points")
  nets = [n for n in RAN if n == "test_network_bounds_contain_10k_samples"]
  samplers = [n for n in RAN if n not in ("test_bad_interval_inputs_raise", "_tally_ran")]
  assert SAMPLES["points"] >= 500 * SAMPLES["cases"]
  assert SAMPLES["cases"] >= len(nets) and SAMPLES["points"] >= 10_000 * len(nets)
  if len(nets) == 18:  # the whole module ran: the full tally
    assert SAMPLES["cases"] >= 18 + 10 and SAMPLES["points"] >= 200_000, SAMPLES
  if samplers:
    assert SAMPLES["cases"] > 0


# ----------------------------------------------------------------------------------------------
# regressions: sound-mode error bounds, underflow, pow, NaN, bitwise, comparisons, dead entries
# ----------------------------------------------------------------------------------------------


def _inside64(bound, exact, what=""):
  """Zero-tolerance containment of float64 values ``exact`` in a float32 bound."""
  lo = np.asarray(bound.lower, np.float64)
  hi = np.asarray(bound.upper, np.float64)
  bad = ~((lo <= exact) & (exact <= hi))
  assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} float64 values outside; first: "
                         f"{exact[bad][:3]} not in [{lo[bad][:3]}, {hi[bad][:3]}]")


def _cancelling(n, seed=0, scale=1e4):
  """float32 values whose prefix sums cancel heavily (rounding error >> 1 ulp of the result)."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=n) * scale
  x[1::2] = -x[0::2][: n // 2] * (1 + 1e-6)
  return x.astype(np.float32)


def test_sound_cumsum_error_bound_holds_against_float64():
  x = _cancelling(4096)[None].repeat(2, 0)
  x[1] = x[1][::-1]
  for reverse in (False, True):
    out = bj.ibp(lambda v: jax.lax.cumsum(v, axis=1, reverse=reverse), sound=True)(
        bj.Interval.point(jnp.asarray(x)))
    x64 = x.astype(np.float64)
    exact = np.flip(np.cumsum(np.flip(x64, 1), 1), 1) if reverse else np.cumsum(x64, 1)
    _inside64(out, exact, f"cumsum reverse={reverse}")


def test_sound_avg_pool_error_bound_holds_against_float64():
  x = _cancelling(2 * 32 * 32 * 4, seed=1, scale=1e5).reshape(2, 32, 32, 4)
  pool = lambda v: jax.lax.reduce_window(v, 0.0, jax.lax.add, (1, 16, 16, 1), (1, 8, 8, 1), "VALID")
  out = bj.ibp(pool, sound=True)(bj.Interval.point(jnp.asarray(x)))
  x64 = x.astype(np.float64)
  win = np.lib.stride_tricks.sliding_window_view(x64, (16, 16), axis=(1, 2))
  exact = win[:, ::8, ::8].sum((-1, -2))
  _inside64(out, exact, "reduce_window_sum")


def test_sound_cumlogsumexp_error_bound_holds_against_float64():
  rng = np.random.default_rng(2)
  x = (1e4 + rng.normal(size=(4, 4000)) * 3).astype(np.float32)
  x[0] = 1e4  # equal entries: ~3.7 ulps of error after 4000 steps (one ulp is not enough)
  x[1] = -x[1]
  x[2] = rng.normal(size=4000).astype(np.float32) * 50
  x[3] = rng.normal(size=4000).astype(np.float32) * 1e-3
  out = bj.ibp(lambda v: jax.lax.cumlogsumexp(v, axis=1), sound=True)(bj.Interval.point(jnp.asarray(x)))
  x64 = x.astype(np.float64)
  exact = np.logaddexp.accumulate(x64, axis=1)
  _inside64(out, exact, "cumlogsumexp")


def test_sound_conv_counts_in_features_times_window():
  """Convolution error uses n = in_features × window; checked against float64 with cancellation."""
  rng = np.random.default_rng(3)
  x = (rng.normal(size=(2, 12, 12, 8)) * 1e3).astype(np.float32)
  w = rng.normal(size=(5, 5, 8, 4)).astype(np.float32)
  conv = lambda a, k: jax.lax.conv_general_dilated(a, k, (1, 1), "VALID",
                                                   dimension_numbers=("NHWC", "HWIO", "NHWC"))
  out = bj.ibp(conv, sound=True)(bj.Interval.point(jnp.asarray(x)), jnp.asarray(w))
  x64, w64 = x.astype(np.float64), w.astype(np.float64)
  exact = np.zeros((2, 8, 8, 4))
  for i in range(8):
    for j in range(8):
      exact[:, i, j] = np.einsum("bhwc,hwco->bo", x64[:, i:i + 5, j:j + 5], w64)
  _inside64(out, exact, "conv")
  from boundjax.domains import interval as dom
  dn = jax.lax.conv_dimension_numbers(x.shape, w.shape, ("NHWC", "HWIO", "NHWC"))
  assert dom.conv_count(x.shape, w.shape, {"dimension_numbers": dn}) == 5 * 5 * 8


TRANSCENDENTAL = ["exp", "exp2", "expm1", "log", "log1p", "tanh", "logistic", "sqrt", "rsqrt",
                  "cbrt", "erf", "erfc", "erf_inv", "atan", "asinh", "sinh", "atanh"]


@pytest.mark.parametrize("name", TRANSCENDENTAL)
def test_sound_transcendental_budgets_enclose_float64_on_dense_samples(name):
  """Point boxes at ~1e6 dense float32 samples of the whole domain (tiny, huge, near zeros and
  poles; `boundjax.core.budgets._samples`): the sound bound contains the float64 value."""
  from boundjax.core import budgets
  fn, ref, domain, special = budgets._references()[name]
  x = budgets._samples(domain, special, seed=11, n_bits=400_000, n_grid=200_000, run=5000)
  out = bj.ibp(fn, sound=True)(bj.Interval.point(jnp.asarray(x)))
  with np.errstate(all="ignore"):
    exact = ref(x.astype(np.float64))
  real = np.isfinite(exact) | np.isinf(exact)
  lo, hi = np.asarray(out.lower, np.float64), np.asarray(out.upper, np.float64)
  assert not np.isnan(lo).any() and not np.isnan(hi).any()
  ok = (lo <= exact) & (exact <= hi)
  bad = real & ~ok
  assert not bad.any(), f"{name}: {x[bad][:5]} -> {exact[bad][:5]} not in {lo[bad][:5]}, {hi[bad][:5]}"


def test_sound_subnormal_inputs_and_flushed_results():
  """XLA CPU reads subnormals as 0 and flushes subnormal results: bounds still enclose the
  float64 truth and never cross."""
  x = np.asarray([1e-40, 1e-45, -1e-40, 3e-39, 0.0], np.float32)
  box = bj.Interval.point(jnp.asarray(x))
  x64 = x.astype(np.float64)
  cases = {"sqrt": (jnp.sqrt, np.sqrt), "log": (jnp.log, np.log), "mul": (lambda v: v * 1e30, lambda v: v * 1e30),
           "exp": (jnp.exp, np.exp), "square": (jnp.square, np.square),
           "div": (lambda v: v / 1e-5, lambda v: v / np.float64(np.float32(1e-5)))}
  for name, (f, r) in cases.items():
    out = bj.ibp(f, sound=True)(box)
    assert np.all(np.asarray(out.lower) <= np.asarray(out.upper)), name
    with np.errstate(all="ignore"):
      exact = r(x64)
    keep = ~np.isnan(exact)
    lo, hi = np.asarray(out.lower, np.float64)[keep], np.asarray(out.upper, np.float64)[keep]
    assert np.all((lo <= exact[keep]) & (exact[keep] <= hi)), (name, lo, exact[keep], hi)
  # a product whose exact value is subnormal: flushed to 0, still enclosed
  out = bj.ibp(lambda a: a * 1e-30, sound=True)(bj.Interval.point(jnp.asarray([1e-9], jnp.float32)))
  assert float(out.lower[0]) <= float(np.float32(1e-9)) * 1e-30 <= float(out.upper[0])


@pytest.mark.parametrize("c", [2.0, 3.0, 4.0, -1.0, -2.0, 0.5, -0.5, 1.5, 0.0])
def test_pow_float_exponent_on_negative_boxes(c):
  """``x ** c`` with a float exponent: integral c behaves like integer_pow (even/odd); a
  non-integral c on a box reaching below 0 gives the full line; never NaN; samples enclosed."""
  boxes = [bj.Interval(jnp.asarray([-2.0, -3.0, 0.5, -1.0]), jnp.asarray([1.0, -0.5, 2.0, 0.0]))]
  for box in boxes:
    for sound in (False, True):
      out = bj.ibp(lambda x: x ** c, sound=sound)(box)
      assert not np.isnan(np.asarray(out.lower)).any() and not np.isnan(np.asarray(out.upper)).any()
      pts = np.concatenate([np.linspace(box.lower, box.upper, 2001), np.asarray([box.lower, box.upper])])
      with np.errstate(all="ignore"):
        vals = (np.power(pts.astype(np.float64), c) if sound else
                np.asarray(jnp.asarray(pts, jnp.float32) ** c, np.float64))
      keep = ~np.isnan(vals)
      lo = np.broadcast_to(np.asarray(out.lower, np.float64), vals.shape)
      hi = np.broadcast_to(np.asarray(out.upper, np.float64), vals.shape)
      assert np.all((lo[keep] <= vals[keep]) & (vals[keep] <= hi[keep])), (c, sound)
  out = bj.ibp(lambda x: x ** 2.0)(boxes[0])
  np.testing.assert_array_equal(np.asarray(out.lower), [0.0, 0.25, 0.25, 0.0])
  np.testing.assert_array_equal(np.asarray(out.upper), [4.0, 9.0, 4.0, 1.0])


def test_pow_box_exponent_positive_base():
  x = bj.Interval(jnp.asarray([0.5, 0.0, 2.0]), jnp.asarray([3.0, 1.0, 2.5]))
  y = bj.Interval(jnp.asarray([-1.0, 0.5, -2.0]), jnp.asarray([2.0, 2.0, 0.5]))
  _check(jax.lax.pow, (x, y), what="pow box exponent")
  _check(jax.lax.pow, (x, y), what="pow box exponent sound", sound=True, tol=0.0)


def test_nan_free_idioms_enclose_samples():
  """hypot, xlogy, safe log, 0·inf and std (sound): no NaN in any bound, samples (incl. 0)
  enclosed."""
  from jax.scipy.special import xlogy
  a = bj.Interval(jnp.asarray([-1.0, 0.0, 0.0, 2.0]), jnp.asarray([1.0, 0.0, 3.0, 4.0]))
  b = bj.Interval(jnp.asarray([0.0, -2.0, 0.0, 1.0]), jnp.asarray([2.0, 0.0, 1.0, 3.0]))
  cases = {
      "hypot": (jnp.hypot, (a, b)),
      "xlogy": (xlogy, (bj.Interval(jnp.zeros(4), jnp.ones(4)), bj.Interval(jnp.zeros(4), 2 * jnp.ones(4)))),
      "safe_log": (lambda x: jnp.where(x > 0, jnp.log(x), 0.0), (a,)),
      "zero_times_inf": (lambda x, y: x * jnp.log(y), (bj.Interval(jnp.zeros(4), jnp.zeros(4)), b)),
      "std": (lambda x: jnp.std(x, axis=1), (bj.Interval(-jnp.ones((3, 5)), jnp.ones((3, 5))),)),
  }
  for name, (f, boxes) in cases.items():
    for sound in (False, True):
      out = bj.ibp(f, sound=sound)(*boxes)
      assert not np.isnan(np.asarray(out.lower)).any() and not np.isnan(np.asarray(out.upper)).any(), name
      pts = sample_tree(jax.random.PRNGKey(5), tuple(boxes), 4000)
      vals = np.asarray(jax.vmap(f)(*pts))
      keep = ~np.isnan(vals)
      lo = np.broadcast_to(np.asarray(out.lower), vals.shape)
      hi = np.broadcast_to(np.asarray(out.upper), vals.shape)
      assert np.all((lo[keep] <= vals[keep]) & (vals[keep] <= hi[keep])), (name, sound)
  std = bj.ibp(lambda x: jnp.std(x, axis=1), sound=True)(bj.Interval(-jnp.ones((3, 5)), jnp.ones((3, 5))))
  assert np.all(np.asarray(std.lower) >= 0) and np.all(np.isfinite(np.asarray(std.upper)))


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.uint8, jnp.int8, jnp.bool_])
@pytest.mark.parametrize("op", ["and", "or"])
def test_bitwise_and_or_sound_by_enumeration(op, dtype):
  f = jnp.bitwise_and if op == "and" else jnp.bitwise_or
  npf = np.bitwise_and if op == "and" else np.bitwise_or
  if dtype == jnp.bool_:
    vals = [False, True]
  elif dtype == jnp.uint8:
    vals = list(range(0, 14))
  else:
    vals = list(range(-6, 9))
  boxes = [(l, u) for l in vals for u in vals if l <= u]
  rng = np.random.default_rng(0)
  pairs = [(boxes[i], boxes[j]) for i, j in rng.integers(0, len(boxes), size=(300, 2))]
  xl = jnp.asarray([p[0][0] for p in pairs], dtype)
  xu = jnp.asarray([p[0][1] for p in pairs], dtype)
  yl = jnp.asarray([p[1][0] for p in pairs], dtype)
  yu = jnp.asarray([p[1][1] for p in pairs], dtype)
  out = bj.ibp(f)(bj.Interval(xl, xu), bj.Interval(yl, yu))
  lo, hi = np.asarray(out.lower), np.asarray(out.upper)
  for k, ((a0, a1), (b0, b1)) in enumerate(pairs):
    xs = np.arange(int(a0), int(a1) + 1).astype(dtype)
    ys = np.arange(int(b0), int(b1) + 1).astype(dtype)
    v = npf(xs[:, None], ys[None, :])  # numpy: same integer semantics, no dispatch per pair
    assert lo[k] <= v.min() and v.max() <= hi[k], (op, (a0, a1), (b0, b1), lo[k], hi[k], v.min(), v.max())


def test_comparisons_with_infinite_ends_and_nan_enclose_samples():
  x = bj.Interval(jnp.asarray([-1.0, -1.0, 0.5]), jnp.asarray([2.0, 0.5, 2.0]))
  f = lambda v: jnp.where(jnp.log(v) < 0, 1.0, 0.0)
  for g in (f, lambda v: (jnp.log(v) <= 0).astype(jnp.float32),
            lambda v: (jnp.log(v) >= -5).astype(jnp.float32),
            lambda v: (jnp.log(v) == jnp.log(v)).astype(jnp.float32),
            lambda v: (jnp.log(v) != 1.0).astype(jnp.float32),
            lambda v: (jnp.log(v) < jnp.inf).astype(jnp.float32),
            lambda v: jnp.isfinite(jnp.log(v)).astype(jnp.float32)):
    _check(g, (x,), n=4000, tol=0.0, what="comparison after log")
  # operands with infinite ends: log of a box touching 0, 1/x of a box touching 0
  box = bj.Interval(jnp.asarray([0.0, 0.0, 0.0]), jnp.asarray([2.0, 1.0, 0.0]))
  for cmp in (jnp.less, jnp.less_equal, jnp.greater, jnp.greater_equal, jnp.equal, jnp.not_equal):
    for g in (lambda v: cmp(jnp.log(v), 0.5), lambda v: cmp(1.0 / v, 3.0),
              lambda v: cmp(jnp.log(v), -jnp.inf), lambda v: cmp(1.0 / v, jnp.inf),
              lambda v: cmp(jnp.log(v), 1.0 / v)):
      _check(lambda v: g(v).astype(jnp.float32), (box,), n=2000, tol=0.0, what="inf ends")
  sel = bj.ibp(lambda p, a, b: jax.lax.select(p > 0, a, b))(
      bj.Interval(-jnp.ones(3), jnp.ones(3)), bj.Interval(jnp.zeros(3), jnp.ones(3)), 5 * jnp.ones(3))
  np.testing.assert_array_equal(np.asarray(sel.lower), 0.0)
  np.testing.assert_array_equal(np.asarray(sel.upper), 5.0)


@pytest.mark.parametrize("mode", ["midrad", "signsplit", "best"])
@pytest.mark.parametrize("sound", [False, True])
def test_products_near_float32_max_stay_finite(mode, sound):
  """Boxes near ±3e38 whose products are finite give finite bounds (the centre is l/2 + u/2)."""
  x = bj.Interval(jnp.full((2, 3), 3.0e38), jnp.full((2, 3), 3.2e38))
  xs = bj.Interval(jnp.full((2, 3), -3.2e38), jnp.full((2, 3), 3.0e38))
  w = jnp.full((3, 2), 0.1)
  wb = bj.Interval(w, 1.05 * w)
  for a in (x, xs):
    for b in (w, wb):
      out = bj.ibp(lambda p, q: p @ q, matmul=mode, sound=sound)(a, b)
      assert np.all(np.isfinite(np.asarray(out.lower))) and np.all(np.isfinite(np.asarray(out.upper)))
      _check(lambda p, q: p @ q, (a, b), n=500, tol=1e-6, matmul=mode, sound=sound)
  conv = lambda p, k: jax.lax.conv_general_dilated(p, k, (1,), "VALID")
  out = bj.ibp(conv, matmul=mode, sound=sound)(bj.Interval(jnp.full((1, 2, 4), 3.0e38), jnp.full((1, 2, 4), 3.3e38)),
                                               jnp.full((3, 2, 2), 0.1))
  assert np.all(np.isfinite(np.asarray(out.lower))) and np.all(np.isfinite(np.asarray(out.upper)))


def test_rule_table_has_no_dead_entries():
  from jax import lax
  from boundjax.core import composite
  from boundjax.domains import interval as dom
  for name in dom.RULES:
    assert hasattr(lax, name.replace("-", "_") + "_p") or name in composite.REGISTRY or name in (
        "add_any", "copy", "optimization_barrier"), name
  assert "copy_p" not in dom.RULES
  import inspect
  src = inspect.getsource(dom._build_rules)
  assert src.count('"sort"') == 1

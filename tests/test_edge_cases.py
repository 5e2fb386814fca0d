"""Edge cases of the engine found by independent soundness probes: NaN tests of box-dependent
values, flushed subnormal products, infinite constants in max/min, NNX attention, integer
selections and gathers at box-dependent indices, low-precision casts in sound mode, dilated max
pooling, and options that must be refused. Each test samples the function (10^4 points plus the
box corners where the box is small) and checks the bound, or checks the error raised."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import boundjax as bj
from boundjax.core.options import OptionError
from boundjax.domains.linear import CrownFallbackWarning
from tests.helpers import assert_inside, sample_box

N = 10_000


def _both(fn, box, **kw):
  """``bj.ibp`` and ``bj.crown`` (one problem, no batch axis) of ``fn`` on ``box``."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", CrownFallbackWarning)
    return {"ibp": bj.ibp(fn, sound=kw.get("sound", False))(box),
            "crown": bj.crown(fn, batch_axis=None, **kw)(box)}


def _samples(box: bj.Interval, n: int = N) -> jax.Array:
  return sample_box(jax.random.PRNGKey(0), box, n)


# ----------------------------------------------------------------------------------------------
# Wrong bounds
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("intermediate", ["crown", "ibp"])
@pytest.mark.parametrize("sound", [False, True])
def test_nan_test_of_a_value_that_may_be_nan(intermediate, sound):
  """``isnan(sqrt(x))`` is True for x < 0: CROWN once took ``y != y`` as always False."""
  fn = lambda x: jnp.where(jnp.isnan(jnp.sqrt(x)), -5.0, 0.0) + x  # noqa: E731
  box = bj.Interval(jnp.array([-1.0]), jnp.array([1.0]))
  xs = _samples(box)
  ys = jax.vmap(fn)(xs)
  assert float(jnp.min(ys)) < -5  # the branch is taken
  for name, out in _both(fn, box, intermediate=intermediate, sound=sound).items():
    assert_inside(out, ys, tol=0.0, what=name)
    assert float(out.lower[0]) <= -6.0, name


def test_nan_test_of_a_finite_value_stays_exact():
  """``x == x`` of a value that is never NaN is decided (one variable against itself)."""
  fn = lambda x: jnp.where(jnp.isnan(2 * x + 1), 100.0, 0.0) + x  # noqa: E731
  box = bj.Interval(jnp.array([-1.0, 0.0]), jnp.array([1.0, 2.0]))
  for sound in (False, True):
    for name, out in _both(fn, box, sound=sound).items():
      assert float(jnp.max(out.upper)) <= 2.0 + 1e-5, (name, sound)


def test_the_same_box_passed_twice_is_two_variables_for_equality():
  """``a == b`` of two independent arguments is undecided even when one `Interval` object is
  passed for both (only one variable compared with itself is decided)."""
  box = bj.Interval(jnp.array([0.0, 1.0]), jnp.array([1.0, 1.0]))
  fn = lambda a, b: jnp.where(a == b, 1.0, 0.0) + a  # noqa: E731
  for sound in (False, True):
    out = bj.ibp(fn, sound=sound)(box, box)
    assert float(out.lower[0]) <= 0.0 and float(out.upper[0]) >= 2.0, (sound, out)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", CrownFallbackWarning)
      out = bj.crown(fn, batch_axis=None, sound=sound)(box, box)
    assert float(out.lower[0]) <= 0.0 and float(out.upper[0]) >= 2.0, (sound, out)


def test_nan_test_after_max_still_sees_the_nan():
  """``max(NaN, 0)`` is NaN in JAX: the marker box [0, inf] is not "never NaN"."""
  fn = lambda x: jnp.where(jnp.isnan(jnp.maximum(jnp.sqrt(x), 0.0)), -5.0, 0.0)  # noqa: E731
  box = bj.Interval(jnp.array([-1.0]), jnp.array([1.0]))
  ys = jax.vmap(fn)(_samples(box))
  for name, out in _both(fn, box).items():
    assert_inside(out, ys, tol=0.0, what=name)


@pytest.mark.parametrize("transform", ["ibp", "crown"])
def test_sound_mode_counts_every_flushed_product(transform):
  """1,000 products of 1e-40 are each flushed to zero in float32; their exact sum 1e-37 must
  lie in the sound bound (one λ of slack per flushed term, not one in all)."""
  x = jnp.full((1, 1000), 1e-30, jnp.float32)
  w = jnp.full((1000, 1), 1e-10, jnp.float32)
  exact = 1000 * np.float64(np.float32(1e-30)) * np.float64(np.float32(1e-10))
  fn = lambda v: v @ w  # noqa: E731
  box = bj.Interval(x, x)
  out = bj.ibp(fn, sound=True)(box) if transform == "ibp" else bj.crown(fn, sound=True)(box)
  assert float(out.lower[0, 0]) <= exact <= float(out.upper[0, 0]), (out, exact)


def test_sound_crown_with_tiny_weights_contains_float64():
  """A two-layer network whose products underflow, bounded by sound CROWN, against float64."""
  rng = np.random.default_rng(0)
  w1 = jnp.asarray(rng.normal(size=(64, 32)) * 1e-20, jnp.float32)
  w2 = jnp.asarray(rng.normal(size=(32, 4)) * 1e-19, jnp.float32)
  fn = lambda v: jax.nn.relu(v @ w1) @ w2  # noqa: E731
  center = jnp.asarray(rng.normal(size=(1, 64)), jnp.float32)
  box = bj.Interval(center - 1e-3, center + 1e-3)
  out = bj.crown(fn, sound=True)(box)
  xs = np.asarray(_samples(box), np.float64)
  ys = np.maximum(xs @ np.asarray(w1, np.float64), 0) @ np.asarray(w2, np.float64)
  lo, hi = np.asarray(out.lower, np.float64), np.asarray(out.upper, np.float64)
  assert np.all(ys >= lo) and np.all(ys <= hi)


# ----------------------------------------------------------------------------------------------
# NaN or infinite bounds where a finite one exists
# ----------------------------------------------------------------------------------------------

INF_FUNCTIONS = {
    "max(x, -inf)": lambda x: jnp.maximum(x, -jnp.inf),
    "clip(x, -inf, inf)": lambda x: jnp.clip(x, -jnp.inf, jnp.inf),
    "min(x, inf) * 2": lambda x: 2 * jnp.minimum(x, jnp.inf),
    "max(x, [-inf, 1, 0])": lambda x: jnp.maximum(x, jnp.array([-jnp.inf, 1.0, 0.0])),
    "min(relu(x), [inf, -0.5, 3])": lambda x: jnp.minimum(jax.nn.relu(x),
                                                         jnp.array([jnp.inf, -0.5, 3.0])),
    "logsumexp keepdims": lambda x: jax.scipy.special.logsumexp(x, axis=-1, keepdims=True),
    "logsumexp": lambda x: jax.scipy.special.logsumexp(x),
}


@pytest.mark.parametrize("name", sorted(INF_FUNCTIONS))
@pytest.mark.parametrize("kw", [{}, {"intermediate": "ibp"}, {"sound": True}, {"alpha": True}],
                         ids=["crown", "crown-ibp", "sound", "alpha"])
def test_max_min_against_infinite_constants_give_finite_bounds(name, kw):
  fn = INF_FUNCTIONS[name]
  box = bj.Interval(jnp.array([-1.0, 0.5, -2.0]), jnp.array([1.0, 2.0, 0.5]))
  ys = jax.vmap(fn)(_samples(box))
  out = bj.crown(fn, batch_axis=None, **kw)(box)
  assert np.all(np.isfinite(out.lower)) and np.all(np.isfinite(out.upper)), out
  assert_inside(out, ys, tol=0.0 if kw.get("sound") else 1e-5, what=name)


def test_max_against_plus_infinity_is_the_constant():
  box = bj.Interval(jnp.array([-1.0, 0.5]), jnp.array([1.0, 2.0]))
  out = bj.crown(lambda x: jnp.maximum(x, jnp.inf), batch_axis=None)(box)
  assert np.all(np.asarray(out.lower) == np.inf) and np.all(np.asarray(out.upper) == np.inf)


def _nnx_block(attention_only: bool):
  from flax import nnx

  class Block(nnx.Module):
    def __init__(self, d: int, rngs: nnx.Rngs):
      self.ln1, self.ln2 = nnx.LayerNorm(d, rngs=rngs), nnx.LayerNorm(d, rngs=rngs)
      self.att = nnx.MultiHeadAttention(num_heads=2, in_features=d, decode=False, rngs=rngs)
      self.fc1, self.fc2 = nnx.Linear(d, 32, rngs=rngs), nnx.Linear(32, d, rngs=rngs)

    def __call__(self, x):
      if attention_only:
        return self.att(x)
      x = x + self.att(self.ln1(x))
      return x + self.fc2(nnx.gelu(self.fc1(self.ln2(x))))

  graphdef, state = nnx.split(Block(16, nnx.Rngs(0)))
  return (lambda s, x: nnx.merge(graphdef, s)(x)), state


@pytest.mark.parametrize("attention_only",
                         [True, pytest.param(False, marks=pytest.mark.slow)],
                         ids=["attention", "block"])  # the whole block: ~40 s, slow suite
def test_nnx_attention_and_transformer_block_bounds_are_finite_and_sound(attention_only):
  """NNX's attention takes ``max(-inf, reduce_max(scores))``: once inf − inf, all-NaN bounds."""
  fn, state = _nnx_block(attention_only)
  x = jax.random.normal(jax.random.PRNGKey(1), (1, 4, 16))
  box = bj.Interval(x - 0.01, x + 0.01)
  ys = jax.vmap(lambda z: fn(state, z))(sample_box(jax.random.PRNGKey(2), box, 2000))
  ibp = bj.ibp(fn)(state, box)
  for kw in ({"alpha": True, "alpha_steps": 3},) if attention_only else ({},):
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", CrownFallbackWarning)
      out = bj.crown(fn, **kw)(state, box)
    assert np.all(np.isfinite(out.lower)) and np.all(np.isfinite(out.upper)), kw
    assert_inside(out, ys, tol=1e-4, what=f"crown {kw}")
    assert float(jnp.max(out.upper - out.lower)) <= float(jnp.max(ibp.upper - ibp.lower))
  spec = jnp.eye(64)[:3]
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", CrownFallbackWarning)
    out = bj.crown(lambda s, z: fn(s, z).reshape(1, -1), spec=spec)(state, box)
  assert np.all(np.isfinite(out.lower)) and np.all(np.isfinite(out.upper))
  assert_inside(out, ys.reshape(ys.shape[0], 1, -1)[:, :, :64] @ np.asarray(spec).T, tol=1e-4)


def test_a_rule_that_returns_nan_gives_the_full_line():
  """A NaN end of any interval rule's result becomes ±inf at once (sound), in both modes."""
  from boundjax.domains import interval as interval_domain
  saved = interval_domain.RULES["tanh"]
  interval_domain.RULES["tanh"] = lambda ctx, x, **p: bj.Interval(x.lower * jnp.nan, x.upper,
                                                                  validate=False)
  try:
    box = bj.Interval(jnp.zeros(3), jnp.ones(3))
    for sound in (False, True):
      out = bj.ibp(lambda x: jnp.tanh(x) + 1, sound=sound)(box)
      assert np.all(np.asarray(out.lower) == -np.inf) and np.all(np.asarray(out.upper) >= 2.0)
  finally:
    interval_domain.RULES["tanh"] = saved


def test_the_final_check_names_the_primitive_of_a_nan_bound_or_widens_it_under_jit():
  """The last line of defence of every transformation (`check_outputs`): a concrete NaN end
  raises `BoundError` with the output's primitive and the user's line; under jit it widens."""
  from boundjax.core import program as prog_lib
  box = bj.Interval(jnp.zeros(3), jnp.ones(3))
  program = prog_lib.trace(lambda x: jnp.tanh(x) * 2, prog_lib.split_arguments((box,), {}))
  nan = bj.Interval(jnp.array([0.0, jnp.nan, 1.0]), jnp.array([1.0, 2.0, jnp.nan]),
                    validate=False)
  with pytest.raises(bj.BoundError,
                     match=r"output 0 \(primitive 'mul' at \S*test_edge_cases\.py:\d+.*index \(1,\)"):
    prog_lib.check_outputs([nan], where="bj.ibp", program=program)
  widened = jax.jit(lambda lo, hi: prog_lib.check_outputs(
      [bj.Interval(lo, hi, validate=False)], where="bj.ibp")[0])(nan.lower, nan.upper)
  assert np.asarray(widened.lower).tolist() == [0.0, -np.inf, 1.0]
  assert np.asarray(widened.upper).tolist() == [1.0, 2.0, np.inf]
  diff = bj.DiffInterval(nan, box, box)
  with pytest.raises(bj.BoundError, match=r"output 0\.ref"):
    prog_lib.check_outputs([diff], where="bj.difference")


# ----------------------------------------------------------------------------------------------
# Crashes on ordinary code
# ----------------------------------------------------------------------------------------------

INDEXING = {
    "x[0, argmax(x)]": lambda x: x[0, jnp.argmax(x)],
    "take_along_axis(x, argmax)": lambda x: jnp.take_along_axis(
        x, jnp.argmax(x, axis=1, keepdims=True), axis=1),
    "x[0, (x[0] > 0).astype(int)]": lambda x: x[0, (x[0] > 0).astype(int)],
    "where(x > 0, 1, 0)": lambda x: jnp.where(x > 0, 1, 0),
    "where(x > 0, 1, 0) * x": lambda x: jnp.where(x > 0, 1, 0) * x,
    "x[argmax(x, 1)] rows": lambda x: x[jnp.arange(2), jnp.argmax(x, axis=1)],
}


@pytest.mark.parametrize("name", sorted(INDEXING))
@pytest.mark.parametrize("sound", [False, True])
def test_box_dependent_indices_and_integer_selections(name, sound):
  fn = INDEXING[name]
  box = bj.Interval(jnp.array([[-1.0, 0.5, 0.2], [3.0, -2.0, 0.0]]),
                    jnp.array([[1.0, 2.0, 0.3], [4.0, -1.0, 2.5]]))
  ys = jax.vmap(fn)(_samples(box))
  for transform, out in _both(fn, box, sound=sound).items():
    assert_inside(out, ys, tol=0.0, what=f"{transform} {name}")


def test_gather_at_a_decided_index_is_exact():
  """An index box that is one point (a clear argmax) reads exactly the entry it names."""
  box = bj.Interval(jnp.array([[-1.0, 5.0, 0.2]]), jnp.array([[1.0, 6.0, 0.3]]))
  out = bj.ibp(lambda x: jnp.take_along_axis(x, jnp.argmax(x, axis=1, keepdims=True), axis=1))(box)
  assert np.asarray(out.lower).tolist() == [[5.0]] and np.asarray(out.upper).tolist() == [[6.0]]


def test_gather_fill_mode_out_of_bounds_widens():
  """``x.at[i].get(mode='fill')`` at an index box reaching past the end reads the fill value."""
  box = bj.Interval(jnp.array([0.0, 1.0, 2.0]), jnp.array([0.5, 1.5, 2.5]))
  idx = bj.Interval(jnp.array([1], jnp.int32), jnp.array([4], jnp.int32))
  out = bj.ibp(lambda x, i: x.at[i].get(mode="fill", fill_value=-7.0))(box, idx)
  assert float(out.lower[0]) <= -7.0 and float(out.upper[0]) >= 2.5


@pytest.mark.parametrize("low", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("transform", ["ibp", "crown"])
def test_sound_mode_through_a_low_precision_cast(low, transform):
  fn = lambda x: (x.astype(low) * 3).astype(jnp.float32) + x  # noqa: E731
  box = bj.Interval(jnp.array([[-1.0, 0.5, 1e-3]]), jnp.array([[1.0, 2.0, 7.0]]))
  out = bj.ibp(fn, sound=True)(box) if transform == "ibp" else bj.crown(fn, sound=True)(box)
  xs = np.asarray(_samples(box))
  ys = np.asarray(jax.vmap(fn)(jnp.asarray(xs)), np.float64)  # the low-precision program's values
  assert np.all(ys >= np.asarray(out.lower)) and np.all(ys <= np.asarray(out.upper))


def test_crown_dilated_max_pool_falls_back_to_intervals_with_a_warning():
  pool = lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 1, 1, 1),  # noqa: E731
                                     "VALID", window_dilation=(1, 2, 2, 1))
  rng = np.random.default_rng(0)
  lo = jnp.asarray(rng.uniform(-1, 1, (1, 6, 6, 2)), jnp.float32)
  box = bj.Interval(lo, lo + 0.5)
  with pytest.warns(CrownFallbackWarning, match="dilation"):
    out = bj.crown(pool)(box)
  assert_inside(out, jax.vmap(pool)(sample_box(jax.random.PRNGKey(0), box, N)), tol=0.0)


def test_onnx_maxpool_with_dilations_is_bounded_by_crown(tmp_path):
  """The same through an ONNX ``MaxPool`` with ``dilations`` (where users meet it)."""
  import onnx
  from onnx import TensorProto, helper
  from boundjax.io import load_onnx
  node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], dilations=[2, 2])
  graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                        [1, 1, 6, 6])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])])
  path = tmp_path / "pool.onnx"
  onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
  model = load_onnx(path)
  lo = jnp.asarray(np.random.default_rng(1).uniform(0, 1, (1, 1, 6, 6)), jnp.float32)
  box = bj.Interval(lo, lo + 0.25)
  with pytest.warns(CrownFallbackWarning):
    out = bj.crown(model.apply_fn, batch_axis=None)(model.params, box)
  xs = sample_box(jax.random.PRNGKey(3), box, 2000)
  assert_inside(out, jax.vmap(lambda v: model(v))(xs), tol=0.0)


# ----------------------------------------------------------------------------------------------
# Bad options
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", [[[np.nan, 1.0]], [[np.inf, 1.0]], [[1.0, -np.inf]]])
def test_crown_refuses_a_spec_with_nan_or_inf(spec):
  box = bj.Interval(jnp.array([[-1.0, 0.5]]), jnp.array([[1.0, 2.0]]))
  with pytest.raises(OptionError, match="spec.*NaN or infinite.*test_edge_cases.py"):
    bj.crown(lambda x: x, spec=jnp.asarray(spec, jnp.float32))(box)


@pytest.mark.parametrize("kw,match", [({"alpha_lr": np.inf}, "alpha_lr=inf"),
                                      ({"alpha_lr": np.nan}, "alpha_lr=nan"),
                                      ({"alpha_lr": -0.1}, "alpha_lr=-0.1"),
                                      ({"alpha_steps": 2.5}, "alpha_steps=2.5"),
                                      ({"alpha_steps": 0}, "alpha_steps=0")])
def test_crown_refuses_bad_alpha_options(kw, match):
  with pytest.raises(OptionError, match=match):
    bj.crown(lambda x: jax.nn.relu(x), alpha=True, **kw)


@pytest.mark.parametrize("sound", [False, True])
def test_a_concrete_nan_or_infinite_factor_never_becomes_zero(sound):
  """``c · x`` with a concrete ``c``: ``0 · x`` is 0 even where the box is unbounded-looking,
  but a NaN in ``c`` (no real value), or ``±inf · x`` with ``x`` reaching 0 (NaN at 0), may be
  NaN and gets the whole line; elsewhere the product is the sampled one."""
  c = jnp.array([jnp.nan, jnp.inf, 0.0, 2.0, -jnp.inf])
  box = bj.Interval(jnp.array([-1.0, 0.0, -3.0, -3.0, 1.0]), jnp.array([1.0, 2.0, 3.0, 3.0, 3.0]))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    out = jax.jit(bj.ibp(lambda x: c * x, sound=sound))(box)
  lo, hi = np.asarray(out.lower), np.asarray(out.upper)
  assert not np.isnan(lo).any() and not np.isnan(hi).any()
  assert lo[0] == -np.inf and hi[0] == np.inf and lo[1] == -np.inf and hi[1] == np.inf
  assert lo[2] <= 0 <= hi[2] and hi[2] - lo[2] < 1e-30  # 0 · x = 0
  xs = np.asarray(sample_box(jax.random.PRNGKey(0), box, N))
  ys = np.asarray(c)[None, 3:] * xs[:, 3:]
  assert np.all(ys >= lo[3:]) and np.all(ys <= hi[3:])
  assert hi[4] <= -3.0e38  # -inf · [1, 3] is -inf: nothing above the most negative float

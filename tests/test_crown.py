"""Tests of `boundjax.domains.linear.crown` (CROWN): soundness by sampling, tightness against
IBP, exactness on point boxes, jit, batching, sound floating point and error reporting."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boundjax as bj
from boundjax.domains.linear import CrownFallbackWarning, crown
from boundjax.core.errors import UnsupportedPrimitiveError
from tests.helpers import assert_inside, sample_box

N_SAMPLES = 10_000


class MLP(nn.Module):
  widths: tuple
  out: int

  @nn.compact
  def __call__(self, x):
    for w in self.widths:
      x = nn.relu(nn.Dense(w)(x))
    return nn.Dense(self.out)(x)


class CNN(nn.Module):
  features: tuple
  kernel: int
  stride: int
  padding: str
  pool: bool
  dense: int
  out: int

  @nn.compact
  def __call__(self, x):
    for i, f in enumerate(self.features):
      x = nn.relu(nn.Conv(f, (self.kernel, self.kernel), strides=self.stride if i == 0 else 1,
                          padding=self.padding)(x))
    if self.pool:
      x = nn.avg_pool(x, (2, 2), (2, 2))
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(self.dense)(x))
    return nn.Dense(self.out)(x)


def _random_mlp(seed: int):
  rng = np.random.default_rng(seed)
  depth = int(rng.integers(1, 4))
  widths = tuple(int(w) for w in rng.integers(3, 24, size=depth))
  d_in, out = int(rng.integers(2, 12)), int(rng.integers(1, 6))
  return MLP(widths, out), (d_in,)


def _random_cnn(seed: int):
  rng = np.random.default_rng(seed)
  model = CNN(features=tuple(int(f) for f in rng.integers(2, 5, size=int(rng.integers(1, 3)))),
              kernel=int(rng.integers(2, 4)), stride=int(rng.integers(1, 3)),
              padding=str(rng.choice(["SAME", "VALID"])), pool=bool(rng.integers(0, 2)),
              dense=int(rng.integers(3, 12)), out=int(rng.integers(2, 5)))
  return model, (8, 8, int(rng.integers(1, 3)))


def _random_box(seed: int, batch: int, shape: tuple) -> bj.Interval:
  """Random centres and per-coordinate radii (some zero) of mixed sizes."""
  rng = np.random.default_rng(seed + 1000)
  c = rng.normal(size=(batch, *shape)).astype(np.float32)
  r = rng.uniform(0, 1, size=(batch, *shape)).astype(np.float32) * float(rng.choice([0.02, 0.2, 1.0]))
  r[rng.uniform(size=r.shape) < 0.1] = 0.0
  return bj.Interval(jnp.asarray(c - r), jnp.asarray(c + r))


def _init(model, shape, seed):
  return model.init(jax.random.PRNGKey(seed), jnp.zeros((1, *shape), jnp.float32))


def _samples_per_example(box: bj.Interval, seed: int, n: int = N_SAMPLES):
  """(n, batch, ...) points: half at random box vertices, half uniform (`sample_box`)."""
  pts = [sample_box(jax.random.PRNGKey(seed + b), box[b], n) for b in range(box.shape[0])]
  return jnp.stack(pts, axis=1)


def _outputs(model, params, pts):
  n, b = pts.shape[:2]
  ys = model.apply(params, pts.reshape((n * b, *pts.shape[2:])))
  return ys.reshape((n, b, *ys.shape[1:]))


def _check_sound_and_within_ibp(model, shape, seed, batch=2):
  params = _init(model, shape, seed)
  box = _random_box(seed, batch, shape)
  ys = _outputs(model, params, _samples_per_example(box, seed))
  ibp = bj.ibp(model.apply)(params, box)
  for inter in ("crown", "ibp"):
    out = crown(model.apply, intermediate=inter)(params, box)
    assert out.shape == ys.shape[1:]
    assert_inside(out, ys, what=f"crown(intermediate={inter!r})")
    # never looser than IBP (up to float noise in the comparison of two float computations)
    tol = 1e-5 * (1 + np.abs(np.asarray(ibp.lower)))
    assert np.all(np.asarray(out.lower) >= np.asarray(ibp.lower) - tol)
    assert np.all(np.asarray(out.upper) <= np.asarray(ibp.upper) + tol)
  return out, ibp


@pytest.mark.parametrize("seed", [0, 1, pytest.param(2, marks=pytest.mark.slow),
                                  pytest.param(3, marks=pytest.mark.slow),
                                  pytest.param(4, marks=pytest.mark.slow),
                                  pytest.param(5, marks=pytest.mark.slow)])
def test_random_mlp_sound_and_within_ibp(seed):
  model, shape = _random_mlp(seed)
  _check_sound_and_within_ibp(model, shape, seed)


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow),
                                  pytest.param(2, marks=pytest.mark.slow),
                                  pytest.param(3, marks=pytest.mark.slow)])
def test_random_cnn_sound_and_within_ibp(seed):
  model, shape = _random_cnn(seed)
  _check_sound_and_within_ibp(model, shape, seed)


def test_all_vertices_of_small_box():
  """Every one of the 2^10 vertices plus 10^4 uniform points of a 10-d box."""
  model = MLP((16, 16), 3)
  params = _init(model, (10,), 0)
  box = bj.Interval.around(jnp.linspace(-1, 1, 10)[None], 0.3)
  corners = np.array(np.meshgrid(*[[0, 1]] * 10)).reshape(10, -1).T
  verts = np.where(corners == 1, np.asarray(box.upper), np.asarray(box.lower))
  uni = jax.random.uniform(jax.random.PRNGKey(0), (N_SAMPLES, 1, 10), minval=box.lower,
                           maxval=box.upper)
  pts = jnp.concatenate([jnp.asarray(verts, jnp.float32)[:, None], uni])
  ys = _outputs(model, params, pts)
  out = crown(model.apply)(params, box)
  assert_inside(out, ys, what="crown")
  # not vacuous: tighter than IBP and within a small factor of the sampled range
  assert np.all(np.asarray(out.width) < np.asarray(bj.ibp(model.apply)(params, box).width))
  assert np.all(np.asarray(out.width) <= 5 * np.asarray(ys.max(0) - ys.min(0)))


@pytest.mark.parametrize("model,shape", [(MLP((8, 8), 3), (5,)),
                                         (CNN((3,), 3, 2, "SAME", True, 6, 3), (8, 8, 2))])
def test_point_box_reproduces_fn(model, shape):
  params = _init(model, shape, 1)
  x = jax.random.normal(jax.random.PRNGKey(3), (3, *shape))
  out = crown(model.apply)(params, bj.Interval.point(x))
  y = model.apply(params, x)
  np.testing.assert_allclose(out.lower, y, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(out.upper, y, atol=1e-5, rtol=1e-5)


def test_jit_matches_eager_and_batch_axis_none():
  model = CNN((2,), 3, 2, "SAME", True, 5, 3)
  params = _init(model, (6, 6, 1), 2)
  box = _random_box(2, 3, (6, 6, 1))
  eager = crown(model.apply)(params, box)
  jitted = jax.jit(crown(model.apply))(params, box)
  np.testing.assert_allclose(jitted.lower, eager.lower, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(jitted.upper, eager.upper, rtol=1e-5, atol=1e-5)
  # the whole batch as one problem: cross-example coefficients vanish, same bounds
  whole = crown(model.apply, batch_axis=None)(params, box)
  np.testing.assert_allclose(whole.lower, eager.lower, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(whole.upper, eager.upper, rtol=1e-4, atol=1e-4)
  # chunking does not change the result
  chunked = crown(model.apply, chunk_size=2)(params, box)
  np.testing.assert_allclose(chunked.lower, eager.lower, rtol=1e-5, atol=1e-5)


def test_grad_wrt_endpoints_and_params_matches_finite_differences():
  """Certified training differentiates CROWN bounds: w.r.t. the box endpoints and the weights."""
  model = MLP((8,), 3)
  params = _init(model, (4,), 3)
  x = jax.random.uniform(jax.random.PRNGKey(3), (2, 4))
  bound = crown(model.apply, batch_axis=None)  # one small program: cheap to differentiate

  @jax.jit
  def width(lo, hi, p):
    out = bound(p, bj.Interval(lo, hi))
    return jnp.sum(out.upper - out.lower)

  lo, hi = x - 0.05, x + 0.05
  g_lo, g_hi, g_p = jax.jit(jax.grad(width, argnums=(0, 1, 2)))(lo, hi, params)
  assert np.all(np.isfinite(g_lo)) and np.all(np.isfinite(g_hi))
  assert any(np.any(np.asarray(g) != 0) for g in jax.tree_util.tree_leaves(g_p))
  for i in range(4):
    d = jnp.zeros_like(hi).at[0, i].set(1e-3)
    fd = (width(lo, hi + d, params) - width(lo, hi - d, params)) / 2e-3
    np.testing.assert_allclose(g_hi[0, i], fd, rtol=0.02, atol=2e-3)
  k = params["params"]["Dense_0"]["kernel"]
  d = jnp.zeros_like(k).at[1, 2].set(1e-3)
  shift = lambda s: {"params": {**params["params"],
                                "Dense_0": {**params["params"]["Dense_0"], "kernel": k + s * d}}}
  fd = (width(lo, hi, shift(1)) - width(lo, hi, shift(-1))) / 2e-3
  np.testing.assert_allclose(g_p["params"]["Dense_0"]["kernel"][1, 2], fd, rtol=0.02, atol=2e-3)


def test_tighter_than_ibp_on_deep_mlp(record_property):
  """A 6-layer ReLU MLP: CROWN beats IBP by a wide margin (mean width ratio reported)."""
  model = MLP((64,) * 6, 10)
  params = _init(model, (20,), 4)
  x = jax.random.uniform(jax.random.PRNGKey(5), (4, 20))
  box = bj.Interval.around(x, 0.05)
  ibp = bj.ibp(model.apply)(params, box)
  out = crown(model.apply)(params, box)
  cibp = crown(model.apply, intermediate="ibp")(params, box)
  ratio = float(jnp.mean(out.width / ibp.width))
  record_property("crown_over_ibp_mean_width_ratio", ratio)
  record_property("crown_ibp_over_ibp_mean_width_ratio", float(jnp.mean(cibp.width / ibp.width)))
  print(f"mean width ratio CROWN/IBP = {ratio:.4f}, CROWN-IBP/IBP = "
        f"{float(jnp.mean(cibp.width / ibp.width)):.4f}")
  assert ratio < 0.5
  assert bool(jnp.all(out.width < ibp.width))
  assert float(jnp.mean(out.width)) <= float(jnp.mean(cibp.width))
  ys = _outputs(model, params, _samples_per_example(box, 5))
  assert_inside(out, ys, what="crown deep mlp")


def test_affine_function_is_exact():
  """No ReLU: CROWN gives the exact range ``W c ± |W| r`` of an affine map."""
  w = jax.random.normal(jax.random.PRNGKey(0), (6, 4))
  b = jnp.arange(4.0)
  f = lambda w, b, x: x @ w + b
  box = bj.Interval.around(jax.random.normal(jax.random.PRNGKey(1), (2, 6)), 0.1)
  out = crown(f)(w, b, box)
  np.testing.assert_allclose(out.lower, box.center @ w + b - box.radius @ jnp.abs(w), rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(out.upper, box.center @ w + b + box.radius @ jnp.abs(w), rtol=1e-5,
                             atol=1e-5)


def test_nested_calls_fanout_clip_and_pytrees():
  """jit, checkpoint, custom_vjp, residual fan-out, clip (max/min with constants), two boxes
  and a dict output."""
  k1, k2 = jax.random.split(jax.random.PRNGKey(7))
  w1 = jax.random.normal(k1, (5, 5))
  w2 = jax.random.normal(k2, (5, 5))

  @jax.custom_vjp
  def scale(x):
    return 0.5 * x
  scale.defvjp(lambda x: (scale(x), None), lambda _, g: (0.5 * g,))

  @jax.jit
  def block(x):
    return jax.nn.relu(x @ w1) + x  # residual: x is used twice

  def f(params, inputs):
    h = jax.checkpoint(block)(inputs["a"]) - scale(inputs["b"])
    h = jnp.clip(h, -1.0, 0.7) @ params["w"]
    return {"out": jax.nn.relu(h), "mean": jnp.mean(h, axis=-1, keepdims=True)}

  params = {"w": w2}
  boxes = {"a": bj.Interval.around(jax.random.normal(k1, (2, 5)), 0.3),
           "b": bj.Interval.around(jax.random.normal(k2, (2, 5)), 0.2)}
  out = crown(f)(params, boxes)
  keys = jax.random.split(jax.random.PRNGKey(8), 2)
  pa = jnp.stack([sample_box(jax.random.fold_in(keys[0], b), boxes["a"][b], N_SAMPLES)
                  for b in range(2)], 1)
  pb = jnp.stack([sample_box(jax.random.fold_in(keys[1], b), boxes["b"][b], N_SAMPLES)
                  for b in range(2)], 1)
  ys = jax.vmap(lambda a, b: f(params, {"a": a, "b": b}))(pa, pb)
  assert_inside(out["out"], ys["out"], what="out")
  assert_inside(out["mean"], ys["mean"], what="mean")


def test_removed_sound_fp_keyword_fails_clearly():
  """``sound_fp`` (the old name of ``sound``) was removed: Python's TypeError names it."""
  with pytest.raises(TypeError, match="sound_fp"):
    crown(lambda x: x, sound_fp=True)


def test_sound_mode_holds_in_exact_arithmetic():
  """Sound mode encloses the float64 evaluation (a proxy for exact arithmetic) with zero
  tolerance, and contains the default-mode bounds."""
  model = MLP((16, 16, 16), 4)
  params = _init(model, (8,), 9)
  x = jax.random.uniform(jax.random.PRNGKey(9), (2, 8))
  box = bj.Interval.around(x, 0.05)
  fast = crown(model.apply)(params, box)
  sound = crown(model.apply, sound=True)(params, box)
  assert bool(jnp.all(sound.lower <= fast.lower)) and bool(jnp.all(sound.upper >= fast.upper))
  # the price is small next to the magnitudes involved (a γ_n-relative slack)
  scale = 1 + jnp.abs(fast.lower) + jnp.abs(fast.upper)
  assert float(jnp.max((sound.width - fast.width) / scale)) < 1e-4
  pts = _samples_per_example(box, 9)
  with jax.enable_x64(True):
    p64 = jax.tree_util.tree_map(lambda a: jnp.asarray(np.asarray(a), jnp.float64), params)
    ys = np.asarray(_outputs(model, p64, jnp.asarray(np.asarray(pts), jnp.float64)))
  assert ys.dtype == np.float64
  assert_inside(sound, ys, tol=0.0, what="sound")
  sibp = crown(model.apply, intermediate="ibp", sound=True)(params, box)
  assert_inside(sibp, ys, tol=0.0, what="sound crown-ibp")
  ibp_sound = bj.ibp(model.apply, sound=True)(params, box)
  assert bool(jnp.all(sibp.lower >= ibp_sound.lower)) and bool(jnp.all(sibp.upper <= ibp_sound.upper))


def test_unsupported_primitive_names_it_and_the_line():
  """A primitive with neither a linear relaxation nor an interval rule raises, naming it and
  the user's line; one with an interval rule only falls back to it with a warning."""
  f = lambda x: jnp.sin(x) @ jnp.ones((3, 2))  # the line below is reported
  box = bj.Interval.around(jnp.zeros((1, 3)), 0.1)
  with pytest.raises(UnsupportedPrimitiveError, match=r"'sin'.*test_crown.py:\d+"):
    crown(f)(box)
  g = lambda x: jnp.cbrt(x) @ jnp.ones((3, 2))  # cbrt: an interval rule, no linear relaxation
  with pytest.warns(CrownFallbackWarning, match=r"'cbrt' at .*test_crown.py:\d+.*interval"):
    out = crown(g)(box)
  ref = bj.ibp(g)(box)
  np.testing.assert_allclose(out.lower, ref.lower, rtol=1e-6)
  np.testing.assert_allclose(out.upper, ref.upper, rtol=1e-6)


def test_bad_inputs_raise_value_error():
  model = MLP((4,), 2)
  params = _init(model, (3,), 0)
  box = bj.Interval.around(jnp.zeros((2, 3)), 0.1)
  with pytest.raises(ValueError, match="intermediate"):
    crown(model.apply, intermediate="deeppoly")
  with pytest.raises(ValueError, match="batch_axis"):
    crown(model.apply, batch_axis="0")
  with pytest.raises(ValueError, match="sound"):
    crown(model.apply, sound=1)
  with pytest.raises(ValueError, match="chunk_size"):
    crown(model.apply, chunk_size=0)
  with pytest.raises(ValueError, match="out of range"):
    crown(model.apply, batch_axis=3)(params, box)
  with pytest.raises(ValueError, match="batch size"):
    crown(lambda a, b: a + b)(box, bj.Interval.around(jnp.zeros((3, 3)), 0.1))
  with pytest.raises(ValueError, match="floating point"):
    crown(lambda a: a)(bj.Interval(jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 3), jnp.int32)))
  with pytest.raises(ValueError, match="batch axis of size 1"):
    crown(lambda a: jnp.sum(a))(box)
  with pytest.raises(ValueError, match="lower > upper"):
    bj.Interval(jnp.ones(3), jnp.zeros(3))


def test_no_box_is_plain_call():
  model = MLP((4,), 2)
  params = _init(model, (3,), 0)
  x = jnp.ones((2, 3))
  np.testing.assert_array_equal(crown(model.apply)(params, x), model.apply(params, x))


@pytest.mark.parametrize("layout,strides,padding,rhs_dil", [
    (("NHWC", "HWIO", "NHWC"), (2, 2), ((1, 2), (1, 2)), (1, 1)),
    pytest.param(("NCHW", "OIHW", "NCHW"), (2, 3), ((0, 1), (2, 0)), (1, 1),
                 marks=pytest.mark.slow),
    (("NHWC", "HWIO", "NHWC"), (1, 2), "VALID", (2, 1)),
])
def test_conv_transpose_matches_vjp(layout, strides, padding, rhs_dil):
  """The materialised-kernel conv transpose equals JAX's VJP of the convolution."""
  from boundjax.domains import linear
  xs = (1, 9, 7, 3) if layout[0] == "NHWC" else (1, 3, 9, 7)
  ws = (3, 2, 3, 4) if layout[1] == "HWIO" else (4, 3, 3, 2)
  w = jax.random.normal(jax.random.PRNGKey(0), ws)
  f = lambda x: jax.lax.conv_general_dilated(x, w, strides, padding, rhs_dilation=rhs_dil,
                                             dimension_numbers=layout)
  closed = jax.make_jaxpr(f)(jnp.zeros(xs))
  from boundjax.core import program as prog_lib
  prog = linear.rules.from_core(prog_lib.flatten(closed))
  linear.rules.classify_program(prog, [True])
  cenv = linear.rules.eval_concrete(prog, [None])
  (e,) = [q for q in prog.eqns if q.name == "conv_general_dilated"]
  y_shape = e.outvars[0].shape
  rows = jax.random.normal(jax.random.PRNGKey(1), (5, *y_shape))
  _, vjp = jax.vjp(f, jnp.zeros(xs))
  want = jax.vmap(vjp)(rows)[0]
  got = linear.backward.transpose_rows(e, cenv, vjp, rows)[0]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  # its derivatives (α-CROWN differentiates through it): in the rows, and in the kernel
  v = jax.random.normal(jax.random.PRNGKey(2), want.shape)
  grad = jax.grad(lambda r: jnp.sum(v * linear.backward.transpose_rows(e, cenv, vjp, r)[0]))
  grad_ref = jax.grad(lambda r: jnp.sum(v * jax.vmap(vjp)(r)[0]))
  np.testing.assert_allclose(grad(rows), grad_ref(rows), rtol=1e-5, atol=1e-5)

  def transposed(w_):
    conv = lambda x: jax.lax.conv_general_dilated(x, w_, strides, padding,  # noqa: E731
                                                  rhs_dilation=rhs_dil, dimension_numbers=layout)
    return jax.vjp(conv, jnp.zeros(xs))[1](rows[0])[0]
  ours = lambda w_: jnp.sum(v[0] * linear.prefix._conv_transposed(e, rows[0], w_))  # noqa: E731
  ref = lambda w_: jnp.sum(v[0] * transposed(w_))  # noqa: E731
  np.testing.assert_allclose(jax.grad(ours)(w), jax.grad(ref)(w), rtol=1e-5, atol=1e-5)


class _TwoConv(nn.Module):
  """conv-relu-conv(-relu-dense); returns the second conv's pre-activations and the logits."""
  f1: int
  f2: int
  k1: int
  k2: int
  s1: int
  s2: int
  pad1: Any
  pad2: Any

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(self.f1, (self.k1, self.k1), strides=self.s1, padding=self.pad1)(x))
    pre = nn.Conv(self.f2, (self.k2, self.k2), strides=self.s2, padding=self.pad2)(x)
    h = nn.relu(pre).reshape((pre.shape[0], -1))
    return pre, nn.Dense(3)(nn.relu(nn.Dense(7)(h)))


@pytest.mark.parametrize("cfg", [
    dict(f1=3, f2=4, k1=3, k2=3, s1=1, s2=1, pad1="SAME", pad2="SAME", hw=(12, 12), c=1),
    pytest.param(dict(f1=4, f2=3, k1=4, k2=4, s1=2, s2=1, pad1="VALID", pad2="VALID",
                      hw=(18, 18), c=1), marks=pytest.mark.slow),
    dict(f1=2, f2=5, k1=3, k2=2, s1=2, s2=2, pad1=((1, 2), (0, 1)), pad2="SAME", hw=(15, 13),
         c=2),
])
def test_patches_equal_dense_pass_on_random_cnns(cfg, monkeypatch):
  """The windowed backward pass gives the dense pass's bounds (intermediate and final), on
  random CNNs with strides, SAME/VALID/explicit padding and several input channels; the windowed
  path is really taken, and the bounds hold on sampled points."""
  from boundjax.domains import linear
  calls = []
  real = linear.windows.backward_patches
  monkeypatch.setattr(linear.windows, "backward_patches",
                      lambda *a: calls.append(1) or real(*a))
  hw, c = cfg.pop("hw"), cfg.pop("c")
  model = _TwoConv(**cfg)
  shape = (*hw, c)
  for seed in range(1):
    params = _init(model, shape, seed)
    box = _random_box(seed, 2, shape)
    n_before = len(calls)
    fast = crown(model.apply)(params, box)
    assert len(calls) > n_before, "the windowed path was not used"
    dense = crown(model.apply, patches=False)(params, box)
    for a, b in zip(fast, dense):
      scale = 1 + np.abs(np.asarray(b.lower)) + np.abs(np.asarray(b.upper))
      np.testing.assert_array_less(np.abs(np.asarray(a.lower) - np.asarray(b.lower)), 1e-5 * scale)
      np.testing.assert_array_less(np.abs(np.asarray(a.upper) - np.asarray(b.upper)), 1e-5 * scale)
    pts = _samples_per_example(box, seed, n=2000)
    pre, logits = model.apply(params, pts.reshape((-1, *shape)))
    assert_inside(fast[0], pre.reshape((2000, 2, *pre.shape[1:])), what="conv2 pre-activation")
    assert_inside(fast[1], logits.reshape((2000, 2, 3)), what="logits")


@pytest.mark.slow
def test_alpha_on_intermediate_layers_keeps_the_windowed_pass(monkeypatch):
  """``alpha_intermediate`` on a CNN: the convolution's bounds stay windowed inside the α steps
  (its slopes are CROWN's, rerun on the tighter bounds below), the dense layers get their own
  slopes; never looser than α on the output alone, sound on 10^4 sampled points."""
  from boundjax.domains import linear
  calls = []
  real = linear.windows.backward_patches
  monkeypatch.setattr(linear.windows, "backward_patches", lambda *a: calls.append(1) or real(*a))
  model = _TwoConv(3, 4, 3, 3, 1, 1, "SAME", "SAME")
  shape = (8, 8, 1)
  params = _init(model, shape, 3)
  logits = lambda p, x: model.apply(p, x)[1]  # noqa: E731
  box = bj.Interval.around(_random_box(3, 2, shape).center, 0.05)
  out_only = crown(logits, alpha=True, alpha_steps=10)(params, box)
  n_before = len(calls)
  mid = crown(logits, alpha=True, alpha_steps=10, alpha_intermediate=True)(params, box)
  assert len(calls) > n_before, "the windowed pass was not used"
  tol = 1e-5 * (1 + np.abs(np.asarray(out_only.lower)))
  assert np.all(np.asarray(mid.lower) >= np.asarray(out_only.lower) - tol)
  assert np.all(np.asarray(mid.upper) <= np.asarray(out_only.upper) + tol)
  pts = _samples_per_example(box, 3, n=5000)
  ys = logits(params, pts.reshape((-1, *shape))).reshape((5000, 2, 3))
  assert_inside(mid, ys, what="alpha_intermediate on a CNN")


def test_patches_flag_is_checked_and_used_in_both_modes(monkeypatch):
  from boundjax.domains import linear
  with pytest.raises(ValueError, match="patches"):
    crown(lambda x: x, patches=1)
  calls = []
  real = linear.windows.backward_patches
  monkeypatch.setattr(linear.windows, "backward_patches", lambda *a: calls.append(1) or real(*a))
  model = _TwoConv(3, 4, 3, 3, 1, 1, "SAME", "SAME")
  params = _init(model, (8, 8, 1), 0)
  box = _random_box(0, 1, (8, 8, 1))
  jax.eval_shape(crown(model.apply, sound=True, patches=False), params, box)  # traced only
  assert not calls
  jax.eval_shape(crown(model.apply, sound=True), params, box)
  assert calls
  calls.clear()
  jax.eval_shape(crown(model.apply), params, box)
  assert calls
  # the whole batch as one problem: rows of both examples, windows in each
  box2 = _random_box(1, 2, (8, 8, 1))
  whole = crown(model.apply, batch_axis=None)(params, box2)
  dense = crown(model.apply, batch_axis=None, patches=False)(params, box2)
  for a, b in zip(whole, dense):
    np.testing.assert_allclose(a.lower, b.lower, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(a.upper, b.upper, rtol=1e-5, atol=1e-5)


def _sound_windowed_cases(model, shape, seed, radii):
  """(box, sound windowed bounds, sound dense bounds, float bounds, float64 values) per radius."""
  params = _init(model, shape, seed)
  with jax.enable_x64(True):
    p64 = jax.tree_util.tree_map(lambda a: jnp.asarray(np.asarray(a), jnp.float64), params)
  win_f = jax.jit(crown(model.apply, sound=True))
  dense_f = jax.jit(crown(model.apply, sound=True, patches=False))
  fast_f = jax.jit(crown(model.apply))
  for rad in radii:
    box = bj.Interval.around(_random_box(seed, 2, shape).center * 30.0, rad)
    win, dense, fast = win_f(params, box), dense_f(params, box), fast_f(params, box)
    pts = _samples_per_example(box, seed, n=N_SAMPLES if rad else 1)
    with jax.enable_x64(True):
      ys = model.apply(p64, jnp.asarray(np.asarray(pts), jnp.float64).reshape((-1, *shape)))
      ys = [np.asarray(y).reshape((len(pts), 2, *y.shape[1:])) for y in ys]
    yield rad, win, dense, fast, ys


@pytest.mark.parametrize("cfg", [
    dict(f1=3, f2=4, k1=3, k2=3, s1=1, s2=1, pad1="SAME", pad2="SAME", hw=(10, 10), c=1),
    pytest.param(dict(f1=2, f2=5, k1=3, k2=2, s1=2, s2=2, pad1=((1, 2), (0, 1)), pad2="SAME",
                      hw=(15, 13), c=2), marks=pytest.mark.slow),
])
def test_sound_windowed_pass_encloses_float64(cfg, monkeypatch):
  """Sound mode's windowed pass: taken, encloses the network evaluated in float64 with zero
  tolerance (10^4 samples per box, and point boxes, where float32 rounding alone decides),
  contains the float-mode bounds and is within a γ_n-relative slack of the sound dense pass.
  Without its rounding slack the point boxes fail: the slack is what makes it sound."""
  from boundjax.domains import linear
  calls = []
  real = linear.windows.backward_patches
  monkeypatch.setattr(linear.windows, "backward_patches", lambda *a: calls.append(1) or real(*a))
  # CROWN's own bounds, not met with the interval pass (which alone bounds a point box exactly)
  monkeypatch.setattr(linear.backward, "_intersect", lambda a, lo, hi, sound: bj.Interval(
      jnp.where(jnp.isfinite(lo), lo, a.lower), jnp.where(jnp.isfinite(hi), hi, a.upper),
      validate=False))
  hw, c = cfg.pop("hw"), cfg.pop("c")
  model, shape = _TwoConv(**cfg), (*hw, c)
  for rad, win, dense, fast, ys in _sound_windowed_cases(model, shape, 4, (0.0, 1e-6, 0.05)):
    assert calls, "the windowed path was not used in sound mode"
    for w, d, f, y, what in zip(win, dense, fast, ys, ("conv2", "logits")):
      assert_inside(w, y, tol=0.0, what=f"sound windowed {what}, radius {rad}")
      assert bool(jnp.all(w.lower <= f.lower)) and bool(jnp.all(w.upper >= f.upper))
      # its price is of the dense pass's order (fewer terms per sum: often below it)
      scale = 1e-6 * (1 + jnp.abs(d.lower) + jnp.abs(d.upper))
      assert bool(jnp.all(f.lower - w.lower <= 2 * (f.lower - d.lower) + scale))
      assert bool(jnp.all(w.upper - f.upper <= 2 * (d.upper - f.upper) + scale))
  # the slack has teeth: with it set to zero, float32 rounding escapes a point box's bound
  monkeypatch.setattr(linear.windows, "_window_slack",
                      lambda plan, *a: jnp.zeros((2, plan.bias_t.shape[0]), plan.bias_t.dtype))
  escaped = 0
  for rad, win, _, _, ys in _sound_windowed_cases(model, shape, 4, (0.0,)):
    lo, hi = np.asarray(win[0].lower, np.float64), np.asarray(win[0].upper, np.float64)
    escaped += int(np.sum((ys[0] < lo) | (ys[0] > hi)))
  assert escaped > 0


def test_no_window_pattern_is_built_for_a_target_that_sees_all_of_its_relu(monkeypatch):
  """A dense layer behind a convolution's ReLU sees every entry of it: the windowed plan is
  refused from the target's own pattern, before the convolution's pattern (an identity of the
  convolution's size at trace time: 4.4 GB on VeriVital's 23,328-wide first layer in float64)
  is built; the bounds still hold."""
  from boundjax.domains import linear
  sizes = []
  real = linear.windows._support
  monkeypatch.setattr(linear.windows, "_support",
                      lambda prog, t, *a: sizes.append(t.size) or real(prog, t, *a))

  class ConvDense(nn.Module):
    @nn.compact
    def __call__(self, x):
      h = nn.relu(nn.Conv(6, (3, 3), padding="VALID")(x))
      return nn.Dense(3)(h.reshape((h.shape[0], -1)))

  model, shape = ConvDense(), (10, 10, 1)
  params = _init(model, shape, 0)
  box = _random_box(0, 2, shape)
  out = crown(model.apply, sound=True)(params, box)
  assert sizes and max(sizes) == 3  # only the output's own pattern (3 rows)
  pts = _samples_per_example(box, 0, n=2000)
  assert_inside(out, _outputs(model, params, pts), what="conv-dense, sound")


def test_chunks_are_even_and_sized_for_what_is_alive():
  """`_even_chunk` never exceeds the budget's chunk and splits a batch into equal parts (no
  remainder body); `_live_factor` counts sound mode's slack arrays and logistic/tanh
  relaxations (measured factors, see its docstring); chunked and whole-batch bounds agree."""
  from boundjax.domains.linear import api
  for n in range(1, 70):
    for c in range(1, 80):
      e = api._even_chunk(c, n)
      assert 1 <= e <= min(c, n) and -(-n // e) == -(-n // min(c, n))
  assert api._even_chunk(71, 128) == 64
  model = MLP((8, 8), 3)
  params = _init(model, (5,), 1)
  box = _random_box(1, 6, (5,))
  whole = crown(model.apply, sound=True)(params, box)
  chunked = crown(model.apply, sound=True, chunk_size=4)(params, box)  # 6 -> 2 x 3
  np.testing.assert_allclose(chunked.lower, whole.lower, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(chunked.upper, whole.upper, rtol=1e-6, atol=1e-6)
  # the factor, on equations as the engine classifies them (logistic: a relaxed unary)
  from types import SimpleNamespace as Eqn
  relu_prog = Eqn(eqns=[Eqn(kind="affine", name="dot_general"), Eqn(kind="relu", name="max")])
  sig_prog = Eqn(eqns=[Eqn(kind="affine", name="dot_general"),
                       Eqn(kind="nonlinear", name="logistic")])
  assert api._live_factor(relu_prog, False) == 3.0
  assert api._live_factor(relu_prog, True) == 6.0
  assert api._live_factor(sig_prog, False) == 7.5
  assert api._live_factor(sig_prog, True) == 15.0

"""Tests of CROWN's linear relaxations of nonlinear operations and of its interval fallback
(`boundjax.domains.linear`): every bound is checked against 10,000 sampled points of the box (half
at random vertices) plus every vertex of the box; relaxed operations must not warn, fallbacks
must warn once naming the primitive and the line."""

from __future__ import annotations

import itertools
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import boundjax as bj
from boundjax.domains.linear import CrownFallbackWarning, crown
from tests.helpers import assert_inside, sample_box

N_SAMPLES = 10_000
D = 6


def _layer(seed: int, d_in: int, d_out: int):
  rng = np.random.default_rng(seed)
  w = jnp.asarray(rng.normal(size=(d_in, d_out)) / np.sqrt(d_in), jnp.float32)
  b = jnp.asarray(rng.normal(size=(d_out,)) * 0.3, jnp.float32)
  return w, b


def _points(box: bj.Interval, seed: int) -> jnp.ndarray:
  """Sampled points of a small box plus all of its vertices (leading axis)."""
  pts = sample_box(jax.random.PRNGKey(seed), box, N_SAMPLES)
  lo, hi = np.asarray(box.lower).ravel(), np.asarray(box.upper).ravel()
  if lo.size <= 12:
    corners = np.array(list(itertools.product(*zip(lo, hi))), np.float32)
    pts = jnp.concatenate([pts, jnp.asarray(corners.reshape((-1, *box.shape)))])
  return pts


def _bound(fn, box, *, expect_warning: str | None = None, **kw):
  """``crown(fn)(box)``, asserting a fallback warning (or none)."""
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = crown(fn, batch_axis=None, **kw)(box)
  msgs = [str(w.message) for w in caught if issubclass(w.category, CrownFallbackWarning)]
  if expect_warning is None:
    assert not msgs, msgs
  else:
    assert any(expect_warning in m and "test_crown_relaxations.py" in m for m in msgs), msgs
  return out


def _check(fn, box, seed=0, **kw):
  out = _bound(fn, box, **kw)
  ys = jax.vmap(fn)(_points(box, seed))
  assert_inside(out, ys, what=getattr(fn, "__name__", "fn"))
  ibp = bj.ibp(fn)(box)
  tol = 1e-5 * (1 + np.abs(np.asarray(ibp.lower)))
  assert np.all(np.asarray(out.lower) >= np.asarray(ibp.lower) - tol)
  return out, ibp


def _mlp_around(act, seed: int = 0, width: int = 8):
  """x -> W2 act(W1 x + b1) + b2: the activation between two random layers."""
  w1, b1 = _layer(seed, D, width)
  w2, b2 = _layer(seed + 1, width, 3)
  return lambda x: act(x @ w1 + b1) @ w2 + b2


UNARY = {
    "exp": jnp.exp,
    "expm1": jnp.expm1,
    "tanh": jnp.tanh,
    "logistic": jax.nn.sigmoid,
    "erf": lax.erf,
    "erfc": lax.erfc,
    "atan": jnp.arctan,
    "square": jnp.square,
    "integer_pow2": lambda x: x ** 2,
    "integer_pow4": lambda x: x ** 4,
    "abs": jnp.abs,
    "leaky_relu": jax.nn.leaky_relu,
    "leaky_max": lambda x: jnp.maximum(x, 0.2 * x),
    "softplus": jax.nn.softplus,
    "gelu_exact": lambda x: jax.nn.gelu(x, approximate=False),
    "silu": jax.nn.silu,
    "x_times_tanh": lambda x: x * jnp.tanh(x),
}
POSITIVE = {  # need inputs inside their real domain: applied to 0.5 + x^2
    "log": jnp.log,
    "log1p": jnp.log1p,
    "sqrt": jnp.sqrt,
    "rsqrt": lax.rsqrt,
    "reciprocal": lambda d: 1.0 / d,
    "div_both": lambda d: jnp.flip(d, -1) / d,
}


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("radius", [0.05, 1.0])
def test_unary_relaxation_sound_no_warning(name, radius):
  fn = _mlp_around(UNARY[name], seed=len(name))
  x = jax.random.normal(jax.random.PRNGKey(len(name)), (D,))
  _check(fn, bj.Interval.around(x, radius), seed=3)


@pytest.mark.parametrize("name", sorted(POSITIVE))
def test_positive_domain_relaxation_sound(name):
  w1, b1 = _layer(7, D, 8)
  w2, b2 = _layer(8, 8, 3)
  fn = lambda x: POSITIVE[name](0.5 + jnp.square(x @ w1 + b1)) @ w2 + b2
  box = bj.Interval.around(jax.random.normal(jax.random.PRNGKey(1), (D,)), 0.3)
  _check(fn, box)


def test_tanh_network_tighter_than_interval_fallback():
  """The tanh lines make CROWN tighter than IBP on a 3-layer tanh network (not just sound)."""
  ws = [_layer(s, a, b) for s, (a, b) in enumerate([(D, 16), (16, 16), (16, 4)])]

  def fn(x):
    for w, b in ws[:-1]:
      x = jnp.tanh(x @ w + b)
    return x @ ws[-1][0] + ws[-1][1]

  out, ibp = _check(fn, bj.Interval.around(jnp.linspace(-1, 1, D), 0.1))
  assert float(jnp.mean(out.width)) < 0.8 * float(jnp.mean(ibp.width))


def test_product_of_two_boxes_mccormick():
  fn = lambda x: (x[:3] * x[3:]) @ jnp.ones((3, 2)) + x[:2] * x[1:3]
  _check(fn, bj.Interval.around(jnp.array([0.3, -1.0, 2.0, 0.5, -0.2, 1.0]), 0.5))
  # two Interval arguments
  box = bj.Interval.around(jnp.zeros((4,)), 1.0)
  f2 = lambda a, b: a * b + a
  with warnings.catch_warnings():
    warnings.simplefilter("error", CrownFallbackWarning)
    out = crown(f2, batch_axis=None)(box, bj.Interval.around(jnp.ones((4,)), 0.5))
  a = sample_box(jax.random.PRNGKey(0), box, N_SAMPLES)
  b = sample_box(jax.random.PRNGKey(1), bj.Interval.around(jnp.ones((4,)), 0.5), N_SAMPLES)
  assert_inside(out, f2(a, b), what="a*b+a")


def test_max_min_of_two_boxes():
  w1, b1 = _layer(3, D, 4)
  w2, b2 = _layer(4, D, 4)
  for op in (jnp.maximum, jnp.minimum):
    _check(lambda x: op(x @ w1 + b1, x @ w2 + b2) @ jnp.ones((4, 2)),
           bj.Interval.around(jnp.linspace(-1, 1, D), 0.4))


def test_max_pooling_relaxed_and_reduce_max():
  class PoolCNN(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = nn.relu(nn.Conv(3, (3, 3))(x))
      x = nn.max_pool(x, (2, 2), (2, 2))
      return nn.Dense(3)(x.reshape((x.shape[0], -1)))

  model = PoolCNN()
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 6, 6, 1)))
  x = jax.random.uniform(jax.random.PRNGKey(1), (2, 6, 6, 1))
  box = bj.Interval.around(x, 0.05)
  out = crown(model.apply)(params, box)
  pts = jnp.stack([sample_box(jax.random.PRNGKey(b), box[b], N_SAMPLES) for b in range(2)], 1)
  ys = model.apply(params, pts.reshape((-1, 6, 6, 1))).reshape((N_SAMPLES, 2, 3))
  assert_inside(out, ys, what="max_pool cnn")
  ibp = bj.ibp(model.apply)(params, box)
  assert float(jnp.mean(out.width)) <= float(jnp.mean(ibp.width)) + 1e-6
  for op, seed in ((jnp.max, 5), (jnp.min, 6)):
    pool = lambda h: (op(h.reshape((2, 4)), axis=-1, keepdims=True) * jnp.ones((2, 4))).reshape(-1)
    _check(_mlp_around(pool, seed=seed), bj.Interval.around(jnp.zeros((D,)), 0.5))


def test_softmax_layernorm_attention_fall_back_or_relax_soundly():
  softmax = _mlp_around(lambda h: jax.nn.softmax(h), seed=11)
  _check(softmax, bj.Interval.around(jnp.zeros((D,)), 0.3), expect_warning="softmax")

  ln = nn.LayerNorm()
  ln_params = ln.init(jax.random.PRNGKey(0), jnp.zeros((8,)))
  _check(_mlp_around(lambda h: ln.apply(ln_params, h), seed=12),
         bj.Interval.around(jnp.linspace(-1, 1, D), 0.1))

  att = nn.SelfAttention(num_heads=2, qkv_features=4, out_features=4)
  a_params = att.init(jax.random.PRNGKey(1), jnp.zeros((3, 4)))
  fn = lambda x: att.apply(a_params, x.reshape((3, 2)) @ jnp.ones((2, 4)) * 0.5).reshape(-1)
  out = crown(fn, batch_axis=None)(bj.Interval.around(jnp.linspace(-1, 1, D), 0.05))
  pts = _points(bj.Interval.around(jnp.linspace(-1, 1, D), 0.05), 0)
  assert_inside(out, jax.vmap(fn)(pts), what="attention")


def test_fallback_warns_once_per_primitive_and_is_sound():
  fn = _mlp_around(lambda h: jnp.cumsum(jnp.sort(h)), seed=13)  # sort: interval only
  box = bj.Interval.around(jnp.zeros((D,)), 0.5)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = crown(fn, batch_axis=None)(box)
  msgs = [str(w.message) for w in caught if issubclass(w.category, CrownFallbackWarning)]
  assert len(msgs) == 1 and "'sort'" in msgs[0] and "test_crown_relaxations.py:" in msgs[0]
  assert_inside(out, jax.vmap(fn)(_points(box, 0)), what="sort fallback")


def test_sound_mode_nonlinear_falls_back_and_holds_in_float64():
  """A smooth function without sound lines (exp) falls back to its interval in sound mode."""
  ws = [_layer(s, a, b) for s, (a, b) in enumerate([(D, 8), (8, 3)])]
  fn = lambda x: jnp.exp(x @ ws[0][0] + ws[0][1]) @ ws[1][0] + ws[1][1]
  box = bj.Interval.around(jnp.linspace(-1, 1, D), 0.2)
  out = _bound(fn, box, sound=True, expect_warning="exp")
  pts = np.asarray(_points(box, 0), np.float64)
  with jax.enable_x64(True):
    w64 = [(jnp.asarray(np.asarray(w), jnp.float64), jnp.asarray(np.asarray(b), jnp.float64))
           for w, b in ws]
    ys = np.asarray(jnp.exp(pts @ w64[0][0] + w64[0][1]) @ w64[1][0] + w64[1][1])
  assert_inside(out, ys, tol=0.0, what="sound exp")


@pytest.mark.parametrize("name", ["logistic", "tanh"])
def test_sound_s_shaped_lines_hold_in_float64(name):
  """`sound_unary_lines`: on 4,000 float32 boxes (centres ~N(0, 8), widths from 1e-6 to ~30)
  every finite line is on its side of the function at 2,001 points of its box, evaluated in
  float64 (scipy), with zero tolerance; the float lines of `_s_shaped` are not (they miss by
  about 1e-7 somewhere: what the outward move is for); the move stays below 1e-3."""
  import scipy.special as sp
  from boundjax.domains.linear.rules import _UNARY_LINES, sound_unary_lines
  f = sp.expit if name == "logistic" else np.tanh
  rng = np.random.default_rng(0)
  c = rng.normal(scale=8, size=4000)
  w = np.abs(rng.normal(scale=3, size=4000)) * rng.choice([1e-6, 1e-3, 0.1, 1, 10], 4000)
  l, u = (c - w).astype(np.float32), (c + w).astype(np.float32)
  xs = l + np.linspace(0, 1, 2001)[:, None] * (u.astype(np.float64) - l)
  ys = f(xs)
  worst = {}
  for tag, lines in (("sound", sound_unary_lines(name)), ("float", _UNARY_LINES[name])):
    a_lo, b_lo, a_up, b_up = (np.asarray(x, np.float64) for x in lines(jnp.asarray(l),
                                                                        jnp.asarray(u)))
    lo_ok, up_ok = np.isfinite(a_lo) & np.isfinite(b_lo), np.isfinite(a_up) & np.isfinite(b_up)
    assert lo_ok.mean() > 0.99 and up_ok.mean() > 0.99
    worst[tag] = (float((a_lo * xs + b_lo - ys)[:, lo_ok].max()),
                  float((ys - a_up * xs - b_up)[:, up_ok].max()))
  assert worst["sound"][0] <= 0.0 and worst["sound"][1] <= 0.0, worst
  assert max(worst["float"]) > 0.0, worst  # the check sees float error
  assert min(worst["sound"]) > -1e-3, worst
  assert sound_unary_lines("exp") is None


def test_sound_mode_sigmoid_network_uses_its_lines():
  """A sigmoid network in sound mode is bounded by the sound S-shaped lines (no interval
  fallback warning), tighter than sound IBP, and holds for float64 values (zero tolerance)."""
  ws = [_layer(50 + s, a, b) for s, (a, b) in enumerate([(D, 16), (16, 16), (16, 4)])]

  def fn(x):
    for w, b in ws[:-1]:
      x = jax.nn.sigmoid(3.0 * (x @ w + b))
    return x @ ws[-1][0] + ws[-1][1]

  box = bj.Interval.around(jnp.linspace(-1, 1, D), 0.1)
  out = _bound(fn, box, sound=True)  # fails on any CrownFallbackWarning
  ibp = bj.ibp(fn, sound=True)(box)
  assert float(jnp.mean(out.width)) < 0.8 * float(jnp.mean(ibp.width))
  pts = np.asarray(_points(box, 1), np.float64)
  with jax.enable_x64(True):
    h = jnp.asarray(pts)
    for w, b in ws[:-1]:
      h = jax.nn.sigmoid(3.0 * (h @ jnp.asarray(np.asarray(w), jnp.float64)
                                + jnp.asarray(np.asarray(b), jnp.float64)))
    ys = np.asarray(h @ jnp.asarray(np.asarray(ws[-1][0]), jnp.float64)
                    + jnp.asarray(np.asarray(ws[-1][1]), jnp.float64))
  assert_inside(out, ys, tol=0.0, what="sound sigmoid network")


def test_bfloat16_dense_and_round_trip_are_sound():
  model = nn.Dense(3, dtype=jnp.bfloat16)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, D)))
  box = bj.Interval.around(jax.random.normal(jax.random.PRNGKey(1), (2, D)), 0.1)
  with pytest.warns(CrownFallbackWarning, match="bfloat16"):
    out = crown(model.apply)(params, box)
  pts = jnp.stack([sample_box(jax.random.PRNGKey(b), box[b], N_SAMPLES) for b in range(2)], 1)
  ys = model.apply(params, pts.reshape((-1, D))).reshape((N_SAMPLES, 2, 3))
  assert_inside(out, ys.astype(jnp.float32), tol=0.0, what="bf16 dense")

  w, b = _layer(2, D, 4)
  fn = lambda x: (x.astype(jnp.bfloat16).astype(jnp.float32) - x) * 1000.0 @ w + b
  box = bj.Interval.around(jnp.linspace(-2, 2, D), 0.01)
  with pytest.warns(CrownFallbackWarning, match="bfloat16"):
    out = crown(fn, batch_axis=None)(box)
  ys = jax.vmap(fn)(_points(box, 1))
  assert float(jnp.max(jnp.abs(ys))) > 1e-3  # the rounding error is visible
  assert_inside(out, ys, tol=0.0, what="bf16 round trip")


# ----------------------------------------------------------------------------------------------
# Specifications: bounds of C @ fn(x)
# ----------------------------------------------------------------------------------------------

class _MnistMLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(64)(x))
    x = nn.relu(nn.Dense(32)(x))
    return nn.Dense(10)(x)


class _MnistCNN(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(8, (4, 4), strides=2)(x))
    x = nn.relu(nn.Conv(16, (4, 4), strides=2)(x))
    x = nn.relu(nn.Dense(64)(x.reshape((x.shape[0], -1))))
    return nn.Dense(10)(x)


def _margin_spec(labels) -> jnp.ndarray:
  """Per-example ``C[i]`` with rows ``e_label - e_j`` (j != label): (batch, 9, 10)."""
  eye = np.eye(10, dtype=np.float32)
  return jnp.asarray([[eye[y] - eye[j] for j in range(10) if j != y] for y in labels])


def _check_spec(model, shape, seed, n_samples=N_SAMPLES):
  params = model.init(jax.random.PRNGKey(seed), jnp.zeros((1, *shape)))
  batch = 16
  x = jax.random.uniform(jax.random.PRNGKey(seed + 1), (batch, *shape))
  labels = np.asarray(jax.random.randint(jax.random.PRNGKey(seed + 2), (batch,), 0, 10))
  box = bj.Interval.around(x, 0.01, domain=(0.0, 1.0))
  c = _margin_spec(labels)
  out = crown(model.apply, spec=c)(params, box)
  assert out.shape == (batch, 9)
  logits = crown(model.apply)(params, box)
  cp, cn = jnp.maximum(c, 0), jnp.minimum(c, 0)
  sub_lo = jnp.einsum("bkm,bm->bk", cp, logits.lower) + jnp.einsum("bkm,bm->bk", cn, logits.upper)
  sub_hi = jnp.einsum("bkm,bm->bk", cp, logits.upper) + jnp.einsum("bkm,bm->bk", cn, logits.lower)
  tol = 1e-5 * (1 + jnp.abs(sub_lo))
  assert bool(jnp.all(out.lower >= sub_lo - tol)) and bool(jnp.all(out.upper <= sub_hi + tol))
  # strictly tighter on average (the margin's rows share their path through the network)
  assert float(jnp.mean(out.width)) < float(jnp.mean(sub_hi - sub_lo))
  for b in range(batch):
    pts = sample_box(jax.random.PRNGKey(100 + b), box[b], n_samples)
    ys = model.apply(params, pts) @ c[b].T
    assert_inside(bj.Interval(out.lower[b], out.upper[b]), ys, what=f"spec example {b}")
  # one C for every example equals the per-example C repeated
  shared = crown(model.apply, spec=c[0])(params, box[:2])
  per = crown(model.apply, spec=jnp.stack([c[0], c[0]]))(params, box[:2])
  np.testing.assert_allclose(shared.lower, per.lower, rtol=1e-5, atol=1e-5)
  return out, sub_lo, sub_hi


def test_spec_margins_mnist_mlp_sound_and_tighter():
  _check_spec(_MnistMLP(), (28, 28, 1), 0)


def test_spec_margins_mnist_cnn_sound_and_tighter():
  _check_spec(_MnistCNN(), (28, 28, 1), 1)


def test_spec_batch_axis_none_and_errors():
  w, b = _layer(0, D, 4)
  fn = lambda x: jax.nn.relu(x @ w + b) @ jnp.ones((4, 3))
  box = bj.Interval.around(jnp.zeros((D,)), 0.5)
  c = jnp.asarray([[1.0, -1.0, 0.0], [0.0, 1.0, -1.0]])
  out = crown(fn, batch_axis=None, spec=c)(box)
  assert out.shape == (2,)
  assert_inside(out, jax.vmap(fn)(_points(box, 0)) @ c.T, what="spec unbatched")
  with pytest.raises(ValueError, match="columns"):
    crown(fn, batch_axis=None, spec=jnp.ones((2, 5)))(box)
  with pytest.raises(ValueError, match="sound"):
    crown(fn, batch_axis=None, spec=c, sound=True)
  with pytest.raises(ValueError, match="batch_axis=0"):
    crown(fn, batch_axis=None, spec=jnp.ones((1, 2, 3)))


# ----------------------------------------------------------------------------------------------
# α-CROWN
# ----------------------------------------------------------------------------------------------

def _mlp(ws):
  """The ReLU network of layers ``ws`` (a list of ``(w, b)``)."""
  def fn(x):
    for w, b in ws[:-1]:
      x = jax.nn.relu(x @ w + b)
    return x @ ws[-1][0] + ws[-1][1]
  return fn


def _mlp_float64(ws, pts) -> np.ndarray:
  """`_mlp` evaluated in float64 at ``pts``: the reference of the sound mode."""
  with jax.enable_x64(True):
    w64 = [(jnp.asarray(np.asarray(w), jnp.float64), jnp.asarray(np.asarray(b), jnp.float64))
           for w, b in ws]
    return np.asarray(_mlp(w64)(jnp.asarray(np.asarray(pts), jnp.float64)))


def test_alpha_crown_sound_and_never_looser():
  ws = [_layer(s, a, b) for s, (a, b) in enumerate([(D, 24), (24, 24), (24, 4)])]
  fn = _mlp(ws)

  box = bj.Interval.around(jnp.stack([jnp.linspace(-1, 1, D), jnp.linspace(1, -1, D)]), 0.3)
  plain = crown(fn)(box)
  opt = crown(fn, alpha=True, alpha_steps=30)(box)
  tol = 1e-6 * (1 + jnp.abs(plain.lower))
  assert bool(jnp.all(opt.lower >= plain.lower - tol)) and bool(jnp.all(opt.upper <= plain.upper + tol))
  assert float(jnp.mean(opt.width)) < float(jnp.mean(plain.width))
  pts = jnp.stack([_points(box[b], b) for b in range(2)], 1)
  assert_inside(opt, jax.vmap(fn)(pts), what="alpha-crown")
  # with a spec and in sound mode
  c = jnp.asarray([[1.0, -1.0, 0.0, 0.0], [0.0, 0.0, 1.0, -1.0]])
  out = crown(fn, alpha=True, spec=c)(box)
  assert_inside(out, jax.vmap(fn)(pts) @ c.T, what="alpha-crown spec")
  sound = crown(fn, alpha=True, sound=True)(box)
  sound_plain = crown(fn, sound=True)(box)
  assert bool(jnp.all(sound.lower >= sound_plain.lower)) and bool(jnp.all(sound.upper <= sound_plain.upper))
  assert float(jnp.mean(sound.width)) < float(jnp.mean(sound_plain.width))
  ys = _mlp_float64(ws, pts)
  assert_inside(sound, ys, tol=0.0, what="alpha-crown sound mode vs float64")


def test_alpha_on_intermediate_layers_sound_and_tighter():
  """``alpha_intermediate``: every ReLU layer's bounds get their own slopes. Never looser than
  α on the output alone (itself never looser than CROWN), tighter on average on a 3-hidden-layer
  network, and sound on 10^4 points plus the corners per box (sound mode: the next test)."""
  ws = [_layer(40 + s, a, b) for s, (a, b) in enumerate([(D, 16), (16, 16), (16, 16), (16, 4)])]
  fn = _mlp(ws)

  box = bj.Interval.around(jnp.stack([jnp.linspace(-1, 1, D), jnp.linspace(1, -1, D)]), 0.3)
  out_only = crown(fn, alpha=True, alpha_steps=10)(box)  # itself never looser than CROWN
  mid = crown(fn, alpha=True, alpha_steps=10, alpha_intermediate=True)(box)
  tol = 1e-5 * (1 + jnp.abs(out_only.lower))
  assert bool(jnp.all(mid.lower >= out_only.lower - tol))
  assert bool(jnp.all(mid.upper <= out_only.upper + tol))
  assert float(jnp.mean(mid.width)) < 0.97 * float(jnp.mean(out_only.width))
  pts = jnp.stack([_points(box[b], 60 + b) for b in range(2)], 1)
  assert pts.shape[0] >= 10_000
  assert_inside(mid, jax.vmap(fn)(pts), what="alpha on intermediate layers")
  with pytest.raises(ValueError, match="alpha_intermediate"):
    crown(fn, alpha=True, alpha_intermediate=1)


def _pre_activations(ws, pts) -> list[np.ndarray]:
  """Every ReLU layer's input of `_mlp` at ``pts`` (float64)."""
  h, out = np.asarray(pts, np.float64), []
  for w, b in ws[:-1]:
    z = h @ np.asarray(w, np.float64) + np.asarray(b, np.float64)
    out.append(z)
    h = np.maximum(z, 0.0)
  return out


@pytest.mark.slow
@pytest.mark.parametrize("sound", [False, True])
def test_alpha_intermediate_info_reports_the_optimised_layer_bounds(sound):
  """With ``alpha_intermediate`` and ``return_info``, ``info.pre`` holds the hidden layers'
  bounds that the final pass used (optimised slopes, met with CROWN's), not CROWN's first pass:
  they contain every sampled pre-activation (sound mode: float64 values, zero tolerance), are
  never looser than CROWN's and tighter in total, as branch and bound needs them (its domains
  start from the root's ``info.pre``)."""
  ws = [_layer(40 + s, a, b) for s, (a, b) in enumerate([(D, 16), (16, 16), (16, 16), (16, 4)])]
  fn = _mlp(ws)
  box = bj.Interval.around(jnp.stack([jnp.linspace(-1, 1, D), jnp.linspace(1, -1, D)]), 0.3)
  spec = jnp.asarray([[1.0, -1.0, 0.0, 0.0]])
  kw = dict(spec=None if sound else spec, return_info=True, sound=sound)
  g = (lambda x: fn(x) @ spec.T) if sound else fn  # sound mode: the spec composed into fn
  _, plain = crown(g, **kw)(box)
  _, mid = crown(g, alpha=True, alpha_steps=10, alpha_intermediate=True, **kw)(box)
  pts = np.stack([np.asarray(_points(box[b], 70 + b)) for b in range(2)], 1)
  zs = _pre_activations(ws, pts)
  tighter = 0.0
  for (l0, u0), (l1, u1), z in zip(plain.pre, mid.pre, zs):
    l0, u0, l1, u1 = (np.asarray(a, np.float64).reshape(z.shape[1:]) for a in (l0, u0, l1, u1))
    tol = 0.0 if sound else 1e-5 * (1 + np.abs(z))
    assert np.all(z >= l1 - tol) and np.all(z <= u1 + tol)
    assert np.all(l1 >= l0) and np.all(u1 <= u0)
    tighter += float(np.sum(u0 - l0) - np.sum(u1 - l1))
  total = sum(float(np.sum(np.asarray(u) - np.asarray(l))) for l, u in plain.pre)
  assert tighter > 0.01 * total, (tighter, total)


@pytest.mark.slow
def test_alpha_on_intermediate_layers_sound_mode_holds_in_float64():
  """``alpha_intermediate`` in sound mode: 10^4 points plus corners per box, evaluated in
  float64, inside the bounds with zero tolerance."""
  ws = [_layer(40 + s, a, b) for s, (a, b) in enumerate([(D, 16), (16, 16), (16, 16), (16, 4)])]
  box = bj.Interval.around(jnp.stack([jnp.linspace(-1, 1, D), jnp.linspace(1, -1, D)]), 0.3)
  sound = crown(_mlp(ws), alpha=True, alpha_steps=10, alpha_intermediate=True, sound=True)(box)
  pts = jnp.stack([_points(box[b], 60 + b) for b in range(2)], 1)
  assert_inside(sound, _mlp_float64(ws, pts), tol=0.0,
                what="alpha on intermediate layers, sound mode vs float64")


def test_sound_mode_exact_slope_relaxations_hold_in_float64():
  """Products (McCormick), max pooling and max/min of two boxes keep their lines in sound mode
  mode (exact slopes, offsets rounded outward, rounding slack of the step): no fallback warning,
  checked against the float64 evaluation with zero tolerance, tighter than sound IBP."""
  w1, b1 = _layer(21, D, 8)
  w2, b2 = _layer(22, D, 8)
  w3, b3 = _layer(23, 4, 3)

  def fn(x):
    h, g = x @ w1 + b1, x @ w2 + b2
    p = (h * g).reshape((2, 4))
    q = jnp.max(p, axis=0) + jnp.minimum(h[:4], g[4:]) + jnp.maximum(h[4:], g[:4])
    return q @ w3 + b3

  box = bj.Interval.around(jnp.linspace(-1, 1, D), 0.2)
  out = _bound(fn, box, sound=True)
  fast = _bound(fn, box)
  # single McCormick planes in sound mode (averaged ones by default): comparable widths
  assert float(jnp.mean(out.width)) < 1.5 * float(jnp.mean(fast.width))
  ibp = bj.ibp(fn, sound=True)(box)
  assert bool(jnp.all(out.lower >= ibp.lower)) and bool(jnp.all(out.upper <= ibp.upper))
  assert float(jnp.mean(out.width)) < float(jnp.mean(ibp.width))
  pts = np.asarray(_points(box, 2), np.float64)
  with jax.enable_x64(True):
    c = lambda a: jnp.asarray(np.asarray(a), jnp.float64)  # noqa: E731
    h, g = pts @ c(w1) + c(b1), pts @ c(w2) + c(b2)
    p = (h * g).reshape((-1, 2, 4))
    q = jnp.max(p, axis=1) + jnp.minimum(h[:, :4], g[:, 4:]) + jnp.maximum(h[:, 4:], g[:, :4])
    ys = np.asarray(q @ c(w3) + c(b3))
  assert_inside(out, ys, tol=0.0, what="sound product/pool/max2")


def _chord_threshold(f, df, l):
  """The ``u* > 0`` at which the chord of ``f`` on ``[l, u]`` (``l < 0``) becomes a valid lower
  line, ``f'(l)(u − l) = f(u) − f(l)``, by float64 bisection (below ``u*`` it cuts ``f`` near
  ``l``, above it lies under ``f``)."""
  lo, hi = 0.0, 1e4
  for _ in range(200):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if df(l) * (mid - l) < f(mid) - f(l) else (lo, mid)
  return hi


@pytest.mark.parametrize("name", ["logistic", "tanh"])
def test_s_shaped_chord_around_zero_holds_and_is_taken(name):
  """Boxes around 0 on both sides of the point ``u*`` where the chord starts to hold (relative
  distances 1e-6 … 0.5, and mirrored for the upper line): every line, float and sound, is on its
  side of the function on 4,001 float64 points of the box (zero tolerance in sound mode, the
  points packed near the end where a chord that does not hold leaves the function), and well
  past ``u*`` (1.5 ``u*``) the lower line is the chord itself: it meets ``f`` at both ends; at
  half of ``u*`` it is not (the chord would cut ``f``)."""
  import scipy.special as sp
  from boundjax.domains.linear.rules import _UNARY_LINES, sound_unary_lines
  f = sp.expit if name == "logistic" else np.tanh
  df = (lambda x: sp.expit(x) * (1 - sp.expit(x))) if name == "logistic" else \
      (lambda x: 1 - np.tanh(x) ** 2)
  ls = np.array([-4.0, -1.5, -0.6, -0.1, -0.01])
  rel = np.array([-0.5, -1e-2, -1e-4, -1e-6, 1e-6, 1e-4, 1e-2, 0.5, 3.0])
  us = np.array([_chord_threshold(f, df, l) for l in ls])[:, None] * (1 + rel)
  l = np.repeat(ls, len(rel)).astype(np.float32)
  u = us.reshape(-1).astype(np.float32)
  l, u = np.concatenate([l, -u]), np.concatenate([u, -l])        # mirrored: the upper line
  t = np.concatenate([np.linspace(0, 1, 2001), np.geomspace(1e-9, 1e-3, 1000)])
  t = np.concatenate([t, 1 - t])
  xs = l + t[:, None] * (u.astype(np.float64) - l)
  ys = f(xs)
  for tag, lines in (("sound", sound_unary_lines(name)), ("float", _UNARY_LINES[name])):
    a_lo, b_lo, a_up, b_up = (np.asarray(x, np.float64) for x in lines(jnp.asarray(l),
                                                                        jnp.asarray(u)))
    # float lines: rounding of the order of the line's terms (|a x| reaches ~10 on these boxes)
    slack = 0.0 if tag == "sound" else 2e-6 * (1 + np.abs(a_lo * xs) + np.abs(a_up * xs))
    assert np.all(a_lo * xs + b_lo <= ys + slack), (tag, np.max(a_lo * xs + b_lo - ys - slack))
    assert np.all(a_up * xs + b_up >= ys - slack), (tag, np.max(ys - a_up * xs - b_up - slack))
    if tag == "float":
      n = len(ls) * len(rel)
      past = np.tile(rel, len(ls)) >= 0.5                    # clearly past u*: the chord
      lo_gap = np.abs(a_lo[:n] * np.stack([l[:n], u[:n]]) + b_lo[:n] - f(np.stack([l[:n], u[:n]])))
      up_gap = np.abs(a_up[n:] * np.stack([l[n:], u[n:]]) + b_up[n:] - f(np.stack([l[n:], u[n:]])))
      assert np.all(lo_gap[:, past] < 1e-5) and np.all(up_gap[:, past] < 1e-5)
      # short of u* the chord cuts f: a tangent below f(l) at l is used instead
      short = (np.tile(rel, len(ls)) <= -0.5) & (np.repeat(ls, len(rel)) <= -0.1)
      assert np.all(a_lo[:n][short] * l[:n][short] + b_lo[:n][short] < f(l[:n][short]) - 1e-6)


def test_crown_lower_bound_of_a_sigmoid_box_with_a_valid_chord_is_the_chords():
  """``y = σ(x) − 0.05 x`` on ``[-0.3, 6]``, where the chord of σ holds: CROWN's lower bound is
  the chord's minimum over the box minus ``0.05 x``, computed here by hand in float64 (the
  tangent CROWN used before reaches about 0.14 lower)."""
  import scipy.special as sp
  l, u = -0.3, 6.0
  k = (sp.expit(u) - sp.expit(l)) / (u - l)
  want = min(sp.expit(l) - 0.05 * l, sp.expit(l) + (k - 0.05) * (u - l))
  out = bj.crown(lambda x: jax.nn.sigmoid(x) - 0.05 * x, batch_axis=None)(
      bj.Interval(jnp.asarray([l], jnp.float32), jnp.asarray([u], jnp.float32)))
  assert abs(float(out.lower[0]) - want) < 1e-5, (float(out.lower[0]), want)

"""CROWN through products of two boxes: dot_general / einsum / convolution whose operands both
depend on a box (McCormick planes, `boundjax.domains.linear.backward._dot_planes`).

Every case draws 10,000 points of the boxes uniformly plus 2,000 random vertices (the extremes
of a bilinear function lie at vertices) and the all-lower / all-upper corners, and checks:
``bj.crown(fn)`` against ``fn`` in float32 (relative tolerance 1e-5) and
``bj.crown(fn, sound=True)`` against ``fn`` in float64 with no tolerance. No bound may be NaN,
and no CROWN bound may be looser than ``bj.ibp``'s (both modes).
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boundjax as bj
from boundjax.domains.linear import rules

N_UNIFORM, N_VERTICES = 10_000, 2_000


def _box(rng, shape, centre=0.0, spread=1.0, width=0.3):
  c = centre + spread * rng.normal(size=shape)
  a, b = c - width * rng.random(shape), c + width * rng.random(shape)
  return bj.Interval(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))


def _points(boxes, seed=1):
  """Uniform points, random vertices and the two extreme corners of every box (float64)."""
  r = np.random.default_rng(seed)
  out = []
  for b in boxes:
    lo, hi = np.asarray(b.lower, np.float64), np.asarray(b.upper, np.float64)
    uni = lo + (hi - lo) * r.random((N_UNIFORM, *lo.shape))
    ver = np.where(r.random((N_VERTICES, *lo.shape)) < 0.5, lo, hi)
    out.append(np.concatenate([uni, ver, lo[None], hi[None]]))
  return out


def _inside(bound, ys, rtol, what):
  lo, hi = np.asarray(bound.lower, np.float64), np.asarray(bound.upper, np.float64)
  assert not np.isnan(lo).any() and not np.isnan(hi).any(), f"{what}: NaN in a bound"
  slack = rtol * (1 + np.abs(ys))
  bad = (ys < lo - slack) | (ys > hi + slack)
  assert not bad.any(), f"{what}: {int(bad.sum())} sampled values outside the bound"


def _evaluate(fn, points):
  """``fn`` on every point, vectorised 500 at a time: a vmap over all 12,002 points of a
  convolution whose kernel is batched becomes one grouped convolution with 12,002 groups, which
  XLA's CPU backend ran for 15 minutes (the whole test: 878 s, now 136 s on a loaded machine)."""
  return jax.lax.map(lambda args: fn(*args), tuple(points), batch_size=500)


def _check(fn, boxes, what, *, batch_axis=None, **kw):
  """Both modes against sampled values; returns the float (non-sound) CROWN and IBP bounds."""
  pts = _points(boxes)
  with warnings.catch_warnings():
    warnings.simplefilter("error", rules.CrownFallbackWarning)  # the product is relaxed
    out = bj.crown(fn, batch_axis=batch_axis, **kw)(*boxes)
    kw_sound = {k: v for k, v in kw.items() if k != "spec"}
    sound = bj.crown(fn, batch_axis=batch_axis, sound=True, **kw_sound)(*boxes)
  ib = bj.ibp(fn)(*boxes)
  ys = np.asarray(_evaluate(fn, [jnp.asarray(p, jnp.float32) for p in pts]), np.float64)
  if "spec" in kw:
    ys = ys.reshape(ys.shape[0], -1) @ np.asarray(kw["spec"], np.float64).T
  else:
    assert np.all(out.lower >= ib.lower) and np.all(out.upper <= ib.upper), what
  _inside(out, ys, 1e-5, what)
  with jax.enable_x64(True):
    ys64 = np.asarray(_evaluate(fn, [jnp.asarray(p) for p in pts]))
  _inside(sound, ys64, 0.0, what + " (sound, float64; spec is not a sound-mode option)")
  # sound mode: the engine's own forward interval pass rounds differently from bj.ibp's (a few
  # ulps either way), so "never looser" holds up to that
  ib_sound = bj.ibp(fn, sound=True)(*boxes)
  ulps = 1e-6 * (1 + np.abs(np.asarray(ib_sound.upper)) + np.abs(np.asarray(ib_sound.lower)))
  assert np.all(sound.lower >= ib_sound.lower - ulps), what
  assert np.all(sound.upper <= ib_sound.upper + ulps), what
  return out, ib


def _mlp(ws, bs, x):
  for i, (w, b) in enumerate(zip(ws, bs)):
    x = x @ w + b
    if i < len(ws) - 1:
      x = jax.nn.relu(x)
  return x


def _layers(rng, sizes, width):
  ws = [_box(rng, (a, b), 0.0, 1 / np.sqrt(a), width) for a, b in zip(sizes[:-1], sizes[1:])]
  bs = [_box(rng, (b,), 0.0, 0.1, width) for b in sizes[1:]]
  return ws, bs


@pytest.mark.parametrize("intermediate", ["crown", "ibp"])
def test_box_input_times_weight_boxes_three_layers(intermediate):
  rng = np.random.default_rng(0)
  ws, bs = _layers(rng, [5, 8, 8, 3], 0.04)
  x = _box(rng, (1, 5), 0.0, 1.0, 0.1)
  fn = lambda w0, w1, w2, b0, b1, b2, x: _mlp([w0, w1, w2], [b0, b1, b2], x)  # noqa: E731
  out, ib = _check(fn, [*ws, *bs, x], f"x-box @ W-box ({intermediate})",
                   intermediate=intermediate)
  if intermediate == "crown":
    assert np.mean(out.upper - out.lower) < 0.9 * np.mean(ib.upper - ib.lower)


def test_point_input_with_weight_and_bias_boxes_is_strictly_tighter_than_ibp():
  """The AGT setting: a 3-layer ReLU MLP, a fixed input, every weight and bias in a box."""
  rng = np.random.default_rng(1)
  ws, bs = _layers(rng, [6, 16, 16, 3], 0.05)
  x = jnp.asarray(rng.normal(size=(1, 6)), jnp.float32)
  fn = lambda w0, w1, w2, b0, b1, b2: _mlp([w0, w1, w2], [b0, b1, b2], x)  # noqa: E731
  out, ib = _check(fn, [*ws, *bs], "point x, W and b boxes")
  assert np.mean(out.upper - out.lower) < 0.8 * np.mean(ib.upper - ib.lower)
  # through a pytree of parameters, a batch of inputs under vmap (one pass per example)
  xs = jnp.asarray(rng.normal(size=(4, 1, 6)), jnp.float32)
  f2 = lambda p, xi: _mlp(p[0], p[1], xi)  # noqa: E731
  many = jax.vmap(lambda xi: bj.crown(f2, batch_axis=None)((ws, bs), xi))(xs)
  one = bj.crown(f2, batch_axis=None)((ws, bs), xs[0])
  np.testing.assert_allclose(many.lower[0], one.lower, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("order", ["x @ W", "W @ x"])
def test_mixed_sign_boxes_both_orders(order):
  """Both operands straddle 0 in most entries (pivot chords), and the parameter box on either
  side of the product."""
  rng = np.random.default_rng(2)
  a = _box(rng, (1, 4), 0.0, 0.3, 1.0)
  w = _box(rng, (4, 3), 0.0, 0.3, 1.0)
  v = _box(rng, (3, 2), 0.0, 0.3, 1.0)
  if order == "x @ W":
    fn = lambda a, w, v: jax.nn.relu(a @ w) @ v  # noqa: E731
  else:
    fn = lambda a, w, v: (v.T @ jax.nn.relu(w.T @ a.T)).T  # noqa: E731
  _check(fn, [a, w, v], f"mixed signs, {order}")


def test_neither_operand_a_parameter_box_and_a_square():
  """Operands computed from boxes (coefficients flow back through both) and ``x xᵀ`` (one
  variable in both operands)."""
  rng = np.random.default_rng(3)
  x = _box(rng, (3, 4), 0.0, 1.0, 0.4)
  w = _box(rng, (4, 2), 0.0, 1.0, 0.4)
  fn = lambda x, w: jax.nn.relu(x * 2.0 - 0.5) @ (w + x[0][:, None])  # noqa: E731
  _check(fn, [x, w], "computed operands")
  _check(lambda x: x @ x.T, [x], "x @ x.T")


def test_batched_matmul_and_einsum_with_batch_dimensions():
  rng = np.random.default_rng(4)
  q = _box(rng, (2, 3, 4), 0.0, 1.0, 0.3)
  k = _box(rng, (2, 5, 4), 0.0, 1.0, 0.3)
  v = _box(rng, (2, 5, 3), 0.0, 1.0, 0.3)
  fn = lambda q, k, v: jnp.einsum("bqk,bkd->bqd",  # noqa: E731
                                  jax.nn.relu(jnp.einsum("bqd,bkd->bqk", q, k)), v)
  _check(fn, [q, k, v], "attention-like einsum")
  _check(lambda q, k: jnp.matmul(q, k.transpose(0, 2, 1)), [q, k], "batched matmul")


def test_convolution_with_a_kernel_box():
  rng = np.random.default_rng(5)
  x = _box(rng, (1, 2, 5, 5), 0.0, 1.0, 0.2)
  k1 = _box(rng, (3, 2, 3, 3), 0.0, 0.3, 0.1)
  k2 = _box(rng, (2, 3, 2, 2), 0.0, 0.3, 0.1)
  conv = lambda a, k: jax.lax.conv_general_dilated(a, k, (1, 1), "VALID")  # noqa: E731
  fn = lambda x, k1, k2: conv(jax.nn.relu(conv(x, k1)), k2)  # noqa: E731
  out, ib = _check(fn, [x, k1, k2], "conv of boxes")
  assert np.mean(out.upper - out.lower) < np.mean(ib.upper - ib.lower)


def test_alpha_and_spec_through_products():
  rng = np.random.default_rng(6)
  ws, bs = _layers(rng, [4, 8, 8, 3], 0.05)
  x = jnp.asarray(rng.normal(size=(1, 4)), jnp.float32)
  fn = lambda w0, w1, w2, b0, b1, b2: _mlp([w0, w1, w2], [b0, b1, b2], x)  # noqa: E731
  plain, _ = _check(fn, [*ws, *bs], "alpha", alpha=True, alpha_steps=5)
  c = jnp.asarray([[1.0, -1.0, 0.0], [1.0, 0.0, -1.0]])
  spec, _ = _check(fn, [*ws, *bs], "spec", spec=c)
  crown = bj.crown(fn, batch_axis=None)(*ws, *bs)
  naive_lo = crown.lower[0, 0] - crown.upper[0, 1:]
  assert np.all(np.asarray(spec.lower) >= np.asarray(naive_lo) - 1e-5)


def test_infinite_operand_entries_give_no_nan():
  rng = np.random.default_rng(7)
  x = _box(rng, (1, 4), 0.0, 1.0, 0.3)
  w = _box(rng, (4, 3), 0.0, 1.0, 0.3)
  pin = jnp.zeros((4, 3), bool).at[0, 0].set(True)  # a box entry is -inf (boxes refuse it)
  fn = lambda x, w: jax.nn.relu(x @ jnp.where(pin, -jnp.inf, w)) @ jnp.ones((3, 2))  # noqa: E731
  for sound in (False, True):
    out = bj.crown(fn, batch_axis=None, sound=sound)(x, w)
    assert not np.isnan(out.lower).any() and not np.isnan(out.upper).any()

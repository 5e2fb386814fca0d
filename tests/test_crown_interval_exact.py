"""CROWN skips the backward pass of a target the interval pass bounds exactly
(`boundjax.domains.linear.prefix.interval_exact`: a linear map of the input box, such as a
network's first convolution): the bounds stay CROWN's (checked against a float64 reference and
by sampling in float64) and the memory budget no longer counts that pass."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boundjax as bj
from tests.helpers import sample_box

N_SAMPLES = 10_000


def _conv_net(seed: int):
  """conv(1 -> 8, 3x3) -> ReLU -> dense(10): the conv output has 800 entries, so its dense
  backward pass (800 rows through the convolution) needs about 5 MB per example."""
  rng = np.random.default_rng(seed)
  k = rng.normal(size=(8, 1, 3, 3)).astype(np.float32) / 3
  b = rng.normal(size=(8,)).astype(np.float32) * 0.1
  w = rng.normal(size=(800, 10)).astype(np.float32) / 20

  def f(x):  # x: (1, 1, 12, 12)
    z = jax.lax.conv_general_dilated(x, k, (1, 1), "VALID") + b[None, :, None, None]
    return jnp.maximum(z, 0.0).reshape((1, -1)) @ w

  return f, (k, b, w)


def _conv_matrix(k: np.ndarray) -> np.ndarray:
  """The VALID 3x3 convolution of a 1x12x12 input as an (800, 144) float64 matrix (rows in
  the output's (channel, row, column) order)."""
  J = np.zeros((8, 10, 10, 12, 12))
  for i in range(10):
    for j in range(10):
      J[:, i, j, i:i + 3, j:j + 3] = k[:, 0]
  return J.reshape(800, 144)


def _reference(params, lo, hi):
  """float64 CROWN of `_conv_net` with the convolution's exact interval range (the dense
  Jacobian, sign split), CROWN's adaptive lower slopes: (lower, upper) of the 10 outputs."""
  k, b, w = (np.asarray(p, np.float64) for p in params)
  J = _conv_matrix(k)
  bias = np.repeat(b, 100)
  l = np.maximum(J, 0) @ lo.ravel() + np.minimum(J, 0) @ hi.ravel() + bias
  u = np.maximum(J, 0) @ hi.ravel() + np.minimum(J, 0) @ lo.ravel() + bias
  unstable = (l < 0) & (u > 0)
  up_slope = np.where(u <= 0, 0.0, np.where(l >= 0, 1.0, u / np.where(unstable, u - l, 1)))
  up_bias = np.where(unstable, -up_slope * l, 0.0)
  lo_slope = np.where(u <= 0, 0.0, np.where(l >= 0, 1.0, (u >= -l).astype(float)))
  out = []
  for sign in (1.0, -1.0):
    A = sign * w.T  # rows: the outputs, signed
    slope = np.where(A >= 0, lo_slope, up_slope)  # a lower bound of A relu(z)
    off = np.where(A >= 0, 0.0, up_bias)
    M = (A * slope) @ J
    c = (A * slope) @ bias + (A * off).sum(1)
    out.append(sign * (np.maximum(M, 0) @ lo.ravel() + np.minimum(M, 0) @ hi.ravel() + c))
  return out[0], out[1]


@pytest.mark.parametrize("sound", [False, True])
def test_first_convolution_bounded_by_intervals(sound):
  f, params = _conv_net(0)
  rng = np.random.default_rng(1)
  x0 = rng.random((1, 1, 12, 12)).astype(np.float32)
  box = bj.Interval(jnp.asarray(x0 - 0.05), jnp.asarray(x0 + 0.05))
  # 1 MB: the first convolution's dense backward pass alone would need about 5 MB
  out = bj.crown(f, batch_axis=None, sound=sound, memory_bytes=1 << 20)(box)
  lo, hi = np.asarray(out.lower, np.float64)[0], np.asarray(out.upper, np.float64)[0]
  ref_lo, ref_hi = _reference(params, np.asarray(box.lower, np.float64),
                              np.asarray(box.upper, np.float64))
  # CROWN's bound, not an interval bound of the whole network (that is far looser); sound mode
  # adds the a-priori rounding bounds (about 3e-3 here, as with the backward pass)
  tol = 1e-2 if sound else 1e-5
  assert np.all(np.abs(lo - ref_lo) <= tol * (1 + np.abs(ref_lo))), (lo, ref_lo)
  assert np.all(np.abs(hi - ref_hi) <= tol * (1 + np.abs(ref_hi))), (hi, ref_hi)
  ibp = bj.ibp(f)(box)
  assert np.all(hi - lo < np.asarray(ibp.upper - ibp.lower)[0] - 1e-3)
  # sound: every sampled point (vertices included), evaluated in float64
  xs = np.asarray(sample_box(jax.random.PRNGKey(2), box, N_SAMPLES), np.float64)
  k, b, w = (np.asarray(p, np.float64) for p in params)
  z = xs.reshape(N_SAMPLES, 144) @ _conv_matrix(k).T + np.repeat(b, 100)
  ys = np.maximum(z, 0.0) @ w
  assert np.all(ys >= lo - (0 if sound else 1e-4)) and np.all(ys <= hi + (0 if sound else 1e-4))


def test_two_linear_maps_keep_their_backward_pass():
  """relu(x W1 W2): the interval pass through two products is looser than the range of W1 W2;
  CROWN's upper bound of the output is the composed map's exact maximum (clipped at 0)."""
  rng = np.random.default_rng(3)
  W1 = rng.normal(size=(6, 6)).astype(np.float32)
  W2 = rng.normal(size=(6, 4)).astype(np.float32)
  f = lambda x: jnp.maximum(x @ W1 @ W2, 0.0)  # noqa: E731
  box = bj.Interval(jnp.full((6,), -1.0, jnp.float32), jnp.full((6,), 1.0, jnp.float32))
  out = bj.crown(f, batch_axis=None)(box)
  W = np.asarray(W1, np.float64) @ W2
  exact_hi = np.maximum(np.abs(W).sum(0), 0.0)  # max of x W over [-1, 1]^6
  np.testing.assert_allclose(np.asarray(out.upper), exact_hi, rtol=1e-5, atol=1e-5)
  two_step = np.abs(W1).sum(0) @ np.abs(W2)  # the interval pass through both products
  assert np.all(exact_hi < two_step - 1e-3)


def test_pooling_after_the_first_relu_needs_no_backward_pass():
  """conv -> ReLU -> max pooling -> dense: the pooling's input (the ReLU's output) is bounded
  exactly by the interval pass, so a budget too small for its dense pass still gives CROWN's
  bound, sound on 10^4 samples in float64."""
  f, (k, b, w) = _conv_net(4)
  w2 = np.asarray(w[:200], np.float32)

  def g(x):
    z = jax.lax.conv_general_dilated(x, k, (1, 1), "VALID") + b[None, :, None, None]
    p = jax.lax.reduce_window(jnp.maximum(z, 0.0), -jnp.inf, jax.lax.max, (1, 1, 2, 2),
                              (1, 1, 2, 2), "VALID")
    return p.reshape((1, -1)) @ w2

  x0 = np.random.default_rng(5).random((1, 1, 12, 12)).astype(np.float32)
  box = bj.Interval(jnp.asarray(x0 - 0.05), jnp.asarray(x0 + 0.05))
  out = bj.crown(g, batch_axis=None, sound=True, memory_bytes=1 << 20)(box)
  lo, hi = np.asarray(out.lower, np.float64)[0], np.asarray(out.upper, np.float64)[0]
  xs = np.asarray(sample_box(jax.random.PRNGKey(6), box, N_SAMPLES), np.float64)
  with jax.enable_x64(True):
    z = jax.lax.conv_general_dilated(jnp.asarray(xs[:, 0]), jnp.asarray(k, jnp.float64),
                                     (1, 1), "VALID") + np.asarray(b, np.float64)[None, :, None,
                                                                                  None]
    p = jax.lax.reduce_window(jnp.maximum(z, 0.0), -jnp.inf, jax.lax.max, (1, 1, 2, 2),
                              (1, 1, 2, 2), "VALID")
    ys = np.asarray(p.reshape((N_SAMPLES, -1))) @ np.asarray(w2, np.float64)
  assert np.all(ys >= lo) and np.all(ys <= hi)
  ibp = bj.ibp(g)(box)
  assert np.all(np.asarray(out.upper - out.lower) <= np.asarray(ibp.upper - ibp.lower) + 1e-6)

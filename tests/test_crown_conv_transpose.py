"""CROWN's transposes of strided convolutions (`boundjax.domains.linear.prefix`): the phase
decomposition and the im2col product compute exactly JAX's maps, and bounds through them are
sound and the same as through JAX's own transpose."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import boundjax as bj
from boundjax.domains.linear import prefix


def _random_conv(rng, dtype):
  """A random strided convolution (1 or 2 spatial axes, channels first or last) and an input."""
  nsp = int(rng.integers(1, 3))
  k = tuple(int(v) for v in rng.integers(1, 6, nsp))
  s = tuple(int(v) for v in rng.integers(1, 4, nsp))
  if all(v == 1 for v in s):
    s = (2,) + s[1:]
  size = tuple(int(v) for v in rng.integers(max(k), 12, nsp))
  pad = [(int(rng.integers(0, 3)), int(rng.integers(0, 3))) for _ in range(nsp)]
  ci, co = int(rng.integers(1, 4)), int(rng.integers(1, 4))
  if nsp == 2 and rng.integers(0, 2):
    dn, xs, ws = ("NHWC", "HWIO", "NHWC"), (2, *size, ci), (*k, ci, co)
  else:
    sp = "HW" if nsp == 2 else "H"
    dn, xs, ws = ("NC" + sp, "OI" + sp, "NC" + sp), (2, ci, *size), (co, ci, *k)
  x = jnp.asarray(rng.normal(size=xs), dtype)
  w = jnp.asarray(rng.normal(size=ws), dtype)
  f = lambda v: lax.conv_general_dilated(v, w, s, pad, dimension_numbers=dn)
  eqn = jax.make_jaxpr(f)(x).jaxpr.eqns[-1]
  e = types.SimpleNamespace(
      params=eqn.params,
      invars=[types.SimpleNamespace(shape=x.shape, aval=types.SimpleNamespace(dtype=x.dtype)),
              None])
  return e, f, x, w


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_phases_and_product_are_jax_maps(dtype):
  with jax.enable_x64(dtype == jnp.float64):
    rng = np.random.default_rng(0)
    tol = 1e-12 if dtype == jnp.float64 else 1e-4
    for _ in range(12):
      e, f, x, w = _random_conv(rng, dtype)
      assert prefix._phases_apply(e.params, x.shape, w.shape)
      y, vjp = jax.vjp(f, x)
      g = jnp.asarray(rng.normal(size=y.shape), dtype)
      want = np.asarray(vjp(g)[0], np.float64)
      got = np.asarray(prefix._conv_transposed_phases(e, g, w), np.float64)
      assert got.shape == want.shape
      np.testing.assert_allclose(got, want, rtol=0, atol=tol * (1 + np.abs(want).max()))
      want = np.asarray(f(x), np.float64)
      got = np.asarray(prefix._conv_as_product(e, x, w), np.float64)
      np.testing.assert_allclose(got, want, rtol=0, atol=tol * (1 + np.abs(want).max()))


def _cnn(params, x):
  h = lax.conv_general_dilated(x, params["k1"], (2, 2), [(1, 1), (1, 1)]) + params["b1"]
  h = jax.nn.relu(h)
  h = lax.conv_general_dilated(h, params["k2"], (2, 1), [(1, 0), (1, 1)])
  h = jax.nn.relu(h).reshape(h.shape[0], -1)
  return h @ params["w"]


def test_sound_alpha_crown_through_strided_convolutions(monkeypatch):
  """Sound α-CROWN (gradients through the transposes) on a CNN with strided convolutions in
  float64: the bounds contain the float64 values at 10^4 sampled inputs and the box corners of
  a 4-pixel sub-box, and equal those through JAX's own transpose (phases switched off)."""
  rng = np.random.default_rng(3)
  with jax.enable_x64(True):
    params = {"k1": jnp.asarray(rng.normal(size=(4, 2, 3, 3)) * 0.5),
              "b1": jnp.asarray(rng.normal(size=(1, 4, 1, 1)) * 0.1),
              "k2": jnp.asarray(rng.normal(size=(3, 4, 2, 2)) * 0.5),
              "w": jnp.asarray(rng.normal(size=(3 * 2 * 4, 3)))}
    centre = jnp.asarray(rng.normal(size=(1, 2, 6, 6)))
    box = bj.Interval(centre - 0.1, centre + 0.1)
    bound = lambda: jax.jit(bj.crown(_cnn, sound=True, alpha=True, alpha_steps=5))(params, box)
    ours = bound()
    monkeypatch.setattr(prefix, "_phases_apply", lambda *a: False)
    jaxs = bound()
    np.testing.assert_allclose(np.asarray(ours.lower), np.asarray(jaxs.lower), rtol=1e-9,
                               atol=1e-9)
    np.testing.assert_allclose(np.asarray(ours.upper), np.asarray(jaxs.upper), rtol=1e-9,
                               atol=1e-9)
    xs = centre + rng.uniform(-0.1, 0.1, (10_000, 2, 6, 6))
    corners = np.array(np.broadcast_to(np.asarray(centre), (16, 2, 6, 6)))
    for j, bits in enumerate(np.ndindex(2, 2, 2, 2)):
      corners[j, 0, 0, :4] += (2 * np.array(bits) - 1) * 0.1
    vals = np.asarray(jax.vmap(lambda v: _cnn(params, v[None])[0])(
        jnp.concatenate([xs, jnp.asarray(corners)])))
    assert np.all(vals >= np.asarray(ours.lower)) and np.all(vals <= np.asarray(ours.upper))


def test_temporaries_of_the_products_are_counted_for_the_memory_budget():
  """`prefix.conv_temporaries` (per backward row, what `bj.crown`'s chunking adds beside the
  state) covers the largest array each product builds (its shifted copies side by side), and
  is 0 where JAX's own convolution runs (stride 1)."""
  rng = np.random.default_rng(3)
  for _ in range(12):
    e, f, x, w = _random_conv(rng, jnp.float32)
    eqn = jax.make_jaxpr(f)(x).jaxpr.eqns[-1]
    full = types.SimpleNamespace(name="conv_general_dilated", params=eqn.params,
                                 invars=eqn.invars, outvars=eqn.outvars)
    rows = x.shape[0]
    g = jnp.zeros(eqn.outvars[0].aval.shape, x.dtype)
    largest = 0
    for fn, arg in ((lambda g: prefix._conv_transposed_phases(e, g, w), g),
                    (lambda v: prefix._conv_as_product(e, v, w), x)):
      largest = max(largest, max(int(np.prod(o.aval.shape)) for q in
                                 jax.make_jaxpr(fn)(arg).jaxpr.eqns for o in q.outvars) // rows)
    assert largest <= prefix.conv_temporaries(full) <= 4 * largest
  stride1 = jax.make_jaxpr(lambda v: lax.conv_general_dilated(
      v, jnp.ones((3, 3, 2, 4)), (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")))(
          jnp.ones((1, 8, 8, 2))).jaxpr.eqns[-1]
  assert prefix.conv_temporaries(types.SimpleNamespace(
      name="conv_general_dilated", params=stride1.params, invars=stride1.invars,
      outvars=stride1.outvars)) == 0

"""boundjax.core.compile: `bj.jit` compiles with boundjax's XLA:CPU options and gives what
``jax.jit`` gives; a jaxlib that rejects the options gets plain ``jax.jit``; ``bj.crown``
works eagerly (its own compilation takes the options), under ``jax.jit`` and under ``bj.jit``
(nested: the options are the outer compilation's)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import boundjax as bj
from boundjax.core import compile as C


def _cnn(p, x):
  h = lax.conv_general_dilated(x, p["k"], (1, 1), "VALID",
                               dimension_numbers=("NHWC", "HWIO", "NHWC"))
  h = jax.nn.relu(h + p["b"])
  return h.reshape(h.shape[0], -1) @ p["w"]


def _params(dtype):
  rng = np.random.default_rng(0)
  return {"k": jnp.asarray(rng.normal(size=(3, 3, 2, 4)) / 3, dtype),
          "b": jnp.asarray(0.1 * rng.normal(size=4), dtype),
          "w": jnp.asarray(rng.normal(size=(36 * 4, 3)) / 12, dtype)}


def test_the_options_are_used_on_cpu_and_change_no_result():
  if jax.default_backend() == "cpu":
    assert C.compiler_options() == C.CPU_COMPILER_OPTIONS  # this jaxlib accepts them
  p = _params(jnp.float32)
  x = jnp.asarray(np.random.default_rng(1).uniform(size=(5, 8, 8, 2)), jnp.float32)
  np.testing.assert_allclose(bj.jit(_cnn)(p, x), jax.jit(_cnn)(p, x), rtol=1e-5, atol=1e-6)
  box = bj.Interval(x - 0.05, x + 0.05)
  a, b = bj.jit(bj.crown(_cnn))(p, box), jax.jit(bj.crown(_cnn))(p, box)
  np.testing.assert_allclose(a.lower, b.lower, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(a.upper, b.upper, rtol=1e-4, atol=1e-5)
  with jax.enable_x64(True):  # float64 (the sound mode): other kernels, last bits only
    p64, x64 = _params(jnp.float64), jnp.asarray(x, jnp.float64)
    box64 = bj.Interval(x64 - 0.05, x64 + 0.05)
    s1 = bj.jit(bj.crown(_cnn, sound=True))(p64, box64)
    s2 = jax.jit(bj.crown(_cnn, sound=True))(p64, box64)
    np.testing.assert_allclose(s1.lower, s2.lower, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(s1.upper, s2.upper, rtol=1e-13, atol=1e-15)
    ys = jax.vmap(lambda z: _cnn(p64, z[None])[0])(
        x64[0] + jnp.asarray(np.random.default_rng(3).uniform(-0.05, 0.05, (10_000, 8, 8, 2))))
    assert bool(jnp.all(ys >= s1.lower[0])) and bool(jnp.all(ys <= s1.upper[0]))


def test_crown_eager_under_jit_and_under_bj_jit_agree():
  """Eager ``bj.crown`` compiles its numeric part with the options; under an outer jit it
  must not (JAX refuses compiler options on a nested jit): all three give the same bounds."""
  p = _params(jnp.float32)
  x = jnp.asarray(np.random.default_rng(2).uniform(size=(3, 8, 8, 2)), jnp.float32)
  box = bj.Interval(x - 0.02, x + 0.02)
  f = bj.crown(_cnn)
  outs = [f(p, box), jax.jit(f)(p, box), bj.jit(f)(p, box)]
  for o in outs[1:]:
    np.testing.assert_allclose(o.lower, outs[0].lower, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(o.upper, outs[0].upper, rtol=1e-4, atol=1e-5)


def test_an_option_the_jaxlib_rejects_falls_back_to_plain_jit(monkeypatch):
  monkeypatch.setattr(C, "CPU_COMPILER_OPTIONS", {"xla_no_such_option_in_any_jaxlib": True})
  C._accepted.cache_clear()
  try:
    assert C.compiler_options() is None
    y = bj.jit(jnp.sin)(jnp.arange(3.0))
    np.testing.assert_allclose(y, np.sin(np.arange(3.0)), rtol=1e-6)
  finally:
    C._accepted.cache_clear()

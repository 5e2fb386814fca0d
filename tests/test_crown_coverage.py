"""Coverage of the linear domain (CROWN): every record of ``OPS`` has a sampled soundness case.

`test_every_crown_op_has_a_case` fails when a primitive is added to the table without a case.
Each case bounds a small function that reaches the primitive with a box-dependent operand,
checks that CROWN used its own rule (no interval fallback warning), and that 10,000 sampled
points of the box plus all its corners lie inside the bound.
"""

import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import boundjax as bj
from boundjax.core import program
from boundjax.domains.linear import rules
from jax._src.ad_util import add_any_p  # the primitive gradients accumulate with

W = jax.random.normal(jax.random.PRNGKey(7), (4, 3))
K = jax.random.normal(jax.random.PRNGKey(8), (2, 1, 2, 2))  # OIHW


def _box(lo=-1.0, hi=1.0, shape=(1, 4)):
  r = np.random.default_rng(0)
  a = r.uniform(lo, hi, shape).astype(np.float32)
  b = r.uniform(lo, hi, shape).astype(np.float32)
  return bj.Interval(jnp.asarray(np.minimum(a, b)), jnp.asarray(np.maximum(a, b)))


CASES = {
    "add": lambda x: x + 1.0,
    "add_any": lambda x: add_any_p.bind(x, 2 * x),
    "sub": lambda x: x - x[:, ::-1],
    "neg": lambda x: -x,
    "reshape": lambda x: x.reshape(1, 2, 2),
    "broadcast_in_dim": lambda x: jnp.broadcast_to(x[:, None, :], (1, 3, 4)),
    "transpose": lambda x: x.reshape(1, 2, 2).transpose(0, 2, 1),
    "squeeze": lambda x: jnp.squeeze(x[:, :, None], -1),
    "expand_dims": lambda x: lax.expand_dims(x, (2,)),
    "reduce_sum": lambda x: jnp.sum(x, -1),
    "reduce_window_sum": lambda x: lax.reduce_window(x, 0.0, lax.add, (1, 2), (1, 1), "VALID"),
    "concatenate": lambda x: jnp.concatenate([x, 2 * x], -1),
    "slice": lambda x: x[:, 1:3],
    "pad": lambda x: lax.pad(x, 0.5, [(0, 0, 0), (1, 2, 1)]),
    # a widening conversion of a float16 box (float16 equations are bounded in float32 and
    # rounded outward, so the fallback warning is allowed here)
    "convert_element_type": (lambda x: x.astype(jnp.float32) * 1.5, (1, 4), -1.0, 1.0,
                             jnp.float16),
    "copy": lambda x: lax.copy_p.bind(x),
    "stop_gradient": lambda x: lax.stop_gradient(x),
    "rev": lambda x: x[:, ::-1],
    "cumsum": lambda x: jnp.cumsum(x, -1),
    "select_n": lambda x: jnp.where(jnp.array([True, False, True, False]), x, 2 * x),
    "dynamic_slice": lambda x: lax.dynamic_slice(x, (0, 1), (1, 2)),
    "gather": lambda x: x[:, jnp.array([2, 0, 2])],
    "mul": lambda x: x * jnp.array([1.0, -2.0, 0.5, 3.0]),
    "div": lambda x: x / jnp.array([3.0, -2.0, 0.5, 4.0]),
    "dot_general": lambda x: x @ W,
    "conv_general_dilated": (lambda x: lax.conv_general_dilated(
        x, K, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW")), (1, 1, 3, 3)),
    "max": lambda x: jnp.maximum(x, 0.0),
    "min": lambda x: jnp.minimum(x, 0.3),
    "exp": lambda x: jnp.exp(x),
    "expm1": lambda x: jnp.expm1(x),
    "tanh": lambda x: jnp.tanh(x),
    "logistic": lambda x: jax.nn.sigmoid(x),
    "erf": lambda x: jax.scipy.special.erf(x),
    "erfc": lambda x: jax.scipy.special.erfc(x),
    "atan": lambda x: jnp.arctan(x),
    "abs": lambda x: jnp.abs(x),
    "square": lambda x: lax.square(x),
    "integer_pow": lambda x: lax.integer_pow(x, 2),
    "log": (lambda x: jnp.log(x), (1, 4), 0.2, 3.0),
    "log1p": (lambda x: jnp.log1p(x), (1, 4), 0.2, 3.0),
    "sqrt": (lambda x: jnp.sqrt(x), (1, 4), 0.2, 3.0),
    "rsqrt": (lambda x: lax.rsqrt(x), (1, 4), 0.2, 3.0),
    "reduce_max": lambda x: jnp.max(x, -1),
    "reduce_min": lambda x: jnp.min(x, -1),
    "reduce_window_max": lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2), (1, 1),
                                                     "VALID"),
    "reduce_window_min": lambda x: lax.reduce_window(x, jnp.inf, lax.min, (1, 2), (1, 1),
                                                     "VALID"),
}


def _case(name):
  """``(fn, shape, low, high, dtype)`` of a case."""
  c = CASES[name]
  if callable(c):
    c = (c,)
  defaults = (None, (1, 4), -1.0, 1.0, jnp.float32)
  return tuple(c) + defaults[len(c):]


def test_every_crown_op_has_a_case():
  missing = sorted(set(rules.OPS) - set(CASES))
  assert not missing, f"CROWN ops without a soundness case: {missing}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_crown_op_sound(name):
  fn, shape, lo, hi, dtype = _case(name)
  box = _box(lo, hi, shape)
  box = bj.Interval(box.lower.astype(dtype), box.upper.astype(dtype))
  core = program.trace(fn, program.split_arguments((box,), {}))
  reached = {e.name for e in core.eqns if e.abstract}
  # stop_gradient is the identity on values and dropped by the program layer (CROWN once read
  # its zero derivative as a zero map: every bound through it was [0, 0]); expand_dims is a
  # reshape or broadcast by the time it is traced
  assert name in reached or name in {"expand_dims", "stop_gradient"}, (name, reached)
  with warnings.catch_warnings():
    if dtype == jnp.float32:
      warnings.simplefilter("error", rules.CrownFallbackWarning)
    out = bj.crown(fn)(box)
  n = 10_000
  t = jax.random.uniform(jax.random.PRNGKey(1), (n, *shape))
  pts = (box.lower + t * (box.upper - box.lower)).astype(dtype)
  flat_lo, flat_hi = box.lower.reshape(-1), box.upper.reshape(-1)
  if flat_lo.size <= 10:
    corners = jnp.asarray(list(itertools.product(*zip(np.asarray(flat_lo), np.asarray(flat_hi)))))
    pts = jnp.concatenate([pts, corners.reshape(-1, *shape).astype(dtype)])
  ys = jax.vmap(fn)(pts)
  tol = 1e-5 * (1 + jnp.abs(ys))
  bad = (ys < out.lower - tol) | (ys > out.upper + tol)
  assert int(jnp.sum(bad)) == 0, f"{name}: {int(jnp.sum(bad))} sampled values outside"
  assert not jnp.isnan(out.lower).any() and not jnp.isnan(out.upper).any()


def test_memory_budget_that_cannot_fit_one_example_raises_with_the_size():
  box = bj.Interval(-jnp.ones((2, 64)), jnp.ones((2, 64)))
  w = jnp.ones((64, 64)) / 64
  f = lambda x: jnp.maximum(x @ w, 0) @ w
  with pytest.raises(MemoryError, match="MiB"):
    bj.crown(f, memory_bytes=1024)(box)
  out = bj.crown(f)(box)
  assert out.shape == (2, 64)

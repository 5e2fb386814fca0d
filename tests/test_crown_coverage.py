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
from tests.helpers import fast_subset
from jax._src.ad_util import add_any_p  # the primitive gradients accumulate with

W = jax.random.normal(jax.random.PRNGKey(7), (4, 3))
# OIHW; rounded to bfloat16 (exact in float16 too) so that casting it to a box's dtype keeps it
K = jax.random.normal(jax.random.PRNGKey(8), (2, 1, 2, 2)).astype(jnp.bfloat16).astype(jnp.float32)


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
    "reduce_sum": lambda x: jnp.sum(x, -1),
    "reduce_window_sum": lambda x: lax.reduce_window(x, 0.0, lax.add, (1, 2), (1, 1), "VALID"),
    "concatenate": lambda x: jnp.concatenate([x, 2 * x], -1),
    "slice": lambda x: x[:, 1:3],
    "pad": lambda x: lax.pad(x, jnp.asarray(0.5, x.dtype), [(0, 0, 0), (1, 2, 1)]),
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
    "dynamic_update_slice": lambda x: lax.dynamic_update_slice(x, 2 * x[:, :2], (0, 1)),
    # several results: rewritten as one slice / copy per result before the backward pass
    "split": lambda x: jnp.concatenate(jnp.split(x, [1, 3], axis=1)[::-1], -1),
    "optimization_barrier": lambda x: jnp.concatenate(lax.optimization_barrier((x, -2 * x)), -1),
    "device_put": lambda x: jnp.concatenate(jax.device_put((x, -2 * x)), -1),
    "sharding_constraint": lambda x: -lax.with_sharding_constraint(
        x, jax.sharding.SingleDeviceSharding(jax.devices()[0])),
    "gather": lambda x: x[:, jnp.array([2, 0, 2])],
    "scatter": lambda x: x.at[:, jnp.array([3, 0])].set(-2 * x[:, 1:3], unique_indices=True),
    "scatter-add": lambda x: x.at[:, jnp.array([2, 0, 2])].add(-2 * x[:, 1:]),
    "scatter-sub": lambda x: lax.scatter_sub(
        x.T, jnp.array([[3], [0], [3]]), 2 * x.T[:3],
        lax.ScatterDimensionNumbers((1,), (0,), (0,))).T,
    "mul": lambda x: x * jnp.array([1.0, -2.0, 0.5, 3.0]),
    "div": lambda x: x / jnp.array([3.0, -2.0, 0.5, 4.0]),
    "dot_general": lambda x: x @ W,
    "conv_general_dilated": (lambda x: lax.conv_general_dilated(
        x, K.astype(x.dtype), (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW")),
        (1, 1, 3, 3)),
    "max": lambda x: jnp.maximum(x, 0.0),
    "min": lambda x: jnp.minimum(x, 0.25),  # dyadic: the float64 check evaluates the same fn
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


def test_every_relaxation_mode_has_its_lines():
  from boundjax.domains.linear import backward
  assert set(backward.RELAXATIONS) | {"dot"} == set(rules.MODES)


def test_every_crown_op_has_a_case():
  missing = sorted((set(rules.OPS) | set(rules._ONE_PER_OUTPUT)) - set(CASES))
  assert not missing, f"CROWN ops without a soundness case: {missing}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_crown_op_sound(name):
  fn, shape, lo, hi, dtype = _case(name)
  box = _box(lo, hi, shape)
  box = bj.Interval(box.lower.astype(dtype), box.upper.astype(dtype))
  core = program.trace(fn, program.split_arguments((box,), {}))
  reached = {e.name for e in core.eqns if e.abstract}
  # stop_gradient is the identity on values and dropped by the program layer (CROWN once read
  # its zero derivative as a zero map: every bound through it was [0, 0])
  assert name in reached or name in {"stop_gradient"}, (name, reached)
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


# ----------------------------------------------------------------------------------------------
# Special inputs for every record: low precision, infinite entries, NaN-producing branches
# ----------------------------------------------------------------------------------------------
#
# Each float32 case is re-run (10,000 samples plus corners, both modes: ``bj.crown(fn)`` against
# fn's own values, ``bj.crown(fn, sound=True)`` against fn in float64 with zero tolerance):
# * with its box in bfloat16 and in float16 (low-precision equations are bounded by intervals);
# * with the first entry of the box pinned to +inf and the last to -inf by a constant mask;
# * behind ``where(s > 0, x, sqrt(s))`` with a box ``s`` reaching below 0 (NaN for s < 0).
# No bound may be NaN; sampled values that are NaN are not real numbers and are skipped.

def _samples(boxes, n=10_000):
  r = np.random.default_rng(1)
  out = []
  for b in boxes:
    lo, hi = np.asarray(b.lower, np.float64), np.asarray(b.upper, np.float64)
    pts = lo + (hi - lo) * r.random((n, *lo.shape))
    if lo.size <= 10:
      corners = np.asarray(list(itertools.product(*zip(lo.ravel(), hi.ravel()))))
      pts = np.concatenate([pts, corners.reshape(-1, *lo.shape)])
    out.append(pts)
  m = min(len(p) for p in out)
  return [p[:m] for p in out]


def _inside(out, ys, tol, what):
  lo = np.asarray(out.lower, np.float64)
  hi = np.asarray(out.upper, np.float64)
  assert not np.isnan(lo).any() and not np.isnan(hi).any(), f"{what}: NaN in a bound"
  ys = np.asarray(ys, np.float64)
  slack = tol * (1 + np.where(np.isfinite(ys), np.abs(ys), 0.0))
  bad = ~np.isnan(ys) & ((ys < lo - slack) | (ys > hi + slack))
  assert not bad.any(), f"{what}: {int(bad.sum())} sampled values outside the bound"


def _check_crown_both_modes(fn, boxes, tol, what):
  pts = _samples(boxes)
  dtypes = [b.dtype for b in boxes]
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", rules.CrownFallbackWarning)
    out = bj.crown(fn)(*boxes)
    sound = bj.crown(fn, sound=True)(*boxes)
  ys = jax.vmap(fn)(*[jnp.asarray(p, d) for p, d in zip(pts, dtypes)])
  _inside(out, ys, tol, what)
  with jax.enable_x64(True):
    ys64 = np.asarray(jax.vmap(fn)(*[jnp.asarray(np.asarray(p, d).astype(np.float64))
                                     for p, d in zip(pts, dtypes)]))
  _inside(sound, ys64, 0.0, what + " (sound, float64)")


FLOAT32_CASES = sorted(k for k in CASES if _case(k)[4] == jnp.float32)
VARIANTS_IN_CI = ("add", "mul", "div", "dot_general", "conv_general_dilated", "exp", "log",
                  "max", "reduce_max", "reduce_window_max", "select_n", "sqrt", "tanh")
"""Ops whose special-input variants run in CI (one or two per family); all run in the slow
suite."""


# Products whose two operands both depend on a box (McCormick planes of every scalar product,
# `backward._dot_planes`): a parameter box concretised at once, operands that are computed from
# boxes, and a convolution with a kernel box. Ten scalars per case, so every corner is sampled.
TWO_BOX_CASES = {
    "dot_general": (lambda x, w: x @ w, [(1, 2), (2, 3)]),
    "dot_general (computed operands)": (lambda x, w: (x - 0.25) @ (w * 2.0), [(1, 2), (2, 3)]),
    "dot_general (batch dims)": (lambda x, w: jnp.einsum("bij,bjk->bik", x, w),
                                 [(2, 1, 2), (2, 2, 1)]),
    "conv_general_dilated": (lambda x, k: lax.conv_general_dilated(
        x, k, (1, 1), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW")),
        [(1, 1, 2, 3), (2, 1, 1, 2)]),
}


def test_every_two_box_product_has_a_case():
  assert {n.split(" ")[0] for n in TWO_BOX_CASES} == {"dot_general", "conv_general_dilated"}


@pytest.mark.parametrize("name", sorted(TWO_BOX_CASES))
def test_crown_two_box_product_sound_both_modes(name):
  fn, shapes = TWO_BOX_CASES[name]
  boxes = [_box(-1.0, 1.0, s) for s in shapes]
  boxes[1] = bj.Interval(boxes[1].lower * 0.5 + 0.2, boxes[1].upper * 0.5 + 0.2)
  for sound in (False, True):
    with warnings.catch_warnings():
      warnings.simplefilter("error", rules.CrownFallbackWarning)  # relaxed, not intervals
      bj.crown(fn, batch_axis=None, sound=sound)(*boxes)
  r = np.random.default_rng(2)
  los = [np.asarray(b.lower, np.float64) for b in boxes]
  his = [np.asarray(b.upper, np.float64) for b in boxes]
  pts = [lo + (hi - lo) * r.random((10_000, *lo.shape)) for lo, hi in zip(los, his)]
  flat_lo = np.concatenate([a.ravel() for a in los])
  flat_hi = np.concatenate([a.ravel() for a in his])
  corners = np.asarray(list(itertools.product(*zip(flat_lo, flat_hi))))  # every joint corner
  off = 0
  for i, lo in enumerate(los):
    pts[i] = np.concatenate([pts[i], corners[:, off:off + lo.size].reshape(-1, *lo.shape)])
    off += lo.size
  out = bj.crown(fn, batch_axis=None)(*boxes)
  sound = bj.crown(fn, batch_axis=None, sound=True)(*boxes)
  _inside(out, jax.vmap(fn)(*[jnp.asarray(p, jnp.float32) for p in pts]), 1e-5, name)
  with jax.enable_x64(True):
    ys64 = np.asarray(jax.vmap(fn)(*[jnp.asarray(p) for p in pts]))
  _inside(sound, ys64, 0.0, name + " (sound, float64)")
  ib = bj.ibp(fn)(*boxes)
  assert np.all(out.lower >= ib.lower) and np.all(out.upper <= ib.upper)


@pytest.mark.parametrize("name", fast_subset(FLOAT32_CASES, VARIANTS_IN_CI))
@pytest.mark.parametrize("low", [jnp.bfloat16, jnp.float16], ids=lambda d: jnp.dtype(d).name)
def test_crown_op_low_precision_both_modes(name, low):
  fn, shape, lo, hi, _ = _case(name)
  box = _box(lo, hi, shape)
  box = bj.Interval(box.lower.astype(low), box.upper.astype(low))
  _check_crown_both_modes(fn, [box], 4 * float(jnp.finfo(low).eps), f"{name} ({jnp.dtype(low)})")


@pytest.mark.parametrize("name", fast_subset(FLOAT32_CASES, VARIANTS_IN_CI))
def test_crown_op_infinite_entries_and_nan_branches(name):
  fn, shape, lo, hi, _ = _case(name)
  box = _box(lo, hi, shape)
  n = int(np.prod(shape))
  pos = jnp.asarray((np.arange(n) == 0).reshape(shape))
  neg = jnp.asarray((np.arange(n) == n - 1).reshape(shape))
  with_inf = lambda x: fn(jnp.where(pos, jnp.inf, jnp.where(neg, -jnp.inf, x)))  # noqa: E731
  _check_crown_both_modes(with_inf, [box], 1e-5, f"{name} (±inf entries)")
  s = bj.Interval(-jnp.ones(shape), jnp.ones(shape))
  nan_branch = lambda s_, x: fn(jnp.where(s_ > 0, x, jnp.sqrt(s_)))  # noqa: E731
  _check_crown_both_modes(nan_branch, [s, box], 1e-5, f"{name} (NaN branch)")

"""The one program layer (boundjax.core.program) and the defects it makes impossible.

Each regression test names the defect it guards against; all of them failed before the program
layer existed (identity-based dependence, name-matched composites, a walker per domain).
"""

import functools
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boundjax as bj
from boundjax.core import composite, program
from tests.helpers import matmul_precisions

KEY = jax.random.PRNGKey(0)


def _samples(box: bj.Interval, n: int, key=KEY):
  t = jax.random.uniform(key, (n, *box.shape), box.dtype)
  return box.lower + t * (box.upper - box.lower)


def _inside(out: bj.Interval, ys, tol=0.0) -> int:
  """Number of sampled values outside ``out``."""
  return int(jnp.sum((ys < out.lower - tol) | (ys > out.upper + tol)))


# ----------------------------------------------------------------------------------------------
# arguments
# ----------------------------------------------------------------------------------------------

def test_split_arguments_kinds():
  box = bj.Interval(jnp.zeros(2), jnp.ones(2))
  args = program.split_arguments((box, jnp.ones(3), 2.0, "relu", None), {"k": np.int32(3)})
  kinds = dict(zip(map(str, range(len(args.kinds))), args.kinds))
  assert args.kinds == ["box", "array", "static", "static", "array"], kinds
  assert len(args.boxes) == 1 and len(args.dynamic) == 3


def test_same_interval_object_in_two_leaves_is_two_variables():
  """Defect: ``bj.ibp(lambda a, b: a - b)(I, I)`` returned [0, 0]."""
  box = bj.Interval(jnp.zeros(3), jnp.full(3, 2.0))
  out = bj.ibp(lambda a, b: a - b)(box, box)
  np.testing.assert_array_equal(out.lower, -2.0)
  np.testing.assert_array_equal(out.upper, 2.0)
  out = bj.ibp(lambda a, b: a * b)(bj.Interval(-jnp.ones(3), jnp.ones(3)),
                                   bj.Interval(-jnp.ones(3), jnp.ones(3)))
  np.testing.assert_array_equal(out.lower, -1.0)
  params = {"w1": box, "w2": box}
  out = bj.ibp(lambda p: p["w1"] - p["w2"])(params)
  np.testing.assert_array_equal(out.lower, -2.0)
  # difference domain: the same object as N's and N#'s parameter is two members
  x = jnp.ones(3)
  d = bj.difference(lambda p, x: p * x)(box, box, x)
  np.testing.assert_array_equal(d.delta.lower, -2.0)
  np.testing.assert_array_equal(d.delta.upper, 2.0)


def test_one_variable_used_twice_stays_one_variable():
  box = bj.Interval(-jnp.ones(4), jnp.ones(4))
  out = bj.ibp(lambda a: a * a)(box)      # rewritten to a square: [0, 1], not [-1, 1]
  np.testing.assert_array_equal(out.lower, 0.0)
  np.testing.assert_array_equal(out.upper, 1.0)


def test_python_scalars_are_static_in_ibp_and_crown():
  """Defect: Python scalars were traced by ibp but static in crown."""
  box = bj.Interval(jnp.zeros((2, 3)), jnp.ones((2, 3)))
  f = lambda x, axis, scale: jnp.sum(x * scale, axis=axis)
  for transform in (bj.ibp, lambda g: bj.crown(g, batch_axis=None)):
    out = transform(f)(box, 1, 2.0)
    np.testing.assert_allclose(out.upper, [6.0, 6.0])
    out = transform(f)(box, axis=0, scale=1.0)
    np.testing.assert_allclose(out.upper, [2.0, 2.0, 2.0])


def test_checkpoint_and_every_call_primitive_is_inlined():
  """Defect: ``bj.ibp(jax.checkpoint(f))`` raised 'no rule for primitive remat'."""
  w = jax.random.normal(KEY, (3, 4))

  @jax.custom_jvp
  def act(x):
    return jnp.maximum(x, 0.0)

  act.defjvp(lambda p, t: (act(p[0]), t[0] * (p[0] > 0)))

  @jax.custom_vjp
  def ident(x):
    return x

  ident.defvjp(lambda x: (x, None), lambda _, g: (g,))

  def f(x):
    h = jax.checkpoint(lambda z: jnp.tanh(z @ w))(x)
    return ident(jax.jit(act)(h)).sum(-1)

  box = bj.Interval.around(jnp.zeros((1, 3)), 0.5)
  out = bj.ibp(f)(box)
  ys = jax.vmap(f)(_samples(box, 10_000))
  assert _inside(out, ys, 1e-6) == 0
  core = program.trace(f, program.split_arguments((box,), {}))
  names = {e.name for e in core.eqns}
  assert not names & set(program.CALL_PRIMITIVES), names
  crown_f = lambda x: ident(jax.checkpoint(lambda z: jax.jit(act)(z @ w))(x)).sum(-1)
  out = bj.crown(crown_f)(box)
  assert _inside(out, jax.vmap(crown_f)(_samples(box, 10_000)), 1e-5) == 0


# ----------------------------------------------------------------------------------------------
# composites by identity
# ----------------------------------------------------------------------------------------------

def test_user_function_named_like_a_composite_gets_no_composite_rule():
  """Defect: a user's jitted ``log_softmax`` received the rule of plain log_softmax; 2,694 of
  6,000 sampled outputs fell outside the bound."""

  @jax.jit
  def log_softmax(x):
    return jax.nn.log_softmax(3 * x) + 1

  @jax.jit
  def softmax(x):
    return jnp.exp(x) / 2

  box = bj.Interval.around(jax.random.normal(KEY, (6, 5)), 0.3)
  xs = _samples(box, 6_000)
  for fn in (log_softmax, softmax):
    for sound in (False, True):
      out = bj.ibp(fn, sound=sound)(box)
      assert _inside(out, jax.vmap(fn)(xs), 1e-5) == 0, (fn, sound)


def test_jax_log_softmax_is_recognised_by_its_body_not_its_name():
  box = bj.Interval.around(jax.random.normal(KEY, (4, 5)), 0.1)
  core = program.trace(lambda x: jax.nn.log_softmax(x, axis=0), program.split_arguments((box,), {}))
  assert [e.name for e in core.eqns] == ["boundjax_log_softmax"]
  assert core.eqns[0].params == {"axis": -2}

  def renamed(x):  # JAX's own body under another name is the same program
    return jax.jit(lambda z: jax.nn.log_softmax(z), inline=False)(x)

  def changed(x):  # same name, different body
    return jax.jit(lambda z: z - jnp.max(z, -1, keepdims=True))(x)

  assert "boundjax_log_softmax" in {e.name for e in program.trace(
      renamed, program.split_arguments((box,), {})).eqns}
  assert "boundjax_log_softmax" not in {e.name for e in program.trace(
      changed, program.split_arguments((box,), {})).eqns}


def test_same_jaxpr_compares_bodies():
  a = jax.make_jaxpr(lambda x: jnp.exp(x) + 1.0)(jnp.ones(3)).jaxpr
  b = jax.make_jaxpr(lambda y: jnp.exp(y) + 1.0)(jnp.ones(3)).jaxpr
  c = jax.make_jaxpr(lambda y: jnp.exp(y) + 2.0)(jnp.ones(3)).jaxpr
  d = jax.make_jaxpr(lambda y: jnp.exp(y) + 1.0)(jnp.ones(4)).jaxpr
  assert composite.same_jaxpr(a, b)
  assert not composite.same_jaxpr(a, c)
  assert not composite.same_jaxpr(a, d)


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "logsumexp"])
def test_composites_agree_with_jax_under_transformations(name):
  f_bj, f_jax = getattr(bj.nn, name), getattr(jax.nn, name)
  x = jax.random.normal(KEY, (3, 4, 5))
  for axis in (-1, 0, 1):
    np.testing.assert_allclose(f_bj(x, axis=axis), f_jax(x, axis=axis), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(jax.vmap(lambda z: f_bj(z, axis=axis - 1 if axis < 0 else axis))(x),
                               jax.vmap(lambda z: f_jax(z, axis=axis - 1 if axis < 0 else axis))(x),
                               rtol=1e-6, atol=1e-6)
    g = lambda f: jax.grad(lambda z: jnp.sum(jnp.sin(f(z, axis=axis))))(x)
    np.testing.assert_allclose(g(f_bj), g(f_jax), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jax.jit(lambda z: f_bj(z, axis=axis))(x), f_jax(x, axis=axis),
                               rtol=1e-6, atol=1e-6)


def test_cross_entropy_gradient_is_exact_for_any_labels():
  z = jax.random.normal(KEY, (4, 5))
  y = jax.random.uniform(jax.random.PRNGKey(1), (4, 5))  # does not sum to one
  ref = lambda z: jnp.sum(-jnp.sum(y * jax.nn.log_softmax(z), -1))
  ours = lambda z: jnp.sum(bj.nn.softmax_cross_entropy(z, y))
  np.testing.assert_allclose(jax.grad(ours)(z), jax.grad(ref)(z), rtol=1e-5, atol=1e-6)
  yb = jnp.array([0.0, 1.0, 0.3, 0.7])
  ref_b = lambda z: jnp.sum(jax.nn.softplus(z) - yb * z)
  ours_b = lambda z: jnp.sum(bj.nn.sigmoid_binary_cross_entropy(z, yb))
  np.testing.assert_allclose(jax.grad(ours_b)(z[:, 0]), jax.grad(ref_b)(z[:, 0]), rtol=1e-5)


def _float64(fn, xs):
  with jax.enable_x64(True):
    return np.asarray(jax.vmap(fn)(jnp.asarray(np.asarray(xs), jnp.float64)))


@pytest.mark.parametrize("centre,eps", [(1000.0, 1e-3), (-500.0, 0.5), (0.0, 1e-6),
                                        (30.0, 10.0), (1000.0, 0.0)])
def test_composites_sound_mode_against_float64(centre, eps):
  """Defect: logits near 1000 or -500, or tiny boxes, put 20-100 % of samples outside the sound
  bounds of the composites by up to 4.5e-5."""
  x = centre + jax.random.normal(KEY, (3, 6)) * (1 + abs(centre) * 1e-3)
  box = bj.Interval.around(x, eps)
  xs = np.concatenate([np.asarray(_samples(box, 5_000)), np.asarray(box.lower)[None],
                       np.asarray(box.upper)[None]])
  labels = jax.nn.one_hot(jnp.arange(3) % 6, 6)
  fns = {
      "softmax": lambda z: bj.nn.softmax(z),
      "log_softmax": lambda z: bj.nn.log_softmax(z),
      "jax_log_softmax": lambda z: jax.nn.log_softmax(z),
      "logsumexp": lambda z: bj.nn.logsumexp(z),
      "sce": lambda z: bj.nn.softmax_cross_entropy(z, labels),
      "bce": lambda z: bj.nn.sigmoid_binary_cross_entropy(z, labels),
  }
  for name, fn in fns.items():
    out = bj.ibp(fn, sound=True)(box)
    ys = _float64(fn, xs)
    lo, hi = np.asarray(out.lower, np.float64), np.asarray(out.upper, np.float64)
    bad = int(np.sum((ys < lo) | (ys > hi)))
    assert bad == 0, f"{name}: {bad} float64 values outside the sound bound"
    assert not np.isnan(lo).any() and not np.isnan(hi).any()


# ----------------------------------------------------------------------------------------------
# sound mode: matrix products at HIGHEST precision
# ----------------------------------------------------------------------------------------------

def test_sound_modes_emit_highest_precision_products():
  """Defect: sound mode ignored matmul precision (TF32 on GPUs breaks u = 2^-24)."""
  w = jax.random.normal(KEY, (5, 3))
  k = jax.random.normal(KEY, (4, 1, 3, 3))
  f = lambda x: jnp.maximum(x.reshape(1, 5) @ w, 0).sum() + jax.lax.conv(
      x.reshape(1, 1, 5, 1) * jnp.ones((1, 1, 5, 3)), k, (1, 1), "SAME").sum()
  box = bj.Interval.around(jnp.zeros(5), 0.1)
  highest = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
  for bounded in (bj.ibp(f, sound=True),):
    precisions = matmul_precisions(jax.make_jaxpr(bounded)(box).jaxpr)
    assert precisions and all(p == highest for p in precisions), precisions
  g = lambda x: jnp.maximum(x @ w, 0) @ jnp.ones((3, 2))
  precisions = matmul_precisions(jax.make_jaxpr(bj.crown(g, sound=True))(
      bj.Interval.around(jnp.zeros((2, 5)), 0.1)).jaxpr)
  assert precisions and all(p == highest for p in precisions), precisions
  # without sound mode, the user's precision stays
  assert not all(p == highest for p in matmul_precisions(jax.make_jaxpr(bj.ibp(f))(box).jaxpr))


# ----------------------------------------------------------------------------------------------
# outputs
# ----------------------------------------------------------------------------------------------

def test_no_nan_in_returned_bounds():
  box = bj.Interval(jnp.array([-1.0, 0.5]), jnp.array([2.0, 3.0]))
  for fn in (lambda x: jnp.where(x > 0, jnp.log(x), 0.0), lambda x: jnp.log(x),
             lambda x: jnp.sqrt(x) * 0.0, lambda x: jnp.where(jnp.log(x) < 0, 1.0, 0.0)):
    out = bj.ibp(fn)(box)
    assert not jnp.isnan(out.lower).any() and not jnp.isnan(out.upper).any()
    out = jax.jit(bj.ibp(fn))(box)
    assert not jnp.isnan(out.lower).any() and not jnp.isnan(out.upper).any()
  safe_log = lambda x: jnp.where(x > 0, jnp.log(jnp.where(x > 0, x, 1.0)), 0.0)
  xs = _samples(box, 10_000)
  assert _inside(bj.ibp(safe_log)(box), jax.vmap(safe_log)(xs)) == 0
  step = lambda x: jnp.where(jnp.log(x) < 0, 1.0, 0.0)   # log(x) NaN for x < 0: compares False
  out = bj.ibp(step)(box)
  assert _inside(out, jax.vmap(step)(xs)) == 0


def test_crown_interval_bias_with_batch_length_is_not_split():
  """Defect: the default batch_axis=0 split every Interval leaf along axis 0, so an interval
  bias whose length equals the batch size was silently split per example."""
  w = jax.random.normal(KEY, (3, 4))
  f = lambda b, x: x @ w + b
  x = bj.Interval.around(jax.random.normal(KEY, (4, 3)), 0.1)
  b = bj.Interval(-jnp.arange(4.0), jnp.arange(4.0))
  with pytest.raises(bj.BoundError, match="batch_axis=None"):
    bj.crown(f)(b, x)
  out = bj.crown(f, batch_axis=None)(b, x)
  pts = jax.vmap(f)(_samples(b, 2_000, jax.random.PRNGKey(3)), _samples(x, 2_000))
  assert _inside(out, pts, 1e-5) == 0


def test_jax_softmax_inlined_is_recognised_and_tighter():
  box = bj.Interval.around(jax.random.normal(KEY, (3, 5)), 0.2)
  for axis in (0, -1):
    core = program.trace(lambda z: jax.nn.softmax(z, axis=axis), program.split_arguments((box,), {}))
    assert [e.name for e in core.eqns] == ["boundjax_softmax"]
  # an intermediate value used elsewhere keeps its equations; a changed body is not matched
  def changed(z):
    e = jnp.exp(z - jax.lax.stop_gradient(jnp.max(z, -1, keepdims=True)))
    return e / (jnp.sum(e, -1, keepdims=True) + 1.0)
  core = program.trace(changed, program.split_arguments((box,), {}))
  assert "boundjax_softmax" not in [e.name for e in core.eqns]
  xs = _samples(box, 10_000)
  for fn in (lambda z: jax.nn.softmax(z), changed,
             lambda z: jax.nn.softmax(z) * jnp.exp(z - jnp.max(z))):
    assert _inside(bj.ibp(fn)(box), jax.vmap(fn)(xs), 1e-6) == 0
  naive = lambda z: jnp.exp(z) / jnp.sum(jnp.exp(z), -1, keepdims=True)
  assert float(bj.ibp(jax.nn.softmax)(box).width.max()) < 0.5 * float(
      bj.ibp(naive)(box).width.max())


def test_errors_name_the_users_line():
  box = bj.Interval(jnp.zeros(3), jnp.ones(3))
  with pytest.raises(bj.UnsupportedPrimitiveError, match=r"test_program.py:\d+"):
    bj.ibp(lambda z: jnp.cumprod(z))(box)   # jnp.cumprod is a cached inner trace of JAX's


def test_wide_bounds_warn():
  box = bj.Interval(jnp.zeros(3), jnp.full(3, 20.0))
  with pytest.warns(UserWarning, match="wide"):
    bj.ibp(lambda z: jnp.exp(z))(box)


DECOMPOSED_CASES = {
    "stack": lambda x: jnp.stack([x, -2 * x, x[::-1]], axis=1),
    "unstack": lambda x: jnp.stack(jnp.unstack(x, axis=1)[::-1], axis=0),
    "tile": lambda x: jnp.tile(x, (2, 3)),
}


def test_every_decomposed_primitive_has_a_case():
  assert set(DECOMPOSED_CASES) == set(program.DECOMPOSED)


@pytest.mark.parametrize("name", sorted(DECOMPOSED_CASES))
def test_decomposed_primitives_are_exact_in_every_domain(name):
  """``jnp.stack`` / ``jnp.unstack`` / ``jnp.tile`` bind primitives of their own; the program
  layer writes them as concatenations, slices and broadcasts: pure data movement, so every
  domain's bound is the same data movement of the input's bounds (entry by entry), and a point
  box gives the function's value bitwise."""
  fn = DECOMPOSED_CASES[name]
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)
  r = jnp.asarray(rng.uniform(0.0, 0.5, size=(3, 4)), jnp.float32)
  box = bj.Interval(x - r, x + r)
  traced = program.trace(fn, program.split_arguments((box,), {}))
  assert name not in {e.name for e in traced.eqns}
  assert name in str(jax.make_jaxpr(fn)(x))  # the case binds the primitive
  want_lo, want_hi = fn(box.lower), fn(box.upper)
  if name == "stack":  # the -2x part swaps ends
    want_lo, want_hi = jnp.minimum(want_lo, want_hi), jnp.maximum(want_lo, want_hi)
  for transform in (bj.ibp, functools.partial(bj.crown, batch_axis=None),
                    functools.partial(bj.crown, batch_axis=None, sound=True)):
    out = transform(fn)(box)
    np.testing.assert_allclose(out.lower, want_lo, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out.upper, want_hi, rtol=1e-6, atol=1e-6)
  point = bj.ibp(fn)(bj.Interval(x, x))
  np.testing.assert_array_equal(point.lower, fn(x))
  np.testing.assert_array_equal(point.upper, fn(x))
  ys = jax.vmap(fn)(jnp.asarray(x + r * rng.uniform(-1, 1, size=(10_000, 3, 4)), jnp.float32))
  out = bj.ibp(fn)(box)
  assert bool(jnp.all((ys >= out.lower) & (ys <= out.upper)))

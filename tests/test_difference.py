"""Soundness and tightness of the difference domain `bj.difference` (LUCID, difference intervals).

Every soundness case samples >= 10,000 (input, member) pairs: inputs in the box (uniform and at
vertices) and members of the parameter box (uniform and at vertices, where interval bounds are
attained), evaluates N and the member on the same input with plain JAX, and asserts the
difference, N's value and the member's value lie in ``delta``, ``ref`` and ``other``.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boundjax as bj
from boundjax.core.errors import MemoryBudgetError
from boundjax.models import MLP, mlp_layer_values
from milp import difference as MD
from milp import network as MN

TOL = 2e-5  # float32 rounding of two forward passes, relative to the values' magnitude


def shifted_box(seed, params, width, shift=0.0):
  """Interval parameters around ``params``: random width, optionally shifted off ``params``."""
  rng = np.random.default_rng(seed)
  def box(p):
    p = np.asarray(p)
    s = shift * rng.normal(size=p.shape)
    lo = p + s - width * rng.random(p.shape)
    hi = p + s + width * rng.random(p.shape)
    return bj.Interval(jnp.asarray(lo, p.dtype), jnp.asarray(hi, p.dtype))
  return jax.tree_util.tree_map(box, params)


def np_sample_box(rng, box, n, vertex_fraction=0.3):
  """``n`` points of an Interval (numpy): a share at random vertices, the rest uniform."""
  lo, hi = np.asarray(box.lower), np.asarray(box.upper)
  t = rng.random((n,) + lo.shape)
  corner = (rng.random(n) < vertex_fraction).reshape((n,) + (1,) * lo.ndim)
  t = np.where(corner, np.round(t), t)
  return (lo + t * (hi - lo)).astype(lo.dtype)


def np_sample_tree(rng, tree, n, vertex_fraction=0.5):
  """``n`` members of a parameter box (leading axis), numpy."""
  return jax.tree_util.tree_map(lambda b: np_sample_box(rng, b, n, vertex_fraction), tree,
                                is_leaf=bj.is_interval)


def check(bound: bj.DiffInterval, ref_vals, other_vals, what=""):
  """``ref_vals`` (n, ...) for N, ``other_vals`` (m, n, ...) for members, at the same inputs."""
  ref_vals, other_vals = np.asarray(ref_vals), np.asarray(other_vals)
  scale = TOL * (1.0 + np.abs(ref_vals)[None] + np.abs(other_vals))
  for name, vals, iv in (("delta", other_vals - ref_vals[None], bound.delta),
                         ("other", other_vals, bound.other),
                         ("ref", np.broadcast_to(ref_vals[None], other_vals.shape), bound.ref)):
    lo = np.broadcast_to(np.asarray(iv.lower), vals.shape)
    hi = np.broadcast_to(np.asarray(iv.upper), vals.shape)
    bad = (vals < lo - scale) | (vals > hi + scale)
    if bad.any():
      i = tuple(np.argwhere(bad)[0])
      raise AssertionError(f"{what} {name}: {int(bad.sum())} of {bad.size} outside; first {i}: "
                           f"{vals[i]!r} not in [{lo[i]!r}, {hi[i]!r}]")
  return other_vals.shape[0] * other_vals.shape[1]


layers_fn = mlp_layer_values  # every pre- and post-activation value, in order


def np_layers(params, x, stacked=False):
  """`layers_fn` in numpy; with ``stacked`` every leaf has a leading member axis and the result
  has shape (members, inputs, ...)."""
  names = sorted(params["params"], key=lambda n: int(n.split("_")[1]))
  outs, h = [], np.asarray(x, np.float64)
  for i, n in enumerate(names):
    w = np.asarray(params["params"][n]["kernel"], np.float64)
    b = np.asarray(params["params"][n]["bias"], np.float64)
    if stacked:
      z = np.einsum("ni,mio->mno" if h.ndim == 2 else "mni,mio->mno", h, w) + b[:, None, :]
    else:
      z = h @ w + b
    outs.append(z)
    if i < len(names) - 1:
      h = np.maximum(z, 0.0)
      outs.append(h)
  return tuple(outs)


def mlp_pairs(rng, params, hyper, box, n_members=200, n_inputs=50):
  x = np_sample_box(rng, box, n_inputs)[:, 0]     # boxes have a batch axis of 1
  members = np_sample_tree(rng, hyper, n_members)
  return np_layers(params, x), np_layers(members, x, stacked=True)


# ------------------------------------------------------------------------------------------------
# MLPs (one architecture for the fast cases, so eager compilation is shared)

D_IN = 6


def _mlp(hidden=(16, 16), d=D_IN, seed=0):
  model = MLP(hidden=hidden, out=3)
  return model, model.init(jax.random.PRNGKey(seed), jnp.zeros((1, d), jnp.float32))


MLP_CASES = [
    # hidden, d, width, shift, box (lo, hi)
    ((16, 16), D_IN, 0.02, 0.0, (0.0, 1.0)),
    ((16, 16), D_IN, 0.01, 0.02, (-1.0, 1.0)),     # N outside the box, inputs of both signs
    ((16, 16), D_IN, 0.1, 0.05, (0.3, 0.5)),
    pytest.param(((32, 16, 8), 8, 0.05, 0.0, (0.0, 1.0)), marks=pytest.mark.slow),
    pytest.param(((12,), 4, 0.2, 0.1, (0.0, 1.0)), marks=pytest.mark.slow),
]


@pytest.mark.parametrize("case", MLP_CASES)
def test_mlp_layers_sound(case):
  hidden, d, width, shift, (a, b) = case
  model, params = _mlp(hidden, d)
  hyper = shifted_box(len(hidden) + int(100 * width), params, width, shift)
  box = bj.Interval(jnp.full((1, d), a), jnp.full((1, d), b))
  bounds = bj.difference(layers_fn)(params, hyper, box)
  ref, other = mlp_pairs(np.random.default_rng(1), params, hyper, box)
  n = 0
  for i, bnd in enumerate(bounds):
    n = check(bnd, ref[i], other[i], f"layer output {i}")
  assert n >= 10_000
  if hidden == (16, 16):  # the Flax model gives the same bounds as the jnp version
    out = bj.difference(model.apply)(params, hyper, box)
    np.testing.assert_allclose(out.delta.upper, bounds[-1].delta.upper, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("varying", ["Dense_0", "Dense_2"])
def test_one_layer_differs(varying):
  """Only one layer's parameters differ; the others are zero-width boxes at N's values. Every
  term of the bilinear identity is then needed: e.g. with ``W# = W`` after the first layer, the
  output difference is ``W (h# - h)`` alone."""
  _, p = _mlp(seed=6)
  def box(path, a):
    if path[1].key == varying:
      return bj.Interval(a - 0.05, a + 0.05)
    return bj.Interval(a + 0.0, a + 0.0)
  hyper = jax.tree_util.tree_map_with_path(box, p)
  box_x = bj.Interval(jnp.zeros((1, D_IN)), jnp.ones((1, D_IN)))
  out = bj.difference(layers_fn)(p, hyper, box_x)
  ref, other = mlp_pairs(np.random.default_rng(7), p, hyper, box_x)
  for i, bnd in enumerate(out):
    assert check(bnd, ref[i], other[i], f"layer output {i}") >= 10_000
  assert np.all(np.asarray(out[-1].delta.upper) > 0)


def test_concrete_other_network():
  """``params_other`` concrete (one member): the bound holds for that member."""
  model, p = _mlp()
  rng = np.random.default_rng(10)
  q = jax.tree_util.tree_map(lambda a: a + 0.01 * rng.normal(size=a.shape).astype(np.float32), p)
  box = bj.Interval(jnp.zeros((1, D_IN)), jnp.ones((1, D_IN)))
  out = bj.difference(layers_fn)(p, q, box)
  x = np_sample_box(rng, box, 10_000)[:, 0]
  ref = np_layers(p, x)
  other = np_layers(jax.tree_util.tree_map(lambda a: np.asarray(a)[None], q), x, stacked=True)
  for i, bnd in enumerate(out):
    assert check(bnd, ref[i], other[i], f"concrete member, output {i}") >= 10_000
  assert not np.allclose(out[-1].delta.lower, 0)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_bias_shifted_family_relu_cases(sign):
  """Every bias moved one way (``delta`` of the first layer excludes 0): the ReLU rule must
  still allow 0 where both units can be off, and the one-sided refinements must hold."""
  _, p = _mlp(seed=3)
  def shift(path, a):
    if path[-1].key == "bias":
      return bj.Interval(a + sign * 0.05, a + sign * 0.15) if sign > 0 else bj.Interval(
          a - 0.15, a - 0.05)
    return bj.Interval(a - 0.002, a + 0.002)
  hyper = jax.tree_util.tree_map_with_path(shift, p)
  box = bj.Interval(jnp.full((1, D_IN), -1.0), jnp.ones((1, D_IN)))
  out = bj.difference(layers_fn)(p, hyper, box)
  assert np.all(sign * np.asarray(out[0].delta.lower if sign > 0 else out[0].delta.upper) > 0)
  ref, other = mlp_pairs(np.random.default_rng(5), p, hyper, box, n_members=100, n_inputs=200)
  for i, bnd in enumerate(out):
    assert check(bnd, ref[i], other[i], f"layer output {i}") >= 10_000
  # units off in both networks for some sampled pairs (the case an unsound rule gets wrong)
  both_off = (other[0] <= 0) & (ref[0][None] <= 0)
  assert both_off.any()


def test_relu_rule_every_case():
  """``relu(x + b)`` per unit, with random boxes chosen so every ReLU case occurs (both off,
  both on, only N on, only N# on, unstable): each (x, b#) pair's difference lies inside."""
  rng = np.random.default_rng(30)
  n = 600
  a = rng.uniform(-1, 1, n).astype(np.float32)
  x_box = bj.Interval(jnp.asarray(a), jnp.asarray(a + rng.uniform(0, 1.5, n).astype(np.float32)))
  w = rng.uniform(-1, 1, n).astype(np.float32)
  b = rng.uniform(-1, 1, n).astype(np.float32)
  wl = w + rng.uniform(-1, 0.5, n).astype(np.float32)
  ql = b + rng.uniform(-1, 1, n).astype(np.float32)
  ref_p = {"w": jnp.asarray(w), "b": jnp.asarray(b)}
  oth_p = {"w": bj.Interval(jnp.asarray(wl), jnp.asarray(wl + rng.uniform(0, 0.5, n).astype(np.float32))),
           "b": bj.Interval(jnp.asarray(ql), jnp.asarray(ql + rng.uniform(0, 1, n).astype(np.float32)))}
  # N#'s own bound on w# x + b# is tighter than N's bound plus the difference bound, which is
  # what makes the one-sided ReLU refinements bite.
  fn = lambda p, x: (jax.nn.relu(p["w"] * x + p["b"]), -jax.nn.relu(p["b"] - x),
                     jnp.minimum(x * 2.0, p["b"]))
  out = bj.difference(fn)(ref_p, oth_p, x_box)
  x = np_sample_box(rng, x_box, 100, vertex_fraction=0.5)
  ms = np_sample_tree(rng, oth_p, 100, vertex_fraction=0.5)
  np_fn = lambda ww, bb, xx: (np.maximum(ww * xx + bb, 0), -np.maximum(bb - xx, 0),
                              np.minimum(2 * xx, bb))
  ref = np_fn(w[None], b[None], x)
  other = np_fn(ms["w"][:, None, :], ms["b"][:, None, :], x[None])
  for i in range(3):
    assert check(out[i], ref[i], other[i], f"output {i}") >= 10_000
  # the cases all occur (pre-activation bounds of N and N# from the ReLU's input)
  pre = bj.difference(lambda p, x: p["w"] * x + p["b"])(ref_p, oth_p, x_box)
  l, u = np.asarray(pre.ref.lower), np.asarray(pre.ref.upper)
  lh, uh = np.asarray(pre.other.lower), np.asarray(pre.other.upper)
  cases = [(l >= 0) & (lh >= 0), (l >= 0) & (lh < 0), (l < 0) & (lh >= 0), (u <= 0) & (uh <= 0)]
  assert all(c.sum() >= 10 for c in cases), [int(c.sum()) for c in cases]
  assert np.any(lh > l + np.asarray(pre.delta.lower) + 1e-3)


def test_two_families():
  """``params_ref`` with Interval leaves too: the bound holds for every pair of networks, one
  from each box (e.g. two hyper-networks of the branch-and-bound)."""
  _, p = _mlp()
  a = shifted_box(20, p, 0.01)
  b = shifted_box(21, p, 0.02, 0.01)
  box = bj.Interval(jnp.zeros((1, D_IN)), jnp.ones((1, D_IN)))
  out = bj.difference(layers_fn)(a, b, box)
  rng = np.random.default_rng(22)
  x = np_sample_box(rng, box, 50)[:, 0]
  ma, mb = np_sample_tree(rng, a, 200), np_sample_tree(rng, b, 200)
  za, zb = np_layers(ma, x, stacked=True), np_layers(mb, x, stacked=True)
  for i, bnd in enumerate(out):
    d = zb[i] - za[i]                       # pairs (a_j, b_j) on the same input
    lo, hi = np.asarray(bnd.delta.lower), np.asarray(bnd.delta.upper)
    scale = TOL * (1 + np.abs(za[i]) + np.abs(zb[i]))
    assert np.all(d >= lo - scale) and np.all(d <= hi + scale), i
    assert np.all(za[i] >= np.asarray(bnd.ref.lower) - scale)
    assert np.all(zb[i] <= np.asarray(bnd.other.upper) + scale)
  assert d.size >= 10_000


def test_exact_products_within_a_memory_budget():
  """``matmul="exact"`` with a budget of a few rows: the hidden layer's product of two boxes
  (the activations of a box input times a kernel box) runs in chunks (a ``scan`` in the
  program), gives the same bounds as with the default budget, and holds on 10^4 pairs; a
  budget below one row raises `MemoryBudgetError`."""
  _, p = _mlp()
  a = shifted_box(30, p, 0.3)  # wide: many weights straddle 0
  b = shifted_box(31, p, 0.3, 0.01)
  # 4 rows (chunks of 1 or 2), inputs of both signs off-centre (midpoint-radius is exact for
  # a box centred on 0, which would leave nothing for the four-corner product to gain)
  box = bj.Interval(jnp.full((4, D_IN), -0.3), jnp.ones((4, D_IN)))
  whole = bj.difference(layers_fn, matmul="exact")(a, b, box)
  best = bj.difference(layers_fn, matmul="best")(a, b, box)
  # the first layer's product (an input box of both signs times a kernel box): the
  # four-corner bound is tighter than midpoint-radius met with sign-split (the mode is used;
  # 3.18 against 3.31 here)
  w_exact, w_best = (float(np.mean(np.asarray(o[0].ref.width))) for o in (whole, best))
  assert w_exact < 0.98 * w_best, (w_exact, w_best)
  per_row = 8 * 4 * 16 * 16  # EXACT_LIVE * itemsize * (16 x 16 kernel terms of one row)
  small = bj.difference(layers_fn, matmul="exact", memory_bytes=2 * per_row)
  assert "scan" in str(jax.make_jaxpr(small)(a, b, box))
  assert "scan" not in str(jax.make_jaxpr(bj.difference(layers_fn, matmul="exact"))(a, b, box))
  part = small(a, b, box)
  for w, q in zip(whole, part):
    for f in ("ref", "other", "delta"):
      np.testing.assert_allclose(getattr(q, f).lower, getattr(w, f).lower, rtol=1e-6, atol=1e-6)
      np.testing.assert_allclose(getattr(q, f).upper, getattr(w, f).upper, rtol=1e-6, atol=1e-6)
  rng = np.random.default_rng(32)
  x = np_sample_box(rng, bj.Interval(box.lower[:1], box.upper[:1]), 50)[:, 0]
  ma, mb = np_sample_tree(rng, a, 200), np_sample_tree(rng, b, 200)
  za, zb = np_layers(ma, x, stacked=True), np_layers(mb, x, stacked=True)
  for i, bnd in enumerate(part):
    d = zb[i] - za[i]
    scale = TOL * (1 + np.abs(za[i]) + np.abs(zb[i]))
    assert np.all(d >= np.asarray(bnd.delta.lower)[:1] - scale), i
    assert np.all(d <= np.asarray(bnd.delta.upper)[:1] + scale), i
  assert d.size >= 10_000
  with pytest.raises(MemoryBudgetError):
    bj.difference(layers_fn, matmul="exact", memory_bytes=64)(a, b, box)


# ------------------------------------------------------------------------------------------------
# A small CNN: conv, ReLU, average and max pooling, flatten, dense

class SmallCNN(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(4, (3, 3), padding="VALID")(x))
    x = nn.avg_pool(x, (2, 2), strides=(2, 2))
    x = nn.relu(nn.Conv(4, (2, 2), padding="SAME")(x))
    x = nn.max_pool(x, (2, 2), strides=(1, 1))
    x = x.reshape(x.shape[0], -1)
    x = nn.relu(nn.Dense(8)(x))
    return nn.Dense(3)(x)


@pytest.mark.parametrize("width,shift", [(0.02, 0.0),
                                         pytest.param(0.05, 0.02, marks=pytest.mark.slow)])
def test_cnn_sound(width, shift):
  model = SmallCNN()
  params = model.init(jax.random.PRNGKey(7), jnp.zeros((1, 8, 8, 1)))
  hyper = shifted_box(1, params, width, shift)
  rng = np.random.default_rng(2)
  center = rng.random((1, 8, 8, 1)).astype(np.float32)
  box = bj.Interval(jnp.asarray(np.clip(center - 0.1, 0, 1)), jnp.asarray(np.clip(center + 0.1, 0, 1)))
  out = bj.difference(model.apply)(params, hyper, box)
  x = np_sample_box(rng, box, 50)[:, 0]
  members = np_sample_tree(rng, hyper, 200)
  ref = model.apply(params, x)
  other = jax.jit(jax.vmap(model.apply, in_axes=(0, None)))(members, x)
  assert check(out, ref, other, "cnn") >= 10_000
  naive = out.naive_delta()
  assert np.all(out.delta.upper - out.delta.lower <= naive.upper - naive.lower + 1e-6)


# ------------------------------------------------------------------------------------------------
# Relation to milp.difference, the point case, jit, tightness

def test_agrees_with_milp_difference():
  """With ``form="paper"`` the domain computes the milp formula (the same refinements), so the
  two agree up to rounding (float64 here); ``form="both"`` is contained in it."""
  _, params = _mlp()
  hyper = shifted_box(3, params, 0.01)
  with jax.enable_x64(True):
    p64 = jax.tree_util.tree_map(lambda a: jnp.asarray(np.asarray(a, np.float64)), params)
    h64 = jax.tree_util.tree_map(
        lambda a: bj.Interval(jnp.asarray(np.asarray(a.lower, np.float64)),
                              jnp.asarray(np.asarray(a.upper, np.float64))), hyper,
        is_leaf=bj.is_interval)
    box = bj.Interval(jnp.zeros((1, D_IN), jnp.float64), jnp.ones((1, D_IN), jnp.float64))
    paper = bj.difference(layers_fn, form="paper")(p64, h64, box)
    both = bj.difference(layers_fn)(p64, h64, box)
  db = MD.difference_bounds(MN.from_params(p64), MN.from_params(h64), np.zeros(D_IN),
                            np.ones(D_IN))
  milp_seq = []
  for m in range(len(db.pre)):
    milp_seq.append(db.pre[m])
    if m < len(db.post):
      milp_seq.append(db.post[m])
  ratios = []
  for (ml, mh), p, b in zip(milp_seq, paper, both):
    pl, ph = np.asarray(p.delta.lower[0]), np.asarray(p.delta.upper[0])
    bl, bh = np.asarray(b.delta.lower[0]), np.asarray(b.delta.upper[0])
    np.testing.assert_allclose(pl, ml, atol=1e-8)   # milp widens outward by ~1e-10
    np.testing.assert_allclose(ph, mh, atol=1e-8)
    assert np.all(bl >= pl - 1e-12) and np.all(bh <= ph + 1e-12)
    ratios.append(float(np.mean(bh - bl) / np.mean(mh - ml)))
  assert all(r <= 1.0 + 1e-6 for r in ratios), ratios


def test_point_hyper_network_gives_zero_delta():
  from boundjax import hypernet
  model, params = _mlp()
  box = bj.Interval(jnp.zeros((1, D_IN)), jnp.ones((1, D_IN)))
  ib = bj.ibp(model.apply)(params, box)
  for other in (params, jax.tree_util.tree_map(jnp.array, params), hypernet.point(params)):
    out = bj.difference(model.apply)(params, other, box)
    assert isinstance(out, bj.DiffInterval)
    assert np.all(np.asarray(out.delta.lower) == 0) and np.all(np.asarray(out.delta.upper) == 0)
    np.testing.assert_array_equal(out.ref.lower, ib.lower)
    np.testing.assert_allclose(out.other.upper, ib.upper, rtol=1e-6)


def test_ref_is_ibp_jit_and_grad():
  model, params = _mlp()
  hyper = shifted_box(4, params, 0.01)
  box = bj.Interval(jnp.zeros((1, D_IN)), jnp.ones((1, D_IN)))
  eager = bj.difference(model.apply)(params, hyper, box)
  jitted = jax.jit(bj.difference(model.apply))(params, hyper, box)
  # differentiable w.r.t. the parameter box (eager: the op-by-op kernels are already compiled)
  g = jax.grad(lambda h: jnp.sum(bj.difference(model.apply)(params, h, box).delta.upper))(hyper)
  for a, b in zip(jax.tree_util.tree_leaves(eager), jax.tree_util.tree_leaves(jitted)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  ib = bj.ibp(model.apply)(params, box)
  np.testing.assert_allclose(eager.ref.lower, ib.lower, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(eager.ref.upper, ib.upper, rtol=1e-6, atol=1e-6)
  grads = jax.tree_util.tree_leaves(g)
  assert all(np.all(np.isfinite(np.asarray(l))) for l in grads)
  assert any(np.any(np.asarray(l) != 0) for l in grads)


def test_tighter_than_subtracting_ibp():
  """``delta`` is inside ``IBP(N#) - IBP(N)`` everywhere and much narrower on average."""
  _, params = _mlp()
  hyper = shifted_box(5, params, 0.005)
  box = bj.Interval(jnp.zeros((1, D_IN)), jnp.ones((1, D_IN)))
  out = bj.difference(layers_fn)(params, hyper, box)
  sep_ref = bj.ibp(layers_fn)(params, box)
  sep_oth = bj.ibp(layers_fn)(hyper, box)
  ratios = []
  for o, r, h in zip(out, sep_ref, sep_oth):
    nl, nh = np.asarray(h.lower - r.upper), np.asarray(h.upper - r.lower)
    dl, dh = np.asarray(o.delta.lower), np.asarray(o.delta.upper)
    assert np.all(dl >= nl - 1e-6) and np.all(dh <= nh + 1e-6)
    ratios.append(float(np.mean(dh - dl) / np.mean(nh - nl)))
  print("mean width ratio delta / (IBP(N#) - IBP(N)) per layer output:",
        [f"{r:.3f}" for r in ratios])
  assert max(ratios) < 0.2, ratios


def _stacked_eval(fn, params, members, x):
  """``fn`` at N (vmapped over inputs) and at every member (numpy loop over members)."""
  f = jax.jit(jax.vmap(fn, in_axes=(None, 0)))
  ref = f(params, x)
  n = jax.tree_util.tree_leaves(members)[0].shape[0]
  outs = [f(jax.tree_util.tree_map(lambda a: a[i], members), x) for i in range(n)]
  return ref, jax.tree_util.tree_map(lambda *a: np.stack(a), *outs)


def test_form_both_within_paper_and_matrix_first():
  """The intersected form is inside the paper form, also when the product is written W @ h."""
  def fn(p, x):
    h = jax.nn.relu(p["w1"] @ x + p["b1"])
    return p["w2"] @ h + p["b2"]

  rng = np.random.default_rng(4)
  p = {"w1": rng.normal(size=(10, 5)), "b1": rng.normal(size=10),
       "w2": rng.normal(size=(3, 10)), "b2": rng.normal(size=3)}
  p = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), p)
  hyper = shifted_box(9, p, 0.02)
  box = bj.Interval(jnp.zeros(5), jnp.ones(5))
  both = bj.difference(fn)(p, hyper, box)
  paper = bj.difference(fn, form="paper")(p, hyper, box)
  assert np.all(both.delta.lower >= paper.delta.lower - 1e-6)
  assert np.all(both.delta.upper <= paper.delta.upper + 1e-6)
  x = np_sample_box(rng, box, 100)
  members = np_sample_tree(rng, hyper, 100)
  ref, other = _stacked_eval(fn, p, members, x)
  assert check(both, ref, other, "W @ h") >= 10_000


def test_elementwise_products_and_ops():
  """mul of two dependent values, min, reduce_max, concatenate, slices, division by a constant."""
  def fn(p, x):
    a = x * p["s"] + p["t"]                 # mul of box and parameter
    b = a * a[::-1]                         # mul of two dependent values
    c = jnp.minimum(a, 0.3) - jnp.maximum(b, a)
    d = jnp.concatenate([c, jnp.max(c, keepdims=True), a[:2] / 4.0])
    return jnp.sum(d.reshape(-1, 1) * jnp.ones((1, 2)), axis=0), d

  rng = np.random.default_rng(8)
  p = {"s": jnp.asarray(rng.normal(size=6), jnp.float32),
       "t": jnp.asarray(rng.normal(size=6), jnp.float32)}
  hyper = shifted_box(2, p, 0.05, 0.01)
  box = bj.Interval(jnp.full(6, -0.5), jnp.full(6, 0.8))
  out = bj.difference(fn)(p, hyper, box)
  x = np_sample_box(rng, box, 100)
  members = np_sample_tree(rng, hyper, 100)
  ref, other = _stacked_eval(fn, p, members, x)
  for i in range(2):
    assert check(out[i], ref[i], other[i], f"output {i}") >= 10_000


@pytest.mark.slow
def test_real_leave_one_out_members():
  """Real retrained networks: N and leave-one-out members on breast_cancer."""
  from sklearn.datasets import load_breast_cancer

  from boundjax import ensembles, hypernet

  data = load_breast_cancer()
  x = data.data.astype(np.float32)
  x = (x - x.min(0)) / np.maximum(x.max(0) - x.min(0), 1e-12)
  y = data.target.astype(np.int32)
  model = MLP(hidden=(16,), out=2)
  init = model.init(jax.random.PRNGKey(0), x[:1])
  removed = ensembles.leave_k_out(np.arange(0, 569, 24))
  ens = ensembles.train_ensemble(model, init, ensembles.sgd(0.1), x, y, removed, epochs=2,
                                 batch_size=64, seed=0, chunk_size=32, progress=False)
  hyper = hypernet.from_ensemble(ens.params)
  box = bj.Interval(jnp.zeros((1, 30)), jnp.ones((1, 30)))
  out = bj.difference(layers_fn)(ens.full, hyper, box)
  xs = np.concatenate([x, np_sample_box(np.random.default_rng(0), box, 200)[:, 0]])
  ref = np_layers(ens.full, xs)
  other = np_layers(ens.params, xs, stacked=True)
  for i, bnd in enumerate(out):
    assert check(bnd, ref[i], other[i], f"LOO members, output {i}") >= 10_000
  naive = out[-1].naive_delta()
  assert np.mean(out[-1].delta.upper - out[-1].delta.lower) < 0.5 * np.mean(
      naive.upper - naive.lower)


# ------------------------------------------------------------------------------------------------
# Errors

def test_errors():
  model, params = _mlp()
  hyper = shifted_box(0, params, 0.01)
  box = bj.Interval(jnp.zeros((1, D_IN)), jnp.ones((1, D_IN)))
  with pytest.raises(bj.UnsupportedPrimitiveError, match="difference domain.*exp"):
    bj.difference(lambda p, x: jnp.exp(model.apply(p, x)))(params, hyper, box)
  with pytest.raises(ValueError, match="structure"):
    bj.difference(model.apply)(params, {"params": {}}, box)
  bad = jax.tree_util.tree_map(lambda a: a[..., :1], params)
  with pytest.raises(ValueError, match="shape"):
    bj.difference(model.apply)(params, bad, box)
  with pytest.raises(ValueError, match="form"):
    bj.difference(model.apply, form="reluDiff")
  with pytest.raises(bj.UnsupportedPrimitiveError, match="convert_element_type"):
    bj.difference(lambda p, x: model.apply(p, x).astype(jnp.int32))(params, hyper, box)
  with pytest.raises(bj.UnsupportedPrimitiveError, match="'gt'"):
    bj.difference(lambda p, x: jnp.where(model.apply(p, x) > 0, 1.0, 0.0))(params, hyper, box)
  with pytest.raises(bj.UnsupportedPrimitiveError, match="div"):
    bj.difference(lambda p, x: 1.0 / model.apply(p, x))(params, hyper, box)


# ------------------------------------------------------------------------------------------------
# sound mode (exact rational reference) and DiffInterval arguments

def _exact_layers(w1, b1, w2, b2, x):
  """Exact (rational) pre-activation, post-ReLU and output of ``w2 relu(w1 x + b1) + b2``."""
  from fractions import Fraction as F
  z = [sum((F(float(w1[i, j])) * F(float(x[j])) for j in range(len(x))), F(float(b1[i])))
       for i in range(len(b1))]
  h = [max(v, F(0)) for v in z]
  y = [sum((F(float(w2[i, j])) * h[j] for j in range(len(h))), F(float(b2[i])))
       for i in range(len(b2))]
  return z, h, y


def _two_layer(p, x):
  z = p["w1"] @ x + p["b1"]
  h = jnp.maximum(z, 0.0)
  return z, h, p["w2"] @ h + p["b2"]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_sound_mode_contains_exact_differences_on_point_inputs(dtype):
  """``sound=True``: on point inputs (where the bound is as tight as the float evaluation) the
  exact rational differences of N and a concrete N# lie in ``delta`` (and N's, N#'s exact values
  in ``ref``/``other``) at every layer; without ``sound`` the same check fails somewhere."""
  from fractions import Fraction as F
  rng = np.random.default_rng(5)
  n, k, m = 7, 9, 3
  mk = lambda *s: rng.normal(size=s)
  base = dict(w1=mk(k, n), b1=mk(k), w2=mk(m, k) / 3, b2=mk(m))
  other = {key: v + 1e-3 * rng.normal(size=v.shape) for key, v in base.items()}
  with jax.enable_x64(dtype == jnp.float64):
    cast = lambda t: {key: np.asarray(v, dtype) for key, v in t.items()}
    p, q = cast(base), cast(other)
    sound = jax.jit(bj.difference(_two_layer, sound=True))
    plain = jax.jit(bj.difference(_two_layer))
    missed = 0
    for trial in range(200):
      x = np.asarray(rng.uniform(-2, 2, n), dtype)
      box = bj.Interval(jnp.asarray(x), jnp.asarray(x))
      er = _exact_layers(p["w1"], p["b1"], p["w2"], p["b2"], x)
      eo = _exact_layers(q["w1"], q["b1"], q["w2"], q["b2"], x)
      for name, fn in (("sound", sound), ("plain", plain)):
        out = fn(p, q, box)
        ok = True
        for layer, a, b in zip(out, er, eo):
          for iv, vals in ((layer.delta, [bb - aa for aa, bb in zip(a, b)]), (layer.ref, a),
                           (layer.other, b)):
            lo, hi = np.asarray(iv.lower), np.asarray(iv.upper)
            assert not (np.isnan(lo).any() or np.isnan(hi).any())
            ok &= all(F(float(lo[i])) <= v <= F(float(hi[i])) for i, v in enumerate(vals))
        if name == "sound":
          assert ok, (trial, dtype)
        else:
          missed += not ok
  assert missed > 0


def test_diffinterval_arguments_and_tighten_are_sound():
  """A `DiffInterval` argument (layer input given by its three enclosures) bounds every
  consistent pair: sampled (h, h#) with h in ref, h# in other and h# - h in delta, members of the
  weight box; >= 10^4 pairs, in both modes. `tighten` keeps every such pair too."""
  rng = np.random.default_rng(6)
  k, m = 8, 4
  w = rng.normal(size=(m, k))
  b = rng.normal(size=m)
  wbox = bj.Interval(jnp.asarray(w - 0.05), jnp.asarray(w + 0.05))
  bbox = bj.Interval(jnp.asarray(b - 0.02), jnp.asarray(b + 0.02))
  h_lo = rng.uniform(-1, 0.5, k)
  h_hi = h_lo + rng.uniform(0, 1, k)
  d_lo = -rng.uniform(0, 0.1, k)
  d_hi = rng.uniform(0, 0.1, k)
  o_lo, o_hi = h_lo + d_lo + 0.02, h_hi + d_hi - 0.02   # other: narrower than ref + delta
  iv = lambda a, c: bj.Interval(jnp.asarray(a), jnp.asarray(c))
  with jax.enable_x64(True):
    arg = bj.DiffInterval(iv(h_lo, h_hi), iv(o_lo, o_hi), iv(d_lo, d_hi))
    fn = lambda p, h: jnp.maximum(p[0] @ h + p[1], 0.0)
    from boundjax.domains.difference import tighten
    for sound in (False, True):
      out = bj.difference(fn, sound=sound)((jnp.asarray(w), jnp.asarray(b)), (wbox, bbox), arg)
      tt = tighten(arg, sound=sound)
      count = 0
      for r in range(60):
        h = rng.uniform(h_lo, h_hi, (200, k))
        lo_s, hi_s = np.maximum(o_lo, h + d_lo), np.minimum(o_hi, h + d_hi)
        hs = lo_s + rng.uniform(0, 1, (200, k)) * (hi_s - lo_s)   # h# in other, h# - h in delta
        keep = np.all((hs >= o_lo) & (hs <= o_hi) & (hs - h >= d_lo) & (hs - h <= d_hi), axis=1)
        h, hs = h[keep], hs[keep]                                  # consistent pairs only
        t = rng.random((m, k)) < 0.5
        ws = np.where(t, w - 0.05, w + 0.05) if r % 2 else w + rng.uniform(-0.05, 0.05, (m, k))
        bs = b + rng.uniform(-0.02, 0.02, m)
        y, ys = np.maximum(h @ w.T + b, 0), np.maximum(hs @ ws.T + bs, 0)
        tol = 1e-12 if not sound else 0.0
        for iv_, vals in ((out.delta, ys - y), (out.ref, y), (out.other, ys)):
          assert np.all(vals >= np.asarray(iv_.lower) - tol)
          assert np.all(vals <= np.asarray(iv_.upper) + tol)
        for iv_, vals in ((tt.delta, hs - h), (tt.other, hs), (tt.ref, h)):
          assert np.all(vals >= np.asarray(iv_.lower)) and np.all(vals <= np.asarray(iv_.upper))
        count += len(h) * m
      assert count >= 10_000, count
      # tighten narrows the given other to ref + delta and the delta to other - ref
      assert np.all(np.asarray(tt.other.upper) <= o_hi) and np.all(np.asarray(tt.delta.lower) >= d_lo)


def test_known_bounds_at_relu_nodes_are_met_refined_and_reported():
  """``known=`` meets each ReLU node's enclosures with given sound ones (here N's CROWN bounds,
  tighter than the domain's IBP ``ref``) where the node is computed, so every later layer starts
  from them; ``return_info`` reports every node's input and output enclosures. Both enclose
  >= 10^4 sampled (input, member) pairs, and the known bounds make the differences tighter."""
  model, params = _mlp((16, 16))
  hyper = shifted_box(3, params, 0.05)
  box = bj.Interval(jnp.zeros((1, D_IN)), jnp.ones((1, D_IN)))
  bound = bj.difference(layers_fn, return_info=True)
  plain, info0 = bound(params, hyper, box)
  crown = bj.crown(layers_fn)(params, box)          # N's bounds of every layer value
  known = [bj.DiffInterval(crown[0], None, None), bj.DiffInterval(crown[2], None, None)]
  outs, info = bound(params, hyper, box, known=known)
  ref, other = mlp_pairs(np.random.default_rng(4), params, hyper, box)
  assert len(info.pre) == len(info.post) == 2
  n = 0
  for k, layer in enumerate((0, 2)):      # node k: pre-activation `layer`, its ReLU `layer + 1`
    for got in (info0, info):
      n = check(got.pre[k], ref[layer], other[layer], f"node {k} input")
      check(got.post[k], ref[layer + 1], other[layer + 1], f"node {k} output")
    ki, ci = info.pre[k].ref, crown[layer]
    assert np.all(np.asarray(ki.lower) >= np.asarray(ci.lower))
    assert np.all(np.asarray(ki.upper) <= np.asarray(ci.upper))
    # the node's value in the outputs is the met one
    np.testing.assert_array_equal(np.asarray(outs[layer].delta.lower),
                                  np.asarray(info.pre[k].delta.lower))
  for i, bnd in enumerate(outs):
    n = check(bnd, ref[i], other[i], f"layer output {i} with known")
  assert n >= 10_000
  width = lambda v: np.asarray(v.delta.upper - v.delta.lower)
  gains = [width(a) - width(b) for a, b in zip(plain, outs)]
  assert all(np.all(g >= -1e-6) for g in gains)          # never looser
  assert max(float(np.max(g)) for g in gains) > 1e-3      # and tighter where CROWN is
  # the checks name what is wrong
  with pytest.raises(ValueError, match="one entry per ReLU node"):
    bound(params, hyper, box, known=known[:1])
  with pytest.raises(ValueError, match="shape"):
    bound(params, hyper, box, known=[bj.DiffInterval(crown[-1], None, None), None])
  with pytest.raises(ValueError, match="DiffInterval"):
    bound(params, hyper, box, known=[crown[0], None])

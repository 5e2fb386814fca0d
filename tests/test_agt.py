"""Unit tests of boundjax.agt: Thm 4.6, streaming top-k, gradient bounds, updates."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from boundjax import agt
from boundjax.agt import descent, losses, mlp, retrain
from boundjax.agt import bounds as bnd
from boundjax.core import options
from boundjax.core.interval import Interval
from tests.helpers import matmul_precisions


@pytest.fixture(autouse=True)
def x64():
  with jax.enable_x64(True):
    yield


def _is_iv(x):
  return isinstance(x, Interval)


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, msg", [
    (dict(k_private=10), "k_private"),
    (dict(k_private=1), "clip_gamma must be finite"),
    (dict(loss="hinge"), "loss"),
    (dict(optimizer="rmsprop"), "optimizer"),
    (dict(momentum=0.9), "optimizer='sgdm'"),
    (dict(l1_reg=0.1, l2_reg=0.1), "l1_reg"),
    (dict(l2_reg=5.0), "monotone"),
    (dict(learning_rate=0.0), "learning_rate"),
    (dict(normalise="sum"), "normalise"),
] + [(dict(**{f: v}), f) for f in ("lr_decay", "lr_min", "l2_reg", "l1_reg", "momentum",
                                   "dampening", "clip_gamma", "learning_rate")
     for v in (float("nan"), float("-inf"))] + [
    (dict(lr_decay=float("inf")), "lr_decay"), (dict(l2_reg=float("inf")), "l2_reg")])
def test_config_rejects_bad_values(kw, msg):
  base = dict(n_epochs=1, learning_rate=0.5, batch_size=10)
  base.update(kw)
  with pytest.raises(ValueError, match=msg):
    agt.Config(**base)


def test_lr_schedule():
  c = agt.Config(n_epochs=1, learning_rate=2.0, batch_size=4, lr_decay=0.5, lr_min=0.5)
  np.testing.assert_allclose([float(c.lr(n)) for n in range(5)], [2.0, 2 / 1.5, 1.0, 0.8, 2 / 3])
  assert float(c.lr(100)) == 0.5


# ---------------------------------------------------------------------------------------------
# Thm 4.6 by brute force and the streaming form
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("b, k", [(5, 1), (6, 2), (4, 3)])
def test_thm46_brute_force(b, k):
  rng = np.random.default_rng(b * 10 + k)
  d, gamma = 3, 0.7
  gl = rng.uniform(-1.5, 1.5, (b, d))
  delta_l = np.clip(gl, -gamma, gamma)
  delta_u = np.clip(gl + rng.uniform(0, 0.6, (b, d)), -gamma, gamma)
  lo, hi = map(np.asarray, descent.descent_bounds_dense(jnp.asarray(delta_l), jnp.asarray(delta_u),
                                                        k, gamma))
  checked = 0
  for r in range(k + 1):
    for rm in itertools.combinations(range(b), r):
      keep = [i for i in range(b) if i not in rm]
      for a in range(k + 1):
        adds = [np.array(v) for v in itertools.product([-gamma, gamma], repeat=d)]
        adds += [rng.uniform(-gamma, gamma, d) for _ in range(4)]
        for combo in itertools.combinations_with_replacement(range(len(adds)), a):
          for _ in range(2):   # a concrete gradient of each kept point inside its bound
            t = rng.uniform(size=(len(keep), d))
            t[: len(keep) // 2] = np.round(t[: len(keep) // 2])
            g = delta_l[keep] + t * (delta_u[keep] - delta_l[keep])
            tot = g.sum(0) + sum((adds[c] for c in combo), np.zeros(d))
            n = len(keep) + a
            # true SGD on the changed batch (1/|B~|); the fixed-1/b convention only when the
            # batch does not grow (a <= r): see test_fixed_b_normalisation_needs_a_le_r.
            for mean in ((tot / n, tot / b) if a <= r else (tot / n,)):
              assert np.all(lo <= mean + 1e-12) and np.all(mean <= hi + 1e-12)
              checked += 1
  assert checked > 100


def test_fixed_b_normalisation_needs_a_le_r():
  """Spec §2.6 claims Thm 4.6 also covers dividing by the nominal b; not when a > r.

  With k additions and no removal, sum/b of b + k clipped gradients can exceed gamma, so it
  exceeds the bound. True SGD on the changed batch divides by |B~| and stays covered.
  """
  b, k, gamma = 4, 2, 1.0
  d = jnp.full((b, 1), 0.9)
  lo, hi = descent.descent_bounds_dense(d, d, k, gamma)
  tot = 0.9 * b + k * gamma
  assert tot / (b + k) <= float(hi[0])
  assert tot / b > float(hi[0])


def test_thm46_is_tight_at_the_worst_case():
  """The bound is attained: remove the k largest lower bounds, add k copies of -gamma."""
  rng = np.random.default_rng(0)
  b, k, gamma = 7, 2, 1.0
  dl = rng.uniform(-1, 1, (b, 1))
  lo, _ = descent.descent_bounds_dense(jnp.asarray(dl), jnp.asarray(dl), k, gamma)
  worst = (np.sort(dl[:, 0])[: b - k].sum() - k * gamma) / b
  np.testing.assert_allclose(np.asarray(lo)[0], worst)


@pytest.mark.parametrize("k", [0, 1, 3, 11])
@pytest.mark.parametrize("frag", [1, 3, 5, 12])
def test_streaming_topk_equals_dense(k, frag):
  rng = np.random.default_rng(k + 7 * frag)
  b = 12
  dl = jnp.asarray(rng.normal(size=(b, 4, 3)))
  du = dl + jnp.asarray(rng.uniform(size=(b, 4, 3)))
  ref = descent.descent_bounds_dense(dl, du, k, 0.8)
  got = descent.descent_bounds(dl, du, k, 0.8, fragsize=frag)
  perm = rng.permutation(b)
  got_perm = descent.descent_bounds(dl[perm], du[perm], k, 0.8, fragsize=frag)
  for r, g, gp in zip(ref, got, got_perm):
    np.testing.assert_allclose(g, r, atol=1e-12)
    np.testing.assert_allclose(gp, r, atol=1e-12)


def test_descent_bounds_monotone_in_k():
  rng = np.random.default_rng(3)
  dl = jnp.asarray(np.clip(rng.normal(size=(20, 5)), -1, 1))
  du = jnp.minimum(dl + 0.3, 1.0)
  prev = None
  for k in range(0, 19):
    lo, hi = descent.descent_bounds_dense(dl, du, k, 1.0)
    if prev is not None:
      assert np.all(np.asarray(lo) <= np.asarray(prev[0]) + 1e-12)
      assert np.all(np.asarray(hi) >= np.asarray(prev[1]) - 1e-12)
    prev = (lo, hi)


def test_descent_bounds_rejects_k_ge_b():
  with pytest.raises(ValueError, match="k < batch size"):
    descent.descent_bounds(jnp.zeros((3, 2)), jnp.zeros((3, 2)), 3, 1.0)


def test_clip_intervals():
  iv = Interval(jnp.array([-3.0, 0.1]), jnp.array([2.0, 0.2]))
  c = descent.clip({"a": iv, "b": jnp.array([5.0])}, 1.0)
  np.testing.assert_allclose(c["a"].lower, [-1.0, 0.1])
  np.testing.assert_allclose(c["a"].upper, [1.0, 0.2])
  np.testing.assert_allclose(c["b"], [1.0])


# ---------------------------------------------------------------------------------------------
# Loss-gradient and parameter-gradient bounds (checks 1-3)
# ---------------------------------------------------------------------------------------------

def test_softmax_bounds_contain_samples_and_fix_typo():
  rng = np.random.default_rng(0)
  zl = rng.normal(size=(50, 4))
  zu = zl + rng.uniform(0, 2, (50, 4))
  pl, pu = map(np.asarray, losses.softmax_bounds(jnp.asarray(zl), jnp.asarray(zu)))
  assert np.all(pl <= pu)
  for _ in range(200):
    z = zl + rng.uniform(size=zl.shape) * (zu - zl)
    p = np.asarray(jax.nn.softmax(jnp.asarray(z)))
    assert np.all(pl <= p + 1e-12) and np.all(p <= pu + 1e-12)
  # p_U is attained at own logit upper, others lower (the paper prints p_L twice)
  zc = np.where(np.eye(4, dtype=bool)[0], zu[0], zl[0])
  np.testing.assert_allclose(np.asarray(jax.nn.softmax(jnp.asarray(zc)))[0], pu[0, 0])


def _net(key, sizes):
  return mlp.init(key, sizes, jnp.float64)


def _widen(params, key, r=0.1):
  leaves, tdef = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(key, 2 * len(leaves))
  out = []
  for i, p in enumerate(leaves):
    lo = p - jax.random.uniform(keys[2 * i], p.shape, p.dtype, 0, r)
    hi = p + jax.random.uniform(keys[2 * i + 1], p.shape, p.dtype, 0, r)
    out.append(Interval(lo, hi))
  return tdef.unflatten(out)


def _samples(box, key, n):
  """n parameter vectors in the box (leading axis n); even ones at random corners."""
  leaves, tdef = jax.tree_util.tree_flatten(box, is_leaf=_is_iv)
  keys = jax.random.split(key, len(leaves))
  out = []
  corner = (jnp.arange(n) % 2 == 0)
  for kk, iv in zip(keys, leaves):
    t = jax.random.uniform(kk, (n,) + iv.shape, iv.dtype)
    t = jnp.where(corner.reshape((n,) + (1,) * iv.ndim), jnp.round(t), t)
    out.append(iv.lower + t * (iv.upper - iv.lower))
  return tdef.unflatten(out)


def _inside(box_leaves, vals, tol=1e-10):
  """Every sampled value (leading sample axis) inside its Interval."""
  return all(bool(jnp.all((iv.lower <= v + tol) & (v <= iv.upper + tol)))
             for iv, v in zip(box_leaves, vals))


@pytest.mark.parametrize("loss, sizes", [
    ("binary_cross_entropy", [3, 6, 5, 1]),
    ("cross_entropy", [3, 6, 4]),
    ("mse", [3, 5, 2]),
])
@pytest.mark.parametrize("matmul", ["midrad", pytest.param("signsplit", marks=pytest.mark.slow)])
def test_grad_bounds_contain_sampled_gradients(loss, sizes, matmul):
  key = jax.random.PRNGKey(sizes[-1] + len(loss))
  k1, k2, k3 = jax.random.split(key, 3)
  params = _net(k1, sizes)
  box = _widen(params, k2)
  xs = jax.random.normal(k3, (6, sizes[0]), jnp.float64)
  if loss == "cross_entropy":
    ys = jnp.arange(6) % sizes[-1]
  elif loss == "mse":
    ys = jax.random.normal(k3, (6, sizes[-1]), jnp.float64)
  else:
    ys = (jnp.arange(6) % 2).astype(jnp.float64)
  gb = jax.jit(lambda pb: mlp.grad_bounds(pb, xs, ys, loss, matmul))(box)
  fb = jax.jit(lambda pb: mlp.forward_bounds(pb, xs, matmul))(box)
  gfn = agt.train.nominal_grad_fn(mlp.apply, loss)
  thetas = _samples(box, k3, 64)
  g, z = jax.jit(jax.vmap(lambda t: (gfn(t, xs, ys), mlp.apply(t, xs))))(thetas)
  assert _inside(jax.tree_util.tree_leaves(gb, is_leaf=_is_iv), jax.tree_util.tree_leaves(g))
  assert _inside([fb], [z])


@pytest.mark.parametrize("loss, sizes", [("binary_cross_entropy", [3, 7, 1]),
                                         ("cross_entropy", [3, 7, 6, 3])])
def test_zero_width_bounds_equal_jax_grad(loss, sizes):
  key = jax.random.PRNGKey(1)
  params = _net(key, sizes)
  box = jax.tree_util.tree_map(lambda p: Interval(p, p), params)
  xs = jax.random.normal(key, (5, 3), jnp.float64)
  ys = (jnp.arange(5) % sizes[-1]).astype(jnp.float64 if sizes[-1] == 1 else jnp.int32)
  if sizes[-1] == 1:
    ys = (jnp.arange(5) % 2).astype(jnp.float64)
  gb = jax.jit(lambda b: mlp.grad_bounds(b, xs, ys, loss))(box)
  g = agt.train.nominal_grad_fn(mlp.apply, loss)(params, xs, ys)
  for a, iv in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(gb, is_leaf=_is_iv)):
    np.testing.assert_allclose(iv.lower, a, atol=1e-10)
    np.testing.assert_allclose(iv.upper, a, atol=1e-10)


def test_margin_bounds_contain_sampled_margins():
  key = jax.random.PRNGKey(4)
  params = _net(key, [3, 6, 4])
  box = _widen(params, key, 0.05)
  xs = jax.random.normal(key, (20, 3), jnp.float64)
  cls = jnp.argmax(mlp.apply(params, xs), -1)
  m = mlp.margin_bounds(box, xs, cls)
  fb = mlp.forward_bounds(box, xs)
  loose = jnp.take_along_axis(fb.lower, cls[:, None], -1) - fb.upper
  assert bool(jnp.all(m >= loose - 1e-12))            # never looser than logit bounds
  z = jax.vmap(lambda t: mlp.apply(t, xs))(_samples(box, key, 128))
  marg = jnp.take_along_axis(z, jnp.broadcast_to(cls[None, :, None], (128, 20, 1)), -1) - z
  assert bool(jnp.all(m[None] <= marg + 1e-10))


def test_mlp_containers_and_auto_backend():
  import flax.linen as nn

  class M(nn.Module):
    @nn.compact
    def __call__(self, x):
      h = nn.relu(nn.Dense(5)(x))
      return nn.Dense(1)(h)
  x = jnp.ones((2, 3))
  m = M()
  p = m.init(jax.random.PRNGKey(0), x)
  assert bnd.resolve("auto", m.apply, p, x) == "mlp"
  np.testing.assert_allclose(mlp.apply(p, x), m.apply(p, x), rtol=1e-6)
  with pytest.raises(ValueError, match="reproduces"):
    bnd.resolve("mlp", lambda p, x: jnp.tanh(m.apply(p, x)), p, x)


# ---------------------------------------------------------------------------------------------
# The engine's bounds of the Dense passes against a hand-written reference and 10^4 samples
# ---------------------------------------------------------------------------------------------

def _ref_product(a, b, matmul):
  """``a @ b`` of ``(lo, hi)`` pairs (a point is ``(v, v)``): midpoint-radius (Rump) or
  sign-split, written out (the interval product of the hand-written passes AGT had before)."""
  (al, au), (bl, bu) = a, b
  if matmul == "midrad":
    am, ar, bm, br = (al + au) / 2, (au - al) / 2, (bl + bu) / 2, (bu - bl) / 2
    mid, rad = am @ bm, jnp.abs(am) @ br + ar @ jnp.abs(bm) + ar @ br
    return mid - rad, mid + rad
  p, n = (lambda v: jnp.maximum(v, 0)), (lambda v: jnp.minimum(v, 0))
  lo = p(al) @ p(bl) + p(au) @ n(bl) + n(al) @ p(bu) + n(au) @ n(bu)
  hi = p(au) @ p(bu) + p(al) @ n(bu) + n(au) @ p(bl) + n(al) @ n(bl)
  return lo, hi


def _ref_grad_bounds(box, x, y, loss, matmul):
  """One sample, layer by layer (AGT, App. B): forward IBP, the loss-gradient rule, then
  ``grad W = z (x) d`` (four corners), ``d <- H(zhat) (.) (W d)`` with H applied to both ends."""
  ls = [{k: (iv.lower, iv.upper) for k, iv in l.items()} for l in box]
  z, cache = x, []
  for i, l in enumerate(ls):
    lo, hi = _ref_product((z[0][None], z[1][None]), l["kernel"], matmul)
    zh = (lo[0] + l["bias"][0], hi[0] + l["bias"][1])
    cache.append((z, zh))
    z = (jnp.maximum(zh[0], 0), jnp.maximum(zh[1], 0)) if i < len(ls) - 1 else zh
  d = losses.logit_grad_bounds(loss, Interval(*z, validate=False), y)
  d = (d.lower, d.upper)
  grads = [None] * len(ls)
  for i in range(len(ls) - 1, -1, -1):
    (zl, zu), _ = cache[i]
    corners = [a[:, None] * b[None, :] for a in (zl, zu) for b in d]
    grads[i] = {"kernel": (jnp.min(jnp.stack(corners), 0), jnp.max(jnp.stack(corners), 0)),
                "bias": d}
    if i > 0:
      lo, hi = _ref_product(ls[i]["kernel"], (d[0][:, None], d[1][:, None]), matmul)
      hl, hu = cache[i - 1][1][0] > 0, cache[i - 1][1][1] > 0
      d = (jnp.where(hl, lo[:, 0], jnp.where(hu, jnp.minimum(lo[:, 0], 0), 0)),
           jnp.where(hl, hi[:, 0], jnp.where(hu, jnp.maximum(hi[:, 0], 0), 0)))
  return grads


def _draw_params(box, key, n):
  """n parameter vectors in the box: odd ones uniform, even ones at random corners, then the
  all-lower and all-upper corners."""
  leaves, tdef = jax.tree_util.tree_flatten(box, is_leaf=_is_iv)
  keys = jax.random.split(key, len(leaves))
  corner = (jnp.arange(n) % 2 == 0)
  out = []
  for kk, iv in zip(keys, leaves):
    t = jax.random.uniform(kk, (n,) + iv.shape, iv.dtype)
    t = jnp.where(corner.reshape((n,) + (1,) * iv.ndim), jnp.round(t), t)
    t = jnp.concatenate([t, jnp.zeros((1,) + iv.shape), jnp.ones((1,) + iv.shape)])
    out.append(iv.lower + t * (iv.upper - iv.lower))
  return tdef.unflatten(out)


@pytest.mark.parametrize("loss, sizes, eps", [
    ("binary_cross_entropy", [3, 6, 5, 1], 0.0),
    ("cross_entropy", [4, 16, 16, 3], 0.0),
    ("cross_entropy", [4, 9, 3], 0.05),          # an input box (feature poisoning)
    ("mse", [5, 12, 10, 8, 2], 0.0),
])
def test_engine_grad_bounds_match_hand_written_passes_and_contain_10k_samples(loss, sizes, eps):
  """`mlp.grad_bounds` is `boundjax.ibp` of the nominal passes: equal (up to rounding) to the
  hand-written interval passes it replaced, for both interval products, and every per-sample
  gradient of 10^4 sampled parameter vectors plus the two all-corner ones (``jax.grad`` in
  float64; with an input box, the input sampled too) lies inside."""
  n, m = 4, 10_000
  k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(len(sizes) + sizes[1]), 4)
  params = _net(k1, sizes)
  box = _widen(params, k2, 0.05)
  xs = jax.random.normal(k3, (n, sizes[0]), jnp.float64)
  ys = {"cross_entropy": jnp.arange(n) % sizes[-1],
        "binary_cross_entropy": (jnp.arange(n) % 2).astype(jnp.float64),
        "mse": jax.random.normal(k3, (n, sizes[-1]), jnp.float64)}[loss]
  xb = Interval(xs - eps, xs + eps) if eps else xs
  lf = losses.per_sample_loss(loss)
  grad = jax.grad(lambda p, x, y: lf(mlp.apply(p, x[None])[0], y))

  def sampled(thetas, t):
    x = xs + eps * (2 * t - 1)        # an input in the box (t in [0, 1])
    g = jax.vmap(lambda p, xx: jax.vmap(grad, in_axes=(None, 0, 0))(p, xx, ys))(thetas, x)
    return jax.tree_util.tree_map(lambda v: (v.min(0), v.max(0)), g)
  thetas = _draw_params(box, k4, m)
  t = jnp.round(jax.random.uniform(k4, (m + 2,) + xs.shape, jnp.float64))
  g_lo_hi = jax.jit(sampled)(thetas, t)
  for matmul in ("midrad", "signsplit"):
    gb = jax.jit(lambda b, matmul=matmul: mlp.grad_bounds(b, xb, ys, loss, matmul))(box)
    ref = [_ref_grad_bounds(box, (xb.lower[i], xb.upper[i]) if eps else (xs[i], xs[i]),
                            ys[i], loss, matmul) for i in range(n)]
    for li, layer in enumerate(gb):
      for name, iv in layer.items():
        r_lo = jnp.stack([r[li][name][0] for r in ref])
        r_hi = jnp.stack([r[li][name][1] for r in ref])
        np.testing.assert_allclose(iv.lower, r_lo, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(iv.upper, r_hi, rtol=1e-12, atol=1e-13)
        assert float(jnp.sum(iv.upper - iv.lower)) <= float(jnp.sum(r_hi - r_lo)) * (1 + 1e-12)
        s_lo, s_hi = g_lo_hi[li][name]
        assert bool(jnp.all(iv.lower <= s_lo + 1e-10) & jnp.all(s_hi <= iv.upper + 1e-10)), \
            (matmul, li, name)


def test_engine_margin_bounds_match_the_folded_last_layer():
  """`mlp.margin_bounds` (``boundjax.ibp`` of the folded margins) equals the hand-written fold
  ``(W_c - W_j) h + (b_c - b_j)`` on the interval activations ``h``."""
  key = jax.random.PRNGKey(5)
  box = _widen(_net(key, [3, 8, 6, 4]), key, 0.05)
  xs = jax.random.normal(key, (7, 3), jnp.float64)
  cls = jnp.arange(7) % 4
  for matmul in ("midrad", "signsplit"):
    h = (xs, xs)
    for l in box[:-1]:
      lo, hi = _ref_product(h, (l["kernel"].lower, l["kernel"].upper), matmul)
      h = (jnp.maximum(lo + l["bias"].lower, 0), jnp.maximum(hi + l["bias"].upper, 0))
    w, b = box[-1]["kernel"], box[-1]["bias"]
    ref = []
    for i in range(7):
      c = int(cls[i])
      dw = (w.lower[:, c:c + 1] - w.upper, w.upper[:, c:c + 1] - w.lower)
      lo, _ = _ref_product((h[0][i:i + 1], h[1][i:i + 1]), dw, matmul)
      ref.append(lo[0] + b.lower[c] - b.upper)
    np.testing.assert_allclose(mlp.margin_bounds(box, xs, cls, matmul), jnp.stack(ref),
                               rtol=1e-12, atol=1e-13)


# ---------------------------------------------------------------------------------------------
# The step and fit (checks 6, 7, 10, 16) and equality with optax at k = 0
# ---------------------------------------------------------------------------------------------

def _data(n=48, d=3, key=0):
  k = jax.random.PRNGKey(key)
  X = jax.random.normal(k, (n, d), jnp.float64)
  y = (X[:, 0] - X[:, 1] > 0).astype(jnp.float64)
  return X, y


@pytest.mark.parametrize("opt", [
    dict(optimizer="sgd"),
    dict(optimizer="sgdm", momentum=0.9, nesterov=True),
    pytest.param(dict(optimizer="sgdm", momentum=0.5), marks=pytest.mark.slow),
    pytest.param(dict(optimizer="sgd", l2_reg=0.1), marks=pytest.mark.slow),
])
def test_k0_point_box_equals_optax_sgd(opt):
  X, y = _data()
  params = _net(jax.random.PRNGKey(2), [3, 8, 1])
  cfg = agt.Config(n_epochs=2, learning_rate=0.3, batch_size=16, lr_decay=0.5, fragsize=5, **opt)
  traj = retrain.agt_trajectory(mlp.apply, params, X, y, cfg)
  pt, bt = traj                                          # a Trajectory unpacks as a pair
  assert traj.params is pt and traj.bounds is bt
  sched = agt.batches(X.shape[0], cfg)
  lr = lambda n: cfg.learning_rate / (1 + cfg.lr_decay * n)  # noqa: E731
  tx = optax.sgd(lr, momentum=cfg.momentum or None, nesterov=cfg.nesterov)
  if cfg.l2_reg:
    tx = optax.chain(optax.add_decayed_weights(cfg.l2_reg), optax.sgd(lr))
  lf = losses.per_sample_loss(cfg.loss)
  mean_loss = lambda p, xb, yb: jnp.mean(jax.vmap(lambda a, b: lf(mlp.apply(p, a[None])[0], b))(xb, yb))  # noqa: E731,E501
  p, st = params, tx.init(params)
  grad = jax.jit(jax.grad(mean_loss))
  t = 0
  for _ in range(cfg.n_epochs):
    for idx in sched:
      g = grad(p, X[idx], y[idx])
      u, st = tx.update(g, st, p)
      p = optax.apply_updates(p, u)
      for a, b, iv in zip(jax.tree_util.tree_leaves(p),
                          jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda q: q[t], pt)),
                          jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda q: q[t], bt),
                                                    is_leaf=_is_iv)):
        np.testing.assert_allclose(b, a, atol=1e-10)
        np.testing.assert_allclose(iv.lower, a, atol=1e-10)   # box stays a point at k=0
        np.testing.assert_allclose(iv.upper, a, atol=1e-10)
      t += 1


def test_step_is_jittable_and_fragment_invariant():
  X, y = _data(40)
  params = _net(jax.random.PRNGKey(3), [3, 6, 1])
  outs = []
  for frag in (40, 7):
    cfg = agt.Config(n_epochs=1, learning_rate=0.5, batch_size=40, k_private=3, clip_gamma=0.2,
                     fragsize=frag)
    step = jax.jit(agt.make_step(mlp.apply, cfg))
    s = agt.init(params, cfg)
    s = step(s, X, y)
    s = step(s, X, y)
    outs.append(s)
  for s in outs[1:]:
    for a, b in zip(jax.tree_util.tree_leaves(outs[0]), jax.tree_util.tree_leaves(s)):
      np.testing.assert_allclose(a, b, atol=1e-12)
  s = outs[0]
  for p, iv in zip(jax.tree_util.tree_leaves(s.params),
                   jax.tree_util.tree_leaves(s.bounds, is_leaf=_is_iv)):
    assert bool(jnp.all((iv.lower <= p) & (p <= iv.upper)))
    assert float(jnp.max(iv.width)) > 0


def test_boxes_nest_in_k():
  X, y = _data(60)
  params = _net(jax.random.PRNGKey(5), [3, 6, 1])
  base = agt.Config(n_epochs=2, learning_rate=0.5, batch_size=30, clip_gamma=0.3,
                    matmul="signsplit")
  prev = None
  for k in (0, 3):
    _, box = agt.fit(mlp.apply, params, X, y, dataclasses.replace(base, k_private=k),
                     progress=False)
    if prev is not None:
      for a, b in zip(jax.tree_util.tree_leaves(prev, is_leaf=_is_iv),
                      jax.tree_util.tree_leaves(box, is_leaf=_is_iv)):
        assert bool(jnp.all((b.lower <= a.lower + 1e-12) & (a.upper <= b.upper + 1e-12)))
    prev = box


def test_fit_history_certify_and_k_grid():
  X, y = _data(90)
  params = _net(jax.random.PRNGKey(6), [3, 6, 1])
  cfg = agt.Config(n_epochs=2, learning_rate=1.0, batch_size=40, clip_gamma=0.1)
  hist = []
  nominal, grid = agt.fit_k_grid(mlp.apply, params, X, y, cfg, [0, 4],
                                 x_val=X, y_val=y, history=hist, progress=False)
  assert len(hist) == 4 and all(isinstance(r, agt.EpochRecord) for r in hist)
  assert [(r.epoch, r.step) for r in hist] == [(1, 2), (2, 4)] * 2      # 90 // 40 = 2 steps
  assert 0 <= hist[-1].val_certified <= 1 and 0 <= hist[-1].val_accuracy <= 1
  assert hist[-1].val_mse is None and set(hist[-1].as_dict()) == {
      "epoch", "step", "val_accuracy", "val_certified", "layers", "width_mean", "width_max",
      "weight_scale"}
  mse = agt.fit(mlp.apply, params, X, y, dataclasses.replace(cfg, loss="mse"), x_val=X,
                y_val=y, progress=False)
  out = np.asarray(mlp.apply(mse.params, X))[:, 0]                 # one output, labels (n,)
  last = mse.history[-1]
  assert last.val_accuracy is None and last.val_certified is None
  np.testing.assert_allclose(last.val_mse, np.mean((out - np.asarray(y)) ** 2), rtol=1e-5)
  assert agt.certify(mlp.apply, nominal, grid[0], X).all()   # k = 0 certifies every point
  kmax = agt.max_certified_k(mlp.apply, nominal, grid, X)
  assert set(np.unique(kmax)) <= {0, 4}
  c4 = agt.certify(mlp.apply, nominal, grid[4], X)
  assert np.all(kmax[c4] == 4)
  with pytest.raises(TypeError, match="method"):    # the removed name of matmul=
    agt.certify(mlp.apply, nominal, grid[4], X, method="rump")
  bad = {0: nominal, 1: jax.tree_util.tree_map(lambda a: a + 1, nominal)}
  with pytest.raises(ValueError, match="share one nominal"):
    agt.check_shared_nominal(bad)


def test_fit_rejects_small_dataset_and_bad_shapes():
  X, y = _data(10)
  params = _net(jax.random.PRNGKey(0), [3, 2, 1])
  with pytest.raises(ValueError, match="fewer than batch_size"):
    agt.fit(mlp.apply, params, X, y, agt.Config(n_epochs=1, learning_rate=0.1, batch_size=20),
            progress=False)
  with pytest.raises(ValueError, match="rows"):
    agt.fit(mlp.apply, params, X, y[:5], agt.Config(n_epochs=1, learning_rate=0.1, batch_size=5),
            progress=False)


@pytest.mark.parametrize("label", [5, -1, 1.5])
def test_fit_rejects_cross_entropy_labels_outside_the_logits(label):
  X, _ = _data(20)
  y = np.zeros(20, np.int64 if float(label).is_integer() else np.float64)
  y[3] = label
  params = _net(jax.random.PRNGKey(0), [3, 4, 2])        # two logits: classes 0 and 1
  cfg = agt.Config(n_epochs=1, learning_rate=0.1, batch_size=10, loss="cross_entropy")
  with pytest.raises(options.OptionError,
                     match=rf"y: label {label!r} at index \(3,\).*2 outputs"):
    agt.fit(mlp.apply, params, X, y, cfg, progress=False)
  y_ok = np.zeros(20, np.int64)
  with pytest.raises(options.OptionError, match=r"y_val: label"):
    agt.fit(mlp.apply, params, X, y_ok, cfg, x_val=X, y_val=y, progress=False)


def test_fit_rejects_binary_labels_other_than_0_and_1():
  X, y = _data(20)
  y = np.asarray(y).copy()
  y[5] = 2.0
  params = _net(jax.random.PRNGKey(0), [3, 4, 1])
  cfg = agt.Config(n_epochs=1, learning_rate=0.1, batch_size=10, loss="binary_cross_entropy")
  with pytest.raises(options.OptionError,
                     match=r"y: binary cross-entropy labels .*0 or 1, got 2\.0 at index \(5,\)"):
    agt.fit(mlp.apply, params, X, y, cfg, progress=False)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_fit_names_a_non_finite_input_before_training(bad):
  X, y = _data(20)
  X = np.asarray(X).copy()
  X[7, 1] = bad
  params = _net(jax.random.PRNGKey(0), [3, 4, 1])
  cfg = agt.Config(n_epochs=1, learning_rate=0.1, batch_size=10)
  with pytest.raises(options.OptionError,
                     match=r"x: 1 entries are NaN or infinite .*index \(7, 1\)"):
    agt.fit(mlp.apply, params, X, y, cfg, progress=False)
  with pytest.raises(options.OptionError, match=r"x_val: 1 entries"):
    agt.fit(mlp.apply, params, _data(20)[0], y, cfg, x_val=X, y_val=y, progress=False)


def test_engine_backend_matches():
  X, y = _data(32)
  params = _net(jax.random.PRNGKey(7), [3, 5, 1])
  box = _widen(params, jax.random.PRNGKey(8), 0.05)
  g_mlp = jax.jit(lambda b: mlp.grad_bounds(b, X, y, "binary_cross_entropy"))(box)
  g_ibp = jax.jit(lambda b: bnd.grad_bounds_fn(mlp.apply, "binary_cross_entropy", "ibp")(b, X, y))(box)
  gfn = agt.train.nominal_grad_fn(mlp.apply, "binary_cross_entropy")
  g = jax.jit(jax.vmap(lambda t: gfn(t, X, y)))(_samples(box, jax.random.PRNGKey(9), 32))
  assert _inside(jax.tree_util.tree_leaves(g_ibp, is_leaf=_is_iv), jax.tree_util.tree_leaves(g))
  w_mlp = sum(float(jnp.sum(iv.width)) for iv in jax.tree_util.tree_leaves(g_mlp, is_leaf=_is_iv))
  w_ibp = sum(float(jnp.sum(iv.width)) for iv in jax.tree_util.tree_leaves(g_ibp, is_leaf=_is_iv))
  assert np.isfinite(w_ibp) and w_mlp > 0


def test_bound_method_is_checked_at_construction():
  assert agt.Config(n_epochs=1, learning_rate=0.1, batch_size=4,
                    bound_method="crown").bound_method == "crown"
  with pytest.raises(ValueError, match="bound_method"):
    agt.Config(n_epochs=1, learning_rate=0.1, batch_size=4, bound_method="alpha-crown")


@pytest.mark.parametrize("field", ["learning_rate", "lr_decay", "lr_min", "momentum",
                                   "dampening", "l1_reg", "l2_reg", "clip_gamma"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_config_rejects_nan_and_inf_in_every_numeric_field(field, value):
  if field == "clip_gamma" and value == float("inf"):
    assert agt.Config(n_epochs=1, learning_rate=0.1, batch_size=4,
                      clip_gamma=value).clip_gamma is None     # "no clipping", as before
    return
  with pytest.raises(ValueError, match=field):
    agt.Config(**{**dict(n_epochs=1, learning_rate=0.1, batch_size=4), field: value})


def test_config_old_option_names_are_refused():
  """``fp_margin`` / ``interval_matmul`` are gone (init-only aliases read back as None)."""
  for old in (dict(fp_margin=True), dict(interval_matmul="rump")):
    with pytest.raises(TypeError, match=next(iter(old))):
      agt.Config(n_epochs=1, learning_rate=0.1, batch_size=4, **old)
  with pytest.raises(ValueError, match="matmul must be one of"):
    agt.Config(n_epochs=1, learning_rate=0.1, batch_size=4, matmul="rump")
  assert not hasattr(agt.Config(n_epochs=1, learning_rate=0.1, batch_size=4), "fp_margin")


def test_both_backends_honour_every_matmul():
  """Both back-ends pass ``matmul`` to `boundjax.ibp`, so "auto" keeps the Dense passes for every
  interval product, and the two agree on the logit bounds of each."""
  X, _ = _data(16)
  params = _net(jax.random.PRNGKey(3), [3, 6, 2])
  cfg = agt.Config(n_epochs=1, learning_rate=0.5, batch_size=16, loss="cross_entropy",
                   matmul="exact")
  agt.make_step(mlp.apply, cfg, "mlp")
  assert bnd.resolve("auto", mlp.apply, params, X[:2], "exact") == "mlp"
  with pytest.raises(ValueError, match="matmul must be one of"):
    bnd.check_matmul("mlp", "rump")
  box = _widen(params, jax.random.PRNGKey(4))
  outs = {m: bnd.forward_bounds_fn(mlp.apply, "ibp", m)(box, X) for m in agt.config.MATMULS}
  ref = {m: mlp.forward_bounds(box, X, m) for m in agt.config.MATMULS}
  for m in outs:
    np.testing.assert_allclose(outs[m].lower, ref[m].lower, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(outs[m].upper, ref[m].upper, rtol=1e-6, atol=1e-9)
  assert not np.allclose(outs["midrad"].lower, outs["signsplit"].lower)
  w = {m: float(jnp.sum(ref[m].width)) for m in ref}
  assert w["exact"] <= min(w["best"], w["midrad"], w["signsplit"]) + 1e-12
  assert w["best"] <= min(w["midrad"], w["signsplit"]) + 1e-12


@pytest.mark.parametrize("backend", ["mlp", "ibp"])
def test_sound_step_runs_products_at_highest_precision(backend):
  """The sound floating-point mode assumes float32 products: every dot_general of the step is
  traced with precision=HIGHEST (no TF32 passes on an accelerator); without it, the default."""
  X, y = _data(16)
  params = _net(jax.random.PRNGKey(3), [3, 6, 1])
  highest = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)

  for sound in (True, False):
    cfg = agt.Config(n_epochs=1, learning_rate=0.5, batch_size=16, k_private=2, clip_gamma=0.2,
                     sound=sound)
    step = agt.make_step(mlp.apply, cfg, backend)
    found = matmul_precisions(jax.make_jaxpr(step)(agt.init(params, cfg), X, y).jaxpr)
    assert found
    assert all(p == highest for p in found) == sound, found

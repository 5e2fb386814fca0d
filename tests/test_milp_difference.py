"""Soundness of the difference intervals of `milp.difference` (LUCID, difference intervals).

Every case samples thousands of (input, member) pairs, members drawn inside the hyper-network's
box (uniformly and at random vertices, where interval bounds are attained) or taken from a real
leave-one-out family, and asserts every pre- and post-ReLU difference, and every hyper-network
pre-activation, lies inside its bound (float64, tolerance 1e-9).
"""

import dataclasses

import jax
import numpy as np
import pytest

from milp import bounds as B
from milp import difference as D
from milp import network as N

TOL = 1e-9


def rand_net(rng, sizes, width=0.0, scale=1.0):
  lo, hi = [], []
  for a, b in zip(sizes[:-1], sizes[1:]):
    w = rng.normal(size=(b, a)) * scale / np.sqrt(a)
    bb = rng.normal(size=b) * 0.3
    r, rb = width * rng.random((b, a)), width * rng.random(b)
    lo.append((w - r, bb - rb))
    hi.append((w + r, bb + rb))
  return N.interval_network(lo, hi)


def around(rng, net, width, offset=0.0):
  """A hyper-network around ``net``: each interval has random width and a random shift, so it
  may or may not contain ``net`` (``offset`` > 0 pushes it away)."""
  lo, hi = [], []
  for l in net.layers:
    w, b = N._dense(l.w_lower), l.b_lower
    sw = offset * rng.normal(size=w.shape)
    sb = offset * rng.normal(size=b.shape)
    lo.append((w + sw - width * rng.random(w.shape), b + sb - width * rng.random(b.shape)))
    hi.append((w + sw + width * rng.random(w.shape), b + sb + width * rng.random(b.shape)))
  return N.interval_network(lo, hi, input_shape=net.input_shape)


def sample_params(rng, hyper, m, vertex_fraction=0.5):
  """``m`` members of the box: list over layers of ``(W (m, out, in), b (m, out))``."""
  out = []
  corner = rng.random(m) < vertex_fraction
  for l in hyper.layers:
    wl, wu = N._dense(l.w_lower), N._dense(l.w_upper)
    tw = rng.random((m,) + wl.shape)
    tb = rng.random((m,) + l.b_lower.shape)
    tw = np.where(corner[:, None, None], np.round(tw), tw)
    tb = np.where(corner[:, None], np.round(tb), tb)
    out.append((wl + tw * (wu - wl), l.b_lower + tb * (l.b_upper - l.b_lower)))
  return out


def sample_inputs(rng, lo, hi, n, vertex_fraction=0.3):
  t = rng.random((n, lo.size))
  t = np.where((rng.random(n) < vertex_fraction)[:, None], np.round(t), t)
  return lo + t * (hi - lo)


def pre_activations(params, x):
  """Pre-activations of every layer for member params ``[(W (m,o,i), b (m,o))]`` at ``x (n, i)``:
  list of ``(m, n, o)`` arrays."""
  h = np.broadcast_to(x, (params[0][0].shape[0],) + x.shape)
  pres = []
  for k, (w, b) in enumerate(params):
    z = np.einsum("moi,mni->mno", w, h) + b[:, None, :]
    pres.append(z)
    h = np.maximum(z, 0.0)
  return pres


def point_params(net):
  return [(N._dense(l.w_lower)[None], l.b_lower[None]) for l in net.layers]


def check_enclosure(net, hyper, db, members, x, what=""):
  """Asserts every difference of (member, x) pairs lies in ``db``; returns the pair count."""
  ref = [z[0] for z in pre_activations(point_params(net), x)]
  hyp = pre_activations(members, x)
  L = len(net.layers)
  for m in range(L):
    d = hyp[m] - ref[m]
    lo, hi = db.pre[m]
    _assert_in(d, lo, hi, f"{what} pre-diff layer {m}")
    _assert_in(hyp[m], *db.hyper[m], f"{what} hyper pre-activation layer {m}")
    _assert_in(ref[m][None], *db.ref[m], f"{what} ref pre-activation layer {m}")
    if m < L - 1:
      dp = np.maximum(hyp[m], 0) - np.maximum(ref[m], 0)
      _assert_in(dp, *db.post[m], f"{what} post-diff layer {m}")
  return hyp[0].shape[0] * hyp[0].shape[1]


def _assert_in(v, lo, hi, what):
  bad = (v < lo - TOL) | (v > hi + TOL)
  if bad.any():
    i = tuple(np.argwhere(bad)[0])
    raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} values outside; first {i}: "
                         f"{v[i]!r} not in [{lo[i[-1]]!r}, {hi[i[-1]]!r}]")


# ------------------------------------------------------------------------------------------------
# Random networks

CASES = [
    # sizes, hyper width, offset from N, input box
    ((4, 8, 8, 3), 0.05, 0.0, (0.0, 1.0)),
    ((5, 10, 6, 2), 0.2, 0.0, (0.0, 1.0)),
    ((3, 6, 6, 6, 2), 0.02, 0.05, (0.0, 1.0)),   # N outside the box
    ((4, 7, 1), 0.1, 0.1, (-1.0, 1.0)),          # negative inputs, sign output
    ((6, 12, 12, 4), 0.0, 0.03, (0.2, 0.6)),     # a point hyper-network other than N
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("method", ["ibp", "crown"])
def test_random_enclosure(case, method):
  sizes, width, offset, (a, b) = CASES[case]
  rng = np.random.default_rng(100 + case)
  net = rand_net(rng, sizes)
  hyper = around(rng, net, width, offset)
  lo, hi = np.full(sizes[0], a), np.full(sizes[0], b)
  db = D.difference_bounds(net, hyper, lo, hi, method=method)
  assert len(db.pre) == len(sizes) - 1 and len(db.post) == len(sizes) - 2
  members = sample_params(rng, hyper, 200)
  x = sample_inputs(rng, lo, hi, 60)
  assert check_enclosure(net, hyper, db, members, x, f"case {case}") >= 10_000
  for dl, dh in db.pre + db.post:
    assert np.all(dl <= dh)


def test_sub_box_and_random_boxes():
  rng = np.random.default_rng(7)
  net = rand_net(rng, (4, 10, 10, 3), scale=1.5)
  hyper = around(rng, net, 0.05, 0.01)
  total = 0
  for trial in range(5):
    c = rng.random(4)
    r = 0.3 * rng.random(4)
    lo, hi = c - r, c + r
    db = D.difference_bounds(net, hyper, lo, hi)
    total += check_enclosure(net, hyper, db, sample_params(rng, hyper, 100),
                             sample_inputs(rng, lo, hi, 20), f"box {trial}")
  assert total >= 10_000


def test_point_hyper_is_zero():
  rng = np.random.default_rng(3)
  net = rand_net(rng, (5, 9, 9, 3))
  db = D.difference_bounds(net, net, np.zeros(5), np.ones(5))
  for dl, dh in db.pre + db.post:
    assert np.all(dl <= 0) and np.all(dh >= 0)
    assert np.max(dh - dl) < 1e-7  # only the outward rounding slack
  for (l, u), (lh, uh) in zip(db.ref, db.hyper):
    assert np.all(lh >= l - 1e-9) and np.all(uh <= u + 1e-9)


def test_tighter_than_naive():
  """The difference interval is never wider than IBP(N#) - IBP(N) and much narrower for a
  narrow hyper-network (the relation the MILP relies on)."""
  rng = np.random.default_rng(11)
  net = rand_net(rng, (6, 16, 16, 2))
  hyper = around(rng, net, 0.01)
  lo, hi = np.zeros(6), np.ones(6)
  db = D.difference_bounds(net, hyper, lo, hi)
  pre_n, post_n = D.naive_difference(net, hyper, lo, hi)
  ratios = []
  for (dl, dh), (nl, nh) in zip(db.pre + db.post, pre_n + post_n):
    assert np.all(dh - dl <= nh - nl + 1e-9)
    assert np.all(dl >= nl - 1e-9) and np.all(dh <= nh + 1e-9)
    ratios.append(float(np.mean(dh - dl) / np.mean(nh - nl)))
  # Pre-activation ratios: the first layer shares the exact input, deeper layers still gain.
  assert max(ratios[: len(db.pre)]) < 0.5, ratios


def test_relu_difference_every_case():
  """`relu_difference` alone: random consistent bounds on zhat, zhat# and their difference, in
  which every ReLU case occurs; sampled (zhat, d) pairs with zhat + d in N#'s bounds."""
  rng = np.random.default_rng(4)
  n = 2000
  l = rng.uniform(-1, 1, n)
  u = l + rng.uniform(0, 1.5, n)
  dl = rng.uniform(-0.8, 0.8, n)
  du = dl + rng.uniform(0, 0.8, n)
  lh = np.maximum(l + dl, l + dl + rng.uniform(-0.2, 0.5, n) * (u + du - l - dl))
  uh = np.maximum(lh, u + du - rng.uniform(0, 0.3, n) * (u + du - l - dl))
  lo, hi = D.relu_difference((dl, du), (l, u), (lh, uh))
  cases = [(l >= 0) & (lh >= 0), (l >= 0) & (lh < 0), (l < 0) & (lh >= 0), (u <= 0) & (uh <= 0)]
  assert all(c.sum() >= 20 for c in cases), [int(c.sum()) for c in cases]
  count = 0
  for _ in range(20):
    t = rng.random((2, n))
    t = np.where(rng.random((2, n)) < 0.3, np.round(t), t)
    z = l + t[0] * (u - l)
    d = dl + t[1] * (du - dl)
    zh = z + d
    ok = (zh >= lh) & (zh <= uh)
    diff = np.maximum(zh, 0) - np.maximum(z, 0)
    assert np.all((diff >= lo - 1e-12)[ok]) and np.all((diff <= hi + 1e-12)[ok])
    count += int(ok.sum())
  assert count >= 10_000


# ------------------------------------------------------------------------------------------------
# The spec's Fig. 4 toy (§2.6)

@pytest.fixture
def fig4():
  """``zhat_11 = -x1 + x2``, ``zhat#_11 = -x1 + [1, 1.1] x2 + [0, 0.1]``; the second neuron
  ``zhat_12 = x1 + x2 - 0.5`` and ``zhat#_12 = [0.99, 1] x1 + [0.99, 1] x2 - 0.5`` (difference
  ``[-0.02, 0]``); output ``z_11 - z_12`` in both."""
  w1 = np.array([[-1.0, 1.0], [1.0, 1.0]])
  b1 = np.array([0.0, -0.5])
  w2 = np.array([[1.0, -1.0], [-1.0, 1.0]])
  b2 = np.zeros(2)
  net = N.interval_network([(w1, b1), (w2, b2)], [(w1, b1), (w2, b2)])
  w1l, w1u = w1.copy(), w1.copy()
  w1u[0, 1] = 1.1
  w1l[1] = [0.99, 0.99]
  hyper = N.interval_network([(w1l, np.array([0.0, -0.5])), (w2, b2)],
                             [(w1u, np.array([0.1, -0.5])), (w2, b2)])
  return net, hyper


def test_fig4_toy(fig4):
  net, hyper = fig4
  db = D.difference_bounds(net, hyper, np.zeros(2), np.ones(2))
  (dl, dh), = db.post
  np.testing.assert_allclose(db.pre[0][0], [0.0, -0.02], atol=1e-9)
  np.testing.assert_allclose(db.pre[0][1], [0.2, 0.0], atol=1e-9)
  # z_11 <= z#_11 <= z_11 + 0.2 and z_12 - 0.02 <= z#_12 <= z_12
  np.testing.assert_allclose(dl, [0.0, -0.02], atol=1e-9)
  np.testing.assert_allclose(dh, [0.2, 0.0], atol=1e-9)
  rng = np.random.default_rng(0)
  check_enclosure(net, hyper, db, sample_params(rng, hyper, 200), sample_inputs(rng, np.zeros(2),
                                                                               np.ones(2), 60))
  # The relax-if-similar candidates at tau = 0.02 (the toy's): only z#_12.
  assert db.similar(0.05)[0].tolist() == [False, True]


def test_bias_is_included():
  """The public code drops I_b: a bias-only shift must show up in the difference."""
  rng = np.random.default_rng(5)
  net = rand_net(rng, (3, 5, 2))
  lo_, hi_ = [], []
  for l in net.layers:
    lo_.append((l.w_lower, l.b_lower + 0.3))
    hi_.append((l.w_lower, l.b_lower + 0.4))
  hyper = N.interval_network(lo_, hi_)
  db = D.difference_bounds(net, hyper, np.zeros(3), np.ones(3))
  np.testing.assert_allclose(db.pre[0][0], 0.3, atol=1e-9)
  np.testing.assert_allclose(db.pre[0][1], 0.4, atol=1e-9)
  check_enclosure(net, hyper, db, sample_params(rng, hyper, 100), sample_inputs(rng, np.zeros(3),
                                                                               np.ones(3), 100))


# ------------------------------------------------------------------------------------------------
# A real leave-one-out family and a convolutional network (sparse matrices)

@pytest.fixture(scope="module")
def loo_family():
  from sklearn.datasets import load_breast_cancer

  from boundjax import ensembles, hypernet
  from boundjax.models import MLP

  data = load_breast_cancer()
  x = data.data.astype(np.float32)
  x = (x - x.min(0)) / np.maximum(x.max(0) - x.min(0), 1e-12)
  y = data.target.astype(np.int32)
  model = MLP(hidden=(16, 16), out=2)
  init = model.init(jax.random.PRNGKey(0), x[:1])
  removed = ensembles.leave_k_out(np.arange(0, 570, 12))  # N + 48 leave-one-out networks
  ens = ensembles.train_ensemble(model, init, ensembles.sgd(0.1, weight_decay=1e-5), x, y,
                                 removed, epochs=4, batch_size=32, seed=0, chunk_size=64,
                                 progress=False)
  net = N.from_params(jax.tree_util.tree_map(np.asarray, ens.full))
  hyper = N.from_params(hypernet.from_ensemble(ens.params, np.arange(1, ens.n_members)))
  members = N.stack_members(ens.params)[1:]
  return net, hyper, members, x


def test_loo_family_enclosure(loo_family):
  net, hyper, members, data = loo_family
  assert not N.contains(hyper, net) or True  # N may or may not lie in the LOO hull
  lo, hi = np.zeros(30), np.ones(30)
  db = D.difference_bounds(net, hyper, lo, hi)
  rng = np.random.default_rng(1)
  real = [(np.stack([N._dense(m.layers[k].w_lower) for m in members]),
           np.stack([m.layers[k].b_lower for m in members])) for k in range(len(members[0].layers))]
  x = np.concatenate([data[:100].astype(np.float64), sample_inputs(rng, lo, hi, 150)])
  n = check_enclosure(net, hyper, db, real, x, "LOO members")
  n += check_enclosure(net, hyper, db, sample_params(rng, hyper, 100), x[::2], "in-box networks")
  assert n >= 10_000
  # The LOO networks are close to N: the difference intervals are much narrower than IBP's.
  pre_n, post_n = D.naive_difference(net, hyper, lo, hi)
  for (dl, dh), (nl, nh) in zip(db.pre, pre_n):
    assert np.mean(dh - dl) < 0.5 * np.mean(nh - nl)


def test_loo_family_crown(loo_family):
  net, hyper, members, data = loo_family
  lo, hi = np.zeros(30), np.ones(30)
  db_i = D.difference_bounds(net, hyper, lo, hi, "ibp")
  db_c = D.difference_bounds(net, hyper, lo, hi, "crown")
  for (a, b), (c, d) in zip(db_i.post, db_c.post):
    assert np.mean(d - c) <= np.mean(b - a) + 1e-12
  rng = np.random.default_rng(2)
  check_enclosure(net, hyper, db_c, sample_params(rng, hyper, 100), sample_inputs(rng, lo, hi, 100),
                  "crown")


def test_conv_sparse():
  import flax.linen as nn  # noqa: F401
  import jax.numpy as jnp

  from boundjax.core.interval import Interval
  from boundjax.models import Conv1dNet

  model = Conv1dNet(channels=6)
  d = 12
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, d)))
  net = N.from_flax(model, params, (d,), sparse_threshold=0.9)
  assert any(hasattr(l.w_lower, "nnz") for l in net.layers)
  key = jax.random.PRNGKey(1)
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(key, len(leaves))
  iv = [Interval(p - 0.02 * jax.random.uniform(k, p.shape), p + 0.02 * jax.random.uniform(
      jax.random.fold_in(k, 1), p.shape)) for p, k in zip(leaves, keys)]
  hyper = N.from_flax(model, jax.tree_util.tree_unflatten(tree, iv), (d,), sparse_threshold=0.9)
  lo, hi = np.zeros(d), np.ones(d)
  db = D.difference_bounds(net, hyper, lo, hi)
  rng = np.random.default_rng(3)
  # Members sampled from the *kernel* box (real convolutions, not just matrices in the matrix
  # box). The layer matrices are linear in the kernels: read which kernel entry each matrix
  # entry is from one extraction with distinct integer kernels, then build members by indexing.
  idx_params = jax.tree_util.tree_unflatten(tree, [
      jnp.arange(1, p.size + 1, dtype=jnp.float32).reshape(p.shape) for p in leaves])
  idx_net = N.from_flax(model, idx_params, (d,), check=False)
  n_members = 200
  corner = (np.arange(n_members) % 2 == 0)
  draws = [np.asarray(i.lower, np.float64)[None] + np.where(
      corner.reshape((-1,) + (1,) * i.lower.ndim), np.round(rng.random((n_members,) + i.lower.shape)),
      rng.random((n_members,) + i.lower.shape)) * np.asarray(i.upper - i.lower, np.float64)[None]
      for i in iv]
  real = []
  for k, l in enumerate(idx_net.layers):  # leaves are (bias, kernel) per layer, in layer order
    bias, kern = draws[2 * k].reshape(n_members, -1), draws[2 * k + 1].reshape(n_members, -1)
    mi = np.rint(N._dense(l.w_lower)).astype(int)
    bi = np.rint(l.b_lower).astype(int)
    w = np.where(mi[None] > 0, kern[:, np.maximum(mi - 1, 0)], 0.0)
    real.append((w, bias[:, bi - 1]))
  # the index map reproduces N itself
  own = [np.asarray(p, np.float64).reshape(-1) for p in leaves]
  for k, l in enumerate(idx_net.layers):
    mi = np.rint(N._dense(l.w_lower)).astype(int)
    np.testing.assert_allclose(np.where(mi > 0, own[2 * k + 1][np.maximum(mi - 1, 0)], 0.0),
                               N._dense(net.layers[k].w_lower), atol=1e-7)
  assert check_enclosure(net, hyper, db, real, sample_inputs(rng, lo, hi, 100), "conv") >= 10_000
  dense = dataclasses.replace(net, layers=tuple(
      N.AffineLayer.point(N._dense(l.w_lower), l.b_lower) for l in net.layers))
  db_dense = D.difference_bounds(dense, hyper, lo, hi)
  for (a, b), (c, e) in zip(db.pre, db_dense.pre):
    np.testing.assert_allclose(a, c, atol=1e-9)
    np.testing.assert_allclose(b, e, atol=1e-9)


# ------------------------------------------------------------------------------------------------
# Errors

def test_errors():
  rng = np.random.default_rng(0)
  net = rand_net(rng, (3, 4, 2))
  hyper = around(rng, net, 0.1)
  box = (np.zeros(3), np.ones(3))
  with pytest.raises(ValueError, match="concrete"):
    D.difference_bounds(hyper, hyper, *box)
  with pytest.raises(ValueError, match="affine layers"):
    D.difference_bounds(net, rand_net(rng, (3, 4, 4, 2)), *box)
  with pytest.raises(ValueError, match="shape"):
    D.difference_bounds(net, rand_net(rng, (3, 5, 2)), *box)
  with pytest.raises(ValueError, match="input box"):
    D.difference_bounds(net, hyper, np.zeros(4), np.ones(4))
  with pytest.raises(ValueError, match="lower <= upper"):
    D.difference_bounds(net, hyper, np.ones(3), np.zeros(3))
  with pytest.raises(ValueError, match="method"):
    D.difference_bounds(net, hyper, *box, method="lp")
  with pytest.raises(ValueError, match="Network"):
    D.difference_bounds(net, "hyper", *box)

"""boundjax.training: the one batch schedule and the one SGD loop."""

import functools
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from boundjax import ensembles as E
from boundjax import training as T
from boundjax.models import MLP


# ---------------------------------------------------------------------------------------------
# Schedule
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shuffle", ["epoch", "once", "none"])
def test_every_point_once_per_epoch_with_the_last_batch_kept(shuffle):
  s = T.Schedule(n=37, batch_size=8, epochs=3, seed=4, shuffle=shuffle)
  b = s.batches_np()
  assert b.shape == (s.steps, 8) == (3 * 5, 8)
  for e in range(3):
    rows = b[e * 5:(e + 1) * 5]
    np.testing.assert_array_equal(np.sort(rows[rows >= 0]), np.arange(37))
    assert (rows[-1] >= 0).sum() == 37 % 8 and (rows[:-1] >= 0).all()   # padding at the end


def test_last_batch_drop_visits_floor_n_over_b_full_batches():
  s = T.Schedule(n=37, batch_size=8, epochs=2, seed=1, last_batch="drop")
  b = s.batches_np()
  assert b.shape == (2 * 4, 8) and (b >= 0).all()
  for e in range(2):
    assert len(np.unique(b[e * 4:(e + 1) * 4])) == 32


def test_shuffle_modes_and_determinism_for_a_seed():
  kw = dict(n=50, batch_size=10, epochs=3)
  a = T.Schedule(seed=7, **kw).batches_np()
  np.testing.assert_array_equal(a, T.Schedule(seed=7, **kw).batches_np())
  assert not np.array_equal(a, T.Schedule(seed=8, **kw).batches_np())
  assert not np.array_equal(a[:5], a[5:10])                        # reshuffled every epoch
  once = T.Schedule(seed=7, shuffle="once", **kw).batches_np()
  np.testing.assert_array_equal(once[:5], once[5:10])                # one order, every epoch
  np.testing.assert_array_equal(once[:5], a[:5])                     # = the first epoch
  none = T.Schedule(shuffle="none", **kw).batches_np()
  np.testing.assert_array_equal(none[:5].ravel(), np.arange(50))
  # the traced path (a key inside jit) gives the same batches as the cached one
  np.testing.assert_array_equal(
      np.asarray(jax.jit(lambda k: T.Schedule(seed=7, **kw).batches(k))(jax.random.PRNGKey(7))),
      a)


def test_schedule_keeps_the_ensembles_data_order():
  """`ensembles.batch_schedule` (the order of every stored ensemble) is the default Schedule."""
  s = T.Schedule(n=37, batch_size=8, epochs=4, seed=3)
  np.testing.assert_array_equal(E.batch_schedule(3, 37, 4, 8), s.batches_np())
  key = jax.random.PRNGKey(3)
  want = np.stack([np.asarray(jax.random.permutation(jax.random.fold_in(key, e), 37))
                   for e in range(4)])
  np.testing.assert_array_equal(s.orders_np(), want)


def test_removal_masks():
  s = T.Schedule(n=10, batch_size=4, epochs=2, seed=0)
  removed = np.array([[-1, -1], [3, -1], [3, 7]])
  m = s.removal_masks(removed)
  b = s.batches_np()
  assert m.shape == (3, s.steps, 4)
  np.testing.assert_array_equal(m[0], (b >= 0).astype(np.float32))
  np.testing.assert_array_equal(m[1], ((b >= 0) & (b != 3)).astype(np.float32))
  np.testing.assert_array_equal(m[2], ((b >= 0) & (b != 3) & (b != 7)).astype(np.float32))
  for row, mask in zip(removed, m):          # the traced weights agree with the numpy masks
    got = np.stack([np.asarray(s.weights(jnp.asarray(r), jnp.asarray(row))) for r in b])
    np.testing.assert_array_equal(got, mask)
  assert m[2].sum() == 2 * (10 - 2)          # every other point once per epoch


@pytest.mark.parametrize("kw, msg", [
    (dict(n=0, batch_size=1, epochs=1), "n must be"),
    (dict(n=5, batch_size=0, epochs=1), "batch_size"),
    (dict(n=5, batch_size=2, epochs=1, shuffle="sometimes"), "shuffle"),
    (dict(n=5, batch_size=2, epochs=1, last_batch="pad"), "last_batch"),
    (dict(n=5, batch_size=6, epochs=1, last_batch="drop"), "no batch"),
])
def test_schedule_rejects_bad_options(kw, msg):
  with pytest.raises(ValueError, match=msg):
    T.Schedule(**kw)


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------

def _problem(n=23, d=3, seed=0):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
  y = jnp.asarray((rng.normal(size=n) > 0).astype(np.int32))
  model = MLP(hidden=(5,), out=2)
  return x, y, model, model.init(jax.random.PRNGKey(seed), x[:1])


def _max_diff(a, b):
  return max(float(jnp.max(jnp.abs(p - q)))
             for p, q in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def test_loop_equals_a_hand_written_loop():
  x, y, model, p0 = _problem()
  sched = T.Schedule(n=23, batch_size=5, epochs=3, seed=2)
  opt = optax.chain(optax.add_decayed_weights(1e-3), optax.sgd(0.2, momentum=0.5))
  got = jax.jit(lambda p, b: T.train(T.mean_gradient(model.apply, T.softmax_cross_entropy), opt,
                                     p, x, y, b, removed_row=jnp.asarray([4])))(
      p0, sched.batches())
  p, state = p0, opt.init(p0)
  for idx in sched.batches_np():
    keep = idx[(idx >= 0) & (idx != 4)]
    loss = lambda q: jnp.mean(T.softmax_cross_entropy(model.apply(q, x[keep]), y[keep]))  # noqa
    u, state = opt.update(jax.grad(loss)(p), state, p)
    p = optax.apply_updates(p, u)
  assert _max_diff(got, p) <= 1e-6


def _sgd_without(model, p0, x, y, sched, point, lr, wd):
  """SGD written out: every batch of the schedule with ``point`` deleted (not masked)."""
  p = p0
  for idx in sched.batches_np():
    keep = idx[(idx >= 0) & (idx != point)]
    loss = lambda q: jnp.mean(T.softmax_cross_entropy(model.apply(q, x[keep]), y[keep]))  # noqa
    g = jax.grad(loss)(p)
    p = jax.tree_util.tree_map(lambda a, b: a - lr * (b + wd * a), p, g)
  return p


def test_leave_one_out_member_equals_network_trained_alone_without_the_point():
  """Member i of the family (point i masked) = the network trained alone on the data without
  point i on the same schedule: written out by hand, by `train_single`, and by the loop with
  explicit weights zeroing point i. (vmapped and alone agree to float32 rounding: XLA may order
  a batched matmul's sums differently.)"""
  x, y, model, p0 = _problem(n=30)
  sched = T.Schedule(n=30, batch_size=8, epochs=2, seed=9)
  opt = E.sgd(0.3, weight_decay=1e-4)
  removed = E.leave_k_out([0, 7, 29])
  ens = E.train_ensemble(model, p0, opt, x, y, removed, schedule=sched, progress=False)
  assert ens.schedule is sched
  for m, row in enumerate(removed):
    by_hand = _sgd_without(model, p0, x, y, sched, int(row[0]), 0.3, 1e-4)
    assert _max_diff(ens.member(m), by_hand) <= 1e-6, m
    alone = E.train_single(model, p0, opt, x, y, row, schedule=sched)
    assert _max_diff(ens.member(m), alone) <= 1e-6, m
    w = jnp.asarray(sched.removal_masks(row[None])[0])
    grad_fn = T.mean_gradient(model.apply, T.softmax_cross_entropy)
    weighted = jax.jit(lambda p, b, w: T.train(grad_fn, opt, p, x, y, b, weights=w))(
        p0, sched.batches(), w)
    assert _max_diff(alone, weighted) == 0.0, m           # the same program, bit for bit
  assert _max_diff(ens.member(0), ens.member(1)) > 1e-4


def test_trajectory_and_clipped_mean_gradient():
  x, y, model, p0 = _problem(n=12)
  sched = T.Schedule(n=12, batch_size=4, epochs=2, seed=0, shuffle="none")
  per = jax.vmap(jax.grad(lambda p, a, b: T.softmax_cross_entropy(model.apply(p, a[None]),
                                                                  b[None])[0]),
                 in_axes=(None, 0, 0))
  g_fn = T.clipped_mean_gradient(per, gamma=0.05)
  opt = optax.sgd(0.1)
  (p, _), traj = T.scan_steps(g_fn, opt, (p0, opt.init(p0)), x, y, sched.batches(),
                              trajectory=True)
  assert jax.tree_util.tree_leaves(traj)[0].shape[0] == sched.steps
  assert _max_diff(jax.tree_util.tree_map(lambda a: a[-1], traj), p) == 0.0
  q = p0
  for idx in sched.batches_np():
    g = jax.tree_util.tree_map(lambda a: jnp.mean(jnp.clip(a, -0.05, 0.05), 0), per(q, x[idx],
                                                                                    y[idx]))
    q = jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, q, g)
  assert _max_diff(p, q) <= 1e-6


def test_trainers_reject_a_schedule_for_other_data():
  x, y, model, p0 = _problem(n=10)
  with pytest.raises(ValueError, match="n=11"):
    E.train_single(model, p0, E.sgd(0.1), x, y, schedule=T.Schedule(11, 2, 1))
  with pytest.raises(ValueError, match="disagrees"):
    E.train_single(model, p0, E.sgd(0.1), x, y, schedule=T.Schedule(10, 2, 1), epochs=3)
  with pytest.raises(ValueError, match="optimizer must be"):
    T.as_optimizer(lambda g: g)


def test_an_optimizer_factory_pickles_and_trains_like_its_transformation():
  """`build_optimizer`: a zero-argument factory (what worker processes receive) is built once
  per factory and trains exactly like the transformation it builds."""
  factory = functools.partial(T.sgd, 0.1, weight_decay=1e-3)
  assert pickle.loads(pickle.dumps(factory)).args == (0.1,)
  assert T.build_optimizer(factory) is T.build_optimizer(factory)
  tx = T.sgd(0.1, weight_decay=1e-3)
  assert T.build_optimizer(tx) is tx
  x, y, model, p0 = _problem(n=10)
  sched = T.Schedule(10, 4, 2, seed=3)
  grad_fn = T.mean_gradient(model.apply, T.softmax_cross_entropy)
  a = T.train(grad_fn, factory, p0, x, y, sched.batches())
  b = T.train(grad_fn, tx, p0, x, y, sched.batches())
  assert _max_diff(a, b) == 0.0
  with pytest.raises(ValueError, match="returned a dict"):
    T.build_optimizer(lambda: {})

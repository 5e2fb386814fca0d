"""The optax-style bounded optimisers of `boundjax.agt.optim` (AGT, Alg. 1 line 10; Adam).

* (a) the ``(init, update)`` pair in a plain user loop gives ``fit``'s nominal parameters and
  box bit for bit (sgd, sgdm, adam);
* the nominal run of `bounded_adam` is ``optax.adam`` / ``optax.adamw`` /
  ``add_decayed_weights + adam`` bit for bit;
* (b) bounded Adam by real retraining: neighbouring datasets (up to k removals and k additions
  per batch) trained with plain ``optax.adam`` on the same schedule stay in the box at every
  step (>= 50 retrained models, 0 violations), and the box of k = 0 is left by them (the check
  can fail);
* (c) the interval Adam step against >= 1e4 sampled (g, m, v) per coordinate plus every corner,
  in float64; the Cauchy-Schwarz step bound against random and worst-case gradient sequences;
* (d) validation errors.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from boundjax import agt, training
from boundjax.agt import mlp, optim, retrain
from boundjax.core.interval import Interval, split_tree


@pytest.fixture(autouse=True)
def x64():
  with jax.enable_x64(True):
    yield


def _blobs(n, d=4, seed=0, sep=1.5):
  rng = np.random.default_rng(seed)
  y = rng.integers(0, 2, n)
  centres = rng.normal(size=(2, d)) * sep
  x = centres[y] + rng.normal(size=(n, d))
  return jnp.asarray(x), jnp.asarray(y, jnp.float64)


def _leaves(tree):
  return [np.asarray(a) for a in jax.tree_util.tree_leaves(tree)]


def _box_leaves(bounds):
  lo, hi = split_tree(bounds)
  return _leaves(lo), _leaves(hi)


# ---------------------------------------------------------------------------------------------
# (a) the pair in a user's own loop equals fit
# ---------------------------------------------------------------------------------------------

OPTIMIZERS = {
    "sgd_l2": dict(l2_reg=0.01),
    "sgdm_nesterov": dict(optimizer="sgdm", momentum=0.9, nesterov=True),
    "adam": dict(optimizer="adam", learning_rate=0.05, b1=0.8, b2=0.99, eps_adam=1e-6),
    "adamw_sound": dict(optimizer="adam", learning_rate=0.05, weight_decay=0.1, sound=True),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_user_loop_with_the_pair_equals_fit(name):
  x, y = _blobs(120)
  params = mlp.init(jax.random.PRNGKey(0), [4, 6, 1], jnp.float64)
  kw = {"learning_rate": 0.5, "lr_decay": 0.2, **OPTIMIZERS[name]}
  cfg = agt.Config(n_epochs=2, batch_size=40, k_private=1, clip_gamma=0.5, **kw)
  res = agt.fit(mlp.apply, params, x, y, cfg, backend="mlp", progress=False)

  tx = agt.transform(cfg)
  if cfg.optimizer == "adam":     # the public constructor gives the same pair
    tx = agt.bounded_adam(cfg.lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps_adam,
                          weight_decay=cfg.weight_decay, sound=cfg.sound)
  state, box = tx.init(params), agt.point_box(params)

  @jax.jit
  def step(box, state, xb, yb):
    with jax.default_matmul_precision("highest" if cfg.sound else None):
      dirs = agt.descent_directions(mlp.apply, cfg, box.params, box.bounds, xb, yb,
                                    backend="mlp")
      return tx.update(dirs, state, box)

  for rows in cfg.schedule(len(x)).epoch_batches():     # a plain for over batches
    for idx in rows:
      box, state = step(box, state, x[idx], y[idx])
  assert int(state.count) == 6
  for a, b in zip(_leaves(box.params), _leaves(res.params)):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(sum(_box_leaves(box.bounds), []), sum(_box_leaves(res.bounds), [])):
    np.testing.assert_array_equal(a, b)
  lo, hi = _box_leaves(res.bounds)
  assert any((h - l).max() > 0 for l, h in zip(lo, hi))          # a real box (k = 1)


def _random_grads(params, n, seed):
  rng = np.random.default_rng(seed)
  return [jax.tree_util.tree_map(lambda p: jnp.asarray(rng.normal(size=p.shape) * 0.3), params)
          for _ in range(n)]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("variant", ["adam", "adamw", "l2"])
def test_nominal_adam_is_optax_bit_for_bit(dtype, variant):
  sched = lambda n: jnp.maximum(0.1 / (1.0 + 0.3 * n), 0.01)  # noqa: E731
  hp = dict(b1=0.8, b2=0.99, eps=1e-6)
  ref = {"adam": optax.adam(sched, **hp),
         "adamw": optax.adamw(sched, weight_decay=0.05, **hp),
         "l2": optax.chain(optax.add_decayed_weights(0.05), optax.adam(sched, **hp))}[variant]
  kw = {"adam": {}, "adamw": dict(weight_decay=0.05), "l2": dict(l2_reg=0.05)}[variant]
  sound = variant != "adam"      # the nominal run ignores it; the sound box holds it
  tx = agt.bounded_adam(sched, **hp, **kw, sound=sound)
  params = jax.tree_util.tree_map(lambda a: a.astype(dtype),
                                  mlp.init(jax.random.PRNGKey(3), [5, 4, 2], jnp.float64))
  grads = [jax.tree_util.tree_map(lambda a: a.astype(dtype), g)
           for g in _random_grads(params, 25, 1)]
  state, box = tx.init(params), agt.point_box(params)
  ostate, p = ref.init(params), params

  @jax.jit
  def optax_step(g, ostate, p):
    u, ostate = ref.update(g, ostate, p)
    return optax.apply_updates(p, u), ostate

  update = jax.jit(tx.update)
  for g in grads:
    box, state = update((g, g, g), state, box)
    p, ostate = optax_step(g, ostate, p)
  for a, b in zip(_leaves(box.params), _leaves(p)):
    assert a.dtype == dtype
    np.testing.assert_array_equal(a, b)
  if sound:   # on a point box the sound bounds hold the nominal run
    lo, hi = _box_leaves(box.bounds)
    for l, h, n in zip(lo, hi, _leaves(box.params)):
      assert (l <= n).all() and (n <= h).all()


@pytest.mark.parametrize("variant", ["sgd", "sgdm", "nesterov_l2"])
def test_nominal_sgd_and_momentum_are_optax_sgd(variant):
  """The torch momentum convention with dampening 0 is optax's trace (``g + m v``); equal up
  to rounding (XLA may fuse ``p - a g`` into one multiply-add in one program and not in the
  other)."""
  sched = lambda n: jnp.maximum(0.3 / (1.0 + 0.2 * n), 0.05)  # noqa: E731
  tx, ref = {
      "sgd": (agt.bounded_sgd(sched), optax.sgd(sched)),
      "sgdm": (agt.bounded_sgdm(sched, momentum=0.9), optax.sgd(sched, momentum=0.9)),
      "nesterov_l2": (agt.bounded_sgdm(sched, momentum=0.8, nesterov=True, l2_reg=0.01),
                      optax.chain(optax.add_decayed_weights(0.01),
                                  optax.sgd(sched, momentum=0.8, nesterov=True))),
  }[variant]
  params = mlp.init(jax.random.PRNGKey(4), [5, 4, 2], jnp.float64)
  state, box = tx.init(params), agt.point_box(params)
  ostate, p = ref.init(params), params

  @jax.jit
  def optax_step(g, ostate, p):
    u, ostate = ref.update(g, ostate, p)
    return optax.apply_updates(p, u), ostate

  update = jax.jit(tx.update)
  for g in _random_grads(params, 20, 2):
    box, state = update((g, g, g), state, box)
    p, ostate = optax_step(g, ostate, p)
  for a, b in zip(_leaves(box.params), _leaves(p)):
    np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)


# ---------------------------------------------------------------------------------------------
# (b) bounded Adam by real retraining with optax.adam
# ---------------------------------------------------------------------------------------------

def _retrain_optax(params, x, y, cfg, nb, tx):
  """`retrain.retrain` with a plain optax optimiser: parameters after every step (M, steps, ...)."""
  sched = cfg.schedule(x.shape[0])
  idx, w = retrain._extended_steps(x.shape[0], sched, nb)
  m, n_slots, k = nb.w_add.shape
  x_ext = jnp.concatenate([jnp.broadcast_to(x, (m,) + x.shape),
                           nb.x_add.reshape((m, n_slots * k) + x.shape[1:])], axis=1)
  y_ext = jnp.concatenate([jnp.broadcast_to(y, (m,) + y.shape),
                           nb.y_add.reshape((m, n_slots * k)).astype(y.dtype)], axis=1)
  grad_fn = training.clipped_mean_gradient(agt.train.nominal_grad_fn(mlp.apply, cfg.loss),
                                           cfg.gamma, "kept")

  def one(xm, ym, wm):
    _, traj = training.scan_steps(grad_fn, tx, (params, tx.init(params)), xm, ym, idx,
                                  weights=wm, trajectory=True)
    return traj
  return jax.jit(jax.vmap(one))(x_ext, y_ext, w)


def _excess(bounds, rt):
  """Largest distance of a retrained parameter outside the box, per (model, step)."""
  lo, hi = split_tree(bounds)
  ex = [jnp.maximum(l[None] - r, r - h[None]).reshape(r.shape[0], r.shape[1], -1).max(-1)
        for l, h, r in zip(jax.tree_util.tree_leaves(lo), jax.tree_util.tree_leaves(hi),
                           jax.tree_util.tree_leaves(rt))]
  return np.max(np.stack([np.asarray(e) for e in ex]), 0)


ADAM_CASES = {
    "adam": dict(),
    "adamw_l2": dict(weight_decay=0.05, l2_reg=0.01, b1=0.8, b2=0.95),
}


@pytest.mark.parametrize("dtype", [jnp.float64, pytest.param(jnp.float32, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", list(ADAM_CASES))
def test_bounded_adam_holds_every_retrained_model(name, dtype):
  """float64, and float32 (retrained in float32: the rounding margins of ``sound=True``)."""
  x, y = _blobs(240)
  x, y = x.astype(dtype), y.astype(dtype)
  params = mlp.init(jax.random.PRNGKey(1), [4, 8, 1], dtype)
  cfg = agt.Config(n_epochs=3, batch_size=120, k_private=2, clip_gamma=0.1, learning_rate=0.01,
                   lr_decay=0.2, optimizer="adam", fragsize=50, sound=True, **ADAM_CASES[name])
  traj = retrain.agt_trajectory(mlp.apply, params, x, y, cfg)
  nb = retrain.make_neighbours(3, mlp.apply, params, x, y, cfg, n_sets=56)
  ref = optax.adamw(cfg.lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps_adam,
                    weight_decay=cfg.weight_decay)
  if cfg.l2_reg:
    ref = optax.chain(optax.add_decayed_weights(cfg.l2_reg), ref)
  rt = _retrain_optax(params, x, y, cfg, nb, ref)
  exc = _excess(traj.bounds, rt)
  assert exc.shape == (56, 6) and nb.n_removed > 0 and nb.n_added > 0
  assert int(np.sum(exc > 0)) == 0, float(exc.max())
  # the unchanged dataset retrains to the nominal trajectory (the harness is right)
  same = retrain.Neighbours(jnp.ones_like(nb.keep[:1]), nb.x_add[:1], nb.y_add[:1],
                            jnp.zeros_like(nb.w_add[:1]))
  rt0 = _retrain_optax(params, x, y, cfg, same, ref)
  for a, b in zip(_leaves(traj.params), _leaves(rt0)):
    np.testing.assert_allclose(b[0], a, rtol=0, atol=1e-12 if dtype == jnp.float64 else 1e-6)
  # the retrained models really move, and the box stays finite
  lo, hi = _box_leaves(traj.bounds)
  assert all(np.isfinite(l).all() and np.isfinite(h).all() for l, h in zip(lo, hi))
  spread = max(float(np.ptp(r[:, -1], axis=0).max()) for r in _leaves(rt))
  assert spread > 1e-4


def test_adam_retraining_check_can_fail_with_a_too_small_box():
  """The k = 0 Adam box (the nominal trajectory) is left by the k = 2 neighbours."""
  x, y = _blobs(240)
  params = mlp.init(jax.random.PRNGKey(1), [4, 8, 1], jnp.float64)
  cfg2 = agt.Config(n_epochs=2, batch_size=120, k_private=2, clip_gamma=0.1, learning_rate=0.01,
                    optimizer="adam")
  cfg0 = agt.Config(n_epochs=2, batch_size=120, k_private=0, clip_gamma=0.1, learning_rate=0.01,
                    optimizer="adam")
  traj = retrain.agt_trajectory(mlp.apply, params, x, y, cfg0)
  nb = retrain.make_neighbours(0, mlp.apply, params, x, y, cfg2, n_sets=8)
  rt = _retrain_optax(params, x, y, cfg2, nb, optax.adam(cfg2.lr))
  assert _excess(traj.bounds, rt).max() > 1e-6


# ---------------------------------------------------------------------------------------------
# (c) the interval Adam step against sampling; the step bound against sequences
# ---------------------------------------------------------------------------------------------

def _boxes(rng, d):
  """d coordinates: (g, m, v) boxes covering every sign pattern (g crossing 0, m crossing 0,
  v touching 0, tiny and large v)."""
  def box(lo_scale, hi_scale, shift):
    a = rng.normal(size=d) * lo_scale + shift
    b = a + np.abs(rng.normal(size=d)) * hi_scale
    return a, b
  g = box(1.0, 1.0, rng.choice([-1.0, 0.0, 1.0], size=d))
  m = box(0.5, 0.5, rng.choice([-0.5, 0.0, 0.5], size=d))
  v_lo = np.abs(rng.normal(size=d)) * rng.choice([0.0, 1e-6, 1.0], size=d)
  v = (v_lo, v_lo + np.abs(rng.normal(size=d)) * rng.choice([1e-6, 1.0], size=d))
  return g, m, v


@pytest.mark.parametrize("t", [1, 2, 7, 40])
def test_adam_interval_step_encloses_sampled_points_and_corners(t):
  rng = np.random.default_rng(t)
  d, n = 96, 10_000
  b1, b2, eps = 0.9, 0.999, 1e-8
  (g_l, g_u), (m_l, m_u), (v_l, v_u) = _boxes(rng, d)
  iv = optim.adam_interval_update(*(jnp.asarray(a) for a in (g_l, g_u, m_l, m_u, v_l, v_u)),
                                  jnp.asarray(t, jnp.int32), b1, b2, eps, sound=True)
  iv = optim.AdamInterval(*(np.asarray(a) for a in iv))
  # samples: uniform in the boxes, every corner, and g = 0 where the g box holds it
  u01 = lambda: rng.uniform(size=(n, d))  # noqa: E731
  g = g_l + (g_u - g_l) * u01()
  m = m_l + (m_u - m_l) * u01()
  v = v_l + (v_u - v_l) * u01()
  corners = np.array(list(itertools.product([0, 1], repeat=3)))
  pick = lambda lo, hi, c: np.where(c[:, None] == 0, lo[None], hi[None])  # noqa: E731
  g = np.concatenate([g, pick(g_l, g_u, corners[:, 0]), np.clip(0.0, g_l, g_u)[None]])
  m = np.concatenate([m, pick(m_l, m_u, corners[:, 1]), m_l[None]])
  v = np.concatenate([v, pick(v_l, v_u, corners[:, 2]), v_l[None]])
  # Adam's step in float64 (numpy, independent of the code under test)
  m2 = b1 * m + (1 - b1) * g
  v2 = b2 * v + (1 - b2) * g * g
  u = (m2 / (1 - b1 ** t)) / (np.sqrt(v2 / (1 - b2 ** t)) + eps)
  assert (iv.m_lo <= m2).all() and (m2 <= iv.m_hi).all()
  assert (iv.v_lo <= v2).all() and (v2 <= iv.v_hi).all() and (iv.v_lo >= 0).all()
  assert (iv.u_lo <= u).all() and (u <= iv.u_hi).all()
  # m' and v' are exact ranges (attained at corners / g = 0), up to the rounding margin
  tol = lambda a: 1e-12 * (1 + np.abs(a))  # noqa: E731
  assert (np.abs(m2.min(0) - iv.m_lo) <= tol(m2.min(0))).all()
  assert (np.abs(m2.max(0) - iv.m_hi) <= tol(m2.max(0))).all()
  assert (np.abs(v2.min(0) - iv.v_lo) <= tol(v2.min(0))).all()
  assert (np.abs(v2.max(0) - iv.v_hi) <= tol(v2.max(0))).all()
  # the quotient is exact over the (m', v') box: its ends are attained at a corner of it
  mh = np.stack([iv.m_lo, iv.m_hi]) / (1 - b1 ** t)
  den = np.sqrt(np.stack([iv.v_lo, iv.v_hi]) / (1 - b2 ** t)) + eps
  q = (mh[:, None] / den[None, :]).reshape(4, d)
  np.testing.assert_allclose(iv.u_lo, q.min(0), rtol=1e-12)
  np.testing.assert_allclose(iv.u_hi, q.max(0), rtol=1e-12)


def test_interval_square_against_sampling():
  rng = np.random.default_rng(0)
  lo = rng.normal(size=500) * 2
  hi = lo + np.abs(rng.normal(size=500)) * 2
  s_lo, s_hi = map(np.asarray, optim.interval_square(jnp.asarray(lo), jnp.asarray(hi)))
  g = lo + (hi - lo) * rng.uniform(size=(20_000, 500))
  g = np.concatenate([g, lo[None], hi[None], np.clip(0.0, lo, hi)[None]])
  np.testing.assert_array_equal(s_lo, (g * g).min(0))
  np.testing.assert_array_equal(s_hi, (g * g).max(0))


def _adam_ratio(gs, b1, b2):
  """|m_hat_t| / sqrt(v_hat_t) after every step of Adam on the sequences ``gs`` (N, T)."""
  m = v = 0.0
  out = []
  with np.errstate(invalid="ignore"):        # 0 / 0 while a sequence is still all zeros
    for t in range(1, gs.shape[1] + 1):
      m = b1 * m + (1 - b1) * gs[:, t - 1]
      v = b2 * v + (1 - b2) * gs[:, t - 1] ** 2
      out.append(np.abs(m / (1 - b1 ** t)) / np.sqrt(v / (1 - b2 ** t)))
  return np.stack(out, 1)


@pytest.mark.parametrize("b1,b2", [(0.9, 0.999), (0.8, 0.95), (0.0, 0.9), (0.99, 0.98)])
def test_adam_ratio_bound_holds_and_is_attained(b1, b2):
  rng = np.random.default_rng(1)
  steps = 30
  c = np.asarray([float(optim.adam_ratio_bound(jnp.asarray(t, jnp.int32), b1, b2, jnp.float64))
                  for t in range(1, steps + 1)])
  n = 10_000
  gs = np.concatenate([rng.normal(size=(n, steps)),
                       rng.normal(size=(n, steps)) * np.exp(rng.normal(size=(n, 1)) *
                                                            np.arange(steps)[None] / 5),
                       np.sign(rng.normal(size=(n, steps)))])
  ratio = _adam_ratio(gs, b1, b2)
  assert (ratio <= c[None]).all()
  # the Cauchy-Schwarz equality case g_{t-j} = (b1 / b2)^j reaches C_t (up to the slack)
  for t in (1, 5, steps):
    worst = (b1 / b2) ** np.arange(t)[::-1]
    r = _adam_ratio(worst[None], b1, b2)[0, -1]
    assert r <= c[t - 1] and r >= c[t - 1] * (1 - 1e-9) / (1 + 8 * (t + 2) * 2.3e-16)
  assert np.isinf(float(optim.adam_ratio_bound(jnp.asarray(3), 0.9, 0.0, jnp.float32)))


def test_bounded_adam_box_stays_finite_when_v_reaches_zero():
  """A direction box crossing 0 at step 1 puts v_L = 0 (quotient ~ 1 / eps); the step bound
  keeps the box at most 2 a C_1 = 2 a wide."""
  tx = agt.bounded_adam(0.1)
  p = {"w": jnp.zeros(3)}
  state, box = tx.init(p), agt.point_box(p)
  d = ({"w": jnp.zeros(3)}, {"w": -jnp.ones(3)}, {"w": jnp.ones(3)})
  box, state = tx.update(d, state, box)
  lo, hi = _box_leaves(box.bounds)
  np.testing.assert_allclose(hi[0] - lo[0], 0.2, rtol=1e-6)


def test_bounded_sgd_with_weight_decay_step_above_one_stays_ordered():
  """a * l2_reg > 1 flips the sign of theta: the box is the scaled interval, still ordered."""
  tx = agt.bounded_sgd(2.0, l2_reg=1.0)
  p = {"w": jnp.asarray([1.5])}
  box = agt.ParamBox(p, {"w": Interval(jnp.asarray([1.0]), jnp.asarray([2.0]))})
  z = {"w": jnp.zeros(1)}
  box, _ = tx.update((z, z, z), tx.init(p), box)
  lo, hi = _box_leaves(box.bounds)
  np.testing.assert_array_equal(lo[0], [-2.0])
  np.testing.assert_array_equal(hi[0], [-1.0])
  np.testing.assert_array_equal(np.asarray(box.params["w"]), [-1.5])


# ---------------------------------------------------------------------------------------------
# (d) validation
# ---------------------------------------------------------------------------------------------

BASE = dict(n_epochs=1, learning_rate=0.1, batch_size=10)


@pytest.mark.parametrize("kw,msg", [
    (dict(optimizer="adam", b1=1.0), "b1 and b2"),
    (dict(optimizer="adam", b2=-0.1), "b1 and b2"),
    (dict(optimizer="adam", eps_adam=0.0), "eps_adam"),
    (dict(optimizer="adam", b1=float("nan")), "b1"),
    (dict(optimizer="adam", weight_decay=-1.0), "weight_decay"),
    (dict(optimizer="sgd", weight_decay=0.1), "weight_decay"),
    (dict(optimizer="adam", momentum=0.9), "optimizer='sgdm'"),
    (dict(optimizer="adam", l1_reg=0.1), "l1_reg"),
    (dict(optimizer="rmsprop"), "optimizer"),
])
def test_config_rejects_bad_adam_options(kw, msg):
  with pytest.raises(ValueError, match=msg):
    agt.Config(**BASE, **kw)


def test_config_accepts_adam_and_defaults_are_optax():
  c = agt.Config(**BASE, optimizer="adam")
  assert (c.b1, c.b2, c.eps_adam, c.weight_decay) == (0.9, 0.999, 1e-8, 0.0)


@pytest.mark.parametrize("make,msg", [
    (lambda: agt.bounded_adam(0.0), "learning_rate"),
    (lambda: agt.bounded_adam(0.1, b2=1.0), "b2"),
    (lambda: agt.bounded_adam(0.1, eps=0.0), "eps"),
    (lambda: agt.bounded_adam(0.1, weight_decay=-0.1), "weight_decay"),
    (lambda: agt.bounded_sgdm(0.1, momentum=1.5), "momentum"),
    (lambda: agt.bounded_sgdm(0.1, momentum=0.5, dampening=0.1, nesterov=True), "nesterov"),
    (lambda: agt.bounded_sgd(0.1, l1_reg=0.1, l2_reg=0.1), "l1_reg"),
    (lambda: agt.bounded_sgd("fast"), "learning_rate"),
])
def test_constructors_reject_bad_values(make, msg):
  with pytest.raises(ValueError, match=msg):
    make()


def test_bad_types_are_type_errors():
  with pytest.raises(TypeError, match="sound"):
    agt.bounded_adam(0.1, sound="yes")
  tx = agt.bounded_sgd(0.1)
  p = {"w": jnp.zeros(2)}
  with pytest.raises(TypeError, match="directions"):
    tx.update({"w": jnp.zeros(2)}, tx.init(p), agt.point_box(p))
  with pytest.raises(TypeError, match="box"):
    tx.update((p, p, p), tx.init(p), p)


def test_descent_directions_takes_the_backend_as_a_keyword():
  x, y = _blobs(24)
  params = mlp.init(jax.random.PRNGKey(0), [4, 6, 1], jnp.float64)
  cfg = agt.Config(n_epochs=1, learning_rate=0.1, batch_size=24, k_private=2, clip_gamma=0.5)
  box = agt.point_box(params)
  new = agt.descent_directions(mlp.apply, cfg, box.params, box.bounds, x, y, backend="mlp")
  ibp = agt.descent_directions(mlp.apply, cfg, box.params, box.bounds, x, y, backend="ibp")
  with pytest.warns(DeprecationWarning, match="keyword backend='mlp' or backend='ibp'"):
    old = agt.descent_directions(mlp.apply, cfg, "mlp", box.params, box.bounds, x, y)
  for a, b in zip(_leaves(new), _leaves(old)):
    np.testing.assert_array_equal(a, b)                 # the old positional call is the same
  for a, b in zip(_leaves(new[0]), _leaves(ibp[0])):
    np.testing.assert_allclose(a, b, rtol=1e-10)        # same nominal direction either back-end
  with pytest.raises(ValueError, match=r"backend must be one of \('mlp', 'ibp'\).*not given"):
    agt.descent_directions(mlp.apply, cfg, box.params, box.bounds, x, y)
  with pytest.raises(ValueError, match="got 'auto'"):
    agt.descent_directions(mlp.apply, cfg, box.params, box.bounds, x, y, backend="auto")
  with pytest.raises(TypeError, match="7 were given"):
    agt.descent_directions(mlp.apply, cfg, box.params, box.bounds, x, y, y)

"""AGT's removal-only neighbourhood (``Config(neighbourhood="remove")``) and explicit schedules.

The unlearning rule (AGT's public code): after removing up to k points from a batch of b, the mean
over the points left lies in ``[SEMin_{b-k}(delta_L) / (b - k), SEMax_{b-k}(delta_U) / (b - k)]``.
It is checked by brute force over every removal set, then end to end: the box of one AGT run
must contain every network of a leave-k-out family that `boundjax.ensembles.train_ensemble`
trains for real (reshuffled epochs, a smaller last batch, weight decay), in float32 with the
sound floating-point mode and in float64.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boundjax import agt, ensembles
from boundjax.agt import descent
from boundjax.core.interval import Interval
from boundjax.models import MLP
from boundjax.training import Schedule

_is_iv = lambda x: isinstance(x, Interval)  # noqa: E731


@pytest.mark.parametrize("b,k", [(5, 1), (6, 2), (7, 3)])
def test_remove_rule_brute_force(b, k):
  rng = np.random.default_rng(b * 10 + k)
  for _ in range(20):
    dl = rng.normal(size=(b, 3))
    du = dl + rng.uniform(0, 1, size=(b, 3))
    acc = descent.init_accumulator(jnp.zeros(3), k)
    acc = descent.accumulate(acc, jnp.asarray(dl), jnp.asarray(dl), jnp.asarray(du), None)
    _, lo, hi = descent.finalize(acc, b, 0.0, remove_only=True)
    lo, hi = np.asarray(lo), np.asarray(hi)
    worst_lo, worst_hi = np.full(3, np.inf), np.full(3, -np.inf)
    for r in range(k + 1):
      for removed in itertools.combinations(range(b), r):
        keep = np.setdiff1d(np.arange(b), removed)
        worst_lo = np.minimum(worst_lo, dl[keep].mean(0))
        worst_hi = np.maximum(worst_hi, du[keep].mean(0))
    np.testing.assert_allclose(lo, worst_lo, rtol=1e-5, atol=1e-6)   # tight (float32 sums)
    np.testing.assert_allclose(hi, worst_hi, rtol=1e-5, atol=1e-6)


def test_remove_needs_no_clipping_but_add_remove_does():
  agt.Config(n_epochs=1, learning_rate=0.1, batch_size=8, k_private=2, neighbourhood="remove")
  with pytest.raises(ValueError, match="clip_gamma must be finite"):
    agt.Config(n_epochs=1, learning_rate=0.1, batch_size=8, k_private=2)
  with pytest.raises(ValueError, match="neighbourhood must be one of"):
    agt.Config(n_epochs=1, learning_rate=0.1, batch_size=8, neighbourhood="swap")


def _data(n, d, seed, dtype):
  rng = np.random.default_rng(seed)
  y = rng.integers(0, 2, n)
  x = rng.uniform(0, 1, (n, d)) + 0.6 * y[:, None] * rng.uniform(0, 1, d)
  return np.asarray(x / x.max(0), dtype), np.asarray(y, np.int32)


def _members_outside(box, params) -> tuple[int, float]:
  """Count of member parameters outside the box and the largest excursion."""
  count, worst = 0, 0.0
  for iv, p in zip(jax.tree_util.tree_leaves(box, is_leaf=_is_iv), jax.tree_util.tree_leaves(params)):
    p = np.asarray(p)
    lo, hi = np.asarray(iv.lower)[None], np.asarray(iv.upper)[None]
    out = np.maximum(lo - p, 0) + np.maximum(p - hi, 0)
    count += int(np.sum(out > 0))
    worst = max(worst, float(out.max()))
  return count, worst


@pytest.mark.parametrize("dtype,k", [(jnp.float32, 1), (jnp.float64, 1), (jnp.float32, 2)])
def test_box_contains_every_trained_leave_k_out_member(dtype, k):
  """One AGT run vs the real family: all leave-one-out networks (k = 1), or 300 random
  leave-two-out networks (k = 2), trained by `train_ensemble` on the same schedule."""
  n, d, epochs, bs = 110, 3, 3, 30           # 4 batches per epoch, the last one of 20 points
  x, y = _data(n, d, seed=k, dtype=dtype)
  with jax.enable_x64(dtype == jnp.float64):
    x, y = jnp.asarray(x, dtype), jnp.asarray(y)
    model = MLP(hidden=(8,), out=2)
    init = jax.tree_util.tree_map(lambda p: p.astype(dtype),
                                  model.init(jax.random.PRNGKey(3), jnp.zeros((1, d), dtype)))
    if k == 1:
      removed = ensembles.leave_k_out(np.arange(n))
    else:
      rng = np.random.default_rng(0)
      pairs = np.stack([rng.choice(n, 2, replace=False) for _ in range(300)])
      removed = np.concatenate([np.full((1, 2), -1), pairs]).astype(np.int32)
    sched = Schedule(n=n, batch_size=bs, epochs=epochs, seed=5)   # shared by both
    ens = ensembles.train_ensemble(
        model, init, ensembles.sgd(0.1, weight_decay=1e-3), x, y, removed, schedule=sched,
        loss_fn=ensembles.softmax_cross_entropy, progress=False)
    assert ens.schedule is sched
    cfg = agt.Config(n_epochs=epochs, learning_rate=0.1, batch_size=bs, loss="cross_entropy",
                     k_private=k, neighbourhood="remove", l2_reg=1e-3, fragsize=7,
                     sound=True)   # without it float64 members leave the box by ~1e-17
    params, box = agt.fit(model.apply, init, x, y, cfg, schedule=ens.schedule, progress=False)
    count, worst = _members_outside(box, ens.params)
    assert count == 0, f"{count} member parameters outside the AGT box (worst by {worst:.3g})"
    # the nominal run is N (row 0) up to rounding, and the box is not trivially wide
    for p, q in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(ens.full)):
      np.testing.assert_allclose(np.asarray(p), np.asarray(q), atol=1e-5)
    widths = [float(np.max(iv.upper - iv.lower))
              for iv in jax.tree_util.tree_leaves(box, is_leaf=_is_iv)]
    assert max(widths) < 0.5, widths
    spread = max(float(np.max(np.ptp(np.asarray(p), axis=0)))
                 for p in jax.tree_util.tree_leaves(ens.params))
    assert spread > 0                         # the members really differ


def test_box_without_the_margin_or_with_a_wrong_schedule_is_not_a_guarantee():
  """The check above can fail: the box of a run on a *different* schedule (the fixed order of
  `agt.batches`, last batch dropped) misses members trained on the reshuffled schedule."""
  n, d, epochs, bs = 90, 3, 3, 16
  x, y = _data(n, d, seed=1, dtype=jnp.float32)
  model = MLP(hidden=(8,), out=2)
  init = model.init(jax.random.PRNGKey(3), jnp.zeros((1, d)))
  ens = ensembles.train_ensemble(
      model, init, ensembles.sgd(0.2, weight_decay=1e-3), x, y, ensembles.leave_k_out(np.arange(n)),
      epochs=epochs, batch_size=bs, seed=5, loss_fn=ensembles.softmax_cross_entropy,
      progress=False)
  cfg = agt.Config(n_epochs=epochs, learning_rate=0.2, batch_size=bs, loss="cross_entropy",
                   k_private=1, neighbourhood="remove", l2_reg=1e-3, sound=True)
  _, box = agt.fit(model.apply, init, x, y, cfg, progress=False)   # default fixed batches
  count, _ = _members_outside(box, ens.params)
  assert count > 0


def test_schedule_must_match_the_config_and_the_data():
  x, y = _data(40, 3, seed=0, dtype=jnp.float32)
  model = MLP(hidden=(4,), out=2)
  init = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 3)))
  cfg = agt.Config(n_epochs=2, learning_rate=0.1, batch_size=8, loss="cross_entropy",
                   k_private=1, neighbourhood="remove")
  with pytest.raises(ValueError, match="must agree"):
    agt.fit(model.apply, init, x, y, cfg, schedule=Schedule(40, 8, 3), progress=False)
  with pytest.raises(ValueError, match="n=41"):
    agt.fit(model.apply, init, x, y, cfg, schedule=Schedule(41, 8, 2), progress=False)
  res = agt.fit(model.apply, init, x, y, cfg, schedule=Schedule(40, 8, 2), progress=False)
  assert res.schedule == Schedule(40, 8, 2)
  assert agt.fit(model.apply, init, x, y, cfg, progress=False).schedule == cfg.schedule(40)


def test_schedule_must_be_a_schedule_and_removed_keywords_fail():
  """The index-array schedule and the ``X_val`` keyword were removed (0.x): clear errors."""
  x, y = _data(41, 3, seed=0, dtype=jnp.float32)
  model = MLP(hidden=(4,), out=2)
  init = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 3)))
  cfg = agt.Config(n_epochs=2, learning_rate=0.1, batch_size=8, loss="cross_entropy",
                   k_private=1, neighbourhood="remove")
  with pytest.raises(TypeError, match="schedule must be a boundjax.training.Schedule"):
    agt.fit(model.apply, init, x, y, cfg, schedule=np.zeros((4, 8), np.int32), progress=False)
  with pytest.raises(TypeError, match="X_val"):
    agt.fit(model.apply, init, x, y, cfg, X_val=x, progress=False)
  # Schedule(41, 8, 2) keeps a last batch of 41 mod 8 = 1 point, not more than k_private = 1
  with pytest.raises(ValueError, match="not more than"):
    agt.fit(model.apply, init, x, y, cfg, schedule=Schedule(41, 8, 2), progress=False)

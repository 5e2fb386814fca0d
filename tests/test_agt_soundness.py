"""AGT soundness by real retraining (AGT, Def. 4.3 and Thm 4.5): the heart of the AGT tests.

For small problems, AGT runs once; then many neighbouring datasets (each batch with up to k
points removed and up to k added: random, highest-loss and highest-gradient removals; random,
large-norm and label-flipped additions; substitutions; mixtures) are trained for real with the
same initialisation, batches and schedule. Every retrained parameter vector must lie in the AGT
box at EVERY step, and every prediction certified stable must be unchanged.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boundjax import agt
from boundjax.agt import mlp, retrain
from tests.helpers import gaussian_blobs


@pytest.fixture(autouse=True)
def x64():
  with jax.enable_x64(True):
    yield



def _check(report, min_certified=1):
  assert report.retrained_models > 0 and report.removals > 0 and report.additions > 0
  assert report.param_violations == 0, report
  assert report.prediction_changes == 0, report
  assert report.certified_points >= min_certified, report


CASES = {
    "sgd_bce": dict(loss="binary_cross_entropy", sizes=[4, 8, 1], k=2,
                    cfg=dict(learning_rate=1.0, clip_gamma=0.1, lr_decay=0.3)),
    "sgdm_nesterov_l2": dict(loss="binary_cross_entropy", sizes=[4, 8, 1], k=1,
                             cfg=dict(learning_rate=0.3, clip_gamma=0.1, optimizer="sgdm",
                                      momentum=0.9, nesterov=True, l2_reg=0.01)),
    "sgdm_dampening": dict(loss="binary_cross_entropy", sizes=[4, 6, 1], k=2,
                           cfg=dict(learning_rate=0.5, clip_gamma=0.1, optimizer="sgdm",
                                    momentum=0.5, dampening=0.3)),
    "sgd_l1": dict(loss="binary_cross_entropy", sizes=[4, 8, 1], k=2,
                   cfg=dict(learning_rate=1.0, clip_gamma=0.1, l1_reg=0.01)),
    "ce_3class": dict(loss="cross_entropy", sizes=[4, 8, 3], k=1,
                      cfg=dict(learning_rate=1.0, clip_gamma=0.1)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_retrained_models_stay_in_box_and_certificates_hold(name):
  case = CASES[name]
  classes = case["sizes"][-1] if case["loss"] == "cross_entropy" else 2
  X, y = gaussian_blobs(240, classes=classes)
  if case["loss"] != "cross_entropy":
    y = y.astype(jnp.float64)
  params = mlp.init(jax.random.PRNGKey(1), case["sizes"], jnp.float64)
  cfg = agt.Config(n_epochs=3, batch_size=120, k_private=case["k"], loss=case["loss"],
                   fragsize=50, sound=True, **case["cfg"])
  report = retrain.empirical_retrain_test(mlp.apply, params, X, y, cfg, X, n_sets=16, seed=3)
  _check(report)


def test_check_can_fail_with_a_too_small_box():
  """The k = 0 box (a single trajectory) must be violated by the k = 2 neighbours."""
  X, y = gaussian_blobs(240)
  y = y.astype(jnp.float64)
  params = mlp.init(jax.random.PRNGKey(1), [4, 8, 1], jnp.float64)
  cfg2 = agt.Config(n_epochs=2, batch_size=120, k_private=2, clip_gamma=0.1, learning_rate=1.0)
  cfg0 = dataclasses.replace(cfg2, k_private=0)
  _, bt = retrain.agt_trajectory(mlp.apply, params, X, y, cfg0)
  nb = retrain.make_neighbours(0, mlp.apply, params, X, y, cfg2, 8)
  rt = retrain.retrain(mlp.apply, params, X, y, cfg2, nb)
  lo = jax.tree_util.tree_leaves(jax.tree_util.tree_map(
      lambda b: b.lower, bt, is_leaf=lambda v: hasattr(v, "lower")))
  outside = sum(int(jnp.sum(r < l[None] - 1e-9)) for l, r in zip(lo, jax.tree_util.tree_leaves(rt)))
  assert outside > 0


def test_nominal_retrain_equals_agt_nominal():
  """Zero changes reproduce AGT's nominal trajectory exactly (the harness itself is right)."""
  X, y = gaussian_blobs(240)
  y = y.astype(jnp.float64)
  params = mlp.init(jax.random.PRNGKey(2), [4, 6, 1], jnp.float64)
  cfg = agt.Config(n_epochs=2, batch_size=120, k_private=1, clip_gamma=0.2, learning_rate=0.5,
                   optimizer="sgdm", momentum=0.9)
  pt, _ = retrain.agt_trajectory(mlp.apply, params, X, y, cfg)
  nb = retrain.make_neighbours(0, mlp.apply, params, X, y, cfg, 1, k=1)
  nb = retrain.Neighbours(jnp.ones_like(nb.keep), nb.x_add, nb.y_add, jnp.zeros_like(nb.w_add))
  rt = retrain.retrain(mlp.apply, params, X, y, cfg, nb)
  for a, b in zip(jax.tree_util.tree_leaves(pt), jax.tree_util.tree_leaves(rt)):
    np.testing.assert_allclose(b[0], a, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 5, 10])
@pytest.mark.parametrize("opt", [dict(), dict(optimizer="sgdm", momentum=0.9, nesterov=True)])
def test_retraining_large(k, opt):
  X, y = gaussian_blobs(1200, d=6, seed=k)
  y = y.astype(jnp.float64)
  params = mlp.init(jax.random.PRNGKey(k), [6, 32, 16, 1], jnp.float64)
  cfg = agt.Config(n_epochs=4, batch_size=400, k_private=k, clip_gamma=0.05, learning_rate=0.5,
                   lr_decay=0.3, fragsize=128, sound=True, **opt)
  report = retrain.empirical_retrain_test(mlp.apply, params, X, y, cfg, X[:400], n_sets=64,
                                          seed=k)
  _check(report, min_certified=0)


def _outside(traj, rt):
  lo, hi = (jax.tree_util.tree_leaves(jax.tree_util.tree_map(
      f, traj.bounds, is_leaf=lambda v: hasattr(v, "lower"))) for f in (lambda b: b.lower,
                                                                       lambda b: b.upper))
  return max(float(jnp.max(jnp.maximum(l[None] - r, r - h[None])))
             for l, h, r in zip(lo, hi, jax.tree_util.tree_leaves(rt)))


def test_fixed_b_convention_needs_its_own_box():
  """The issue-16 gap by retraining: every bias gradient negative (MSE towards a far target),
  one addition at -gamma per batch. Thm 4.6's box (normalise="actual") holds the true-mean
  retraining but not the fixed-1/b one (excess gamma * lr / b per step); `retrain` refuses that
  pairing; the normalise="nominal" box holds both."""
  X, _ = gaussian_blobs(48)
  y = jnp.full((48,), 5.0)
  params = mlp.init(jax.random.PRNGKey(1), [4, 8, 1], jnp.float64)
  cfg = agt.Config(n_epochs=2, batch_size=8, k_private=1, clip_gamma=0.1, learning_rate=0.1,
                   loss="mse", sound=True)
  nb = retrain.make_neighbours(3, mlp.apply, params, X, y, cfg, 16)
  fixed_b = dataclasses.replace(cfg, normalise="nominal")
  box_actual = retrain.agt_trajectory(mlp.apply, params, X, y, cfg)
  box_nominal = retrain.agt_trajectory(mlp.apply, params, X, y, fixed_b)
  rt_actual = retrain.retrain(mlp.apply, params, X, y, cfg, nb)            # config's: "actual"
  rt_fixed = retrain.retrain(mlp.apply, params, X, y, fixed_b, nb)         # config's: "nominal"
  assert _outside(box_actual, rt_actual) <= 0
  assert _outside(box_actual, rt_fixed) > 1e-3                            # the gap
  assert _outside(box_nominal, rt_fixed) <= 0 and _outside(box_nominal, rt_actual) <= 0
  with pytest.raises(ValueError, match="more additions than removals"):
    retrain.retrain(mlp.apply, params, X, y, cfg, nb, normalise="nominal")
  # no batch grows (a <= r <= k: remove point 0 where an addition has no removal): Thm 4.6's
  # box covers the fixed-1/b mean too
  grows = nb.w_add.sum(-1) > (1 - nb.keep).sum(-1)
  subst = retrain.Neighbours(nb.keep * (1 - grows[..., None] * (jnp.arange(8) == 0)), nb.x_add,
                             nb.y_add, nb.w_add)
  removed = np.sum(1 - np.asarray(subst.keep), -1)
  assert np.all(removed >= np.sum(np.asarray(subst.w_add), -1)) and removed.max() <= 1
  rt_subst = retrain.retrain(mlp.apply, params, X, y, cfg, subst, normalise="nominal")
  assert _outside(box_actual, rt_subst) <= 0

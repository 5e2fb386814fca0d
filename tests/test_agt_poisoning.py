"""Poisoning certificates of AGT (Sosnin et al., "Certified Robustness to Data Poisoning in
Gradient-Based Training"): soundness by real retraining on poisoned data, the descent bound
against brute force, the label-set gradient bounds against sampling, degenerate budgets and
the validation of the configuration.
"""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boundjax import agt
from boundjax.agt import mlp, poison_attacks, poisoning, retrain
from boundjax.core.interval import Interval
from tests.helpers import gaussian_blobs


@pytest.fixture(autouse=True)
def x64():
  with jax.enable_x64(True):
    yield



def _widths(bounds):
  return [np.asarray(b.upper - b.lower) for b in
          jax.tree_util.tree_leaves(bounds, is_leaf=lambda a: isinstance(a, Interval))]


# ----------------------------------------------------------------------------------------------
# Soundness by retraining
# ----------------------------------------------------------------------------------------------

CASES = {
    "bce_features": dict(loss="binary_cross_entropy", sizes=[4, 8, 1],
                         cfg=dict(k_poison=2, epsilon=0.05, clip_gamma=0.5)),
    "bce_labels": dict(loss="binary_cross_entropy", sizes=[4, 8, 1],
                       cfg=dict(label_k_poison=1, learning_rate=0.2)),
    "ce_unpaired": dict(loss="cross_entropy", sizes=[4, 8, 3],
                        cfg=dict(k_poison=1, epsilon=0.05, label_k_poison=1, clip_gamma=0.2,
                                 learning_rate=0.3)),
    "ce_targeted_paired": dict(loss="cross_entropy", sizes=[4, 6, 3],
                               cfg=dict(k_poison=2, epsilon=0.03, label_k_poison=1,
                                        poison_target_idx=0, paired_poison=True, learning_rate=0.3,
                                        clip_gamma=0.2)),
    "mse_targets": dict(loss="mse", sizes=[4, 8, 1],
                        cfg=dict(k_poison=1, epsilon=0.02, label_k_poison=2, label_epsilon=0.1,
                                 learning_rate=0.1)),
    "sgdm_features": dict(loss="binary_cross_entropy", sizes=[4, 8, 1],
                          cfg=dict(k_poison=2, epsilon=0.05, optimizer="sgdm", momentum=0.5,
                                   learning_rate=0.3)),
    "ibp_backend_ce_labels": dict(loss="cross_entropy", sizes=[4, 6, 3], backend="ibp",
                                  cfg=dict(label_k_poison=1, k_poison=1, epsilon=0.02,
                                           paired_poison=True, learning_rate=0.3,
                                           clip_gamma=0.2)),
}


def _case_data(case, n=160):
  classes = case["sizes"][-1] if case["loss"] == "cross_entropy" else 2
  X, y = gaussian_blobs(n, classes=classes, sep=3.0 if classes > 2 else 1.5)
  if case["loss"] == "mse":
    y = jnp.tanh(X[:, 0] - X[:, 1])
  elif case["loss"] != "cross_entropy":
    y = y.astype(jnp.float64)
  return X, y, classes


def _run(name, n_sets, seed):
  case = CASES[name]
  X, y, classes = _case_data(case)
  params = mlp.init(jax.random.PRNGKey(1), case["sizes"], jnp.float64)
  kw = dict(learning_rate=0.5)
  kw.update(case["cfg"])
  cfg = agt.Config(n_epochs=3, batch_size=80, loss=case["loss"], fragsize=40, sound=True, **kw)
  return poison_attacks.empirical_poisoning_test(
      mlp.apply, params, X, y, cfg, X, n_sets=n_sets, seed=seed,
      backend=case.get("backend", "mlp"), n_classes=classes), cfg


#: The cases run in CI (12 poisoned datasets each: 60 retrained models); all in the slow test.
FAST = ("bce_features", "bce_labels", "ce_unpaired", "mse_targets", "ibp_backend_ce_labels")


@pytest.mark.parametrize("name", FAST)
def test_poisoned_retraining_stays_in_box_and_certificates_hold(name):
  report, cfg = _run(name, n_sets=12, seed=3)
  assert report.retrained_models == 12
  assert report.changed_models == 12, report        # every poisoned dataset moved the model
  if cfg.k_poison and cfg.epsilon:
    assert report.feature_poisoned > 0
  if cfg.label_k_poison:
    assert report.label_poisoned > 0
  assert report.param_violations == 0, report
  assert report.prediction_changes == 0, report
  if cfg.loss != "mse":
    assert report.certified_points >= 1, report


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_poisoned_retraining_many_models(name):
  report, _ = _run(name, n_sets=40, seed=11)
  assert report.param_violations == 0, report
  assert report.prediction_changes == 0, report


def test_check_can_fail_with_a_smaller_budget():
  """A box built for epsilon / 10 (and one for no label flips) must be left by models
  retrained on data poisoned with the full budget: the check has teeth."""
  case = CASES["bce_features"]
  X, y, _ = _case_data(case)
  params = mlp.init(jax.random.PRNGKey(1), case["sizes"], jnp.float64)
  big = agt.Config(n_epochs=2, batch_size=80, loss=case["loss"], learning_rate=0.5,
                   k_poison=2, epsilon=0.2, label_k_poison=2)
  pois = poison_attacks.make_poisoned(0, mlp.apply, params, X, y, big, 10)
  rt = poison_attacks.retrain(mlp.apply, params, pois.x, pois.y, big)
  for small in (dataclasses.replace(big, epsilon=0.02, label_k_poison=0),
                dataclasses.replace(big, label_k_poison=0)):
    traj = retrain.agt_trajectory(mlp.apply, params, X, y, small)
    assert np.sum(poison_attacks.box_excess(traj.bounds, rt) > 0) > 0
  traj = retrain.agt_trajectory(mlp.apply, params, X, y, big)
  assert np.sum(poison_attacks.box_excess(traj.bounds, rt) > 1e-12) == 0


# ----------------------------------------------------------------------------------------------
# The descent bound against brute force
# ----------------------------------------------------------------------------------------------

def _random_bounds(rng, b, d):
  c = rng.normal(size=(b, d))
  wl, wu = c - rng.uniform(0, 0.5, (b, d)), c + rng.uniform(0, 0.5, (b, d))
  il, iu = wl - rng.uniform(0, 1, (b, d)), wu + rng.uniform(0, 1, (b, d))
  return wl, wu, il, iu


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_descent_bound_equals_brute_force_over_poisoned_subsets(k):
  """max / min over every set S of <= k poisoned samples of (sum_{i not in S} wp + sum_{i in S}
  iwp) / b, per coordinate, by enumeration; the streaming and dense forms must equal it."""
  rng = np.random.default_rng(k)
  b, d = 7, 5
  wl, wu, il, iu = _random_bounds(rng, b, d)
  hi_bf, lo_bf = np.full(d, -np.inf), np.full(d, np.inf)
  for r in range(k + 1):
    for S in itertools.combinations(range(b), r):
      m = np.zeros(b, bool)
      m[list(S)] = True
      hi_bf = np.maximum(hi_bf, np.where(m[:, None], iu, wu).sum(0) / b)
      lo_bf = np.minimum(lo_bf, np.where(m[:, None], il, wl).sum(0) / b)
  lo, hi = poisoning.descent_bounds_dense(*map(jnp.asarray, (wl, wu, il, iu)), k)
  np.testing.assert_allclose(hi, hi_bf, rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(lo, lo_bf, rtol=1e-12, atol=1e-12)
  for f in (1, 3, 7):
    acc = poisoning.init_accumulator(jnp.zeros(d), k)
    for s in range(0, b, f):
      sl = slice(s, s + f)
      acc = poisoning.accumulate(acc, jnp.asarray(wl[sl]), jnp.asarray(wl[sl]),
                                 jnp.asarray(wu[sl]), jnp.asarray(il[sl]), jnp.asarray(iu[sl]))
    _, lo_s, hi_s = poisoning.finalize(acc, b)
    np.testing.assert_allclose(hi_s, hi_bf, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lo_s, lo_bf, rtol=1e-12, atol=1e-12)


def test_descent_bound_clamps_differences_of_narrower_poisoned_bounds():
  """Where a poisoned bound is (by rounding) narrower than the clean one, the bound must still
  cover fewer poisoned samples: no negative increase is added."""
  wl, wu = jnp.zeros((4, 2)), jnp.ones((4, 2))
  il, iu = wl + 0.1, wu - 0.1
  lo, hi = poisoning.descent_bounds_dense(wl, wu, il, iu, 2)
  np.testing.assert_array_equal(lo, 0.0)
  np.testing.assert_array_equal(hi, 1.0)


# ----------------------------------------------------------------------------------------------
# Label-set gradient bounds against sampling
# ----------------------------------------------------------------------------------------------

def _logit_samples(rng, zl, zu, n=10_000):
  c = zl.shape[-1]
  corners = np.array(list(itertools.product([0, 1], repeat=c)), float)
  u = np.concatenate([rng.uniform(size=(n, c)), corners])
  return zl + u * (zu - zl)


@pytest.mark.parametrize("target", [-1, 0, 2])
def test_cross_entropy_label_bounds_contain_every_label_and_logit(target):
  rng = np.random.default_rng(0)
  zl = rng.normal(size=4)
  zu = zl + rng.uniform(0, 2, 4)
  y = 1
  iv = poisoning.label_logit_grad_bounds("cross_entropy", Interval(jnp.asarray(zl),
                                                                    jnp.asarray(zu)),
                                         jnp.asarray(y), target_idx=target)
  z = _logit_samples(rng, zl, zu)
  p = np.asarray(jax.nn.softmax(jnp.asarray(z), -1))
  labels = range(4) if target < 0 else {y, target}
  g = np.concatenate([p - np.eye(4)[lbl] for lbl in labels])
  assert (g >= np.asarray(iv.lower) - 1e-12).all() and (g <= np.asarray(iv.upper) + 1e-12).all()
  # tight: the bounds are attained at box corners with an allowed label
  np.testing.assert_allclose(g.min(0), iv.lower, atol=1e-12)
  np.testing.assert_allclose(g.max(0), iv.upper, atol=1e-12)


@pytest.mark.parametrize("target", [-1, 0, 1])
@pytest.mark.parametrize("y", [0.0, 1.0])
def test_bce_label_bounds(target, y):
  rng = np.random.default_rng(1)
  zl, zu = np.array([-0.7]), np.array([1.3])
  iv = poisoning.label_logit_grad_bounds("binary_cross_entropy",
                                         Interval(jnp.asarray(zl), jnp.asarray(zu)),
                                         jnp.asarray(y), target_idx=target)
  z = _logit_samples(rng, zl, zu)
  labels = (0.0, 1.0) if target < 0 else {y, float(target)}
  g = np.concatenate([1 / (1 + np.exp(-z)) - lbl for lbl in labels])
  np.testing.assert_allclose(g.min(0), iv.lower, atol=1e-12)
  np.testing.assert_allclose(g.max(0), iv.upper, atol=1e-12)


@pytest.mark.parametrize("target", [-1, 1])
def test_mse_label_bounds(target):
  rng = np.random.default_rng(2)
  zl = rng.normal(size=3)
  zu = zl + rng.uniform(0, 1, 3)
  y, le = rng.normal(size=3), 0.3
  iv = poisoning.label_logit_grad_bounds("mse", Interval(jnp.asarray(zl), jnp.asarray(zu)),
                                         jnp.asarray(y), label_epsilon=le, target_idx=target)
  z = _logit_samples(rng, zl, zu)
  mv = np.concatenate([rng.uniform(-le, le, (10_000, 3)),
                       np.array(list(itertools.product([-le, le], repeat=3)))])
  if target >= 0:
    mv = mv * np.eye(3)[target]
  yp = y + mv                                     # one poisoned target per logit sample, and
  z = np.concatenate([z, np.repeat(z[-8:], 8, 0)])    # every corner target at every corner
  yp = np.concatenate([yp, np.tile(yp[-8:], (8, 1))])
  g = 2 * (z - yp) / 3
  assert (g >= np.asarray(iv.lower) - 1e-12).all() and (g <= np.asarray(iv.upper) + 1e-12).all()
  np.testing.assert_allclose(g.min(0), iv.lower, atol=1e-12)
  np.testing.assert_allclose(g.max(0), iv.upper, atol=1e-12)


# ----------------------------------------------------------------------------------------------
# Degenerate budgets and the two back-ends
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [dict(k_poison=2, epsilon=0.0), dict(k_poison=0, epsilon=0.1),
                                dict(k_poison=3, epsilon=0.0, paired_poison=True)])
def test_zero_budget_gives_the_nominal_box(kw):
  X, y = gaussian_blobs(160)
  y = y.astype(jnp.float64)
  params = mlp.init(jax.random.PRNGKey(2), [4, 8, 1], jnp.float64)
  base = agt.Config(n_epochs=2, batch_size=80, learning_rate=0.5, fragsize=30)
  ref = agt.fit(mlp.apply, params, X, y, base, progress=False)
  got = agt.fit(mlp.apply, params, X, y, dataclasses.replace(base, **kw), progress=False)
  assert all(np.all(w == 0) for w in _widths(got.bounds))
  for a, b in zip(jax.tree_util.tree_leaves(tuple(ref)), jax.tree_util.tree_leaves(tuple(got))):
    np.testing.assert_array_equal(a, b)


def test_positive_budget_widens_and_grows_with_epsilon():
  X, y = gaussian_blobs(160)
  y = y.astype(jnp.float64)
  params = mlp.init(jax.random.PRNGKey(2), [4, 8, 1], jnp.float64)
  base = agt.Config(n_epochs=2, batch_size=80, learning_rate=0.5, k_poison=2)
  w = [max(float(x.max()) for x in _widths(agt.fit(
      mlp.apply, params, X, y, dataclasses.replace(base, epsilon=e), progress=False).bounds))
       for e in (0.01, 0.05, 0.2)]
  assert 0 < w[0] < w[1] < w[2]


def test_mlp_and_ibp_backends_agree_on_the_step():
  """Both back-ends (explicit passes, and the generic engine with the vector-Jacobian product
  for label sets) give boxes containing the shared nominal run after a step."""
  X, y = gaussian_blobs(80, classes=3)
  params = mlp.init(jax.random.PRNGKey(3), [4, 6, 3], jnp.float64)
  cfg = agt.Config(n_epochs=1, batch_size=80, learning_rate=0.5, loss="cross_entropy",
                   k_poison=2, epsilon=0.05, label_k_poison=1)
  ra = agt.fit(mlp.apply, params, X, y, cfg, backend="mlp", progress=False)
  rb = agt.fit(mlp.apply, params, X, y, cfg, backend="ibp", progress=False)
  for p, ia, ib in zip(jax.tree_util.tree_leaves(ra.params),
                       jax.tree_util.tree_leaves(ra.bounds, is_leaf=lambda a: isinstance(a, Interval)),
                       jax.tree_util.tree_leaves(rb.bounds, is_leaf=lambda a: isinstance(a, Interval))):
    for iv in (ia, ib):
      assert np.all(iv.lower <= p + 1e-12) and np.all(p <= iv.upper + 1e-12)


def test_fragment_size_does_not_change_the_box():
  X, y = gaussian_blobs(160, classes=3)
  params = mlp.init(jax.random.PRNGKey(4), [4, 6, 3], jnp.float64)
  cfg = agt.Config(n_epochs=1, batch_size=80, learning_rate=0.5, loss="cross_entropy",
                   k_poison=2, epsilon=0.05, label_k_poison=1)
  a = agt.fit(mlp.apply, params, X, y, cfg, progress=False)
  b = agt.fit(mlp.apply, params, X, y, dataclasses.replace(cfg, fragsize=7), progress=False)
  for u, v in zip(jax.tree_util.tree_leaves(tuple(a)), jax.tree_util.tree_leaves(tuple(b))):
    np.testing.assert_allclose(u, v, rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------

BASE = dict(n_epochs=1, learning_rate=0.1, batch_size=10)


@pytest.mark.parametrize("kw,field", [
    (dict(k_poison=-1), "k_poison"),
    (dict(k_poison=1.5), "k_poison"),
    (dict(k_poison=True), "k_poison"),
    (dict(label_k_poison=-2), "label_k_poison"),
    (dict(epsilon=-0.1, k_poison=1), "epsilon"),
    (dict(epsilon=float("nan"), k_poison=1), "epsilon"),
    (dict(epsilon=float("inf"), k_poison=1), "epsilon"),
    (dict(label_epsilon=float("nan"), loss="mse"), "label_epsilon"),
    (dict(label_epsilon=0.1, label_k_poison=1), "label_epsilon"),
    (dict(k_poison=10), "batch_size"),
    (dict(k_poison=6, label_k_poison=4), "batch_size"),
    (dict(poison_target_idx=-2), "poison_target_idx"),
    (dict(poison_target_idx=2, label_k_poison=1), "poison_target_idx"),
    (dict(paired_poison=1, k_poison=1), "paired_poison"),
    (dict(k_poison=1, k_private=1, clip_gamma=0.1), "k_private"),
])
def test_validation_errors_name_the_field(kw, field):
  with pytest.raises(ValueError, match=field):
    agt.Config(**{**BASE, **kw})


def test_paired_budget_is_the_max():
  ok = agt.Config(**BASE, k_poison=6, label_k_poison=4, paired_poison=True)
  assert ok.poison_budget == 6 and ok.poisoning
  assert agt.Config(**BASE, k_poison=3, label_k_poison=4).poison_budget == 7
  assert not agt.Config(**BASE, epsilon=0.5).poisoning


def test_target_index_beyond_the_outputs_is_refused():
  X, y = gaussian_blobs(20, classes=3)
  params = mlp.init(jax.random.PRNGKey(0), [4, 5, 3], jnp.float64)
  cfg = agt.Config(n_epochs=1, batch_size=10, learning_rate=0.1, loss="cross_entropy",
                   label_k_poison=1, poison_target_idx=5)
  with pytest.raises(ValueError, match="poison_target_idx"):
    agt.fit(mlp.apply, params, X, y, cfg, progress=False)

"""CROWN bounds over AGT's parameter box (`boundjax.agt.crown`, ``Config(bound_method="crown")``).

Ground truth: float64 sampling of >= 2e4 parameter vectors per box (a third of the coordinates
pinned to a box corner), the two all-lower / all-upper corners, and real retraining on
neighbouring datasets (`boundjax.agt.retrain`).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boundjax import agt
from boundjax.agt import bounds as bnd
from boundjax.agt import crown, mlp, retrain
from boundjax.core.interval import Interval

N_SAMPLES = 20_000


@pytest.fixture(autouse=True)
def x64():
  with jax.enable_x64(True):
    yield


def _box(sizes, eps, seed=0):
  params = mlp.init(jax.random.PRNGKey(seed), sizes, jnp.float64)
  rng = np.random.default_rng(seed)
  box = [{k: Interval(v - eps * rng.random(v.shape), v + eps * rng.random(v.shape))
          for k, v in l.items()} for l in params]
  x = jnp.asarray(rng.normal(size=(5, sizes[0])))
  return params, box, x


def _draw(box, key):
  """One parameter vector in the box: uniform, with ~30 % of coordinates at a corner."""
  out = []
  for l in box:
    d = {}
    for name in sorted(l):
      iv = l[name]
      key, s = jax.random.split(key)
      t = jax.random.uniform(s, iv.lower.shape, jnp.float64)
      t = jnp.where(t < 0.15, 0.0, jnp.where(t > 0.85, 1.0, t))
      d[name] = iv.lower + t * (iv.upper - iv.lower)
    out.append(d)
  return out


def _samples(box, fn, n=N_SAMPLES, seed=1):
  """``fn(params)`` at n sampled parameter vectors plus the all-lower and all-upper corners."""
  vals = jax.vmap(lambda k: fn(_draw(box, k)))(jax.random.split(jax.random.PRNGKey(seed), n))
  lo = [{k: iv.lower for k, iv in l.items()} for l in box]
  hi = [{k: iv.upper for k, iv in l.items()} for l in box]
  return jax.tree_util.tree_map(lambda v, a, b: jnp.concatenate([v, a[None], b[None]]),
                                vals, fn(lo), fn(hi))


NETS = {"3-layer": [4, 16, 16, 3], "4-layer": [5, 12, 10, 8, 2]}


@pytest.mark.parametrize("name", list(NETS))
@pytest.mark.parametrize("matmul", ["midrad", "signsplit"])
def test_forward_bounds_contain_sampled_logits(name, matmul):
  _, box, x = _box(NETS[name], 0.05)
  cb = crown.forward_bounds(box, x, matmul)
  z = np.asarray(_samples(box, lambda p: mlp.apply(p, x)))
  assert np.all(np.asarray(cb.lower) <= z.min(0)) and np.all(np.asarray(cb.upper) >= z.max(0))
  # ... and is not trivially wide: within 3x the sampled spread
  assert np.mean(cb.upper - cb.lower) < 3 * np.mean(z.max(0) - z.min(0))


@pytest.mark.parametrize("name", list(NETS))
def test_margin_bounds_contain_sampled_margins(name):
  _, box, x = _box(NETS[name], 0.05)
  cls = jnp.asarray(np.arange(x.shape[0]) % NETS[name][-1])
  lo = np.asarray(crown.margin_bounds(box, x, cls, "signsplit"))
  z = np.asarray(_samples(box, lambda p: mlp.apply(p, x)))             # (n, batch, C)
  zc = np.take_along_axis(z, np.asarray(cls)[None, :, None], -1)
  assert np.all(lo <= (zc - z).min(0))


def test_gradient_bounds_contain_sampled_gradients():
  _, box, x = _box([4, 10, 10, 3], 0.05)
  y = jnp.asarray(np.arange(x.shape[0]) % 3)
  gb = crown.grad_bounds(box, x, y, "cross_entropy", "midrad")
  g = _samples(box, lambda p: mlp.per_sample_grads(p, x, y, "cross_entropy"), n=10_000)
  for iv, s in zip(jax.tree_util.tree_leaves(gb, is_leaf=lambda a: isinstance(a, Interval)),
                   jax.tree_util.tree_leaves(g)):
    s = np.asarray(s)
    assert np.all(np.asarray(iv.lower) <= s.min(0)) and np.all(np.asarray(iv.upper) >= s.max(0))


@pytest.mark.parametrize("matmul", ["midrad", "signsplit"])
def test_never_looser_than_interval_and_strictly_tighter_from_two_hidden_layers(matmul):
  _, box, x = _box([5, 16, 16, 16, 2], 0.03)
  ib, cb = mlp.forward_bounds(box, x, matmul), crown.forward_bounds(box, x, matmul)
  assert np.all(cb.lower >= ib.lower) and np.all(cb.upper <= ib.upper)
  assert np.mean(cb.upper - cb.lower) < 0.9 * np.mean(ib.upper - ib.lower)
  cls = jnp.zeros(x.shape[0], jnp.int32)
  mi, mc = mlp.margin_bounds(box, x, cls, matmul), crown.margin_bounds(box, x, cls, matmul)
  assert np.all(mc >= mi) and np.mean(mc[:, 1] - mi[:, 1]) > 0
  y = jnp.zeros(x.shape[0], jnp.int32)
  gi = mlp.grad_bounds(box, x, y, "cross_entropy", matmul)
  gc = crown.grad_bounds(box, x, y, "cross_entropy", matmul)
  wi = sum(float(jnp.sum(l.upper - l.lower)) for l in jax.tree_util.tree_leaves(
      gi, is_leaf=lambda a: isinstance(a, Interval)))
  wc = sum(float(jnp.sum(l.upper - l.lower)) for l in jax.tree_util.tree_leaves(
      gc, is_leaf=lambda a: isinstance(a, Interval)))
  assert wc < wi


def test_one_hidden_layer_is_already_exact_with_signsplit():
  """With one hidden layer the sign-split interval logits are exact per coordinate, so CROWN
  equals them (the module docstring's fact 1): for every sample and output the parameter
  vector that attains the upper bound is built by hand (W2 at its upper end, each hidden unit
  at its largest or smallest value by the sign of its W2 entry) and reaches it."""
  _, box, x = _box([4, 8, 3], 0.05)
  cb, sb = crown.forward_bounds(box, x, "signsplit"), mlp.forward_bounds(box, x, "signsplit")
  np.testing.assert_allclose(cb.lower, sb.lower, rtol=0, atol=1e-12)
  np.testing.assert_allclose(cb.upper, sb.upper, rtol=0, atol=1e-12)
  (w1, b1), (w2, b2) = [(l["kernel"], l["bias"]) for l in box]
  for n in range(x.shape[0]):
    xs = x[n][:, None]
    w1_hi = jnp.where(xs >= 0, w1.upper, w1.lower)      # largest hidden pre-activations
    w1_lo = jnp.where(xs >= 0, w1.lower, w1.upper)
    for j in range(3):
      up = w2.upper[:, j] >= 0                           # hidden unit m: max if W2_mj >= 0
      p = [{"kernel": jnp.where(up[None], w1_hi, w1_lo),
            "bias": jnp.where(up, b1.upper, b1.lower)},
           {"kernel": w2.upper, "bias": b2.upper}]
      assert float(mlp.apply(p, x[n])[j]) == pytest.approx(float(cb.upper[n, j]), abs=1e-12)


def test_point_box_gives_the_nominal_logits():
  params, _, x = _box([4, 8, 8, 2], 0.0)
  box = jax.tree_util.tree_map(lambda p: Interval(p, p), params)
  cb = crown.forward_bounds(box, x)                 # "midrad": the nominal pass's own sums
  z = mlp.apply(params, x)
  assert np.all(cb.lower <= z) and np.all(cb.upper >= z)   # rounding never cuts into it
  np.testing.assert_allclose(cb.lower, z, atol=1e-12)
  np.testing.assert_allclose(cb.upper, z, atol=1e-12)


def test_bad_input_is_refused():
  _, box, x = _box([4, 8, 8, 2], 0.01)
  with pytest.raises(TypeError, match="x must be a point"):
    crown.forward_bounds(box, Interval(x, x + 0.1))
  with pytest.raises(ValueError, match="bound_method"):
    bnd.grad_bounds_fn(mlp.apply, "cross_entropy", "ibp", "midrad", "lp")
  with pytest.raises(ValueError, match="bound_method"):
    agt.Config(n_epochs=1, learning_rate=0.1, batch_size=10, bound_method="lp")
  assert agt.Config(n_epochs=1, learning_rate=0.1, batch_size=10,
                    bound_method="crown").bound_method == "crown"


def test_crown_with_the_ibp_back_end_bounds_any_apply_fn():
  """bound_method="crown" runs on the engine with the generic back-end too: the same logit
  bounds as the Dense-stack path (one engine), containing sampled logits, tighter than IBP."""
  _, box, x = _box([5, 16, 16, 16, 2], 0.03)
  batched = lambda p, xb: mlp.apply(p, xb)  # noqa: E731  (a batched apply_fn)
  gen = bnd.forward_bounds_fn(batched, "ibp", "midrad", "crown")(box, x)
  own = bnd.forward_bounds_fn(mlp.apply, "mlp", "midrad", "crown")(box, x)
  np.testing.assert_allclose(gen.lower, own.lower, rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(gen.upper, own.upper, rtol=1e-12, atol=1e-12)
  z = np.asarray(_samples(box, lambda p: mlp.apply(p, x)))
  assert np.all(np.asarray(gen.lower) <= z.min(0)) and np.all(np.asarray(gen.upper) >= z.max(0))
  ib = bnd.forward_bounds_fn(batched, "ibp", "midrad", "interval")(box, x)
  assert np.mean(gen.upper - gen.lower) < 0.9 * np.mean(ib.upper - ib.lower)
  y = jnp.zeros(x.shape[0], jnp.int32)
  g = bnd.grad_bounds_fn(batched, "cross_entropy", "ibp", "midrad", "crown")(box, x, y)
  assert all(np.all(np.asarray(l.lower) <= np.asarray(l.upper)) for l in
             jax.tree_util.tree_leaves(g, is_leaf=lambda a: isinstance(a, Interval)))


def test_margin_bounds_of_the_ibp_back_end_with_crown():
  """``margin_bounds_fn`` with the generic back-end and "crown": the engine bounds ``z_c - z_j``
  of any ``apply_fn`` itself; the bounds contain sampled margins (parameter samples and box
  corners), are never looser than ``l_c - u_j`` of the logit bounds and tighter on average;
  "interval" has none (an interval pass of the margin is ``l_c - u_j``)."""
  _, box, x = _box([5, 16, 16, 3], 0.03)
  batched = lambda p, xb: mlp.apply(p, xb)  # noqa: E731  (a batched apply_fn)
  cls = jnp.asarray([0, 1, 2, 0, 1])
  lo = np.asarray(bnd.margin_bounds_fn("ibp", "midrad", "crown", batched)(box, x, cls))
  fwd = bnd.forward_bounds_fn(batched, "ibp", "midrad", "crown")(box, x)
  naive = np.take_along_axis(np.asarray(fwd.lower), np.asarray(cls)[:, None], 1) - \
      np.asarray(fwd.upper)
  z = np.asarray(_samples(box, lambda p: mlp.apply(p, x)))  # (N, 5, 3)
  m = np.take_along_axis(z, np.broadcast_to(np.asarray(cls)[None, :, None], (len(z), 5, 1)),
                         2) - z
  assert np.all(lo <= m.min(0))
  other = ~np.eye(3, dtype=bool)[np.asarray(cls)]
  assert np.all(lo[other] >= naive[other] - 1e-12)
  assert np.mean(lo[other] - naive[other]) > 1e-3, np.mean(lo[other] - naive[other])
  assert bnd.margin_bounds_fn("ibp", "midrad", "interval", batched) is None
  with pytest.raises(ValueError, match="need apply_fn"):
    bnd.margin_bounds_fn("ibp", "midrad", "crown")


def _blobs(n, d=4, classes=2, seed=0):
  rng = np.random.default_rng(seed)
  y = rng.integers(0, classes, n)
  X = rng.normal(size=(classes, d))[y] * 1.5 + rng.normal(size=(n, d))
  return jnp.asarray(X), jnp.asarray(y)


RETRAIN = {
    "bce_sound": dict(loss="binary_cross_entropy", sizes=[4, 8, 8, 1], classes=2, sound=True,
                      k=2, cfg=dict(learning_rate=1.0, clip_gamma=0.1)),
    "ce_3class_sound": dict(loss="cross_entropy", sizes=[4, 8, 8, 3], classes=3, sound=True,
                            k=1, cfg=dict(learning_rate=0.5, clip_gamma=0.1)),
    "ce_3class": dict(loss="cross_entropy", sizes=[4, 8, 8, 3], classes=3, sound=False,
                      k=1, cfg=dict(learning_rate=0.5, clip_gamma=0.1)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RETRAIN))
def test_crown_fit_survives_real_retraining(name):
  case = RETRAIN[name]
  X, y = _blobs(240, classes=case["classes"])
  if case["loss"] != "cross_entropy":
    y = y.astype(jnp.float64)
  params = mlp.init(jax.random.PRNGKey(1), case["sizes"], jnp.float64)
  cfg = agt.Config(n_epochs=3, batch_size=120, k_private=case["k"], loss=case["loss"],
                   fragsize=50, sound=case["sound"], bound_method="crown", **case["cfg"])
  # Without the sound mode the batch sums round in float64 like the retrained runs' own sums;
  # the Config docs record excesses of ~1e-17 there, the same with interval bounds (checked).
  tol = 0.0 if case["sound"] else 1e-15
  rep = retrain.empirical_retrain_test(mlp.apply, params, X, y, cfg, X, n_sets=16, seed=3,
                                       tol=tol)
  assert rep.retrained_models > 0 and rep.removals > 0 and rep.additions > 0
  assert rep.param_violations == 0, rep
  assert rep.prediction_changes == 0, rep
  assert rep.certified_points >= 10, rep
  # the same run with interval bounds (same nominal model) certifies fewer points
  res_i = agt.fit(mlp.apply, params, X, y, dataclasses.replace(cfg, bound_method="interval"),
                  progress=False)
  n_i = int(np.sum(agt.certify(mlp.apply, res_i.params, res_i.bounds, X)))
  assert rep.certified_points >= n_i
  if case["loss"] == "cross_entropy":
    assert rep.certified_points > n_i


def test_fit_with_crown_runs_and_certifies_at_least_as_much():
  X, y = _blobs(400, d=6)
  params = mlp.init(jax.random.PRNGKey(0), [6, 16, 16, 2], jnp.float64)
  cfg = agt.Config(n_epochs=2, batch_size=200, k_private=2, clip_gamma=0.06, learning_rate=0.5,
                   loss="cross_entropy", bound_method="crown")
  res = agt.fit(mlp.apply, params, X, y, cfg, progress=False, x_val=X, y_val=y)
  res_i = agt.fit(mlp.apply, params, X, y, dataclasses.replace(cfg, bound_method="interval"),
                  progress=False, x_val=X, y_val=y)
  for a, b in zip(jax.tree_util.tree_leaves(res.params), jax.tree_util.tree_leaves(res_i.params)):
    np.testing.assert_array_equal(a, b)                      # one nominal run
  assert res.history[-1].val_certified >= res_i.history[-1].val_certified
  c = agt.certify(mlp.apply, res.params, res.bounds, X, bound_method="crown")
  ci = agt.certify(mlp.apply, res.params, res.bounds, X)
  assert np.all(c >= ci) and c.mean() == pytest.approx(res.history[-1].val_certified)

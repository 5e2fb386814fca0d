"""AGT diagnostics (issue 16, item 4): box width against the weights in `fit`'s history and
progress bar, `VacuousCertificateWarning`, `BoxOverflowError`."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boundjax import agt
from boundjax.agt import diagnostics, mlp


def _blobs(n, d=6, seed=0):
  rng = np.random.default_rng(seed)
  y = rng.integers(0, 2, n)
  x = rng.normal(size=(2, d))[y] * 1.5 + rng.normal(size=(n, d))
  return jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)


def _fit(cfg, x, y, **kw):
  params = mlp.init(jax.random.PRNGKey(0), [x.shape[1], 32, 1], jnp.float32)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    res = agt.fit(mlp.apply, params, x, y, cfg, progress=False, **kw)
  vac = [w for w in caught if issubclass(w.category, agt.VacuousCertificateWarning)]
  return res, vac


def test_healthy_run_records_widths_and_stays_silent():
  x, y = _blobs(400)
  cfg = agt.Config(n_epochs=2, batch_size=400, k_private=1, clip_gamma=0.06, learning_rate=0.1)
  res, vac = _fit(cfg, x, y)
  assert not vac
  assert [r.epoch for r in res.history] == [1, 2]          # recorded without validation data
  rec = res.history[-1]
  assert rec.layers == ("[0]['bias']", "[0]['kernel']", "[1]['bias']", "[1]['kernel']")
  assert all(0 <= m <= M for m, M in zip(rec.width_mean, rec.width_max))
  assert all(s > 0 for s in rec.weight_scale) and max(rec.width_ratio) < 1
  assert rec.val_accuracy is None and "width_mean" in rec.as_dict()
  assert rec.probe_certified > 0.8 and rec.certified == rec.probe_certified
  assert set(agt.train._postfix(rec)) == {"width", "|w|", "max_width", "cert"}


def test_vacuous_box_warns_with_the_knobs():
  """The issue's 0 %-certified first try: small batch, large k and gamma, big steps."""
  x, y = _blobs(400)
  cfg = agt.Config(n_epochs=2, batch_size=100, k_private=10, clip_gamma=1.0, learning_rate=0.5)
  res, vac = _fit(cfg, x, y, x_val=x, y_val=y)
  assert len(vac) == 1                                       # once per fit
  msg = str(vac[0].message)
  for knob in ("batch_size", "clip_gamma", "learning_rate", "k_private"):
    assert knob in msg
  rec = res.history[0]
  assert max(rec.width_ratio) > 1 and rec.val_certified == 0.0
  assert issubclass(agt.VacuousCertificateWarning, UserWarning)


def test_tiny_bias_leaves_raise_no_false_alarm():
  """Zero-initialised biases (the Flax default) stay tiny in a healthy run, so a per-leaf scale
  flags them although the layer's weights are far wider than the box; the layer-level scale
  does not (and the run certifies most points)."""
  x, y = _blobs(400)
  params = mlp.init(jax.random.PRNGKey(0), [x.shape[1], 32, 1], jnp.float32)
  params = [{"kernel": l["kernel"], "bias": jnp.zeros_like(l["bias"])} for l in params]
  cfg = agt.Config(n_epochs=2, batch_size=200, k_private=5, clip_gamma=0.06, learning_rate=0.2)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    res = agt.fit(mlp.apply, params, x, y, cfg, progress=False, x_val=x, y_val=y)
  assert not [w for w in caught if issubclass(w.category, agt.VacuousCertificateWarning)]
  rec = res.history[-1]
  assert rec.val_certified > 0.8
  # the situation is a real false-alarm case for a per-leaf scale: some bias leaf is wider
  # than its own mean |w|
  per_leaf = [float(np.mean(np.abs(np.asarray(p))))
              for p in jax.tree_util.tree_leaves(res.params)]
  assert any(w > s for n, w, s in zip(rec.layers, rec.width_mean, per_leaf) if "bias" in n)
  assert max(rec.width_ratio) < 1


def test_overflowing_box_raises_naming_step_and_layer():
  """Unclipped MSE (unlearning needs no clipping), k = 4, batch 16: the box reaches inf/NaN."""
  x, _ = _blobs(64)
  y = x[:, 0] * 50
  cfg = agt.Config(n_epochs=4, batch_size=16, k_private=4, loss="mse", neighbourhood="remove",
                   learning_rate=0.5)
  with pytest.raises(agt.BoxOverflowError, match=r"at step \d+ in .*kernel.*batch_size") as e:
    _fit(cfg, x, y)
  assert isinstance(e.value, FloatingPointError)


def test_box_stats_and_ratio():
  from boundjax.core.interval import Interval
  params = {"w": jnp.array([1.0, -1.0]), "z": jnp.zeros(2)}
  box = {"w": Interval(jnp.array([0.0, -3.0]), jnp.array([2.0, -1.0])),
         "z": Interval(jnp.zeros(2), jnp.zeros(2))}
  st = diagnostics.box_stats(params, box)
  assert st.width_mean == (2.0, 0.0) and st.width_max == (2.0, 0.0)
  assert st.weight_scale == (0.5, 0.5)                       # one layer: mean of |1,-1,0,0|
  assert st.ratio == (4.0, 0.0) and st.vacuous_layers() == ("['w']",)
  # two layers: each leaf against its own layer's scale, kernel and bias together
  params = [{"kernel": jnp.array([[2.0, -2.0]]), "bias": jnp.array([0.0, 1e-3])},
            {"kernel": jnp.array([[0.1], [0.1]]), "bias": jnp.array([0.0])}]
  box = jax.tree_util.tree_map(lambda p: Interval(p - 0.05, p + 0.05), params)
  st = diagnostics.box_stats(params, box)
  assert diagnostics.layer_groups(params) == ("[0]", "[0]", "[1]", "[1]")
  np.testing.assert_allclose(st.weight_scale, [1.00025, 1.00025, 0.2 / 3, 0.2 / 3])
  assert st.vacuous_layers() == ("[1]['bias']", "[1]['kernel']")   # width 0.1 > 0.067
  assert not np.asarray(diagnostics.finite_flags(
      {"w": Interval(jnp.array([0.0]), jnp.array([jnp.inf]), validate=False)})).all()


def _split_blobs(n_train=400, n_test=2000):
  """Training points and held-out points of the same two blobs."""
  x, y = _blobs(n_train + n_test)
  return x[:n_train], y[:n_train], x[n_train:]


def _held_out_certified(res, xt):
  """Certified fraction on held-out points (ground truth of "certifies most / nothing")."""
  return float(np.mean(agt.certify(mlp.apply, res.params, res.bounds, xt)))


def test_probe_is_the_schedule_s_first_training_points():
  """Without validation data the record holds the certified fraction of the first n_probe
  training points in the schedule's order, as `agt.certify` computes it on them."""
  x, y = _blobs(300)
  cfg = agt.Config(n_epochs=1, batch_size=100, k_private=3, clip_gamma=0.06, learning_rate=0.3)
  res, _ = _fit(cfg, x, y, vacuity=diagnostics.VacuityCheck(n_probe=150))
  order = np.concatenate(cfg.schedule(300).epoch_batches()[0])[:150]
  ref = agt.certify(mlp.apply, res.params, res.bounds, x[order])
  assert res.history[0].probe_certified == pytest.approx(float(np.mean(ref)), abs=1e-12)
  assert 0 < res.history[0].probe_certified < 1                 # a discriminating probe


K_BAD, K_MID = 60, 30     # batch 200: certifies (almost) nothing / about a third of the points


def test_warns_when_nothing_is_certified_although_the_box_is_narrower_than_the_weights():
  """The case the old rule (mean width > mean |w|) missed: the box is still narrower than the
  weights, but certifies (almost) no point; and a run that certifies most points is silent."""
  x, y, xt = _split_blobs()
  bad = agt.Config(n_epochs=2, batch_size=200, k_private=K_BAD, clip_gamma=0.06,
                   learning_rate=0.2)
  res, vac = _fit(bad, x, y)
  assert max(res.history[-1].width_ratio) < 1                    # the old rule: silent
  assert _held_out_certified(res, xt) < 0.1 and len(vac) == 1
  msg = str(vac[0].message)
  assert "training probe" in msg and "min_certified=0.25" in msg and "batch_size" in msg
  good = agt.Config(n_epochs=2, batch_size=200, k_private=2, clip_gamma=0.06, learning_rate=0.2)
  res, vac = _fit(good, x, y)
  assert _held_out_certified(res, xt) > 0.8 and not vac


def test_vacuity_threshold_is_a_parameter_and_none_turns_the_check_off():
  x, y, _ = _split_blobs()
  cfg = agt.Config(n_epochs=2, batch_size=200, k_private=K_MID, clip_gamma=0.06,
                   learning_rate=0.2)
  res, vac = _fit(cfg, x, y)
  c = res.history[-1].probe_certified
  assert 0.3 < c < 0.95 and not vac                               # default 0.25: silent
  _, vac = _fit(cfg, x, y, vacuity=diagnostics.VacuityCheck(min_certified=0.97))
  assert len(vac) == 1 and "min_certified=0.97" in str(vac[0].message)
  res, vac = _fit(cfg, x, y, vacuity=None)
  assert not vac and res.history[-1].probe_certified is None


def test_mse_uses_the_width_ratio():
  """Regression has no certificate: "mse" warns when a leaf's width exceeds max_width_ratio
  times its layer's mean |w| (0.5 by default)."""
  x, _ = _blobs(200)
  y = jnp.tanh(x[:, 0])
  cfg = agt.Config(n_epochs=2, batch_size=100, k_private=2, loss="mse", clip_gamma=0.1,
                   learning_rate=0.2)
  res, vac = _fit(cfg, x, y, vacuity=diagnostics.VacuityCheck(max_width_ratio=1e6))
  r = max(res.history[-1].width_ratio)
  assert not vac and res.history[-1].probe_certified is None and r > 0
  _, vac = _fit(cfg, x, y, vacuity=diagnostics.VacuityCheck(max_width_ratio=r / 2))
  assert len(vac) == 1 and "wider than" in str(vac[0].message)


@pytest.mark.parametrize("kw, name", [(dict(min_certified=1.5), "min_certified"),
                                      (dict(min_certified=-0.1), "min_certified"),
                                      (dict(n_probe=0), "n_probe"),
                                      (dict(n_probe=2.5), "n_probe"),
                                      (dict(max_width_ratio=0.0), "max_width_ratio")])
def test_vacuity_check_rejects_bad_values(kw, name):
  with pytest.raises(ValueError, match=name):
    diagnostics.VacuityCheck(**kw)


def test_fit_rejects_a_vacuity_that_is_not_a_check():
  x, y = _blobs(40)
  cfg = agt.Config(n_epochs=1, batch_size=20, k_private=1, clip_gamma=0.06, learning_rate=0.1)
  with pytest.raises(TypeError, match="vacuity"):
    _fit(cfg, x, y, vacuity=0.25)


# ---------------------------------------------------------------------------------------------
# The same check in a user's own loop: diagnostics.check and the optax-style pair
# ---------------------------------------------------------------------------------------------

def _own_loop_setup():
  x, y = _blobs(96, d=4, seed=3)
  params = mlp.init(jax.random.PRNGKey(0), [4, 6, 1])
  wide = agt.Config(n_epochs=1, learning_rate=2.0, batch_size=32, k_private=8, clip_gamma=5.0)
  return x, y, params, wide


def test_check_measures_what_fit_measures():
  x, y, params, wide = _own_loop_setup()
  point = diagnostics.check(agt.point_box(params), x, apply_fn=mlp.apply, config=wide)
  assert point.certified == 1.0 and not point.vacuous and point.message == ""
  with warnings.catch_warnings(record=True) as rec:
    warnings.simplefilter("always")
    res = agt.fit(mlp.apply, params, x, y, wide, backend="mlp", progress=False, x_val=x[:64],
                  y_val=y[:64])
  fitted = res.history[-1].val_certified
  assert any(issubclass(w.category, diagnostics.VacuousCertificateWarning) for w in rec)
  with pytest.warns(diagnostics.VacuousCertificateWarning, match="at step 3 .* certifies only"):
    out = diagnostics.check(res, x[:64], apply_fn=mlp.apply, config=wide, step=3)
  assert out.certified == fitted and out.vacuous and fitted < 0.25   # fit's own number
  assert out.stats.width_mean == res.history[-1].width_mean
  quiet = diagnostics.check(res, x[:64], apply_fn=mlp.apply, config=wide, warn=False)
  assert quiet.vacuous and quiet.message


def test_the_optax_style_pair_checks_every_n_steps():
  x, y, params, wide = _own_loop_setup()
  tx = agt.with_vacuity_check(agt.transform(wide), every=2, apply_fn=mlp.apply, config=wide,
                              x=x)
  box, state = agt.point_box(params), tx.init(params)

  @jax.jit
  def step(box, state, xb, yb):
    dirs = agt.descent_directions(mlp.apply, wide, box.params, box.bounds, xb, yb,
                                  backend="mlp")
    return tx.update(dirs, state, box)

  with warnings.catch_warnings(record=True) as rec:
    warnings.simplefilter("always")
    for i in range(5):
      rows = np.arange(32) + 32 * (i % 3)
      box, state = step(box, state, x[rows], y[rows])
    jax.effects_barrier()
  msgs = [str(w.message) for w in rec
          if issubclass(w.category, diagnostics.VacuousCertificateWarning)]
  assert [m.split("): ")[1][:9] for m in msgs] == ["at step 2", "at step 4"]   # not 1, 3, 5
  # the pair itself is unchanged: same box as the plain pair
  plain, plain_state = agt.point_box(params), agt.transform(wide).init(params)
  for i in range(5):
    rows = np.arange(32) + 32 * (i % 3)
    dirs = agt.descent_directions(mlp.apply, wide, plain.params, plain.bounds, x[rows], y[rows],
                                  backend="mlp")
    plain, plain_state = agt.transform(wide).update(dirs, plain_state, plain)
  for a, b in zip(jax.tree_util.tree_leaves(box), jax.tree_util.tree_leaves(plain)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  with pytest.raises(ValueError, match="every must be an int >= 1"):
    agt.with_vacuity_check(agt.transform(wide), every=0, apply_fn=mlp.apply, config=wide, x=x)

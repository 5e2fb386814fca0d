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
  assert set(agt.train._postfix(rec)) == {"width", "|w|", "max_width"}


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
  from boundjax.interval import Interval
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

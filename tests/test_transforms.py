"""The "bounds" section of `boundjax demo` (IBP vs CROWN certified-robust accuracy)."""

import re

from boundjax.transforms import demo_section


def test_bounds_demo_reports_sound_certified_accuracy():
  text = demo_section(eps_list=(0.01, 0.05), steps=120, n_samples=40)
  rows = [l.split() for l in text.splitlines() if re.match(r"\s+0\.0\d\d\s", l)]
  assert len(rows) == 2, text
  for eps, ibp_acc, ibp_t, crown_acc, crown_t in rows:
    assert 0.0 <= float(ibp_acc) <= float(crown_acc) <= 1.0, text  # CROWN never looser than IBP
    assert ibp_t.endswith("ms") and crown_t.endswith("ms")
  # certified-robust accuracy cannot grow with eps
  assert float(rows[1][1]) <= float(rows[0][1]) and float(rows[1][3]) <= float(rows[0][3])
  m = re.search(r"violations, must be 0\): (\d+) of (\d+)", text)
  assert m and int(m.group(1)) == 0 and int(m.group(2)) == 40 * 2 * 2 * 2 * 114, text


def test_fit_full_batch_equals_an_explicit_loop_and_learns():
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from boundjax.models import MLP, fit_full_batch

  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(64, 3)), jnp.float32)
  y = jnp.asarray((x[:, 0] + x[:, 1] > 0).astype(np.int32))
  model = MLP(hidden=(8,), out=2)
  p0 = model.init(jax.random.PRNGKey(0), x[:1])
  opt = optax.adam(1e-2)
  fitted = fit_full_batch(model.apply, p0, x, y, opt, 50)
  p, s = p0, opt.init(p0)
  loss = lambda q: optax.softmax_cross_entropy_with_integer_labels(model.apply(q, x), y).mean()
  for _ in range(50):
    u, s = opt.update(jax.grad(loss)(p), s, p)
    p = optax.apply_updates(p, u)
  for a, b in zip(jax.tree_util.tree_leaves(fitted), jax.tree_util.tree_leaves(p)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  assert float(loss(fitted)) < 0.5 * float(loss(p0))

"""The faster AGT paths against their references: two-level top-k, batched nominal gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boundjax import agt
from boundjax.agt import descent, select, mlp, poisoning, train
from boundjax.core.interval import Interval


@pytest.fixture(autouse=True)
def x64():
  with jax.enable_x64(True):
    yield


@pytest.mark.parametrize("f, d, k", [(37, 5, 3), (2000, 7, 10), (101, 3, 1), (500, 4, 10),
                                     (12, 3, 11), (997, 6, 10), (250, 2, 4)])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_leading_equals_lax_top_k(f, d, k, largest):
  rng = np.random.default_rng(f * 31 + d * 7 + k)
  # rounded values give many ties; a block of equal values stresses the group choice
  v = np.round(rng.normal(size=(f, d)), 1)
  v[: f // 3, 0] = 0.5
  extra = rng.normal(size=(d, k))
  s = 1 if largest else -1
  ref = s * jax.lax.top_k(s * jnp.concatenate([jnp.asarray(extra), jnp.asarray(v).T], -1), k)[0]
  got = descent.topk_leading(jnp.asarray(v), k, jnp.asarray(extra), largest=largest)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))
  got3 = descent.topk_leading(jnp.asarray(v).reshape(f, d, 1), k, largest=largest)
  ref3 = s * jax.lax.top_k(s * jnp.asarray(v).T, k)[0]
  np.testing.assert_array_equal(np.asarray(got3)[:, 0], np.asarray(ref3))


@pytest.mark.parametrize("f, k", [(2000, 10), (1000, 10), (500, 10), (997, 10), (5000, 50)])
def test_group_size_splits_into_more_than_k_groups(f, k):
  g = select._group_size(f, k)
  assert 1 <= g and -(-f // g) > k


@pytest.mark.parametrize("loss, sizes", [("binary_cross_entropy", [5, 7, 3, 1]),
                                         ("cross_entropy", [4, 6, 3]), ("mse", [3, 5, 2])])
def test_batched_nominal_grads_equal_vmap_grad(loss, sizes):
  rng = np.random.default_rng(len(sizes))
  p = mlp.init(jax.random.PRNGKey(1), sizes, jnp.float64)
  x = jnp.asarray(rng.normal(size=(9, sizes[0])))
  if loss == "cross_entropy":
    y = jnp.asarray(rng.integers(0, sizes[-1], 9))
  elif loss == "mse":
    y = jnp.asarray(rng.normal(size=(9, sizes[-1])))
  else:
    y = jnp.asarray(rng.integers(0, 2, 9)).astype(jnp.float64)
  ref = train.nominal_grad_fn(mlp.apply, loss)(p, x, y)
  got = mlp.per_sample_grads(p, x, y, loss)
  for a, b in zip(jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(got)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("b, frag", [(60, 60), (60, 17), (60, 25)])
def test_streaming_sums_equal_dense_with_remainder_fragment(b, frag):
  rng = np.random.default_rng(b + frag)
  dl = rng.uniform(-1, 1, (b, 40, 3))
  du = dl + rng.uniform(0, 0.5, (b, 40, 3))
  lo, hi = descent.descent_bounds(jnp.asarray(dl), jnp.asarray(du), 4, 1.0, fragsize=frag)
  rl, rh = descent.descent_bounds_dense(jnp.asarray(dl), jnp.asarray(du), 4, 1.0)
  np.testing.assert_allclose(np.asarray(lo), np.asarray(rl), rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(np.asarray(hi), np.asarray(rh), rtol=1e-12, atol=1e-12)


def _fragment_setup(sizes=(3, 5, 3), b=23, seed=5):
  rng = np.random.default_rng(seed)
  params = mlp.init(jax.random.PRNGKey(seed), list(sizes), jnp.float64)
  box = jax.tree_util.tree_map(
      lambda p: Interval(p - 0.02 * rng.random(p.shape), p + 0.02 * rng.random(p.shape)), params)
  x = jnp.asarray(rng.normal(size=(b, sizes[0])))
  y = jnp.asarray(rng.integers(0, sizes[-1], b))
  return params, box, x, y


def _leaves(tree):
  return jax.tree_util.tree_leaves(tree, is_leaf=lambda a: isinstance(a, Interval))


@pytest.mark.parametrize("frag", [23, 5, 1])
@pytest.mark.parametrize("poison", [False, True])
def test_descent_directions_equal_the_sorted_batch(frag, poison):
  """`descent_directions` (fragments through `descent.scan_fragments`: one fragment, a scan
  with a remainder, single samples) against the dense sorted form of the whole batch: Thm 4.6
  (`descent.descent_bounds_dense`) or the poisoning bound (`poisoning.descent_bounds_dense`)."""
  params, box, x, y = _fragment_setup()
  gamma, k = 0.3, 3
  kw = dict(k_poison=k, epsilon=0.05) if poison else dict(k_private=k)
  cfg = agt.Config(n_epochs=1, learning_rate=0.1, batch_size=23, loss="cross_entropy",
                   clip_gamma=gamma, fragsize=frag, **kw)
  d_n, d_l, d_u = agt.descent_directions(mlp.apply, cfg, params, box, x, y, backend="mlp")
  g = descent.clip(train.nominal_grad_fn(mlp.apply, "cross_entropy")(params, x, y), gamma)
  wp = mlp.grad_bounds(box, x, y, "cross_entropy")
  iwp = mlp.grad_bounds(box, poisoning.input_box(x, 0.05), y, "cross_entropy")
  for i, (gn, w, p) in enumerate(zip(_leaves(g), _leaves(wp), _leaves(iwp))):
    if poison:
      lo, hi = poisoning.descent_bounds_dense(w.lower, w.upper, p.lower, p.upper, k, gamma)
    else:
      lo, hi = descent.descent_bounds_dense(w.lower, w.upper, k, gamma)
    np.testing.assert_allclose(_leaves(d_n)[i], jnp.mean(gn, 0), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(_leaves(d_l)[i], lo, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(_leaves(d_u)[i], hi, rtol=1e-12, atol=1e-15)
    assert np.all(np.asarray(lo) <= np.asarray(hi)) and np.any(np.asarray(lo) < np.asarray(hi))


@pytest.mark.parametrize("value", [0.0, -0.0, 1.5, -np.inf, np.inf, np.nan])
def test_written_stage_gives_the_stage_values(value):
  """`descent._written` (a stage computed as the branch of a conditional that is never
  false-branched) returns ``fn(*args)`` bit for bit, whatever the first input value the
  predicate reads (NaN and infinities included), under jit and without."""
  x = jnp.asarray([[value, 2.0], [3.0, -1.0]])
  fn = lambda a, b: (a * b + 1.0, jnp.sum(a, 0) - b[0])  # noqa: E731
  y = jnp.asarray([[0.5, -2.0], [1.0, 4.0]])
  assert not bool(descent._never(x))
  written = lambda x, y: descent._written(fn, descent._never(x), x, y)  # noqa: E731
  for got in (written(x, y), jax.jit(written)(x, y)):
    for g, r in zip(got, fn(x, y)):
      np.testing.assert_array_equal(np.asarray(g), np.asarray(r))


def test_poisoning_stages_equal_the_one_stage_bounds():
  """`poisoning.mlp_stages` (the poisoning step's two pipeline stages) gives the clipped nominal
  gradients, clean bounds and input-box bounds of the one-stage form, bit for bit."""
  params, box, x, y = _fragment_setup()
  cfg = agt.Config(n_epochs=1, learning_rate=0.1, batch_size=23, loss="cross_entropy",
                   clip_gamma=0.3, k_poison=2, epsilon=0.05, label_k_poison=1)
  gfn = lambda p, x, y: mlp.per_sample_grads(p, x, y, cfg.loss)  # noqa: E731
  first, second = poisoning.mlp_stages(cfg, gfn, params, box)
  got = second(first(x, y))
  pfn = poisoning.poisoned_grad_bounds_fn(mlp.apply, cfg, "mlp")
  ref = (descent.clip(gfn(params, x, y), 0.3),
         descent.clip(mlp.grad_bounds(box, x, y, cfg.loss), 0.3),
         descent.clip(pfn(box, x, y), 0.3))
  for g, r in zip(got, ref):
    for a, b in zip(_leaves(g), _leaves(r)):
      for u, v in ((a.lower, b.lower), (a.upper, b.upper)) if isinstance(a, Interval) else ((a, b),):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))

"""The streaming fold of AGT's descent bound (boundjax.agt.select, boundjax.agt.descent): the
native merge against lax.top_k, the native one-pass accumulate against the XLA reference,
and the memory-budget chunking against one fragment."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boundjax import agt
from boundjax.agt import descent, mlp, select

native = pytest.mark.skipif(not select.native_available(),
                            reason="no C++ compiler: the native merge is not built")


def _values(f, d, seed, dtype=np.float32):
  rng = np.random.default_rng(seed)
  return (np.round(rng.normal(size=(f, d)) * 4) / 4).astype(dtype)   # many ties


def _reference(values, running, largest):
  cand = np.concatenate([running, values.T], axis=-1)
  s = np.sort(cand, axis=-1)
  return s[:, ::-1][:, :running.shape[-1]] if largest else s[:, :running.shape[-1]]


@native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("f,d,k", [(1, 7, 3), (50, 1030, 10), (5, 513, 8), (3, 40, 1)])
@pytest.mark.parametrize("largest", [True, False])
def test_native_merge_keeps_the_k_extremes_of_lax_top_k(dtype, f, d, k, largest):
  with jax.enable_x64(dtype == np.float64):
    fill = -np.inf if largest else np.inf
    running = np.full((d, k), fill, dtype)
    for step, seed in enumerate(range(4)):      # from empty slots, then merged repeatedly
      v = _values(f, d, seed, dtype)
      got = np.asarray(jax.jit(lambda a, b: select.merge(a, b, largest))(v, running))
      want = _reference(v, running, largest)
      assert got.dtype == dtype
      np.testing.assert_array_equal(np.sort(got, -1), np.sort(want, -1), err_msg=str(step))
      running = got


@native
def test_native_merge_never_lets_a_worse_value_in():
  # a chunk entirely below the running k-th changes nothing; one better value replaces the
  # running minimum and nothing else
  running = np.tile(np.arange(10, 13, dtype=np.float32), (5, 1))
  low = np.full((4, 5), 9.5, np.float32)
  np.testing.assert_array_equal(np.sort(np.asarray(select.merge(low, running)), -1), running)
  one = low.copy()
  one[2, 3] = 11.5
  got = np.sort(np.asarray(select.merge(one, running)), -1)
  want = running.copy()
  want[3] = [11, 11.5, 12]
  np.testing.assert_array_equal(got, want)


@native
@pytest.mark.parametrize("track_abs", [True, False])
@pytest.mark.parametrize("shape,k", [((128, 32), 10), ((7,), 3), ((33, 5), 0)])
def test_native_accumulate_equals_the_xla_fold(monkeypatch, track_abs, shape, k):
  rng = np.random.default_rng(0)
  f = 57
  d_l = jnp.asarray(np.round(rng.normal(size=(f,) + shape) * 8) / 8, jnp.float32)
  d_u = d_l + jnp.asarray(np.abs(rng.normal(size=(f,) + shape)), jnp.float32)
  g_n = (d_l + d_u) / 2

  def fold():
    acc = descent.init_accumulator(d_l[0], k)
    for s in range(0, f, 20):
      acc = descent.accumulate(acc, g_n[s:s + 20], d_l[s:s + 20], d_u[s:s + 20], None,
                               track_abs)
    return acc
  got = fold()
  monkeypatch.setenv("BOUNDJAX_NATIVE", "0")
  assert not select.use_native(jnp.float32)
  want = fold()
  for name, a, b in zip(got._fields, got, want):
    if name in ("top_l", "bot_u"):
      np.testing.assert_array_equal(np.sort(a, -1), np.sort(b, -1), err_msg=name)
    else:   # the same sums, summed in another order
      np.testing.assert_allclose(a, b, rtol=2e-6, atol=2e-5, err_msg=name)
  if not track_abs:
    assert not np.any(np.asarray(got.sum_abs))


def test_chunk_size_takes_the_memory_budget():
  params = mlp.init(jax.random.PRNGKey(0), [384, 100, 1])     # 38,601 float32: 154,404 B
  assert descent.chunk_size(params, 1000, 10_000, budget=8 * 2 ** 20) == 54
  assert descent.chunk_size(params, 1000, 20, budget=8 * 2 ** 20) == 20      # fragsize caps
  assert descent.chunk_size(params, 30, 10_000, budget=8 * 2 ** 20) == 30    # the batch caps
  assert descent.chunk_size(params, 1000, 10_000, budget=1) == 1


@pytest.mark.parametrize("poison", [False, True])
def test_step_does_not_depend_on_the_chunk_budget(monkeypatch, poison):
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(96, 6)), jnp.float32)
  y = jnp.asarray(rng.integers(0, 2, size=96))
  params = mlp.init(jax.random.PRNGKey(2), [6, 16, 2])
  cfg = agt.Config(n_epochs=1, learning_rate=0.5, batch_size=96, loss="cross_entropy",
                   k_private=5, clip_gamma=0.1, fragsize=96, sound=True)
  if poison:
    cfg = dataclasses.replace(cfg, k_private=0, k_poison=4, epsilon=0.01)

  def run():
    step = agt.make_step(mlp.apply, cfg, "mlp")
    s = agt.init(params, cfg)
    for _ in range(3):
      s = step(s, x, y)
    return s
  whole = run()
  monkeypatch.setattr(descent, "CHUNK_BYTES", 7 * 4 * 146)     # 146 parameters: 7 samples per chunk
  assert descent.chunk_size(params, 96, 96) == 7
  chunked = run()
  for a, b in zip(jax.tree_util.tree_leaves(whole), jax.tree_util.tree_leaves(chunked)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

"""The streaming fold of AGT's descent bound (boundjax.agt.select, boundjax.agt.descent): the
native merge against lax.top_k, the native one-pass accumulate against the XLA reference,
and the memory-budget chunking against one fragment."""

import dataclasses
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boundjax import agt
from boundjax.agt import descent, mlp, select
from boundjax.core.interval import Interval

# Skipped only where no C++ compiler exists: where one does, a failed build fails these tests.
native = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None,
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


def _factors(f, n, m, seed, dtype=np.float32):
  """Factor boxes of Dense per-sample gradients with zeros, infinite delta bounds (0 * inf
  corners) and many ties."""
  rng = np.random.default_rng(seed)
  zc = np.round(rng.normal(size=(f, n)) * 4) / 4
  zl, zu = zc - np.abs(np.round(rng.normal(size=(f, n)))) / 4, zc
  zl[::7, ::3] = 0.0
  zu[::7, ::3] = 0.0
  dc = np.round(rng.normal(size=(f, m)) * 8) / 64
  dl, du = dc - np.abs(rng.normal(size=(f, m))) / 32, dc + np.abs(rng.normal(size=(f, m))) / 32
  dl[1, 0], du[2, 0], du[0, -1] = -np.inf, np.inf, np.inf     # (zl = zu = 0 at [0, 0])
  return [a.astype(dtype) for a in (zc, dc, zl, zu, dl, du)]


@native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("f,n,m,k,gamma", [(57, 33, 20, 10, 0.05), (40, 3, 1, 4, np.inf),
                                           (300, 64, 64, 5, 0.1), (25, 9, 130, 0, 0.02)])
@pytest.mark.parametrize("track_abs", [True, False])
def test_native_outer_fold_equals_forming_the_products(dtype, f, n, m, k, gamma, track_abs):
  # (300 x 64 x 64: over 2^20 entries, the rows are split between threads)
  with jax.enable_x64(dtype == np.float64):
    zc, dc, zl, zu, dl, du = _factors(f, n, m, 0, dtype)
    g = descent.Outer(jnp.asarray(zc), jnp.asarray(dc))
    box = descent.Outer(Interval(jnp.asarray(zl), jnp.asarray(zu), validate=False),
                        Interval(jnp.asarray(dl), jnp.asarray(du), validate=False))

    @jax.jit
    def fold(g, box):
      fused = formed = descent.init_accumulator(jnp.zeros((n, m), dtype), k)
      for s in range(0, f, 23):       # chunks, and a remainder
        gs = descent.Outer(g.z[s:s + 23], g.d[s:s + 23])
        bs = descent.Outer(box.z[s:s + 23], box.d[s:s + 23])
        fused = descent.accumulate_outer(fused, gs, bs, gamma, track_abs)
        g_n, prod = descent.outer_products(gs, bs, gamma)
        formed = descent.accumulate(formed, g_n, prod.lower, prod.upper, None, track_abs)
      return fused, formed
    got, want = fold(g, box)
  assert np.all(np.isfinite(np.asarray(got.sum_l))) or not np.isfinite(gamma)
  for name, a, b in zip(got._fields, got, want):
    assert a.dtype == dtype, name
    if name in ("top_l", "bot_u"):
      np.testing.assert_array_equal(np.sort(a, -1), np.sort(b, -1), err_msg=name)
    else:   # the same values summed in another order
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, err_msg=name)


def _sample_factor_boxes(rng, f, n, m):
  """Nominal factors ``zc`` (f, n), ``dc`` (f, m) and boxes around them (float64), with every
  fourth sample's first ``z`` entry exactly 0 (0 * anything)."""
  zc, dc = rng.normal(size=(f, n)), rng.normal(size=(f, m)) / 4
  zl, zu = zc - rng.uniform(0, 0.3, (f, n)), zc + rng.uniform(0, 0.3, (f, n))
  dl, du = dc - rng.uniform(0, 0.1, (f, m)), dc + rng.uniform(0, 0.1, (f, m))
  zl[::4, 0] = zu[::4, 0] = zc[::4, 0] = 0.0
  return zc, dc, zl, zu, dl, du


@native
@pytest.mark.parametrize("gamma", [0.3, np.inf])
def test_native_outer_fold_contains_sampled_concrete_products(gamma):
  """Soundness of the fused fold on its own: 12,000 concrete draws of every sample's factors
  (a third of them at random corners of the boxes), their clipped outer products: every draw's
  sum over the samples lies in [sum_l, sum_u], its i-th largest value per coordinate is at
  least the i-th largest kept lower bound, its i-th smallest at most the i-th smallest kept
  upper bound (the order statistics Thm 4.6 uses), and the nominal sum is the nominal one."""
  f, n, m, k = 30, 5, 18, 3
  rng = np.random.default_rng(7)
  zc, dc, zl, zu, dl, du = _sample_factor_boxes(rng, f, n, m)
  zl, zu, dl, du, zc, dc = (a.astype(np.float32) for a in (zl, zu, dl, du, zc, dc))
  zeros = np.zeros((n, m), np.float32)
  out = select.accumulate_outer(zc, dc, (zl, zu), (dl, du), gamma, (zeros,) * 4,
                                np.full((n, m, k), -np.inf, np.float32),
                                np.full((n, m, k), np.inf, np.float32))
  sum_n, sum_l, sum_u, _, top_l, bot_u = (np.asarray(a, np.float64) for a in out)
  top_l = -np.sort(-top_l, -1)                           # i-th largest kept lower bound
  bot_u = np.sort(bot_u, -1)                             # i-th smallest kept upper bound
  tol = 1e-5 * (1 + np.abs(sum_l) + np.abs(sum_u))        # float32 sums of f terms
  clip = lambda v: np.clip(v, -gamma, gamma)              # noqa: E731
  np.testing.assert_allclose(sum_n, clip(zc[:, :, None].astype(np.float64) * dc[:, None, :])
                             .sum(0), rtol=1e-5, atol=1e-5)
  for batch in range(24):
    u1, u2 = rng.uniform(size=(500, f, n)), rng.uniform(size=(500, f, m))
    if batch % 3 == 0:                                    # corners of the boxes
      u1, u2 = np.round(u1), np.round(u2)
    z = zl + u1 * (zu.astype(np.float64) - zl)
    d = dl + u2 * (du.astype(np.float64) - dl)
    v = clip(z[:, :, :, None] * d[:, :, None, :])         # (draws, f, n, m)
    total = v.sum(1)
    assert np.all(total >= sum_l - tol) and np.all(total <= sum_u + tol)
    largest = -np.sort(-v, 1)[:, :k]                      # (draws, k, n, m)
    smallest = np.sort(v, 1)[:, :k]
    assert np.all(largest >= np.moveaxis(top_l, -1, 0)[None] - 1e-7)
    assert np.all(smallest <= np.moveaxis(bot_u, -1, 0)[None] + 1e-7)


@native
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("gamma", [0.3, np.inf])
def test_poisoning_fold_contains_every_sampled_poisoned_mean(monkeypatch, fused, gamma):
  """Soundness of the poisoning fold (`poisoning.accumulate_outer`, native in one pass or with
  the products formed) on its own: 12,000 concrete draws of every sample's clean factors (in
  the clean boxes) and poisoned factors (in the poisoned boxes, which overlap the clean ones
  but need not contain them), a third at box corners; for each draw and coordinate the
  *worst* choice of at most k poisoned samples (the k largest positive, or smallest negative,
  clipped poisoned-minus-clean differences) gives a batch mean inside ``[dθ_L, dθ_U]`` of
  `poisoning.finalize`; the worst corners per coordinate attain the bound (it is exact for one
  coordinate); and the nominal mean is the clipped nominal products' mean."""
  from boundjax.agt import poisoning
  monkeypatch.setattr(descent, "fused_outer", lambda dt, _f=descent.fused_outer: fused and _f(dt))
  f, n, m, k = 30, 5, 18, 3
  rng = np.random.default_rng(11)
  zc, dc, zl, zu, dl, du = _sample_factor_boxes(rng, f, n, m)
  pzc = zc + rng.normal(size=(f, n)) * 0.5                # a poisoned sample's own factors
  pdc = dc + rng.normal(size=(f, m)) * 0.1
  pzl, pzu = pzc - rng.uniform(0, 0.4, (f, n)), pzc + rng.uniform(0, 0.4, (f, n))
  pdl, pdu = pdc - rng.uniform(0, 0.1, (f, m)), pdc + rng.uniform(0, 0.1, (f, m))
  cast = lambda *a: [x.astype(np.float32) for x in a]    # noqa: E731
  zl, zu, dl, du, zc, dc, pzl, pzu, pdl, pdu = cast(zl, zu, dl, du, zc, dc, pzl, pzu, pdl, pdu)
  acc = poisoning.init_accumulator(jnp.zeros((n, m), jnp.float32), k)
  acc = poisoning.accumulate_outer(
      acc, descent.Outer(zc, dc),
      descent.Outer(Interval(zl, zu), Interval(dl, du)),
      descent.Outer(Interval(pzl, pzu), Interval(pdl, pdu)), gamma)
  nom, lo, hi = (np.asarray(a, np.float64) for a in poisoning.finalize(acc, f, fp_margin=True))
  clip = lambda v: np.clip(v, -gamma, gamma)              # noqa: E731
  np.testing.assert_allclose(nom, clip(zc[:, :, None].astype(np.float64) * dc[:, None, :])
                             .mean(0), rtol=1e-5, atol=1e-6)
  tol = 1e-6 * (1 + np.abs(lo) + np.abs(hi))
  draw = lambda a, b, u: a + u * (b.astype(np.float64) - a)  # noqa: E731
  for batch in range(24):
    us = [rng.uniform(size=(500, f, x)) for x in (n, m, n, m)]
    if batch % 3 == 0:                                    # corners of the boxes
      us = [np.round(u) for u in us]
    v = clip(draw(zl, zu, us[0])[..., None] * draw(dl, du, us[1])[:, :, None, :])
    pv = clip(draw(pzl, pzu, us[2])[..., None] * draw(pdl, pdu, us[3])[:, :, None, :])
    base = v.sum(1)                                       # (draws, n, m): no sample poisoned
    up = np.sort(np.maximum(pv - v, 0), 1)[:, -k:].sum(1)    # the worst k poisoned samples
    down = np.sort(np.minimum(pv - v, 0), 1)[:, :k].sum(1)
    assert np.all((base + up) / f <= hi + tol), float(np.max((base + up) / f - hi))
    assert np.all((base + down) / f >= lo - tol), float(np.max(lo - (base + down) / f))
  # per coordinate, the worst concrete draw: every sample's factors at the corner that makes its
  # clipped product largest (smallest), the k worst samples poisoned at their poisoned corners;
  # the fold's bound is attained there, so it must hold and be tight (a shrunken bound fails)
  corners = lambda al, au, bl, bu: clip(np.stack([  # noqa: E731  (f, n, m, 4)
      a.astype(np.float64)[:, :, None] * b.astype(np.float64)[:, None, :]
      for a in (al, au) for b in (bl, bu)], -1))
  c, pc = corners(zl, zu, dl, du), corners(pzl, pzu, pdl, pdu)
  worst_hi = (c.max(-1).sum(0) + np.sort(np.maximum(pc.max(-1) - c.max(-1), 0), 0)[-k:].sum(0)) / f
  worst_lo = (c.min(-1).sum(0) + np.sort(np.minimum(pc.min(-1) - c.min(-1), 0), 0)[:k].sum(0)) / f
  np.testing.assert_array_less(worst_hi, hi + tol)
  np.testing.assert_array_less(lo - tol, worst_lo)
  np.testing.assert_allclose(hi, worst_hi, rtol=1e-4, atol=5e-5)  # fp margin, float32 sums
  np.testing.assert_allclose(lo, worst_lo, rtol=1e-4, atol=5e-5)


@native
def test_native_outer_fold_gives_the_whole_clipped_line_for_a_non_finite_factor():
  zc, dc, zl, zu, dl, du = _factors(6, 4, 16, 1)
  zl[2, 1], zu[3, 2] = -np.inf, np.nan
  zeros = np.zeros((4, 16), np.float32)
  out = select.accumulate_outer(zc, dc, (zl, zu), (dl, du), 0.25, (zeros,) * 4,
                                np.full((4, 16, 2), -np.inf, np.float32),
                                np.full((4, 16, 2), np.inf, np.float32))
  sum_l, sum_u = np.asarray(out[1]), np.asarray(out[2])
  prod = jax.jit(lambda g, b: descent.outer_products(g, b, 0.25)[1])(   # (jit: no input check)
      descent.Outer(zc, dc), descent.Outer(Interval(zl, zu, validate=False),
                                           Interval(dl, du, validate=False)))
  finite = np.ones((6, 4), bool)
  finite[2, 1] = finite[3, 2] = False
  want_l = np.where(finite[:, :, None], np.nan_to_num(np.asarray(prod.lower), nan=-0.25), -0.25)
  want_u = np.where(finite[:, :, None], np.nan_to_num(np.asarray(prod.upper), nan=0.25), 0.25)
  np.testing.assert_allclose(sum_l, want_l.sum(0), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(sum_u, want_u.sum(0), rtol=1e-6, atol=1e-6)


@native
@pytest.mark.parametrize("sizes", [[20, 32, 16, 3], [12, 40, 1]])
def test_agt_step_with_the_fused_fold_equals_forming_the_products(monkeypatch, sizes):
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.normal(size=(150, sizes[0])), jnp.float32)
  loss = "cross_entropy" if sizes[-1] > 1 else "binary_cross_entropy"
  y = jnp.asarray(rng.integers(0, max(2, sizes[-1]), size=150))
  y = y.astype(jnp.float32) if sizes[-1] == 1 else y
  params = mlp.init(jax.random.PRNGKey(4), sizes)
  cfg = agt.Config(n_epochs=1, learning_rate=0.5, batch_size=150, loss=loss, k_private=6,
                   clip_gamma=0.05, fragsize=64, sound=True)

  def run():
    step = jax.jit(agt.make_step(mlp.apply, cfg, "mlp"))
    s = agt.init(params, cfg)
    for _ in range(3):
      s = step(s, x, y)
    return s
  fused = run()
  monkeypatch.setenv("BOUNDJAX_NATIVE", "0")
  assert not descent.fused_outer(jnp.float32)
  formed = run()
  for a, b in zip(jax.tree_util.tree_leaves(fused), jax.tree_util.tree_leaves(formed)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@native
@pytest.mark.parametrize("f,n,m,k,gamma", [(57, 33, 20, 10, 0.05), (300, 64, 64, 5, 0.1),
                                           (25, 9, 130, 0, np.inf)])
def test_native_poisoning_fold_equals_forming_the_products(f, n, m, k, gamma):
  from boundjax.agt import poisoning
  zc, dc, zl, zu, dl, du = _factors(f, n, m, 0)
  _, _, pzl, pzu, pdl, pdu = _factors(f, n, m, 1)
  pzl, pzu = np.minimum(pzl, zl), np.maximum(pzu, zu)        # poisoned boxes hold the clean ones
  pdl, pdu = np.minimum(pdl, dl), np.maximum(pdu, du)
  iv = lambda lo, hi: Interval(jnp.asarray(lo), jnp.asarray(hi), validate=False)  # noqa: E731
  g = descent.Outer(jnp.asarray(zc), jnp.asarray(dc))
  wp, iwp = descent.Outer(iv(zl, zu), iv(dl, du)), descent.Outer(iv(pzl, pzu), iv(pdl, pdu))

  @jax.jit
  def fold(g, wp, iwp):
    fused = formed = poisoning.init_accumulator(jnp.zeros((n, m)), k)
    for s in range(0, f, 23):
      cut = lambda o: descent.Outer(o.z[s:s + 23], o.d[s:s + 23])  # noqa: E731
      fused = poisoning.accumulate_outer(fused, cut(g), cut(wp), cut(iwp), gamma)
      g_n, clean = descent.outer_products(cut(g), cut(wp), gamma)
      pois = descent.outer_products(cut(g), cut(iwp), gamma)[1]
      formed = poisoning.accumulate(formed, g_n, clean.lower, clean.upper, pois.lower,
                                    pois.upper)
    return fused, formed
  got, want = fold(g, wp, iwp)
  for name in ("top_du", "bot_dl"):
    np.testing.assert_array_equal(np.sort(getattr(got, name), -1),
                                  np.sort(getattr(want, name), -1), err_msg=name)
  for a, b in zip((got.sums.sum_n, got.sums.sum_l, got.sums.sum_u, got.sum_abs),
                  (want.sums.sum_n, want.sums.sum_l, want.sums.sum_u, want.sum_abs)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  assert np.any(np.asarray(got.top_du) > 0) or k == 0


def test_a_new_build_removes_only_stale_builds(tmp_path):
  import time
  keep = tmp_path / "topk_merge_new.so"
  old, recent, other = (tmp_path / n for n in ("topk_merge_old.so", "topk_merge_recent.so",
                                                 "notes.so"))
  for f in (keep, old, recent, other):
    f.write_bytes(b"x")
  day_ago = time.time() - select.STALE_BUILD_SECONDS - 60
  os.utime(old, (day_ago, day_ago))
  os.utime(other, (day_ago, day_ago))
  select._remove_stale_builds(keep)
  assert keep.exists() and recent.exists() and other.exists() and not old.exists()

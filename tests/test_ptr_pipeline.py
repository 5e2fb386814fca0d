"""boundjax.ptr.pipeline: the β-VAE embedder, ARL, the LDP baselines and the reconstruction attack.

Ground truth is independent of the code under test: held-out reconstruction error against the
mean image, a Monte-Carlo KL, Laplace log-densities from scipy on sampled pairs and outputs,
hand-computed SSIM/PSNR/MSE/ℓ1 values, a brute-force contrastive loss, and a bit-for-bit
comparison showing the code's contrastive regulariser does nothing. (The PTR release itself —
⊥ or a value, never the measured constant — is tested in tests/test_ptr.py.)
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from boundjax import data
from boundjax.ptr.pipeline import (ARLConfig, OutputRange, VAEConfig, adversarial_release,
                                   contrastive_loss, embedding_scale, ldp_embedding_release,
                                   ldp_image, metrics, noisy_images, ptr_accuracy,
                                   ptr_accuracy_grid, release_from_statistics, train_arl,
                                   train_vae)
from boundjax.ptr import release as ptr
from boundjax.ptr.pipeline.vae import kl_standard_normal


@pytest.fixture(scope="module")
def mnist():
  ds = data.load("mnist5k", flatten=True)
  return (np.asarray(ds.x_train[:1500]), np.asarray(ds.y_train[:1500]),
          np.asarray(ds.x_test[:500]), np.asarray(ds.y_test[:500]))


@pytest.fixture(scope="module")
def vae(mnist):
  return train_vae(mnist[0], VAEConfig(hidden=256, epochs=10, batch_size=64, lr=2e-3, seed=0))


# ------------------------------------------------------------------------------------------------
# β-VAE
# ------------------------------------------------------------------------------------------------

def test_vae_loss_decreases_and_beats_the_mean_image(vae, mnist):
  x_tr, _, x_te, _ = mnist
  assert vae.losses.shape == (10,)
  assert vae.losses[-1] < 0.8 * vae.losses[0]
  assert np.all(np.diff(vae.losses[:4]) < 0)
  rec = np.asarray(vae.reconstruct(x_te))
  mse_vae = np.mean((rec - x_te) ** 2)
  mse_mean = np.mean((x_tr.mean(0) - x_te) ** 2)      # the best constant predictor (train mean)
  assert mse_vae < 0.75 * mse_mean, (mse_vae, mse_mean)
  assert vae.embed(x_te).shape == (500, 8)


def test_kl_matches_monte_carlo():
  rng = np.random.default_rng(0)
  mu, sigma = rng.normal(size=3), rng.uniform(0.3, 2.0, size=3)
  z = mu + sigma * rng.normal(size=(200_000, 3))
  mc = np.mean(np.sum(stats.norm.logpdf(z, mu, sigma) - stats.norm.logpdf(z), axis=1))
  got = float(kl_standard_normal(jnp.asarray(mu), jnp.asarray(sigma)))
  assert got == pytest.approx(mc, abs=0.02)


def test_vae_rejects_bad_images():
  with pytest.raises(ValueError, match="flattened"):
    train_vae(np.zeros((4, 28, 28)))
  with pytest.raises(ValueError, match=r"\[0, 1\]"):
    train_vae(np.full((4, 16), 2.0))
  with pytest.raises(ValueError, match="beta"):
    VAEConfig(beta=-1.0)


# ------------------------------------------------------------------------------------------------
# ARL
# ------------------------------------------------------------------------------------------------

def test_contrastive_loss_brute_force():
  rng = np.random.default_rng(1)
  v, y, margin = rng.normal(size=(7, 3)) * 3, rng.integers(0, 3, 7), 4.0
  want = np.mean([[(d if yi == yj else max(0.0, margin - d))
                   for yj, d in zip(y, np.linalg.norm(v - vi, axis=1))]
                  for vi, yi in zip(v, y)])
  assert float(contrastive_loss(jnp.asarray(v), jnp.asarray(y), margin)) == pytest.approx(
      want, rel=1e-5)
  g = jax.grad(lambda a: contrastive_loss(a, jnp.asarray(y), margin))(jnp.asarray(v))
  assert np.all(np.isfinite(np.asarray(g)))                 # d_ii = 0 gives no NaN


def _small(**kw):
  return ARLConfig(epochs=kw.pop("epochs", 2), lr_obf=1e-3, lr_pred=1e-3, seed=0, **kw)


def test_code_noop_contrastive_changes_nothing(vae, mnist):
  """The authors' regulariser on the (no-grad) VAE embedding leaves f exactly as without it."""
  x_tr, y_tr = mnist[0][:256], mnist[1][:256]
  mu, sigma = vae.encode(x_tr)
  none = train_arl(mu, sigma, x_tr, y_tr, _small(contrastive_lambda=0.0))
  noop = train_arl(mu, sigma, x_tr, y_tr, _small(contrastive_lambda=100.0,
                                                 contrastive="code_noop"))
  spec = train_arl(mu, sigma, x_tr, y_tr, _small(contrastive_lambda=100.0))
  same = jax.tree_util.tree_map(lambda a, b: bool(jnp.all(a == b)), none.obf_params,
                                noop.obf_params)
  assert all(jax.tree_util.tree_leaves(same))
  diff = jax.tree_util.tree_map(lambda a, b: float(jnp.max(jnp.abs(a - b))), none.obf_params,
                                spec.obf_params)
  assert max(jax.tree_util.tree_leaves(diff)) > 1e-3


def test_arl_end_to_end_above_chance(vae, mnist):
  x_tr, y_tr, x_te, y_te = mnist
  mu, sigma = vae.encode(x_tr)
  model = train_arl(mu, sigma, x_tr, y_tr, _small(epochs=30))
  assert model.losses.shape == (30, 3) and np.all(np.isfinite(model.losses))
  z_te = vae.embed(x_te)
  acc = model.accuracy(z_te, y_te)
  assert acc > 0.3, acc                                     # chance is 0.1 (10 classes)
  assert model.obfuscate(z_te).shape == (500, 8)
  res = ptr_accuracy(jax.random.PRNGKey(0), model, z_te[:100], y_te[:100], proposal=1e3,
                     epsilon=2.0, delta=0.1, radius=0.5)
  assert 0.0 <= res.answer_rate <= 1.0
  assert res.accuracy_bottom_wrong == pytest.approx(res.answer_rate * res.accuracy_answered)
  # the one-search grid draws exactly what ptr_release_batch draws for each ε
  z_q, key, dp = z_te[:64], jax.random.PRNGKey(3), 1e3
  _, _, stats = ptr.ptr_release_batch(key, model.apply, model.obf_params, z_q, proposal=dp,
                                      epsilon=math.inf, delta=0.1, radius=0.5)
  for e in (1.0, 4.0):
    want_out, want_ans, want_stat = ptr.ptr_release_batch(
        key, model.apply, model.obf_params, z_q, proposal=dp, epsilon=e, delta=0.1, radius=0.5)
    got_out, got_ans = release_from_statistics(key, stats, model.obfuscate(z_q), proposal=dp,
                                               epsilon=e, delta=0.1, radius=0.5)
    assert np.array_equal(np.asarray(want_stat), np.asarray(stats))
    assert np.array_equal(np.asarray(want_ans), np.asarray(got_ans))
    assert np.allclose(np.asarray(want_out), np.asarray(got_out), rtol=1e-6, atol=1e-5)  # f32
  grid = ptr_accuracy_grid(key, model, z_q, y_te[:64], proposal=dp, epsilons=[1.0, math.inf],
                           delta=0.1, radius=0.5)
  assert grid[1].answer_rate == 1.0
  assert grid[1].accuracy_answered == pytest.approx(model.accuracy(z_q, y_te[:64]))


def test_arl_config_validation():
  with pytest.raises(ValueError, match="alpha"):
    ARLConfig(alpha=1.5)
  with pytest.raises(ValueError, match="contrastive"):
    ARLConfig(contrastive="nope")
  with pytest.raises(ValueError, match="epochs"):
    ARLConfig(epochs=0)
  with pytest.raises(TypeError, match="integer labels"):
    train_arl(np.zeros((4, 8)), np.ones((4, 8)), np.zeros((4, 16)), np.zeros(4))
  with pytest.raises(ValueError, match="same"):
    train_arl(np.zeros((4, 8)), np.ones((4, 8)), np.zeros((3, 16)), np.zeros(4, int))


# ------------------------------------------------------------------------------------------------
# Baselines
# ------------------------------------------------------------------------------------------------

def _max_log_ratio(a, b, scale):
  """sup_y log p(y|a)/p(y|b) for per-coordinate Laplace(scale): ||a - b||_1 / scale."""
  return np.sum(np.abs(a - b), axis=-1) / scale


def test_ldp_embedding_sensitivity_against_the_definition():
  """ε-DP of clip(v) + Lap(Δ/ε): on 10^4 sampled pairs (and the box corners) the log-density
  ratio, from scipy's Laplace log-pdf at sampled outputs, never exceeds ε; the opposite corners
  attain it (tight); the code's Δ = max hi - min lo exceeds ε there (not ε-DP)."""
  rng = np.random.default_rng(2)
  train_out = rng.normal(size=(500, 8)) * rng.uniform(0.5, 3.0, 8) + rng.normal(size=8)
  rgt = OutputRange.of(train_out)
  eps = 1.5
  b = embedding_scale(rgt, eps, "l1")
  assert b == pytest.approx(np.sum(train_out.max(0) - train_out.min(0)) / eps)
  a = rng.normal(size=(10_000, 8)) * 4                      # also far outside the range
  c = rng.normal(size=(10_000, 8)) * 4
  ca, cc = np.asarray(rgt.clip(a), np.float64), np.asarray(rgt.clip(c), np.float64)
  y = ca + rng.laplace(size=ca.shape) * b                   # outputs where the ratio is read
  ratio = np.sum(stats.laplace.logpdf(y, ca, b) - stats.laplace.logpdf(y, cc, b), axis=1)
  assert ratio.max() <= eps * (1 + 1e-6)
  assert _max_log_ratio(ca, cc, b).max() <= eps * (1 + 1e-6)
  lo, hi = rgt.lo, rgt.hi
  assert _max_log_ratio(lo, hi, b) == pytest.approx(eps, rel=1e-9)
  y_far = hi + 1.0                                          # beyond both: the ratio is attained
  attained = np.sum(stats.laplace.logpdf(y_far, hi, b) - stats.laplace.logpdf(y_far, lo, b))
  assert attained == pytest.approx(eps, rel=1e-9)
  b_code = embedding_scale(rgt, eps, "code")
  assert b_code < b
  assert _max_log_ratio(lo, hi, b_code) > 1.5 * eps         # the code's Δ is not ε-DP
  rel = np.asarray(ldp_embedding_release(jax.random.PRNGKey(0), jnp.asarray(a[:2000]), rgt, eps))
  noise = rel - np.asarray(rgt.clip(a[:2000]))
  assert np.mean(np.abs(noise)) == pytest.approx(b, rel=0.03)
  with pytest.raises(ValueError, match="sensitivity"):
    rgt.sensitivity("l2")


def test_laplace_scales_of_image_and_adversarial_releases():
  x = jnp.full((200, 784), 0.5)
  noise = np.asarray(noisy_images(jax.random.PRNGKey(1), x, 5.0)) - 0.5
  assert np.mean(np.abs(noise)) == pytest.approx(784 / 5.0, rel=0.01)
  assert np.array_equal(np.asarray(noisy_images(jax.random.PRNGKey(1), x, math.inf)), x)
  v = jnp.zeros((20_000, 8))
  rel = np.asarray(adversarial_release(jax.random.PRNGKey(2), v, proposal=3.0, epsilon=2.0,
                                       radius=0.5, calib="code"))
  assert np.mean(np.abs(rel)) == pytest.approx(3.0 * 0.5 / 2.0, rel=0.02)   # Δp R/ε
  rel = np.asarray(adversarial_release(jax.random.PRNGKey(2), v, proposal=3.0, epsilon=2.0,
                                       radius=0.5))
  assert np.mean(np.abs(rel)) == pytest.approx(2 * 3.0 * 0.5 / 2.0, rel=0.02)   # default 2Δp R/ε
  with pytest.raises(ValueError, match="epsilon"):
    noisy_images(jax.random.PRNGKey(1), x, 0.0)


def test_ldp_image_learns_without_noise_and_is_at_chance_with_it(mnist):
  x_tr, y_tr, x_te, y_te = (a[:800] for a in mnist)
  clean = ldp_image(jax.random.PRNGKey(0), x_tr, y_tr, x_te, y_te, math.inf, epochs=3,
                    batch_size=64, lr=3e-3)
  noisy = ldp_image(jax.random.PRNGKey(0), x_tr, y_tr, x_te, y_te, 1.0, epochs=1)
  assert clean.accuracy > 0.6, clean
  assert noisy.accuracy < 0.25, noisy                       # scale 784 per pixel
  assert noisy.scale == pytest.approx(784.0)


# ------------------------------------------------------------------------------------------------
# Attack metrics
# ------------------------------------------------------------------------------------------------

def test_metrics_equal_hand_computed_values():
  rng = np.random.default_rng(3)
  x = rng.uniform(size=(4, 256)).astype(np.float32)
  same = metrics(x, x)
  assert same["ssim"] == pytest.approx(1.0, abs=1e-6)
  assert same["l1"] == 0.0 and same["mse"] == 0.0
  # constant images a, b: SSIM = (2ab + C1)/(a^2 + b^2 + C1) (the contrast term is C2/C2 = 1)
  a, b = 0.3, 0.6
  c1 = (0.01 * 1.0) ** 2
  got = metrics(np.full((2, 256), a), np.full((2, 256), b))
  assert got["ssim"] == pytest.approx((2 * a * b + c1) / (a * a + b * b + c1), rel=1e-4)  # f32
  assert got["l1"] == pytest.approx(0.3, rel=1e-5)
  assert got["mse"] == pytest.approx(0.09, rel=1e-5)
  assert got["psnr"] == pytest.approx(10 * math.log10(1 / 0.09), rel=1e-5)
  assert got["psnr255"] == pytest.approx(20 * math.log10(255 / 0.3), rel=1e-5)
  y = x + rng.normal(scale=0.1, size=x.shape).astype(np.float32)
  m = metrics(x, y, batch_size=2)                           # two batches, PSNR averaged per batch
  err = (x - y).astype(np.float64)
  assert m["l1"] == pytest.approx(np.mean(np.abs(err)), rel=1e-5)
  assert m["mse"] == pytest.approx(np.mean(err ** 2), rel=1e-5)
  per_batch = [np.mean(err[i:i + 2] ** 2) for i in (0, 2)]
  assert m["psnr"] == pytest.approx(np.mean([-10 * math.log10(v) for v in per_batch]), rel=1e-5)
  assert m["psnr255"] == pytest.approx(np.mean([20 * math.log10(255 / math.sqrt(v))
                                                for v in per_batch]), rel=1e-5)
  assert 0.0 < m["ssim"] < 1.0
  with pytest.raises(ValueError, match="shape"):
    metrics(x, x[:2])
  with pytest.raises(ValueError, match="square"):
    metrics(np.zeros((2, 10)), np.zeros((2, 10)))


@pytest.mark.slow
def test_demo_section_numbers():
  """`boundjax demo --only ptr` (about 30 s of CPU): the embedder beats the mean image, the
  pipeline learns, ε = ∞ answers everything, and the l1 sensitivity is at least the code's."""
  from boundjax.demos import ptr as demo
  n = demo.run().numbers
  assert n["vae_mse"] < 0.5 * n["mean_image_mse"]
  assert n["noiseless_accuracy"] > 0.5
  inf = [r for r in n["rows"] if r["epsilon"] == "inf"][0]
  assert inf["answer_rate"] == 1.0
  assert inf["accuracy_answered"] == pytest.approx(n["noiseless_accuracy"], abs=1e-9)
  assert all(0.0 <= r["answer_rate"] <= 1.0 for r in n["rows"])
  assert n["sensitivity_l1"] >= n["sensitivity_code"]

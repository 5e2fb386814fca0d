"""The reconstruction attack of PTR's Tables 2–5 (PTR, App. D; the authors'
``reconstruction_attack.py``): a decoder trained from released representations back to images.

The attacker sees ``v = f(μ) + Lap(b)^m`` for public training images (``μ = E(x)``, the encoder
mean; fresh noise at every step, ``b = Δp R/ε``) and learns ``D : v -> x`` with an ℓ1 loss (Adam,
20 epochs in the code). It is evaluated on one release of every held-out image. The code's
decoder is a ResNet-block generator; ours is an MLP decoder ``m -> 256 -> 784`` (sigmoid), a CPU
substitution. The code's checkpointing never saves (``min_loss = -inf`` and ``if ssim <
min_loss``) and it prints metrics every epoch, so which epoch its tables report is unknown; we
report the attacker's best epoch by held-out SSIM (the strongest attack).

Metrics on images in ``[0, 1]`` (`metrics`):

* SSIM (Wang et al. 2004; ``dm_pix.ssim``, Gaussian window 11, σ 1.5, ``max_val = 1``), mean
  over images;
* ℓ1 = mean ``|x - x̂|``; MSE = mean ``(x - x̂)²`` (the paper's "ℓ2" column is this MSE);
* PSNR = ``10 log10(1/MSE)`` (``dm_pix.psnr``, peak 1), mean over batches;
* ``psnr255`` = ``20 log10(255/sqrt(MSE))`` on the ``[0, 1]`` images, the code's convention (peak
  255 on ``[0, 1]`` data, hence ≈ 60 dB), per batch of ``batch_size`` images and averaged over
  batches as the code does, so it is comparable with the paper's Table 5.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import dm_pix
import jax
import jax.numpy as jnp
import numpy as np
import optax

from boundjax.ptr.pipeline.arl import Decoder
from boundjax.ptr.pipeline.fit import check_positive_int, check_rows, fit

Array = jax.Array
PEAK_255_DB = 20.0 * math.log10(255.0)


def _images(x: Any, side: int | None) -> Array:
  """``(n, H, W, 1)`` images from flattened square ``(n, d)`` (or already NHWC) arrays."""
  x = jnp.asarray(x, jnp.float32)
  if x.ndim == 4:
    return x
  if x.ndim != 2:
    raise ValueError(f"metrics: images must be (n, d) or (n, H, W, C), got shape {x.shape}.")
  side = side or int(round(math.sqrt(x.shape[1])))
  if side * side != x.shape[1]:
    raise ValueError(f"metrics: {x.shape[1]} pixels is not a square image; pass side=.")
  return x.reshape((x.shape[0], side, side, 1))


def metrics(x: Any, x_hat: Any, *, batch_size: int = 128, side: int | None = None) -> dict:
  """``{"ssim", "l1", "mse", "psnr", "psnr255"}`` of reconstructions ``x_hat`` of ``x``.

  Raises:
    ValueError: shapes differ or are not images.
  """
  a, b = _images(x, side), _images(x_hat, side)
  if a.shape != b.shape:
    raise ValueError(f"metrics: x {a.shape} and x_hat {b.shape} differ in shape.")
  batch_size = check_positive_int("batch_size", batch_size)
  ssim = float(jnp.mean(dm_pix.ssim(a, b, max_val=1.0)))
  err = a - b
  mse_b = [float(jnp.mean(err[i:i + batch_size] ** 2)) for i in range(0, a.shape[0], batch_size)]
  psnr_b = [float(dm_pix.psnr(a[i:i + batch_size].reshape(1, -1, 1),
                              b[i:i + batch_size].reshape(1, -1, 1)))
            for i in range(0, a.shape[0], batch_size)]
  return {"ssim": ssim, "l1": float(jnp.mean(jnp.abs(err))), "mse": float(jnp.mean(err ** 2)),
          "psnr": float(np.mean(psnr_b)),
          "psnr255": float(np.mean([PEAK_255_DB - 10.0 * math.log10(m) if m > 0 else math.inf
                                    for m in mse_b]))}


@dataclasses.dataclass(frozen=True)
class AttackResult:
  """One attacker: noise scale, best epoch (by held-out SSIM), its metrics, and the
  reconstructions of the first ``keep`` held-out images at that epoch."""

  scale: float
  best_epoch: int
  metrics: dict
  examples: np.ndarray


def attack_grid(key: Array, v_train: Any, x_train: Any, v_test: Any, x_test: Any,
                scales: Sequence[float], *, epochs: int = 20, batch_size: int = 128,
                lr: float = 1e-3, hidden: Sequence[int] = (256,), keep: int = 8,
                progress: bool = False) -> list[AttackResult]:
  """One attacker per Laplace scale in ``scales``, all trained in one ``vmap``.

  Args:
    key: PRNG key (training noise, test releases, initialisation).
    v_train, x_train: noiseless released vectors ``f(μ)`` ``(n, m)`` and flattened images of
      the attacker's training data; the noise ``Lap(scale)`` is drawn fresh at every step.
    v_test, x_test: the held-out queries; each is released once per scale.
    scales: Laplace scales ``b >= 0`` (``Δp R/ε``; 0 = no noise).
  """
  check_rows("attack_grid (train)", v_train, x_train)
  check_rows("attack_grid (test)", v_test, x_test)
  scales_arr = np.asarray(scales, np.float32)
  if scales_arr.ndim != 1 or scales_arr.size == 0 or not np.all(np.isfinite(scales_arr)) \
      or np.any(scales_arr < 0):
    raise ValueError(f"attack_grid: scales must be a non-empty list of finite values >= 0, got "
                     f"{scales!r}.")
  x_train, x_test = np.asarray(x_train, np.float32), np.asarray(x_test, np.float32)
  v_train, v_test = np.asarray(v_train, np.float32), np.asarray(v_test, np.float32)
  dec = Decoder(x_train.shape[1], tuple(hidden))
  k_init, k_fit, k_test = jax.random.split(key, 3)
  n_cfg = scales_arr.size
  params = jax.vmap(lambda k: dec.init(k, jnp.zeros((1, v_train.shape[1]))))(
      jax.random.split(k_init, n_cfg))
  tx = optax.adam(lr)
  sc = jnp.asarray(scales_arr)

  def loss(p, vb, xb, b, k):
    v = vb + b * jax.random.laplace(k, vb.shape, vb.dtype)
    return jnp.mean(jnp.abs(dec.apply(p, v) - xb))

  def one(p, o, vb, xb, b, k):
    val, g = jax.value_and_grad(loss)(p, vb, xb, b, k)
    upd, o = tx.update(g, o, p)
    return optax.apply_updates(p, upd), o, val

  def step(state, batch, k):
    p, o = state
    ks = jax.random.split(k, n_cfg)
    p, o, val = jax.vmap(one, in_axes=(0, 0, None, None, 0, 0))(p, o, batch[0], batch[1], sc, ks)
    return (p, o), val

  v_rel = jnp.asarray(v_test)[None] + sc[:, None, None] * jax.random.laplace(
      k_test, (n_cfg,) + v_test.shape, jnp.float32)
  recon = jax.jit(jax.vmap(dec.apply))
  best = [(-np.inf, -1, None, None)] * n_cfg

  def on_epoch(e, state):
    xh = np.asarray(recon(state[0], v_rel))
    for c in range(n_cfg):
      m = metrics(x_test, xh[c], batch_size=batch_size)
      if m["ssim"] > best[c][0]:
        best[c] = (m["ssim"], e, m, xh[c][:keep])

  opt_state = jax.vmap(tx.init)(params)
  fit(step, (params, opt_state), (v_train, x_train), epochs=epochs, batch_size=batch_size,
      key=k_fit, desc="attack" if progress else None, on_epoch=on_epoch)
  return [AttackResult(float(s), int(e), m, ex) for s, (_, e, m, ex) in zip(scales_arr, best)]

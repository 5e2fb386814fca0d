"""The public β-VAE embedder ``E`` of the PTR pipeline (PTR, App. D, "embedder training").

The client maps an image to a low-dimensional "semantic" embedding ``z = E(x)`` (``q = 8`` for
MNIST and Fashion-MNIST) and PTR's neighbourhoods live in that space (PTR, App. A, §1). The
supplement (App. D) trains a β-VAE with ``β = 5``, "three fully connected layers with non-linear
activations and dropout", Adam at a constant learning rate 1e-3. Architecture as the authors'
``MnistVAE``: encoder ``784 -> 512 (ELU) -> 512 (tanh) -> 2q`` giving ``(μ, σ = 1e-6 +
softplus(·))``, decoder ``q -> 512 (tanh) -> 512 (ELU) -> 784`` (sigmoid). Dropout is left out
(deterministic training; the embedding is the mean ``μ``).

Loss (β-VAE ELBO, Higgins et al. 2017, with the supplement's β = 5), per batch of ``B`` images:

    L = (1/B) Σ_i [ BCE(x_i, sigmoid(D(z_i))) summed over pixels
                    + β · KL(N(μ_i, σ_i²) || N(0, I)) ],   z_i = μ_i + σ_i ε_i,
    KL = ½ Σ_j (μ_j² + σ_j² - 1 - log σ_j²).

The authors' code at its last commit trains with an MSE loss and the KL term commented out (no
β at all) and names checkpoints with other β and ``q``; we follow the paper (β-VAE, β = 5, q = 8).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from boundjax.ptr.pipeline.fit import adam_step, check_positive_int, fit

Array = jax.Array


class BetaVAE(nn.Module):
  """Fully connected β-VAE over flattened images in ``[0, 1]``.

  Attributes:
    pixels: the flattened image size (784 for 28×28).
    latent: ``q``, the embedding dimension.
    hidden: width of the two hidden layers of the encoder and the decoder.
  """

  pixels: int = 784
  latent: int = 8
  hidden: int = 512

  def setup(self):
    self.enc1, self.enc2 = nn.Dense(self.hidden), nn.Dense(self.hidden)
    self.enc_out = nn.Dense(2 * self.latent)
    self.dec1, self.dec2 = nn.Dense(self.hidden), nn.Dense(self.hidden)
    self.dec_out = nn.Dense(self.pixels)

  def encode(self, x: Array) -> tuple[Array, Array]:
    """``(μ, σ)`` with ``σ = 1e-6 + softplus(·)``."""
    h = jnp.tanh(self.enc2(nn.elu(self.enc1(x))))
    out = self.enc_out(h)
    return out[..., :self.latent], 1e-6 + nn.softplus(out[..., self.latent:])

  def decode_logits(self, z: Array) -> Array:
    """Pixel logits; the reconstruction is ``sigmoid`` of them."""
    return self.dec_out(nn.elu(self.dec2(jnp.tanh(self.dec1(z)))))

  def __call__(self, x: Array, key: Array) -> tuple[Array, Array, Array]:
    mu, sigma = self.encode(x)
    z = mu + sigma * jax.random.normal(key, mu.shape, mu.dtype)
    return self.decode_logits(z), mu, sigma


@dataclasses.dataclass(frozen=True)
class VAEConfig:
  """Training settings (PTR, App. D: β = 5, q = 8, Adam lr 1e-3 constant)."""

  latent: int = 8
  hidden: int = 512
  beta: float = 5.0
  lr: float = 1e-3
  epochs: int = 30
  batch_size: int = 128
  seed: int = 2

  def __post_init__(self):
    for name in ("latent", "hidden", "epochs", "batch_size"):
      check_positive_int(f"VAEConfig.{name}", getattr(self, name))
    if not (self.beta >= 0 and np.isfinite(self.beta)):
      raise ValueError(f"VAEConfig.beta must be finite and >= 0, got {self.beta!r}.")
    if not self.lr > 0:
      raise ValueError(f"VAEConfig.lr must be > 0, got {self.lr!r}.")


@dataclasses.dataclass(frozen=True)
class TrainedVAE:
  """A trained embedder: ``module``, ``params``, the per-epoch training loss ``losses``."""

  module: BetaVAE
  params: Any
  config: VAEConfig
  losses: np.ndarray

  def embed(self, x: Any) -> Array:
    """``μ = E(x)`` for flattened images ``x`` ``(n, pixels)`` (the query embedding)."""
    return _encode_fn(self.module)(self.params, jnp.asarray(x))[0]

  def encode(self, x: Any) -> tuple[Array, Array]:
    """``(μ, σ)`` of the approximate posterior."""
    return _encode_fn(self.module)(self.params, jnp.asarray(x))

  def decode(self, z: Any) -> Array:
    """The decoded image ``sigmoid(D(z))`` in ``[0, 1]``."""
    return _decode_fn(self.module)(self.params, jnp.asarray(z))

  def reconstruct(self, x: Any) -> Array:
    """``D(E(x))`` through the mean embedding."""
    return self.decode(self.embed(x))


@functools.lru_cache(maxsize=16)
def _encode_fn(module: BetaVAE):
  return jax.jit(lambda p, x: module.apply(p, x, method=BetaVAE.encode))


@functools.lru_cache(maxsize=16)
def _decode_fn(module: BetaVAE):
  return jax.jit(lambda p, z: jax.nn.sigmoid(module.apply(p, z, method=BetaVAE.decode_logits)))


def kl_standard_normal(mu: Array, sigma: Array) -> Array:
  """``KL(N(μ, σ²) || N(0, I)) = ½ Σ_j (μ_j² + σ_j² - 1 - log σ_j²)`` per row."""
  return 0.5 * jnp.sum(mu ** 2 + sigma ** 2 - 1.0 - 2.0 * jnp.log(sigma), axis=-1)


def elbo_loss(module: BetaVAE, params: Any, x: Array, key: Array, beta: float) -> Array:
  """The β-VAE loss of the module docstring: mean over the batch of summed BCE + β·KL."""
  logits, mu, sigma = module.apply(params, x, key)
  bce = jnp.sum(optax.sigmoid_binary_cross_entropy(logits, x), axis=-1)
  return jnp.mean(bce + beta * kl_standard_normal(mu, sigma))


def train_vae(x: Any, config: VAEConfig = VAEConfig(), *, progress: bool = False) -> TrainedVAE:
  """Trains the β-VAE on flattened images ``x`` ``(n, pixels)`` in ``[0, 1]``.

  Raises:
    ValueError: ``x`` is not a 2-D array of values in ``[0, 1]``.
  """
  x = np.asarray(x, np.float32)
  if x.ndim != 2:
    raise ValueError(f"train_vae: x must be flattened images (n, pixels), got shape {x.shape}.")
  if not (np.all(np.isfinite(x)) and x.min() >= 0.0 and x.max() <= 1.0):
    raise ValueError("train_vae: x must lie in [0, 1] (BCE reconstruction loss).")
  module = BetaVAE(pixels=x.shape[1], latent=config.latent, hidden=config.hidden)
  key = jax.random.PRNGKey(config.seed)
  k_init, k_fit = jax.random.split(key)
  params = module.init(k_init, jnp.zeros((1, x.shape[1])), k_init)
  tx = optax.adam(config.lr)
  one = adam_step(lambda p, xb, k: elbo_loss(module, p, xb, k, config.beta), tx)

  def step(state, batch, k):
    p, o, v = one(*state, batch[0], k)
    return (p, o), v

  (params, _), losses = fit(step, (params, tx.init(params)), (x,), epochs=config.epochs,
                            batch_size=config.batch_size, key=k_fit, seed=config.seed,
                            desc="β-VAE" if progress else None)
  return TrainedVAE(module, params, config, losses)

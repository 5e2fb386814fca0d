"""The baselines of PTR's accuracy table (PTR, App. D, Table 1; the authors' ``ldp_training.py`` and
``experiment_automation.py::multi_eps``).

* **LDP-Image**: the Laplace mechanism on the pixels. Two images in ``[0, 1]^d`` differ by at most
  ``d`` in ℓ1, so ``x + Lap(d/ε)^d`` is ε-DP (``d = 784`` for 28×28). A classifier is trained on
  noised training images and tested on noised test images. The paper trains a ResNet-18 for 50
  epochs; on this CPU we train a small CNN (two 3×3 convolutions of stride 2 with 8 and 16
  channels, ReLU, Dense(10)) for a few epochs. At ``ε <= 7`` the noise (scale ``>= 112`` per pixel) leaves
  nothing to learn either way; at ``ε = inf`` the small CNN is a weaker classifier than a ResNet.
* **LDP-Embedding**: the Laplace mechanism on ``v = f(z)`` for an obfuscator trained without
  privacy (``α = 0``). The outputs are clipped to the per-coordinate range ``[lo_k, hi_k]`` seen on
  the training data; two clipped vectors differ by at most ``Σ_k (hi_k - lo_k)`` in ℓ1, the
  correct sensitivity (``sensitivity="l1"``). The authors' code uses ``max_k hi_k - min_k lo_k``
  (``sensitivity="code"``), up to ``m`` times too small, i.e. not ε-DP; selectable to reproduce it.
* **Adversarial** (the paper's "Adversarial" row, ``multi_eps``): the ARL obfuscator released as
  ``f(z) + Lap(Δp R/ε)^m`` **without** the PTR test (the code skips it; accuracy ignores ⊥). The
  full mechanism with the test is `boundjax.ptr.release.ptr_release_batch`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from boundjax.ptr import release as ptr
from boundjax.ptr.pipeline.fit import adam_step, check_positive_int, check_rows, fit

Array = jax.Array
SENSITIVITIES = ("l1", "code")


def _check_epsilon(epsilon: float) -> float:
  if not (isinstance(epsilon, (int, float, np.floating)) and epsilon > 0):
    raise ValueError(f"epsilon must be > 0 (math.inf for no noise), got {epsilon!r}.")
  return float(epsilon)


# ------------------------------------------------------------------------------------------------
# LDP-Image
# ------------------------------------------------------------------------------------------------

def image_scale(pixels: int, epsilon: float) -> float:
  """``d/ε``: the Laplace scale for images in ``[0, 1]^d`` (ℓ1 sensitivity ``d``); 0 at ``ε = inf``."""
  return check_positive_int("pixels", pixels) / _check_epsilon(epsilon)


def noisy_images(key: Array, x: Any, epsilon: float) -> Array:
  """``x + Lap(d/ε)`` per pixel for flattened images ``x`` ``(n, d)`` in ``[0, 1]``."""
  x = jnp.asarray(x)
  b = image_scale(x.shape[-1], epsilon)
  return x if b == 0 else x + b * jax.random.laplace(key, x.shape, x.dtype)


class SmallCNN(nn.Module):
  """The CPU stand-in for the paper's ResNet-18 (module docstring)."""

  classes: int = 10
  side: int = 28

  @nn.compact
  def __call__(self, x: Array) -> Array:
    h = x.reshape((-1, self.side, self.side, 1))
    for ch in (8, 16):
      h = nn.relu(nn.Conv(ch, (3, 3), strides=(2, 2))(h))
    return nn.Dense(self.classes)(h.reshape((h.shape[0], -1)))


@dataclasses.dataclass(frozen=True)
class LDPImageResult:
  epsilon: float
  scale: float
  accuracy: float
  epochs: int


def ldp_image_grid(key: Array, x_train: Any, y_train: Any, x_test: Any, y_test: Any,
                   epsilons: Sequence[float], *, epochs: int = 3, batch_size: int = 128,
                   lr: float = 1e-3, classes: int = 10) -> list[LDPImageResult]:
  """One `SmallCNN` per ε, all trained in one ``vmap`` on ``noisy_images`` (fresh noise every
  step); each is scored on one noised release of every test image."""
  x_train, x_test = np.asarray(x_train, np.float32), np.asarray(x_test, np.float32)
  check_rows("ldp_image (train)", x_train, y_train)
  check_rows("ldp_image (test)", x_test, y_test)
  side = int(round(math.sqrt(x_train.shape[1])))
  if side * side != x_train.shape[1]:
    raise ValueError(f"ldp_image: x must be flattened square images, got {x_train.shape[1]} "
                     "pixels.")
  eps = [_check_epsilon(e) for e in epsilons]
  if not eps:
    raise ValueError("ldp_image_grid: epsilons must not be empty.")
  scales = jnp.asarray([image_scale(x_train.shape[1], e) for e in eps], jnp.float32)
  model = SmallCNN(classes, side)
  k_init, k_fit, k_test = jax.random.split(key, 3)
  params = jax.vmap(lambda k: model.init(k, jnp.zeros((1, x_train.shape[1]))))(
      jax.random.split(k_init, len(eps)))
  tx = optax.adam(lr)

  def loss(p, xb, yb, b, k):
    logits = model.apply(p, xb + b * jax.random.laplace(k, xb.shape, xb.dtype))
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, yb))

  one = adam_step(loss, tx)

  def step(state, batch, k):
    p, o, v = jax.vmap(one, in_axes=(0, 0, None, None, 0, 0))(
        *state, batch[0], batch[1], scales, jax.random.split(k, len(eps)))
    return (p, o), v

  (params, _), _ = fit(step, (params, jax.vmap(tx.init)(params)),
                       (x_train, np.asarray(y_train, np.int32)), epochs=epochs,
                       batch_size=batch_size, key=k_fit)
  pred = jax.jit(jax.vmap(lambda p, xb: jnp.argmax(model.apply(p, xb), -1)))
  noisy = jnp.asarray(x_test)[None] + scales[:, None, None] * jax.random.laplace(
      k_test, (len(eps),) + x_test.shape, jnp.float32)
  preds = np.concatenate([np.asarray(pred(params, noisy[:, i:i + 500]))
                          for i in range(0, x_test.shape[0], 500)], axis=1)
  acc = np.mean(preds == np.asarray(y_test)[None], axis=1)
  return [LDPImageResult(e, float(b), float(a), epochs) for e, b, a in zip(eps, scales, acc)]


def ldp_image(key: Array, x_train: Any, y_train: Any, x_test: Any, y_test: Any, epsilon: float,
              **options: Any) -> LDPImageResult:
  """`ldp_image_grid` for one ε."""
  return ldp_image_grid(key, x_train, y_train, x_test, y_test, [epsilon], **options)[0]


# ------------------------------------------------------------------------------------------------
# LDP-Embedding
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class OutputRange:
  """Per-coordinate range ``[lo_k, hi_k]`` of released vectors, measured on training data."""

  lo: np.ndarray
  hi: np.ndarray

  @classmethod
  def of(cls, v: Any) -> "OutputRange":
    v = np.asarray(v, np.float64)
    if v.ndim != 2 or v.shape[0] == 0:
      raise ValueError(f"OutputRange.of: need (n, m) outputs, got shape {v.shape}.")
    return cls(v.min(axis=0), v.max(axis=0))

  def sensitivity(self, kind: str = "l1") -> float:
    """``Σ_k (hi_k - lo_k)`` (``"l1"``: the ℓ1 diameter of the box, correct) or
    ``max_k hi_k - min_k lo_k`` (``"code"``: the authors', up to ``m`` times too small)."""
    if kind == "l1":
      return float(np.sum(self.hi - self.lo))
    if kind == "code":
      return float(np.max(self.hi) - np.min(self.lo))
    raise ValueError(f"sensitivity must be one of {SENSITIVITIES}, got {kind!r}.")

  def clip(self, v: Any) -> Array:
    v = jnp.asarray(v)
    return jnp.clip(v, jnp.asarray(self.lo, v.dtype), jnp.asarray(self.hi, v.dtype))


def embedding_scale(rng: OutputRange, epsilon: float, sensitivity: str = "l1") -> float:
  """``Δ/ε`` with ``Δ = rng.sensitivity(sensitivity)``; 0 at ``ε = inf``."""
  return rng.sensitivity(sensitivity) / _check_epsilon(epsilon)


def ldp_embedding_release(key: Array, v: Any, rng: OutputRange, epsilon: float,
                          sensitivity: str = "l1") -> Array:
  """``clip(v) + Lap(Δ/ε)^m`` for outputs ``v`` ``(n, m)`` (module docstring)."""
  clipped = rng.clip(v)
  b = embedding_scale(rng, epsilon, sensitivity)
  return clipped if b == 0 else clipped + b * jax.random.laplace(key, clipped.shape,
                                                                 clipped.dtype)


# ------------------------------------------------------------------------------------------------
# Adversarial (ARL + Laplace, no PTR test)
# ------------------------------------------------------------------------------------------------

def adversarial_release(key: Array, v: Any, *, proposal: float, epsilon: float, radius: float,
                        calib: str = ptr.DEFAULT_CALIB) -> Array:
  """``v + Lap(b)^m`` with PTR's release scale (`boundjax.ptr.release.release_scale`: ``b =
  2Δp R/ε`` with ``calib="total"``, the default, ``Δp R/ε`` with ``"code"``, ``Δp/ε`` with
  ``"unit"``), for every query: the paper's Table 1 "Adversarial" row, which skips the test (so
  it is not private for points where ``f`` is steeper than ``Δp``)."""
  v = jnp.asarray(v)
  b = ptr.release_scale(proposal, _check_epsilon(epsilon), radius, calib)
  return v if b == 0 else v + b * jax.random.laplace(key, v.shape, v.dtype)

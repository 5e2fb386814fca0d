"""The obfuscator ``f``, predictor ``g`` and adversary ``D`` trained jointly by adversarial
representation learning (ARL) with PTR's noise and contrastive regularisers (PTR, App. D,
"obfuscator training"; the authors' ``adversarial_training.py``).

The obfuscator is a one-hidden-layer ReLU MLP ``8 -> 10 -> 8`` (`boundjax.models.MLP`), so the
local Lipschitz oracles of `boundjax.ptr.lipschitz` (IBP, pattern enumeration) and the exact MILP of
`milp.lipschitz` apply to it. Per minibatch, with ``z = μ + σ·N(0, I)`` the VAE's
reparametrised sample and ``x`` the image (the order of the authors' code):

1. predictor step: ``min_g CE(g(sg[f(z)] + Lap(σ_n)), y)`` (Laplace noise of scale ``σ_n``, the
   noise regulariser; none when ``noise_sigma = 0``);
2. adversary step: ``min_D MSE(D(sg[f(z)]), x)``;
3. obfuscator step: ``min_f -α MSE(D(f(z)), x) + (1 - α) CE(g(f(z)), y) + λ C(v)``;

``sg`` = stop-gradient; higher ``α`` weighs privacy more. Contrastive loss, with
``M_ij = min(1, |y_i - y_j|)`` and ``d_ij = ||v_i - v_j||_2``:

    C = mean_ij [ (1 - M_ij) d_ij + M_ij max(0, margin - d_ij) ].

``contrastive="spec"`` applies it to ``v = f(z)`` (so it shapes the obfuscator: same-class outputs
pulled together, other classes pushed ``margin`` apart). ``contrastive="code_noop"`` applies it to
``v = z``, the VAE embedding computed without gradient, as the authors' code does: a constant with
zero gradient, i.e. the regulariser does nothing (kept to reproduce the code).

Defaults are the supplement's (α = 0.99, σ_n = 0.01, λ = 1, margin 25) and the code's optimisers
(Adam 1e-4 for ``f`` and ``g``, 1e-3 for ``D``). CPU substitutions, stated: the adversary is an MLP
decoder ``q -> 256 -> pixels`` (sigmoid) instead of the code's ResNet-block decoder, and the
predictor's batch norm and dropout are left out.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from boundjax.models import MLP
from boundjax.ptr.pipeline.fit import adam_step, check_positive_int, check_rows, fit

Array = jax.Array
CONTRASTIVE = ("spec", "code_noop")


class Predictor(nn.Module):
  """``g``: Dense + LeakyReLU layers, then Dense(classes) logits (MNIST: ``(50,)``)."""

  hidden: Sequence[int] = (50,)
  classes: int = 10

  @nn.compact
  def __call__(self, v: Array) -> Array:
    for w in self.hidden:
      v = nn.leaky_relu(nn.Dense(w)(v))
    return nn.Dense(self.classes)(v)


class Decoder(nn.Module):
  """An image decoder ``v -> sigmoid(Dense(relu(Dense(v))))`` (ARL adversary, attacker)."""

  pixels: int = 784
  hidden: Sequence[int] = (256,)

  @nn.compact
  def __call__(self, v: Array) -> Array:
    for w in self.hidden:
      v = nn.relu(nn.Dense(w)(v))
    return jax.nn.sigmoid(nn.Dense(self.pixels)(v))


@functools.lru_cache(maxsize=16)
def obfuscator_apply(hidden: tuple[int, ...] = (10,), out: int = 8):
  """``apply(params, z)`` of the obfuscator ``MLP(hidden, out)``; one function per shape, so the
  PTR search (`boundjax.ptr.release`) compiles once per obfuscator shape."""
  module = MLP(hidden=tuple(hidden), out=out)
  return module.apply


def contrastive_loss(v: Array, y: Array, margin: float) -> Array:
  """``C`` of the module docstring over all ordered pairs of the batch (``d_ii = 0``).

  ``d_ij`` is computed as ``sqrt(max(||v_i - v_j||², 1e-12))`` so the gradient at ``i = j`` is 0,
  not NaN.
  """
  diff = v[:, None, :] - v[None, :, :]
  d = jnp.sqrt(jnp.maximum(jnp.sum(diff ** 2, axis=-1), 1e-12))
  M = jnp.minimum(1.0, jnp.abs(y[:, None] - y[None, :]).astype(v.dtype))
  return jnp.mean((1.0 - M) * d + M * jnp.maximum(0.0, margin - d))


@dataclasses.dataclass(frozen=True)
class ARLConfig:
  """ARL settings (PTR, App. D; the authors' code for the optimisers and architectures).

  ``sample_z``: train on the reparametrised sample ``μ + σ N(0, I)`` (the code) instead of ``μ``.
  """

  alpha: float = 0.99
  noise_sigma: float = 0.01
  contrastive_lambda: float = 1.0
  margin: float = 25.0
  contrastive: str = "spec"
  obf_hidden: tuple[int, ...] = (10,)
  out_dim: int = 8
  predictor_hidden: tuple[int, ...] = (50,)
  adversary_hidden: tuple[int, ...] = (256,)
  lr_obf: float = 1e-4
  lr_pred: float = 1e-4
  lr_adv: float = 1e-3
  epochs: int = 50
  batch_size: int = 128
  sample_z: bool = True
  seed: int = 2

  def __post_init__(self):
    if not 0.0 <= self.alpha <= 1.0:
      raise ValueError(f"ARLConfig.alpha must be in [0, 1], got {self.alpha!r}.")
    for name in ("noise_sigma", "contrastive_lambda", "margin"):
      v = getattr(self, name)
      if not (np.isfinite(v) and v >= 0):
        raise ValueError(f"ARLConfig.{name} must be finite and >= 0, got {v!r}.")
    if self.contrastive not in CONTRASTIVE:
      raise ValueError(f"ARLConfig.contrastive must be one of {CONTRASTIVE}, got "
                       f"{self.contrastive!r}.")
    for name in ("out_dim", "epochs", "batch_size"):
      check_positive_int(f"ARLConfig.{name}", getattr(self, name))
    for name in ("lr_obf", "lr_pred", "lr_adv"):
      if not getattr(self, name) > 0:
        raise ValueError(f"ARLConfig.{name} must be > 0, got {getattr(self, name)!r}.")
    object.__setattr__(self, "obf_hidden", tuple(int(w) for w in self.obf_hidden))
    object.__setattr__(self, "predictor_hidden", tuple(int(w) for w in self.predictor_hidden))
    object.__setattr__(self, "adversary_hidden", tuple(int(w) for w in self.adversary_hidden))


@dataclasses.dataclass(frozen=True)
class TrainedARL:
  """The trained triple. ``obfuscate(z)`` is ``f``, ``predict(v)`` is ``argmax g(v)``."""

  config: ARLConfig
  obf_params: Any
  pred_params: Any
  adv_params: Any
  classes: int
  pixels: int
  losses: np.ndarray          # (epochs, 3): predictor, adversary, obfuscator losses

  @property
  def apply(self):
    """``f``'s apply function (hashable, shared by every obfuscator of this shape)."""
    return obfuscator_apply(self.config.obf_hidden, self.config.out_dim)

  def obfuscate(self, z: Any) -> Array:
    return _jit(self.apply)(self.obf_params, jnp.asarray(z))

  def logits(self, v: Any) -> Array:
    return _jit(Predictor(self.config.predictor_hidden, self.classes).apply)(
        self.pred_params, jnp.asarray(v))

  def predict(self, v: Any) -> Array:
    """``argmax g(v)`` for released representations ``v`` ``(n, m)``."""
    return jnp.argmax(self.logits(v), axis=-1)

  def accuracy(self, z: Any, y: Any) -> float:
    """Noiseless accuracy ``mean(argmax g(f(z)) == y)``."""
    return float(np.mean(np.asarray(self.predict(self.obfuscate(z))) == np.asarray(y)))


@functools.lru_cache(maxsize=32)
def _jit(fn):
  return jax.jit(fn)


def train_arl(mu: Any, sigma: Any, x: Any, y: Any, config: ARLConfig = ARLConfig(), *,
              classes: int | None = None, progress: bool = False) -> TrainedARL:
  """Trains ``f``, ``g`` and ``D`` jointly (module docstring).

  Args:
    mu, sigma: the VAE posterior ``(n, q)`` of every training image (`TrainedVAE.encode`);
      ``z = μ + σ N(0, I)`` per step when ``config.sample_z``, else ``z = μ``.
    x: the flattened images ``(n, pixels)`` (the adversary's targets).
    y: integer labels ``(n,)``.
    classes: number of classes (default ``max(y) + 1``).
  """
  mu, sigma = np.asarray(mu, np.float32), np.asarray(sigma, np.float32)
  x, y = np.asarray(x, np.float32), np.asarray(y)
  check_rows("train_arl", mu, sigma, x, y)
  if mu.ndim != 2 or sigma.shape != mu.shape:
    raise ValueError(f"train_arl: mu and sigma must both be (n, q), got {mu.shape}, "
                     f"{sigma.shape}.")
  if not np.issubdtype(y.dtype, np.integer) or y.min() < 0:
    raise TypeError("train_arl: y must hold non-negative integer labels.")
  classes = int(y.max()) + 1 if classes is None else check_positive_int("classes", classes)
  c = config
  obf = MLP(hidden=c.obf_hidden, out=c.out_dim)
  pred = Predictor(c.predictor_hidden, classes)
  adv = Decoder(x.shape[1], c.adversary_hidden)
  k = jax.random.split(jax.random.PRNGKey(c.seed), 4)
  q = mu.shape[1]
  p_obf = obf.init(k[0], jnp.zeros((1, q)))
  p_pred = pred.init(k[1], jnp.zeros((1, c.out_dim)))
  p_adv = adv.init(k[2], jnp.zeros((1, c.out_dim)))
  tx_obf, tx_pred, tx_adv = optax.adam(c.lr_obf), optax.adam(c.lr_pred), optax.adam(c.lr_adv)

  def ce(logits, labels):
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))

  def pred_loss(pp, v, yb, key):
    noise = c.noise_sigma * jax.random.laplace(key, v.shape, v.dtype)
    return ce(pred.apply(pp, v + noise), yb)

  def adv_loss(pa, v, xb):
    return jnp.mean((adv.apply(pa, v) - xb) ** 2)

  def obf_loss(po, pp, pa, z, xb, yb):
    v = obf.apply(po, z)
    loss = (-c.alpha * jnp.mean((adv.apply(pa, v) - xb) ** 2)
            + (1.0 - c.alpha) * ce(pred.apply(pp, v), yb))
    if c.contrastive_lambda > 0:
      target = v if c.contrastive == "spec" else jax.lax.stop_gradient(z)
      loss = loss + c.contrastive_lambda * contrastive_loss(target, yb, c.margin)
    return loss

  step_pred, step_adv = adam_step(pred_loss, tx_pred), adam_step(adv_loss, tx_adv)

  def step(state, batch, key):
    (po, oo), (pp, op), (pa, oa) = state
    mb, sb, xb, yb = batch
    k_z, k_n = jax.random.split(key)
    z = mb + sb * jax.random.normal(k_z, mb.shape, mb.dtype) if c.sample_z else mb
    v = jax.lax.stop_gradient(obf.apply(po, z))
    pp, op, l_pred = step_pred(pp, op, v, yb, k_n)
    pa, oa, l_adv = step_adv(pa, oa, v, xb)
    l_obf, g = jax.value_and_grad(obf_loss)(po, pp, pa, z, xb, yb)
    upd, oo = tx_obf.update(g, oo, po)
    po = optax.apply_updates(po, upd)
    return ((po, oo), (pp, op), (pa, oa)), jnp.stack([l_pred, l_adv, l_obf])

  state = ((p_obf, tx_obf.init(p_obf)), (p_pred, tx_pred.init(p_pred)),
           (p_adv, tx_adv.init(p_adv)))
  state, losses = fit(step, state, (mu, sigma, x, y.astype(np.int32)), epochs=c.epochs,
                      batch_size=c.batch_size, key=k[3], seed=c.seed,
                      desc="ARL" if progress else None)
  ((po, _), (pp, _), (pa, _)) = state
  return TrainedARL(c, po, pp, pa, classes, x.shape[1], losses)

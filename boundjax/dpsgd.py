"""DP-SGD baseline (Abadi et al. 2016) with optax, and its (eps, delta) from ``dp-accounting``.

Per-example gradients are clipped to L2 norm ``l2_norm_clip`` and Gaussian noise of standard
deviation ``noise_multiplier * l2_norm_clip`` is added to their sum (``optax.contrib.dpsgd``).
Privacy is accounted with the RDP accountant of ``dp-accounting`` for ``steps`` compositions of
the Poisson-subsampled Gaussian mechanism with sampling rate q = batch_size / n. As is common
practice (and in the AGT paper's Opacus baseline), the training loop itself draws shuffled
fixed-size batches; the Poisson accounting is the usual approximation of that sampling.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from boundjax.agt.losses import per_sample_loss


# RDP orders; the default list's orders below 2 do not converge for large sampling rates
# (dp-accounting then drops them with a warning), so they are left out here.
_ORDERS = [2.0 + x / 10.0 for x in range(0, 101)] + list(range(13, 64)) + [128, 256, 512]


def _accountant():
  import dp_accounting
  return dp_accounting.rdp.RdpAccountant(_ORDERS)


def _event(noise_multiplier: float, q: float, steps: int):
  import dp_accounting
  return dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(noise_multiplier)),
      steps)


def _steps(n: int, batch_size: int, epochs: int) -> int:
  if batch_size < 1 or batch_size > n:
    raise ValueError(f"dpsgd: batch_size must be in [1, n={n}], got {batch_size}.")
  return epochs * (n // batch_size)


def dpsgd_epsilon(noise_multiplier: float, batch_size: int, n: int, epochs: int,
                  delta: float) -> float:
  """(eps at ``delta``) of DP-SGD: RDP accountant, Poisson-subsampled Gaussian, all steps."""
  import dp_accounting
  if noise_multiplier <= 0:
    raise ValueError(f"dpsgd: noise_multiplier must be > 0, got {noise_multiplier!r}.")
  acc = _accountant()
  acc.compose(_event(noise_multiplier, batch_size / n, _steps(n, batch_size, epochs)))
  return float(acc.get_epsilon(delta))


def calibrate_noise(target_eps: float, delta: float, batch_size: int, n: int, epochs: int) -> float:
  """Smallest noise multiplier whose `dpsgd_epsilon` is <= ``target_eps`` (dp-accounting)."""
  import dp_accounting
  if not target_eps > 0:
    raise ValueError(f"dpsgd: target_eps must be > 0, got {target_eps!r}.")
  steps = _steps(n, batch_size, epochs)
  return float(dp_accounting.calibrate_dp_mechanism(
      _accountant, lambda s: _event(s, batch_size / n, steps),
      target_eps, delta, dp_accounting.LowerEndpointAndGuess(1e-3, 1.0)))


def train_dpsgd(model_apply: Callable, params: Any, X: Any, y: Any, *, loss: str,
                learning_rate: float, epochs: int, batch_size: int, l2_norm_clip: float,
                noise_multiplier: float | None = None, target_eps: float | None = None,
                delta: float = 1e-5, momentum: float | None = None, nesterov: bool = False,
                seed: int = 0, progress: bool = False) -> tuple[Any, float, float]:
  """Trains with DP-SGD; returns ``(params, eps, noise_multiplier)`` (eps at ``delta``).

  Give either ``noise_multiplier`` or ``target_eps`` (then the noise is calibrated).
  """
  from tqdm.auto import tqdm
  X, y = jnp.asarray(X), jnp.asarray(y)
  n = X.shape[0]
  if (noise_multiplier is None) == (target_eps is None):
    raise ValueError("train_dpsgd: give exactly one of noise_multiplier and target_eps.")
  if noise_multiplier is None:
    noise_multiplier = calibrate_noise(target_eps, delta, batch_size, n, epochs)
  eps = dpsgd_epsilon(noise_multiplier, batch_size, n, epochs, delta)
  tx = optax.contrib.dpsgd(learning_rate, l2_norm_clip, noise_multiplier, seed, momentum, nesterov)
  lf = per_sample_loss(loss)
  grads = jax.vmap(jax.grad(lambda p, a, b: lf(model_apply(p, a[None])[0], b)),
                   in_axes=(None, 0, 0))

  @jax.jit
  def step(p, s, xb, yb):
    u, s = tx.update(grads(p, xb, yb), s, p)
    return optax.apply_updates(p, u), s

  state = tx.init(params)
  rng = np.random.default_rng(seed)
  nb = n // batch_size
  for _ in tqdm(range(epochs), desc="DP-SGD", disable=not progress, leave=False):
    order = rng.permutation(n)[: nb * batch_size].reshape(nb, batch_size)
    for idx in order:
      params, state = step(params, state, X[idx], y[idx])
  return params, eps, noise_multiplier

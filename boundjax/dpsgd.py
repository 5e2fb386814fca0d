"""DP-SGD baseline (Abadi et al. 2016) with optax, and its (eps, delta) from ``dp-accounting``.

Per-example gradients are clipped to L2 norm ``l2_norm_clip`` and Gaussian noise of standard
deviation ``noise_multiplier * l2_norm_clip`` is added to their sum (``optax.contrib.dpsgd``).
Privacy is accounted with the RDP accountant of ``dp-accounting`` for ``steps`` compositions of
the Poisson-subsampled Gaussian mechanism with sampling rate q = batch_size / n. As is common
practice (and in the AGT paper's Opacus baseline), the training loop itself draws shuffled
fixed-size batches (a `boundjax.training.Schedule` with ``last_batch="drop"``); the Poisson
accounting is the usual approximation of that sampling. (A Poisson-sampled `Schedule` — rows of a
fixed capacity, ``-1`` in the empty slots — would make the accounting exact; not implemented yet.)
The loop is `boundjax.training.train`.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax

from boundjax import training
from boundjax.agt.losses import per_sample_loss
from boundjax.training import Schedule, as_schedule


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


def calibrate_noise(epsilon: float, delta: float, batch_size: int, n: int, epochs: int) -> float:
  """Smallest noise multiplier whose `dpsgd_epsilon` is <= ``epsilon`` (dp-accounting)."""
  import dp_accounting
  if not epsilon > 0:
    raise ValueError(f"dpsgd: epsilon must be > 0, got {epsilon!r}.")
  target_eps = epsilon
  steps = _steps(n, batch_size, epochs)
  return float(dp_accounting.calibrate_dp_mechanism(
      _accountant, lambda s: _event(s, batch_size / n, steps),
      target_eps, delta, dp_accounting.LowerEndpointAndGuess(1e-3, 1.0)))


@dataclasses.dataclass(frozen=True)
class DPSGDResult:
  """Result of `train`: the parameters and their (epsilon, delta) guarantee.

  Attributes:
    params: the trained parameters.
    epsilon: epsilon at ``delta`` (RDP accountant, `dpsgd_epsilon`).
    delta: the delta of the guarantee.
    noise_multiplier: sigma (noise standard deviation / ``l2_norm_clip``).
    schedule: the `boundjax.training.Schedule` of the run.
  """
  params: Any
  epsilon: float
  delta: float
  noise_multiplier: float
  schedule: Schedule


def train(apply_fn: Callable, params: Any, x: Any, y: Any, *, loss: str, learning_rate: float,
          l2_norm_clip: float, schedule: Optional[Schedule] = None, epochs: Optional[int] = None,
          batch_size: Optional[int] = None, noise_multiplier: Optional[float] = None,
          epsilon: Optional[float] = None, delta: float = 1e-5,
          momentum: Optional[float] = None, nesterov: bool = False, seed: int = 0
          ) -> DPSGDResult:
  """Trains with DP-SGD (Abadi et al. 2016, Alg. 1) through `boundjax.training.train`.

  Per-example gradients (`boundjax.training.per_example_gradients`) go to
  ``optax.contrib.dpsgd``, which clips each to L2 norm ``l2_norm_clip``, sums, adds
  ``N(0, (noise_multiplier * l2_norm_clip)^2)`` noise (key from ``seed``) and divides by the
  batch size. Give either ``noise_multiplier`` or ``epsilon`` (then the noise is calibrated).

  Args:
    schedule: the data order; default ``Schedule(n, batch_size, epochs, seed,
      shuffle="epoch", last_batch="drop")`` (shuffled fixed-size batches). Its steps and
      ``batch_size / n`` enter the accounting.
    loss: "cross_entropy", "binary_cross_entropy" or "mse" (`boundjax.agt.losses`).
  """
  x, y = jnp.asarray(x), jnp.asarray(y)
  n = x.shape[0]
  if schedule is None and batch_size is not None and not 1 <= batch_size <= n:
    raise ValueError(f"dpsgd: batch_size must be in [1, n={n}], got {batch_size}.")
  sched = as_schedule(schedule, n, epochs=epochs, batch_size=batch_size, seed=seed,
                      shuffle="epoch", last_batch="drop", who="dpsgd.train")
  if (noise_multiplier is None) == (epsilon is None):
    raise ValueError("dpsgd.train: give exactly one of noise_multiplier and epsilon.")
  if noise_multiplier is None:
    noise_multiplier = calibrate_noise(epsilon, delta, sched.batch_size, n, sched.epochs)
  eps = dpsgd_epsilon(noise_multiplier, sched.batch_size, n, sched.epochs, delta)
  tx = optax.contrib.dpsgd(learning_rate, l2_norm_clip, noise_multiplier, sched.seed, momentum,
                           nesterov)
  lf = per_sample_loss(loss)
  grad_fn = training.per_example_gradients(apply_fn, jax.vmap(lf))
  run = jax.jit(lambda p, b: training.train(grad_fn, tx, p, x, y, b))
  return DPSGDResult(run(params, sched.batches()), float(eps), float(delta),
                     float(noise_multiplier), sched)


def train_dpsgd(model_apply: Callable, params: Any, X: Any, y: Any, *, loss: str,
                learning_rate: float, epochs: int, batch_size: int, l2_norm_clip: float,
                noise_multiplier: float | None = None, target_eps: float | None = None,
                delta: float = 1e-5, momentum: float | None = None, nesterov: bool = False,
                seed: int = 0, progress: bool = False) -> tuple[Any, float, float]:
  """Deprecated: `train` with ``epsilon=target_eps``; returns ``(params, eps, noise_multiplier)``.
  """
  del progress
  warnings.warn("dpsgd.train_dpsgd is deprecated; use dpsgd.train(apply_fn, params, x, y, ..., "
                "epsilon=...) which returns a DPSGDResult.", DeprecationWarning, stacklevel=2)
  if (noise_multiplier is None) == (target_eps is None):
    raise ValueError("train_dpsgd: give exactly one of noise_multiplier and target_eps.")
  r = train(model_apply, params, X, y, loss=loss, learning_rate=learning_rate,
            l2_norm_clip=l2_norm_clip, epochs=epochs, batch_size=batch_size,
            noise_multiplier=noise_multiplier, epsilon=target_eps, delta=delta,
            momentum=momentum, nesterov=nesterov, seed=seed)
  return r.params, r.epsilon, r.noise_multiplier

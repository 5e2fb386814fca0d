"""DP-SGD baseline (Abadi et al. 2016) with optax, and its (eps, delta) from ``dp-accounting``.

Per-example gradients are clipped to L2 norm ``l2_norm_clip`` and Gaussian noise of standard
deviation ``noise_multiplier * l2_norm_clip`` is added to their sum
(``optax.contrib.differentially_private_aggregate``). Privacy is accounted with the RDP
accountant of ``dp-accounting`` for ``steps`` compositions of the Poisson-subsampled Gaussian
mechanism with sampling rate q = batch_size / n (Mironov, Talwar & Zhang 2019).

Two samplings (``train(..., sampling=...)``):

* ``"poisson"`` (the default): every step includes each point independently with probability
  q (`PoissonSchedule`), the sampling the accountant assumes, so the reported ε is a proven
  bound. The sum of clipped gradients is divided by the *expected* batch size ``q n`` (Abadi et
  al. 2016, Alg. 1: ``1/L``), not by the realised size, which would depend on the data.
  Variable batch sizes under ``jit``: the subsets are drawn on the host (numpy) before
  training and padded with ``-1`` to the largest realised size of the run (the rows of a
  `boundjax.training.Schedule`, empty slots have weight 0 and a zero gradient), so nothing is
  ever truncated and one compiled program runs every step.
* ``"shuffle"``: shuffled fixed-size batches (a `boundjax.training.Schedule` with
  ``last_batch="drop"``, common practice and the AGT paper's Opacus baseline). The Poisson
  accounting is then only a heuristic: shuffling is not covered by it and can have a larger
  true ε (Chua et al. 2024, "How Private are DP-SGD Implementations?"); `DPSGDResult.accounting`
  says so.

The loop is `boundjax.training.train`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Literal, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax

from boundjax import training
from boundjax.agt.losses import per_sample_loss
from boundjax.training import Schedule, as_schedule

SAMPLINGS = ("poisson", "shuffle")

# RDP orders; the default list's orders below 2 do not converge for large sampling rates
# (dp-accounting then drops them with a warning), so they are left out here.
_ORDERS = [2.0 + x / 10.0 for x in range(0, 101)] + list(range(13, 64)) + [128, 256, 512]

#: `DPSGDResult.accounting` of the two samplings.
ACCOUNTING = {
    "poisson": "RDP, Poisson-subsampled Gaussian (exact for the sampling used)",
    "shuffle": "RDP, Poisson-subsampled Gaussian applied to shuffled fixed-size batches: a "
               "heuristic, not a proven bound for shuffling (Chua et al. 2024)",
}


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
  """(eps at ``delta``) of DP-SGD: RDP accountant, Poisson-subsampled Gaussian with
  q = batch_size / n, ``epochs * (n // batch_size)`` steps (Abadi et al. 2016, §3.1)."""
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


# ---------------------------------------------------------------------------------------------
# Poisson sampling
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PoissonSchedule:
  """Poisson-sampled batches: at every step each of the ``n`` points is included independently
  with probability ``q = batch_size / n`` (Abadi et al. 2016, §3.1, "lots"), so the realised
  batch size is Binomial(n, q) and the privacy accounting of `dpsgd_epsilon` applies exactly.

  Attributes:
    n: number of training points.
    batch_size: the *expected* batch size L = q n.
    epochs: ``steps = epochs * (n // batch_size)``, the steps `dpsgd_epsilon` counts.
    seed: the inclusions are drawn with ``numpy.random.default_rng(seed)``.

  `batches` gives index rows padded with ``-1`` to the largest realised size of the run
  (``capacity``), the row format of `boundjax.training.Schedule`. Frozen and hashable; the
  draw is computed once per schedule and cached.
  """

  n: int
  batch_size: int
  epochs: int
  seed: int = 0

  def __post_init__(self):
    for name in ("n", "batch_size", "epochs"):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"PoissonSchedule: {name} must be a positive int, got {v!r}.")
      object.__setattr__(self, name, int(v))
    if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)):
      raise ValueError(f"PoissonSchedule: seed must be an int, got {self.seed!r}.")
    object.__setattr__(self, "seed", int(self.seed))
    if self.batch_size > self.n:
      raise ValueError(f"PoissonSchedule: batch_size (expected) must be <= n={self.n}, got "
                       f"{self.batch_size}.")

  @property
  def q(self) -> float:
    """The sampling rate ``batch_size / n``."""
    return self.batch_size / self.n

  @property
  def steps_per_epoch(self) -> int:
    """``n // batch_size`` (an epoch is 1/q steps in expectation)."""
    return self.n // self.batch_size

  @property
  def steps(self) -> int:
    """Number of SGD steps, ``epochs * steps_per_epoch``."""
    return self.epochs * self.steps_per_epoch

  def batches_np(self) -> np.ndarray:
    """``(steps, capacity)`` int32 indices of the points of every step, ``-1`` padded (a copy)."""
    return np.array(_poisson_batches(self))

  def batches(self) -> jax.Array:
    """`batches_np` as a JAX array."""
    return jnp.asarray(_poisson_batches(self))

  def sizes(self) -> np.ndarray:
    """The realised batch size of every step (Binomial(n, q) draws)."""
    return np.sum(_poisson_batches(self) >= 0, axis=1)

  @property
  def capacity(self) -> int:
    """Width of the padded rows: the largest realised batch size (at least 1)."""
    return int(_poisson_batches(self).shape[1])

  def check_points(self, n: int, who: str = "training") -> None:
    """Raises unless the schedule was made for ``n`` points."""
    if n != self.n:
      raise ValueError(f"{who}: the schedule is for n={self.n} points, the data has {n}.")


@functools.lru_cache(maxsize=8)
def _poisson_batches(s: PoissonSchedule) -> np.ndarray:
  """Independent Bernoulli(q) inclusion of every point at every step, drawn in chunks of steps
  (memory ``chunk * n`` floats); rows padded with ``-1`` to the largest realised size."""
  rng = np.random.default_rng(s.seed)
  rows = []
  chunk = max(1, min(s.steps, 2 ** 23 // s.n))
  for start in range(0, s.steps, chunk):
    take = rng.random((min(chunk, s.steps - start), s.n)) < s.q
    rows.extend(np.flatnonzero(t).astype(np.int32) for t in take)
  cap = max(1, max(len(r) for r in rows))
  out = np.full((len(rows), cap), -1, np.int32)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  out.flags.writeable = False
  return out


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DPSGDResult:
  """Result of `train`: the parameters and their (epsilon, delta) guarantee.

  Attributes:
    params: the trained parameters.
    epsilon: epsilon at ``delta`` (RDP accountant, `dpsgd_epsilon`).
    delta: the delta of the guarantee.
    noise_multiplier: sigma (noise standard deviation / ``l2_norm_clip``).
    schedule: the `PoissonSchedule` (sampling "poisson") or `boundjax.training.Schedule`
      ("shuffle") of the run.
    sampling: ``"poisson"`` or ``"shuffle"``.
    accounting: what ``epsilon`` is (`ACCOUNTING`): a proven bound for "poisson", a heuristic
      for "shuffle".
  """
  params: Any
  epsilon: float
  delta: float
  noise_multiplier: float
  schedule: Union[PoissonSchedule, Schedule]
  sampling: str = "poisson"
  accounting: str = ACCOUNTING["poisson"]


def _sampling_of(schedule: Any, sampling: Optional[str]) -> str:
  """The sampling implied by ``schedule`` and ``sampling`` (default "poisson"); raises on a
  disagreement or an unknown value."""
  if sampling is not None and sampling not in SAMPLINGS:
    raise ValueError(f"dpsgd.train: sampling must be one of {SAMPLINGS}, got {sampling!r}.")
  implied = (None if schedule is None else
             "poisson" if isinstance(schedule, PoissonSchedule) else "shuffle")
  if implied is not None and sampling is not None and implied != sampling:
    raise ValueError(f"dpsgd.train: sampling={sampling!r} disagrees with the "
                     f"{type(schedule).__name__} given as schedule.")
  return sampling or implied or "poisson"


def _poisson_schedule(schedule: Optional[PoissonSchedule], n: int, epochs: Optional[int],
                      batch_size: Optional[int], seed: int) -> PoissonSchedule:
  if schedule is not None:
    for name, v in (("epochs", epochs), ("batch_size", batch_size)):
      if v is not None and v != getattr(schedule, name):
        raise ValueError(f"dpsgd.train: {name}={v} disagrees with the schedule's "
                         f"{name}={getattr(schedule, name)}; give one or the other.")
    schedule.check_points(n, "dpsgd.train")
    return schedule
  if epochs is None or batch_size is None:
    raise ValueError("dpsgd.train: give a schedule, or epochs and batch_size.")
  return PoissonSchedule(n, batch_size, epochs, seed)


def optimizer(learning_rate: float, l2_norm_clip: float, noise_multiplier: float, seed: int,
              momentum: Optional[float] = None, nesterov: bool = False,
              rescale: float = 1.0) -> optax.GradientTransformation:
  """DP-SGD's update (Abadi et al. 2016, Alg. 1) for per-example gradients of a batch row of
  width ``B``: ``g = rescale * (sum_i clip_C(g_i) + N(0, sigma^2 C^2 I)) / B``, then SGD (with
  optional momentum, ``optax.trace``) at ``learning_rate``.

  ``optax.contrib.differentially_private_aggregate`` divides by the row width ``B``; with
  ``rescale = B / L`` the sum is divided by the expected batch size ``L`` of Poisson sampling
  instead. Padded slots carry zero gradients, which clipping leaves zero. With
  ``rescale=1`` and no momentum this is ``optax.contrib.dpsgd``.
  """
  if not rescale > 0:
    raise ValueError(f"dpsgd.optimizer: rescale must be > 0, got {rescale!r}.")
  parts = [optax.contrib.differentially_private_aggregate(l2_norm_clip, noise_multiplier,
                                                          jax.random.key(seed))]
  if rescale != 1.0:
    parts.append(optax.scale(rescale))
  if momentum is not None:
    parts.append(optax.trace(decay=momentum, nesterov=nesterov))
  parts.append(optax.scale_by_learning_rate(learning_rate))
  return optax.chain(*parts)


def train(apply_fn: Callable, params: Any, x: Any, y: Any, *, loss: str, learning_rate: float,
          l2_norm_clip: float, schedule: Optional[Union[Schedule, PoissonSchedule]] = None,
          epochs: Optional[int] = None, batch_size: Optional[int] = None,
          noise_multiplier: Optional[float] = None, epsilon: Optional[float] = None,
          delta: float = 1e-5, momentum: Optional[float] = None, nesterov: bool = False,
          seed: int = 0, sampling: Optional[Literal["poisson", "shuffle"]] = None
          ) -> DPSGDResult:
  """Trains with DP-SGD (Abadi et al. 2016, Alg. 1) through `boundjax.training.train`.

  Per-example gradients (`boundjax.training.per_example_gradients`) are clipped to L2 norm
  ``l2_norm_clip`` and summed, ``N(0, (noise_multiplier * l2_norm_clip)^2)`` noise is added
  (key from ``seed``) and the sum is divided by the batch size ``L`` (`optimizer`): the expected
  size ``q n = batch_size`` under Poisson sampling, the fixed size under shuffling. Give either
  ``noise_multiplier`` or ``epsilon`` (then the noise is calibrated with `calibrate_noise`).

  Args:
    sampling: ``"poisson"`` (default; a `PoissonSchedule` of ``epochs`` and the expected
      ``batch_size``, the sampling the accountant assumes) or ``"shuffle"`` (default schedule
      ``Schedule(n, batch_size, epochs, seed, shuffle="epoch", last_batch="drop")``; the
      reported ε is then a heuristic, see `ACCOUNTING`). Implied by ``schedule`` when given.
    schedule: a `PoissonSchedule` or a `boundjax.training.Schedule`; its steps and
      ``batch_size / n`` enter the accounting.
    loss: "cross_entropy", "binary_cross_entropy" or "mse" (`boundjax.agt.losses`).
  """
  x, y = jnp.asarray(x), jnp.asarray(y)
  n = x.shape[0]
  if batch_size is not None and not 1 <= batch_size <= n:
    raise ValueError(f"dpsgd: batch_size must be in [1, n={n}], got {batch_size}.")
  if not l2_norm_clip > 0:
    raise ValueError(f"dpsgd.train: l2_norm_clip must be > 0, got {l2_norm_clip!r}.")
  mode = _sampling_of(schedule, sampling)
  if mode == "poisson":
    sched = _poisson_schedule(schedule, n, epochs, batch_size, seed)
  else:
    sched = as_schedule(schedule, n, epochs=epochs, batch_size=batch_size, seed=seed,
                        shuffle="epoch", last_batch="drop", who="dpsgd.train")
  if (noise_multiplier is None) == (epsilon is None):
    raise ValueError("dpsgd.train: give exactly one of noise_multiplier and epsilon.")
  if noise_multiplier is None:
    noise_multiplier = calibrate_noise(epsilon, delta, sched.batch_size, n, sched.epochs)
  eps = dpsgd_epsilon(noise_multiplier, sched.batch_size, n, sched.epochs, delta)
  batches = sched.batches()
  tx = optimizer(learning_rate, l2_norm_clip, noise_multiplier, sched.seed, momentum, nesterov,
                 batches.shape[1] / sched.batch_size)
  lf = per_sample_loss(loss)
  grad_fn = training.per_example_gradients(apply_fn, jax.vmap(lf))
  run = jax.jit(lambda p, b: training.train(grad_fn, tx, p, x, y, b))
  return DPSGDResult(run(params, batches), float(eps), float(delta), float(noise_multiplier),
                     sched, mode, ACCOUNTING[mode])

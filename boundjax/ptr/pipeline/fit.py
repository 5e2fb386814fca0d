"""One minibatch loop for the PTR pipeline's stochastic losses (VAE, ARL, attacker, LDP-Image CNN).

`boundjax.training.train` takes a gradient function of ``(params, x, y, weights)``; the losses
here also need fresh randomness every step (the VAE's reparametrisation, the ARL noise
regulariser, the attacker's Laplace release). `fit` keeps the package's `Schedule` for the data
order and runs one jitted ``lax.scan`` per epoch, folding the step number into a PRNG key.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from boundjax import training

Array = jax.Array
PyTree = Any
#: ``step(state, batch_arrays, key) -> (state, loss)``: one minibatch update (``loss`` a scalar
#: or a vector of loss components).
StepFn = Callable[[PyTree, tuple, Array], tuple[PyTree, Array]]


def check_positive_int(name: str, value: Any) -> int:
  """``value`` as an int, or a ValueError naming ``name``."""
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f"{name} must be a positive int, got {value!r}.")
  return int(value)


def check_rows(name: str, *arrays: Any) -> int:
  """The common number of rows of ``arrays`` (a ValueError naming ``name`` otherwise)."""
  rows = {int(np.shape(a)[0]) for a in arrays}
  if len(rows) != 1 or 0 in rows:
    raise ValueError(f"{name}: the arrays must have the same, non-zero number of rows, got "
                     f"{[np.shape(a) for a in arrays]}.")
  return rows.pop()


def adam_step(loss: Callable[..., Array], tx: optax.GradientTransformation):
  """``(params, opt_state, *args) -> (params, opt_state, value)``: one optax step on ``loss``."""
  def step(params, opt_state, *args):
    value, grads = jax.value_and_grad(loss)(params, *args)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value
  return step


def fit(step: StepFn, state: PyTree, arrays: tuple, *, epochs: int, batch_size: int,
        key: Array, seed: int = 0, desc: str | None = None,
        on_epoch: Callable[[int, PyTree], None] | None = None) -> tuple[PyTree, np.ndarray]:
  """Runs ``step`` over `training.Schedule` minibatches; returns ``(state, losses)``, the mean
  loss (or loss vector) of every epoch, shape ``(epochs,)`` or ``(epochs, k)``.

  Batches are ``Schedule(n, batch_size, epochs, seed, shuffle="epoch", last_batch="drop")``
  (every step sees a full batch, so one compilation); step ``t`` gets ``fold_in(key, t)``.
  ``on_epoch(epoch, state)`` runs after every epoch (e.g. a held-out evaluation).
  """
  n = check_rows("fit", *arrays)
  epochs = check_positive_int("epochs", epochs)
  batch_size = min(check_positive_int("batch_size", batch_size), n)
  sched = training.Schedule(n=n, batch_size=batch_size, epochs=epochs, seed=seed,
                            last_batch="drop")
  batches = jnp.asarray(sched.batches_np()).reshape(epochs, sched.steps_per_epoch, batch_size)
  data = tuple(jnp.asarray(a) for a in arrays)

  @jax.jit
  def epoch_fn(state, idx, first_step):
    def body(s, inp):
      t, b = inp
      return step(s, tuple(a[b] for a in data), jax.random.fold_in(key, t))
    steps = first_step + jnp.arange(idx.shape[0])
    return jax.lax.scan(body, state, (steps, idx))

  losses = []
  for e in tqdm(range(epochs), desc=desc, disable=desc is None, leave=False):
    state, vals = epoch_fn(state, batches[e], e * sched.steps_per_epoch)
    losses.append(np.asarray(jnp.mean(vals, axis=0)))
    if on_epoch is not None:
      on_epoch(e, state)
  return state, np.stack(losses)

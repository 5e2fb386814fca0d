"""One batch schedule and one SGD loop for every trainer of the package.

Leave-k-out ensembles (`boundjax.ensembles`), AGT's nominal run and its retraining checks
(`boundjax.agt`), DP-SGD (`boundjax.training.dpsgd`), the finite adversaries of `boundjax.auditing` and the
small demo classifiers (`boundjax.models.fit_full_batch`) all train through this module:

* `Schedule` says which points every SGD step sees: ``n`` points, batches of ``batch_size``,
  ``epochs`` passes, the shuffling and its seed, and what happens to the last partial batch. It is
  the object a leave-k-out family and an AGT run must share: AGT's removal box encloses the
  networks `boundjax.ensembles.train_ensemble` trains only when both follow the same schedule
  (AGT, Thm 4.5 in §4.2, assumes one fixed data order; ``tests/test_agt_unlearning.py``).
* `train` / `scan_steps` run SGD over a schedule in one jitted ``lax.scan``: a gradient function
  (`mean_gradient`, `clipped_mean_gradient`, `per_example_gradients`) turns a batch and its 0/1
  weights into gradients, an optimizer (any optax transformation, or an `Optimizer`) turns them
  into new parameters. One member is one call; ``jax.vmap`` over removed rows (or per-member
  weights) trains a whole family in one program.

A removed point is *masked* out of its batch, never deleted from the data, so every member has the
same batch boundaries and the same number of steps (as LUCID's public ``train.py`` does):
for a batch ``b`` and weights ``w_i in {0, 1}`` the mean loss is
``sum_{i in b} w_i l_i / max(sum_{i in b} w_i, 1)`` (`masked_mean`).

Batches are integer index rows of a fixed width ``batch_size``; a slot holding ``-1`` is empty
(weight 0). A Poisson-sampled schedule (DP-SGD's accounting, a later issue) fits the same
interface: rows of a fixed capacity, a variable number of them filled, the rest ``-1``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, Literal, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax

Array = jax.Array
PyTree = Any
ApplyFn = Callable[[PyTree, Array], Array]
#: A per-example loss ``(outputs (B, ...), labels (B, ...)) -> (B,)``.
LossFn = Callable[[Array, Array], Array]
#: ``grad_fn(params, x_batch, y_batch, weights) -> gradients`` (a pytree the optimizer accepts).
GradFn = Callable[[PyTree, Array, Array, Array], PyTree]

SHUFFLES = ("epoch", "once", "none")
LAST_BATCH = ("keep", "drop")

__all__ = [
    "Schedule", "Optimizer", "OptimizerLike", "as_optimizer", "build_optimizer", "sgd",
    "l1_regularization",
    "softmax_cross_entropy", "binary_logistic_loss", "masked_mean", "batch_weights",
    "mean_gradient", "clipped_mean_gradient", "per_example_gradients", "clip",
    "scan_steps", "train",
]


# ---------------------------------------------------------------------------------------------
# The batch schedule
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Schedule:
  """Which points each SGD step sees: the data order shared by every member of a family.

  Attributes:
    n: number of training points.
    batch_size: B, the width of every batch row.
    epochs: number of passes over the data.
    seed: the shuffling key is ``jax.random.PRNGKey(seed)``; epoch ``e`` of a reshuffled schedule
      visits ``jax.random.permutation(fold_in(key, e), n)``.
    shuffle: ``"epoch"`` (a new permutation every epoch, PyTorch ``shuffle=True``), ``"once"``
      (one permutation, the permutation of epoch 0, visited in every epoch: AGT's fixed data
      order, AGT, §3.2) or ``"none"`` (``0..n-1`` every epoch).
    last_batch: ``"keep"`` (the last batch of an epoch holds ``n mod B`` points, its other slots
      are ``-1``; PyTorch ``drop_last=False``) or ``"drop"`` (the ``n mod B`` points left over
      are not visited in that epoch).

  Frozen and hashable, so it can key caches and be a static argument of ``jax.jit``.
  """

  n: int
  batch_size: int
  epochs: int
  seed: int = 0
  shuffle: Literal["epoch", "once", "none"] = "epoch"
  last_batch: Literal["keep", "drop"] = "keep"

  def __post_init__(self):
    for name in ("n", "batch_size", "epochs"):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"Schedule: {name} must be a positive int, got {v!r}.")
      object.__setattr__(self, name, int(v))
    if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)):
      raise ValueError(f"Schedule: seed must be an int, got {self.seed!r}.")
    object.__setattr__(self, "seed", int(self.seed))
    if self.shuffle not in SHUFFLES:
      raise ValueError(f"Schedule: shuffle must be one of {SHUFFLES}, got {self.shuffle!r}.")
    if self.last_batch not in LAST_BATCH:
      raise ValueError(f"Schedule: last_batch must be one of {LAST_BATCH}, got "
                       f"{self.last_batch!r}.")
    if self.last_batch == "drop" and self.batch_size > self.n:
      raise ValueError(f"Schedule: batch_size={self.batch_size} > n={self.n} with "
                       "last_batch='drop' leaves no batch.")

  @property
  def steps_per_epoch(self) -> int:
    """``ceil(n / B)`` with ``last_batch="keep"``, ``floor(n / B)`` with ``"drop"``."""
    if self.last_batch == "keep":
      return -(-self.n // self.batch_size)
    return self.n // self.batch_size

  @property
  def steps(self) -> int:
    """Number of SGD steps, ``epochs * steps_per_epoch``."""
    return self.epochs * self.steps_per_epoch

  @property
  def repeats_epochs(self) -> bool:
    """True when every epoch visits the same batches (``shuffle`` is "once" or "none")."""
    return self.shuffle != "epoch"

  def key(self) -> Array:
    """The shuffling key ``jax.random.PRNGKey(seed)``."""
    return jax.random.PRNGKey(self.seed)

  def orders(self, key: Optional[Array] = None) -> Array:
    """Visiting order of the points in every epoch, shape ``(epochs, n)`` (int32).

    Traceable: ``key`` (default `key`) may be a traced PRNG key, e.g. one per vmapped trial.
    Without ``key``, a concrete schedule's orders are computed once and cached (the
    permutations are eager JAX calls, ~0.2 s for 10 epochs of Adult on a 2-core CPU).
    """
    if key is None:
      return jnp.asarray(self.orders_np())
    return _orders(key, self.n, self.epochs, self.shuffle)

  def orders_np(self) -> np.ndarray:
    """`orders` for the schedule's own seed as a (read-only, cached) numpy array."""
    return _cached_orders(self, _prng_config())

  def batches(self, key: Optional[Array] = None) -> Array:
    """Index batches of every step, shape ``(steps, B)``, empty slots ``-1`` (traceable)."""
    return _cut(self.orders(key), self.batch_size, self.last_batch)

  def batches_np(self) -> np.ndarray:
    """`batches` for the schedule's own seed, as a numpy array (a copy)."""
    return np.asarray(_cut(self.orders_np(), self.batch_size, self.last_batch, np))

  def epoch_batches(self) -> list[list[np.ndarray]]:
    """Per epoch, the index arrays of its steps with the empty slots removed (numpy)."""
    rows = [r[r >= 0] for r in self.batches_np()]
    per = self.steps_per_epoch
    return [rows[e * per:(e + 1) * per] for e in range(self.epochs)]

  def distinct_batches(self) -> np.ndarray:
    """The batches that differ: one epoch's when every epoch repeats them, else all steps.

    Step ``t`` uses row ``t % len(distinct_batches())``; per-batch modifications of a dataset
    (AGT's neighbouring datasets) are drawn once per distinct batch.
    """
    rows = self.batches_np()
    return rows[: self.steps_per_epoch] if self.repeats_epochs else rows

  def weights(self, batch: Array, removed_row: Optional[Array] = None) -> Array:
    """0/1 weight of each slot of ``batch``: 0 for empty slots and for the indices of
    ``removed_row`` (``-1`` entries remove nothing). Traceable; see `batch_weights`."""
    row = jnp.full((1,), -1, jnp.int32) if removed_row is None else removed_row
    return batch_weights(batch, row)

  def removal_masks(self, removed: Any) -> np.ndarray:
    """``(M, steps, B)`` 0/1 weights of every member (row of ``removed``) at every step (numpy).

    The masks `train_ensemble` applies; for small problems and tests (memory M x steps x B).
    """
    removed = np.asarray(removed).reshape(len(removed), -1)
    b = self.batches_np()
    hit = np.any(b[None, :, :, None] == removed[:, None, None, :], axis=-1)
    return ((b[None] >= 0) & ~hit).astype(np.float32)

  def check_points(self, n: int, who: str = "training") -> None:
    """Raises unless the schedule was made for ``n`` points."""
    if n != self.n:
      raise ValueError(f"{who}: the schedule is for n={self.n} points, the data has {n}.")


def _prng_config() -> tuple:
  """The JAX settings that change `jax.random.permutation`'s output (part of the cache key)."""
  return tuple(str(getattr(jax.config, f, None)) for f in
               ("jax_default_prng_impl", "jax_threefry_partitionable", "jax_enable_x64"))


def _orders(key: Array, n: int, epochs: int, shuffle: str) -> Array:
  if shuffle == "none":
    return jnp.tile(jnp.arange(n, dtype=jnp.int32), (epochs, 1))
  if shuffle == "once":
    first = jax.random.permutation(jax.random.fold_in(key, 0), n).astype(jnp.int32)
    return jnp.tile(first, (epochs, 1))
  return jnp.stack([jax.random.permutation(jax.random.fold_in(key, e), n)
                    for e in range(epochs)]).astype(jnp.int32)


@functools.lru_cache(maxsize=16)
def _cached_orders(schedule: Schedule, prng_config: tuple) -> np.ndarray:
  del prng_config  # cache key only
  orders = np.asarray(_orders(schedule.key(), schedule.n, schedule.epochs, schedule.shuffle),
                      np.int32)
  orders.flags.writeable = False
  return orders


def _cut(orders: Any, batch_size: int, last_batch: str, xp: Any = jnp) -> Any:
  """Cuts each epoch's order into consecutive rows of ``batch_size`` (pad ``-1`` or drop)."""
  epochs, n = orders.shape
  if last_batch == "drop":
    per = n // batch_size
    return orders[:, : per * batch_size].reshape(epochs * per, batch_size)
  per = -(-n // batch_size)
  pad = xp.full((epochs, per * batch_size - n), -1, orders.dtype)
  return xp.concatenate([orders, pad], axis=1).reshape(epochs * per, batch_size)


def batch_weights(batch: Array, removed_row: Array) -> Array:
  """0/1 weight of each slot of ``batch``: 0 for empty slots (``-1``) and removed indices."""
  hit = jnp.any(batch[:, None] == removed_row[None, :], axis=1)
  return ((batch >= 0) & ~hit).astype(jnp.float32)


def masked_mean(losses: Array, weights: Array) -> Array:
  """``sum_i w_i l_i / max(sum_i w_i, 1)``: the mean loss over the points left in the batch."""
  weights = weights.astype(losses.dtype)
  return jnp.sum(weights * losses) / jnp.maximum(jnp.sum(weights), 1.0)


# ---------------------------------------------------------------------------------------------
# Losses and optimizers
# ---------------------------------------------------------------------------------------------

def softmax_cross_entropy(logits: Array, labels: Array) -> Array:
  """Per-example cross-entropy for integer labels (PyTorch ``CrossEntropyLoss``, LUCID)."""
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels.astype(jnp.int32))


def binary_logistic_loss(logits: Array, labels: Array) -> Array:
  """Per-example logistic loss for a scalar output and labels in {-1, +1} or {0, 1} (Sphynx)."""
  z = logits.reshape(logits.shape[0], -1)[:, 0]
  s = jnp.where(labels > 0, 1.0, -1.0).astype(z.dtype)
  return jax.nn.softplus(-s * z)


def l1_regularization(coef: float) -> optax.GradientTransformation:
  """Adds the L1 subgradient ``coef * sign(theta)`` to the updates (Sphynx, §6: 1e-5).

  ``sign(0) = 0``: a parameter exactly at zero gets no push. Chain it before the optimizer:
  ``optax.chain(l1_regularization(1e-5), optax.sgd(0.1))``.
  """
  if not coef >= 0:
    raise ValueError(f"l1_regularization: coef must be >= 0, got {coef}.")

  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("l1_regularization needs params: call optimizer.update(g, state, params).")
    updates = jax.tree_util.tree_map(lambda g, p: g + coef * jnp.sign(p), updates, params)
    return updates, state

  return optax.GradientTransformation(init_fn, update_fn)


def sgd(lr: float = 0.1, weight_decay: float = 0.0, l1: float = 0.0) -> optax.GradientTransformation:
  """Plain SGD with optional weight decay (LUCID: 1e-5) and L1 (Sphynx: 1e-5).

  Weight decay is ``optax.add_decayed_weights(wd)`` before ``optax.sgd(lr)``, exactly
  ``torch.optim.SGD(weight_decay=wd)``.
  """
  parts = []
  if l1:
    parts.append(l1_regularization(l1))
  if weight_decay:
    parts.append(optax.add_decayed_weights(weight_decay))
  parts.append(optax.sgd(lr))
  return optax.chain(*parts)


@dataclasses.dataclass(frozen=True)
class Optimizer:
  """A parameter update rule: ``state = init(params)``, ``params, state = step(grads, state,
  params)``.

  An optax transformation becomes one through `as_optimizer` (``update`` then
  ``optax.apply_updates``); rules that are not additive updates (AGT's interval optimiser applied
  to a point, `boundjax.agt.train.point_optimizer`) give their ``step`` directly, so their
  arithmetic is kept bit for bit.
  """

  init: Callable[[PyTree], Any]
  step: Callable[[PyTree, Any, PyTree], tuple[PyTree, Any]]


#: An optimizer, or a zero-argument callable that builds one (a *factory*). A factory such as
#: ``functools.partial(sgd, 0.1, weight_decay=1e-5)`` pickles, so it can be sent to worker
#: processes (``train_ensemble(..., workers=2)``); an optax transformation is made of closures
#: and does not.
OptimizerLike = Union[Optimizer, optax.GradientTransformation,
                      Callable[[], Union[Optimizer, optax.GradientTransformation]]]


def build_optimizer(optimizer: OptimizerLike
                    ) -> Union[Optimizer, optax.GradientTransformation]:
  """``optimizer`` itself, or the optimizer its factory builds.

  A hashable factory is called once and its optimizer reused (cached by the factory, so equal
  factories share compiled trainers); an unhashable one is called every time.
  """
  if isinstance(optimizer, (Optimizer, optax.GradientTransformation)):
    return optimizer
  if not (callable(optimizer) and _takes_no_arguments(optimizer)):
    raise ValueError(f"optimizer must be an optax GradientTransformation, a "
                     f"boundjax.training.Optimizer or a zero-argument factory of one, got "
                     f"{type(optimizer).__name__}.")
  try:
    hash(optimizer)
  except TypeError:                      # an unhashable factory: no caching
    built = optimizer()
  else:
    built = _built(optimizer)
  if not isinstance(built, (Optimizer, optax.GradientTransformation)):
    raise ValueError(f"the optimizer factory {optimizer!r} returned a "
                     f"{type(built).__name__}, not an optax GradientTransformation or a "
                     "boundjax.training.Optimizer.")
  return built


@functools.lru_cache(maxsize=16)
def _built(factory: Callable[[], Any]) -> Any:
  return factory()


def _takes_no_arguments(fn: Callable) -> bool:
  try:
    inspect.signature(fn).bind()
  except TypeError:
    return False
  except ValueError:                     # no signature available (some builtins): try it
    return True
  return True


def as_optimizer(optimizer: OptimizerLike) -> Optimizer:
  """``optimizer`` as an `Optimizer` (optax transformations are wrapped, cached by identity;
  factories are built with `build_optimizer`)."""
  optimizer = build_optimizer(optimizer)
  return optimizer if isinstance(optimizer, Optimizer) else _from_optax(optimizer)


@functools.lru_cache(maxsize=64)
def _from_optax(tx: optax.GradientTransformation) -> Optimizer:
  def step(grads, state, params):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state
  return Optimizer(tx.init, step)


# ---------------------------------------------------------------------------------------------
# Gradient functions
# ---------------------------------------------------------------------------------------------

def mean_gradient(apply_fn: ApplyFn, loss_fn: LossFn) -> GradFn:
  """``grad_theta masked_mean(loss_fn(apply_fn(theta, x_b), y_b), w)``: SGD on the masked mean
  loss (the leave-k-out trainers)."""
  def grad_fn(params, xb, yb, w):
    return jax.grad(lambda p: masked_mean(loss_fn(apply_fn(p, xb), yb), w))(params)
  return grad_fn


def per_example_gradients(apply_fn: ApplyFn, loss_fn: LossFn) -> GradFn:
  """``w_i * grad_theta loss(apply_fn(theta, x_i[None]), y_i[None])`` stacked along a leading
  batch axis: the input of optimizers that clip per example (``optax.contrib.dpsgd``)."""
  one = lambda p, x, y: loss_fn(apply_fn(p, x[None]), y[None])[0]  # noqa: E731
  per = jax.vmap(jax.grad(one), in_axes=(None, 0, 0))

  def grad_fn(params, xb, yb, w):
    g = per(params, xb, yb)
    return jax.tree_util.tree_map(
        lambda a: a * w.astype(a.dtype).reshape((-1,) + (1,) * (a.ndim - 1)), g)
  return grad_fn


def clip(tree: PyTree, gamma: float) -> PyTree:
  """Element-wise clipping ``min(max(g, -gamma), gamma)`` (AGT, §4.2); identity if inf."""
  if gamma == float("inf"):
    return tree
  return jax.tree_util.tree_map(lambda g: jnp.clip(g, -gamma, gamma), tree)


def clipped_mean_gradient(per_sample_grads: Callable[[PyTree, Array, Array], PyTree],
                          gamma: float = float("inf"),
                          normalise: Literal["kept", "batch"] = "kept",
                          batch_size: Optional[int] = None) -> GradFn:
  """``sum_i w_i Clip_gamma(g_i) / d`` with ``d = sum_i w_i`` ("kept": the mean over the batch
  actually drawn, the convention of AGT, Alg. 1 and Thm 4.6) or ``d = batch_size`` ("batch": a
  fixed ``1/b``, which `agt.descent` covers only with ``normalise="nominal"``): the nominal
  descent direction, used to retrain AGT's neighbouring datasets.

  ``per_sample_grads(params, xs, ys)`` gives unclipped gradients with a leading sample axis.
  """
  if normalise not in ("kept", "batch"):
    raise ValueError(f"clipped_mean_gradient: normalise must be 'kept' or 'batch', got "
                     f"{normalise!r}.")
  if normalise == "batch" and batch_size is None:
    raise ValueError("clipped_mean_gradient: normalise='batch' needs batch_size.")

  def grad_fn(params, xb, yb, w):
    g = clip(per_sample_grads(params, xb, yb), gamma)
    denom = jnp.sum(w) if normalise == "kept" else batch_size
    return jax.tree_util.tree_map(lambda a: jnp.tensordot(w.astype(a.dtype), a, axes=(0, 0))
                                  / denom, g)
  return grad_fn


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------

def scan_steps(grad_fn: GradFn, optimizer: OptimizerLike,
               carry: tuple[PyTree, Any], x: Any, y: Any, batches: Array, *,
               removed_row: Optional[Array] = None, weights: Optional[Array] = None,
               trajectory: bool = False) -> tuple[tuple[PyTree, Any], Optional[PyTree]]:
  """SGD over the rows of ``batches`` from ``carry = (params, optimizer_state)``; traceable.

  Step ``t`` gathers ``x[batches[t]]`` (empty slots read row 0 with weight 0), weights the slots
  by ``batch_weights(batches[t], removed_row) * weights[t]`` and applies
  ``optimizer.step(grad_fn(params, x_b, y_b, w), state, params)``. Every member of a family has
  the same steps; only its weights differ, so ``jax.vmap`` over ``removed_row`` (or ``weights``,
  or ``x``/``y``) trains many members in one program.

  Args:
    grad_fn: see `mean_gradient`, `per_example_gradients`, `clipped_mean_gradient`.
    optimizer: an optax transformation, an `Optimizer`, or a factory of one (`OptimizerLike`).
    carry: ``(params, optimizer_state)``.
    x, y: the data (rows are points); a pytree of arrays is gathered leaf by leaf.
    batches: ``(steps, B)`` int indices, ``-1`` for an empty slot (`Schedule.batches`).
    removed_row: ``(k,)`` indices whose weight is 0 at every step (``-1`` = none).
    weights: optional ``(steps, B)`` weights multiplied in.
    trajectory: also return the parameters after every step (leading axis = step).

  Returns:
    ``((params, optimizer_state), params_after_each_step or None)``.
  """
  opt = as_optimizer(optimizer)
  row = jnp.full((1,), -1, jnp.int32) if removed_row is None else removed_row
  xs = (batches,) if weights is None else (batches, weights)

  def step(c, inp):
    params, state = c
    batch = inp[0]
    w = batch_weights(batch, row)
    if weights is not None:
      w = w * inp[1].astype(w.dtype)
    safe = jnp.maximum(batch, 0)
    xb = jax.tree_util.tree_map(lambda a: a[safe], x)
    yb = jax.tree_util.tree_map(lambda a: a[safe], y)
    params, state = opt.step(grad_fn(params, xb, yb, w), state, params)
    return (params, state), (params if trajectory else None)

  return jax.lax.scan(step, carry, xs)


def train(grad_fn: GradFn, optimizer: OptimizerLike,
          params: PyTree, x: Any, y: Any, batches: Array, *,
          removed_row: Optional[Array] = None, weights: Optional[Array] = None) -> PyTree:
  """SGD from ``params`` over ``batches`` (see `scan_steps`); returns the trained parameters.

  Traceable: wrap it in ``jax.jit`` (and ``jax.vmap`` over members). For a `Schedule` ``s``
  pass ``s.batches()``.
  """
  opt = as_optimizer(optimizer)
  (params, _), _ = scan_steps(grad_fn, opt, (params, opt.init(params)), x, y, batches,
                              removed_row=removed_row, weights=weights)
  return params


def as_schedule(schedule: Optional[Schedule], n: int, *, epochs: Optional[int],
                batch_size: Optional[int], seed: int = 0, shuffle: bool | str = True,
                last_batch: str = "keep", who: str = "training") -> Schedule:
  """The `Schedule` of a trainer given either ``schedule`` or the old keyword arguments.

  ``shuffle=True/False`` means "epoch"/"none". Raises when both are given and disagree, or when
  the schedule is for another number of points.
  """
  if schedule is not None:
    if not isinstance(schedule, Schedule):
      raise ValueError(f"{who}: schedule must be a boundjax.training.Schedule, got "
                       f"{type(schedule).__name__}.")
    for name, v in (("epochs", epochs), ("batch_size", batch_size)):
      if v is not None and v != getattr(schedule, name):
        raise ValueError(f"{who}: {name}={v} disagrees with the schedule's "
                         f"{name}={getattr(schedule, name)}; give one or the other.")
    schedule.check_points(n, who)
    return schedule
  if epochs is None or batch_size is None:
    raise ValueError(f"{who}: give a schedule, or epochs and batch_size.")
  if isinstance(shuffle, bool):
    shuffle = "epoch" if shuffle else "none"
  return Schedule(n=n, batch_size=batch_size, epochs=epochs, seed=seed, shuffle=shuffle,
                  last_batch=last_batch)

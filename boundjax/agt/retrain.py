"""Empirical soundness checks of AGT by real retraining (AGT, Def. 4.3 and Thm 4.5).

The bounds of `boundjax.agt.fit` claim (Def 4.3) that training on any dataset D' whose batches
each differ from the nominal ones by at most k removals and k additions stays inside the box at
every step. These helpers build such D' (random and adversarial removals, random, large-norm and
label-flipped additions, substitutions), retrain on them with the *same* initialisation,
`boundjax.training.Schedule`, step sizes, clipping and optimiser, many datasets at once
(`boundjax.training.scan_steps`, ``vmap`` over datasets), and count every parameter that leaves
the box and every certified prediction that changes.

A modified batch of the nominal batch B (size b) is represented with fixed shapes: the b nominal
points with 0/1 weights (0 = removed) followed by k extra slots (weight 1 = added point). The
descent direction is ``sum_i w_i Clip(g_i) / sum_i w_i`` (true SGD on the modified batch,
``normalise="actual"``), or ``/ b`` with ``normalise="nominal"`` (the fixed-1/b convention)
(`boundjax.training.clipped_mean_gradient`). By default the convention is the config's
(``Config.normalise``), the one its box covers. AGT's Thm 4.6 (§4.2) bound (``normalise="actual"``)
covers the fixed-1/b convention only when no batch grows (additions <= removals): with more
additions than removals the sum has more than b terms and leaves it (AGT, Thm 4.6 states the
mean over ``|B~|``), so `retrain` refuses that combination. The modifications are drawn once per distinct batch
of the schedule (`Schedule.distinct_batches`): with AGT's fixed order the same D' is seen in every
epoch.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Optional

import jax
import jax.numpy as jnp
import numpy as np

from boundjax import training
from boundjax.agt import losses
from boundjax.agt.certify import certify, predict
from boundjax.agt.config import Config
from boundjax.agt.train import init, make_step, nominal_grad_fn, point_optimizer
from boundjax.core.interval import split_tree
from boundjax.training import Schedule

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Neighbours:
  """A stack of M modified datasets, per distinct batch of the schedule (S batches of size b,
  k extra slots; step t uses batch ``t % S``).

  Attributes:
    keep: (M, S, b) weights of the nominal points (0 = removed).
    x_add: (M, S, k, *x_shape) added inputs; y_add: (M, S, k, *y_shape) their labels.
    w_add: (M, S, k) 1 where a slot holds an added point.
  """
  keep: Array
  x_add: Array
  y_add: Array
  w_add: Array

  @property
  def n_removed(self) -> int:
    return int(np.sum(1 - np.asarray(self.keep)))

  @property
  def n_added(self) -> int:
    return int(np.sum(np.asarray(self.w_add)))


def full_schedule(n: int, config: Config, schedule: Optional[Schedule]) -> Schedule:
  """``schedule`` (default ``config.schedule(n)``), checked to have no empty slots: a
  retraining scan needs batches of one size."""
  sched = config.schedule(n) if schedule is None else schedule
  sched.check_points(n, "agt.retrain")
  if (sched.batches_np() < 0).any():
    raise ValueError("agt.retrain: the schedule has a partial last batch (empty slots); use "
                     "last_batch='drop' or a batch size dividing n for retraining checks.")
  return sched


@dataclasses.dataclass(frozen=True)
class Trajectory:
  """An AGT run step by step (`agt_trajectory`).

  Attributes:
    params: the nominal parameters after every step (leaves with a leading step axis).
    bounds: the parameter boxes after every step (`Interval` leaves, leading step axis).

  Unpacks as ``params, bounds = agt_trajectory(...)``.
  """
  params: Any
  bounds: Any

  def __iter__(self) -> Iterator[Any]:
    return iter((self.params, self.bounds))

  def final(self) -> tuple[Any, Any]:
    """``(params, bounds)`` after the last step."""
    last = lambda a: a[-1]  # noqa: E731
    return (jax.tree_util.tree_map(last, self.params),
            jax.tree_util.tree_map(last, self.bounds))


def agt_trajectory(apply_fn: Callable, params: Any, x: Array, y: Array, config: Config,
                   backend: str = "mlp", schedule: Optional[Schedule] = None) -> Trajectory:
  """AGT over the schedule's steps, keeping the nominal parameters and boxes after EVERY step
  (leading axis of length ``schedule.steps``)."""
  sched = full_schedule(x.shape[0], config, schedule)
  step = make_step(apply_fn, config, backend)

  def body(state, i):
    state = step(state, x[i], y[i])
    return state, (state.params, state.bounds)
  _, (pt, bt) = jax.jit(lambda s: jax.lax.scan(body, s, sched.batches()))(init(params, config))
  return Trajectory(pt, bt)


def _extended_steps(n: int, sched: Schedule, nb: Neighbours) -> tuple[Array, Array]:
  """Index rows and weights of every step over the data extended by the added points.

  Member data is ``concat(x, x_add.reshape(S * k, ...))``; step t reads the nominal batch and the
  k slots ``n + (t % S) * k + [0, k)``, weighted by ``keep[t % S]`` and ``w_add[t % S]``.
  """
  rows = sched.batches()
  n_slots, k = nb.w_add.shape[1], nb.w_add.shape[2]
  slot = jnp.arange(sched.steps) % n_slots
  extra = n + slot[:, None] * k + jnp.arange(k)[None, :]
  idx = jnp.concatenate([rows, extra.astype(rows.dtype)], axis=1)
  w = jnp.concatenate([nb.keep[:, slot], nb.w_add[:, slot]], axis=2)       # (M, steps, b + k)
  return idx, w


def check_normalise(config: Config, nb: Neighbours, normalise: Optional[str]) -> str:
  """The retraining convention: ``normalise`` or, if None, ``config.normalise``.

  Raises ``ValueError`` for a convention the config's box does not cover: the fixed-1/b mean
  ("nominal") against a Thm 4.6 box (``config.normalise="actual"``) when some batch gains more
  points than it loses.
  """
  normalise = config.normalise if normalise is None else normalise
  if normalise not in ("actual", "nominal"):
    raise ValueError(f"retrain: normalise must be 'actual' or 'nominal', got {normalise!r}.")
  if normalise == "nominal" and config.normalise == "actual":
    grows = np.sum(np.asarray(nb.w_add), -1) > np.sum(1 - np.asarray(nb.keep), -1)
    if grows.any():
      raise ValueError(
          "retrain: normalise='nominal' (sum / b) with more additions than removals in "
          f"{int(grows.sum())} batch(es) is not covered by the box of Config(normalise="
          "'actual') (AGT, Thm 4.6 bounds the mean over the changed batch); build the box with "
          "Config(normalise='nominal') or retrain with normalise='actual'.")
  return normalise


def retrain(apply_fn: Callable, params: Any, x: Array, y: Array, config: Config,
            nb: Neighbours, normalise: Optional[str] = None,
            schedule: Optional[Schedule] = None) -> Any:
  """Plain (clipped) training on every dataset in ``nb``; parameters after every step.

  Uses the same schedule, step sizes, optimiser, regularisation and clipping as AGT's nominal run
  (`boundjax.agt.train.point_optimizer`), and the batch mean of ``normalise`` (default
  ``config.normalise``; `check_normalise`). Returns a pytree whose leaves have shape
  (M, steps, *param_shape).
  """
  normalise = check_normalise(config, nb, normalise)
  sched = full_schedule(x.shape[0], config, schedule)
  n = x.shape[0]
  idx, w = _extended_steps(n, sched, nb)
  m, n_slots, k = nb.w_add.shape
  x_ext = jnp.concatenate([jnp.broadcast_to(x, (m,) + x.shape),
                           nb.x_add.reshape((m, n_slots * k) + x.shape[1:])], axis=1)
  y_ext = jnp.concatenate([jnp.broadcast_to(y, (m,) + y.shape),
                           nb.y_add.reshape((m, n_slots * k) + y.shape[1:]).astype(y.dtype)],
                          axis=1)
  grad_fn = training.clipped_mean_gradient(
      nominal_grad_fn(apply_fn, config.loss), config.gamma,
      "kept" if normalise == "actual" else "batch", config.batch_size)
  opt = point_optimizer(config)

  def one(xm, ym, wm):
    _, traj = training.scan_steps(grad_fn, opt, (params, opt.init(params)), xm, ym, idx,
                                  weights=wm, trajectory=True)
    return traj
  return jax.jit(jax.vmap(one))(x_ext, y_ext, w)


def make_neighbours(seed: int, apply_fn: Callable, params: Any, x: Array, y: Array,
                    config: Config, n_sets: int, k: int | None = None,
                    n_classes: int | None = None, schedule: Optional[Schedule] = None
                    ) -> Neighbours:
  """M = ``n_sets`` datasets, each batch changed by up to k removals and up to k additions.

  The kinds cycle over: random removals; adversarial removals (the k points of each batch with
  the largest loss under ``params``, and with the largest gradient norm); additions of random
  points, of large-norm points (x 5 the data scale) and of label-flipped copies of batch points;
  substitutions (k removals + k additions); and mixtures with random counts in [0, k].
  """
  X = x
  k = config.k_private if k is None else k
  sched = full_schedule(X.shape[0], config, schedule).distinct_batches()
  n_b, b = sched.shape
  Xn, yn = np.asarray(X), np.asarray(y)
  rng = np.random.default_rng(seed)
  lf = losses.per_sample_loss(config.loss)
  loss_i = np.asarray(jax.vmap(lambda x_, y_: lf(apply_fn(params, x_[None])[0], y_))(X, y))
  g = nominal_grad_fn(apply_fn, config.loss)(params, X, y)
  gnorm = np.sqrt(sum(np.sum(np.asarray(a).reshape(a.shape[0], -1) ** 2, 1)
                      for a in jax.tree_util.tree_leaves(g)))
  scale = float(np.abs(Xn).max())
  if n_classes is None:
    n_classes = 2 if config.loss != "cross_entropy" else int(yn.max()) + 1

  keep = np.ones((n_sets, n_b, b), Xn.dtype)
  x_add = np.zeros((n_sets, n_b, k) + Xn.shape[1:], Xn.dtype)
  y_add = np.zeros((n_sets, n_b, k) + yn.shape[1:], yn.dtype)
  w_add = np.zeros((n_sets, n_b, k), Xn.dtype)
  kinds = ["rand_rm", "loss_rm", "grad_rm", "rand_add", "big_add", "flip_add", "subst", "mix"]

  def new_label(lbl):
    if config.loss == "mse":
      return lbl + rng.normal(size=np.shape(lbl)) * 3
    return (lbl + rng.integers(1, n_classes)) % n_classes if n_classes > 2 else 1 - lbl

  for m in range(n_sets):
    kind = kinds[m % len(kinds)]
    for j in range(n_b):
      idx = sched[j]
      r = a = 0
      if kind in ("rand_rm", "loss_rm", "grad_rm"):
        r = k
      elif kind in ("rand_add", "big_add", "flip_add"):
        a = k
      elif kind == "subst":
        r = a = k
      else:
        r, a = rng.integers(0, k + 1), rng.integers(0, k + 1)
      if r:
        if kind == "loss_rm":
          rm = np.argsort(-loss_i[idx])[:r]
        elif kind == "grad_rm":
          rm = np.argsort(-gnorm[idx])[:r]
        else:
          rm = rng.choice(b, r, replace=False)
        keep[m, j, rm] = 0
      for s in range(a):
        src = idx[rng.integers(b)]
        if kind == "big_add":
          xa = rng.normal(size=Xn.shape[1:]) * 5 * scale
          ya = new_label(yn[src])
        elif kind == "flip_add" or (kind in ("subst", "mix") and s % 2 == 0):
          xa = Xn[src]
          ya = new_label(yn[src])
        else:
          xa = rng.normal(size=Xn.shape[1:]) * scale
          ya = yn[rng.integers(len(yn))]
        x_add[m, j, s], y_add[m, j, s], w_add[m, j, s] = xa, ya, 1
  return Neighbours(jnp.asarray(keep), jnp.asarray(x_add), jnp.asarray(y_add), jnp.asarray(w_add))


@dataclasses.dataclass(frozen=True)
class RetrainReport:
  """Counts from `empirical_retrain_test` (all violation counts must be zero)."""
  k: int
  retrained_models: int
  steps_checked: int
  removals: int
  additions: int
  param_violations: int         # (model, step) pairs with a parameter outside the box
  max_excess: float             # largest distance outside the box (0 when sound)
  certified_points: int
  certified_checks: int         # (model, certified point) pairs compared
  prediction_changes: int       # certified predictions that changed under retraining


def empirical_retrain_test(apply_fn: Callable, params: Any, x: Array, y: Array,
                           config: Config, x_test: Array, *, n_sets: int = 32, seed: int = 0,
                           backend: str = "mlp", normalise: Optional[str] = None,
                           tol: float = 0.0, schedule: Optional[Schedule] = None
                           ) -> RetrainReport:
  """Retrains on ``n_sets`` neighbouring datasets and checks the AGT box at every step.

  ``normalise`` (default ``config.normalise``): the batch mean of the retrained runs (`retrain`).
  Returns a `RetrainReport`; the caller asserts ``param_violations == 0`` and
  ``prediction_changes == 0``.
  """
  X, X_test = x, x_test
  traj = agt_trajectory(apply_fn, params, X, y, config, backend, schedule)
  final_params, final_box = traj.final()
  nb = make_neighbours(seed, apply_fn, final_params, X, y, config, n_sets, schedule=schedule)
  rt = retrain(apply_fn, params, X, y, config, nb, normalise, schedule)
  lo, hi = split_tree(traj.bounds)
  excess = [jnp.maximum(l[None] - r, r - h[None]).reshape(r.shape[0], r.shape[1], -1).max(-1)
            for l, h, r in zip(jax.tree_util.tree_leaves(lo), jax.tree_util.tree_leaves(hi),
                               jax.tree_util.tree_leaves(rt))]
  exc = np.max(np.stack([np.asarray(e) for e in excess]), 0)        # (M, steps)
  viol = int(np.sum(exc > tol))
  cert = certify(apply_fn, final_params, final_box, X_test, backend=backend,
                 matmul=config.matmul, bound_method=config.bound_method)
  nominal = np.asarray(predict(apply_fn, final_params, X_test))
  rt_final = jax.tree_util.tree_map(lambda a: a[:, -1], rt)
  preds = np.asarray(jax.vmap(lambda p: predict(apply_fn, p, X_test))(rt_final))
  changes = int(np.sum((preds != nominal[None]) & cert[None]))
  return RetrainReport(
      k=config.k_private, retrained_models=n_sets, steps_checked=int(exc.size),
      removals=nb.n_removed, additions=nb.n_added, param_violations=viol,
      max_excess=float(max(exc.max(), 0.0)), certified_points=int(cert.sum()),
      certified_checks=int(cert.sum()) * n_sets, prediction_changes=changes)

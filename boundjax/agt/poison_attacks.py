"""Empirical soundness checks of the poisoning certificates by real retraining.

The box of a poisoning run (`boundjax.agt.poisoning`; Sosnin et al., "Certified Robustness to
Data Poisoning in Gradient-Based Training") claims to contain every model that the same
training reaches from a dataset in which every batch has at most ``k_poison`` samples with
features moved within ``epsilon`` (L-infinity) and at most ``label_k_poison`` samples with a
changed label (the same samples when ``paired_poison``). These helpers build such datasets
(random box corners, uniform points in the ball, gradient-sign and projected-gradient-ascent
attacks on the features, random, targeted and loss-maximising label changes), retrain on them
with the same initialisation, `boundjax.training.Schedule`, step sizes, clipping and optimiser
(plain training: `boundjax.training.scan_steps`, ``vmap`` over datasets), and count every
parameter that leaves the box at any step and every certified prediction that changes.

The poisoned points are chosen per distinct batch of the schedule (`Schedule.distinct_batches`),
so with AGT's fixed order every batch, in every epoch, holds at most the budget.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from boundjax import training
from boundjax.agt import losses
from boundjax.agt.certify import certify, predict
from boundjax.agt.config import Config
from boundjax.agt.retrain import full_schedule, agt_trajectory
from boundjax.agt.train import nominal_grad_fn, point_optimizer
from boundjax.core.interval import split_tree
from boundjax.training import Schedule

Array = jax.Array

#: The attack kinds `make_poisoned` cycles over.
FEATURE_KINDS = ("corner", "uniform", "fgsm", "pgd_loss", "pgd_direction")
LABEL_KINDS = ("random", "adversarial")


@dataclasses.dataclass(frozen=True)
class Poisoned:
  """M poisoned copies of a dataset.

  Attributes:
    x: (M, n, *x_shape) features; y: (M, n, *y_shape) labels.
    kinds: the attack of each copy (``"<feature kind>+<label kind>"``).
    n_feature, n_label: total number of feature-poisoned / label-poisoned samples.
  """
  x: Array
  y: Array
  kinds: tuple[str, ...]
  n_feature: int
  n_label: int


def _pgd(grad_x: Callable, x0: np.ndarray, lo: np.ndarray, hi: np.ndarray, eps: float,
         steps: int, rng: np.random.Generator) -> np.ndarray:
  """Projected gradient ascent within ``[lo, hi]`` from a random start, step ``eps / 4`` in the
  sign of ``grad_x(x)`` (batched gradient of the objective with respect to the features)."""
  x = np.clip(x0 + rng.uniform(-eps, eps, x0.shape), lo, hi)
  for _ in range(steps):
    x = np.clip(x + eps / 4 * np.sign(np.asarray(grad_x(jnp.asarray(x)))), lo, hi)
  return x


def _choose(rng: np.random.Generator, b: int, config: Config, full: bool
            ) -> tuple[np.ndarray, np.ndarray]:
  """Batch positions poisoned in features and in labels (``full``: the whole budget, else a
  random count up to it); paired: both inside one set of ``max(k, label_k)`` samples."""
  k, lk = config.k_poison, config.label_k_poison
  if not full:
    k, lk = int(rng.integers(0, k + 1)), int(rng.integers(0, lk + 1))
  if config.paired_poison:
    s = rng.choice(b, max(k, lk), replace=False)
    return s[:k], rng.permutation(s)[:lk]
  return rng.choice(b, k, replace=False), rng.choice(b, lk, replace=False)


def make_poisoned(seed: int, apply_fn: Callable, params: Any, x: Array, y: Array,
                  config: Config, n_sets: int, n_classes: Optional[int] = None,
                  schedule: Optional[Schedule] = None, pgd_steps: int = 10) -> Poisoned:
  """``n_sets`` datasets poisoned within ``config``'s budget in every distinct batch.

  Feature attacks (cycled): ``corner`` (a random corner of the epsilon box), ``uniform`` (a
  uniform point in it), ``fgsm`` (the corner in the sign of the input gradient of the loss at
  ``params``), ``pgd_loss`` (projected gradient ascent of the loss) and ``pgd_direction``
  (ascent of ``<v, grad_theta loss>`` for a random unit direction v: pushes every poisoned
  sample's parameter gradient the same way). Label attacks (cycled): ``random`` (another class,
  the target class, or a target moved to a random corner of ``+-label_epsilon``) and
  ``adversarial`` (the allowed label with the largest loss at ``params``). Every third set uses
  random counts up to the budget instead of the full budget.
  """
  sched = full_schedule(x.shape[0], config, schedule).distinct_batches()
  xn, yn = np.array(x), np.array(y)
  rng = np.random.default_rng(seed)
  eps, leps = config.epsilon, config.label_epsilon
  lf = losses.per_sample_loss(config.loss)
  if n_classes is None:
    n_classes = int(yn.max()) + 1 if config.loss == "cross_entropy" else 2
  t = config.poison_target_idx
  loss_at = jax.jit(jax.vmap(lambda xx, yy: lf(apply_fn(params, xx[None])[0], yy)))

  def label_options(lbl):
    """The labels a poisoned sample may take (classification)."""
    if config.loss == "binary_cross_entropy":
      return [1.0 - float(lbl)] if t < 0 else [float(t)]
    if t >= 0:
      return [t]
    return [c for c in range(n_classes) if c != int(lbl)]

  def poison_label(i, kind):
    if config.loss == "mse":
      lbl = np.array(yn[i], dtype=yn.dtype)
      move = leps * rng.choice([-1.0, 1.0], size=np.shape(lbl))
      if kind == "adversarial":
        out = np.asarray(apply_fn(params, jnp.asarray(xs_m[i][None]))[0]).reshape(np.shape(lbl))
        move = -leps * np.sign(out - lbl + 1e-12) * np.ones_like(move)
      if t >= 0 and np.ndim(lbl):
        mask = np.zeros(np.shape(lbl)); mask[t] = 1.0
        move = move * mask
      return lbl + move
    opts = label_options(yn[i])
    if kind == "adversarial" and len(opts) > 1:
      cand = np.array(opts, dtype=yn.dtype)
      ls = np.asarray(loss_at(jnp.broadcast_to(jnp.asarray(xs_m[i]), (len(cand),) + xn.shape[1:]),
                              jnp.asarray(cand)))
      return cand[int(np.argmax(ls))]
    return np.array(opts[int(rng.integers(len(opts)))], dtype=yn.dtype)

  one_loss = lambda xx, yy: lf(apply_fn(params, xx[None])[0], yy)  # noqa: E731
  pg = nominal_grad_fn(apply_fn, config.loss)

  def dir_obj(xx, yy, v):
    g = pg(params, xx[None], yy[None])
    return sum(jnp.sum(a[0] * b) for a, b in zip(jax.tree_util.tree_leaves(g),
                                                jax.tree_util.tree_leaves(v)))
  g_loss = jax.jit(jax.vmap(jax.grad(one_loss)))
  g_dir = jax.jit(jax.vmap(jax.grad(dir_obj), in_axes=(0, 0, None)))
  tdef = jax.tree_util.tree_structure(params)

  xs_all, ys_all, kinds = [], [], []
  n_feat = n_lab = 0
  for m in range(n_sets):
    fk = FEATURE_KINDS[m % len(FEATURE_KINDS)]
    lk = LABEL_KINDS[(m // len(FEATURE_KINDS)) % len(LABEL_KINDS)]
    full = m % 3 != 2
    xs_m, ys_m = xn.copy(), yn.copy()
    v = [rng.normal(size=np.shape(a)) for a in jax.tree_util.tree_leaves(params)]
    nv = np.sqrt(sum(np.sum(a ** 2) for a in v))
    vt = tdef.unflatten([jnp.asarray(a / nv, dtype=np.asarray(p).dtype)
                         for a, p in zip(v, jax.tree_util.tree_leaves(params))])
    for rows in sched:
      f_pos, l_pos = _choose(rng, rows.size, config, full)
      fi, li = rows[f_pos], rows[l_pos]
      if fi.size and eps > 0:
        x0 = xn[fi]
        lo, hi = x0 - eps, x0 + eps
        if fk == "corner":
          xp = x0 + eps * rng.choice([-1.0, 1.0], size=x0.shape)
        elif fk == "uniform":
          xp = x0 + rng.uniform(-eps, eps, size=x0.shape)
        elif fk == "fgsm":
          xp = x0 + eps * np.sign(np.asarray(g_loss(jnp.asarray(x0), jnp.asarray(yn[fi]))))
        elif fk == "pgd_loss":
          yy = jnp.asarray(yn[fi])
          xp = _pgd(lambda xx: g_loss(xx, yy), x0, lo, hi, eps, pgd_steps, rng)
        else:
          yy = jnp.asarray(yn[fi])
          xp = _pgd(lambda xx: g_dir(xx, yy, vt), x0, lo, hi, eps, pgd_steps, rng)
        xs_m[fi] = np.clip(xp, lo, hi).astype(xn.dtype)
        n_feat += fi.size
      for i in li:
        ys_m[i] = poison_label(i, lk)
      n_lab += li.size
    xs_all.append(xs_m)
    ys_all.append(ys_m)
    kinds.append(f"{fk}+{lk}")
  return Poisoned(jnp.asarray(np.stack(xs_all)), jnp.asarray(np.stack(ys_all)), tuple(kinds),
                  n_feat, n_lab)


def retrain(apply_fn: Callable, params: Any, xs: Array, ys: Array, config: Config,
            schedule: Optional[Schedule] = None) -> Any:
  """Plain clipped training on every dataset ``xs[m], ys[m]`` (the same schedule, step sizes,
  optimiser and clipping as AGT's nominal run, `boundjax.agt.train.point_optimizer`); the
  parameters after every step, leaves of shape (M, steps, *param_shape)."""
  sched = full_schedule(xs.shape[1], config, schedule)
  grad_fn = training.clipped_mean_gradient(nominal_grad_fn(apply_fn, config.loss), config.gamma,
                                           "kept")
  opt = point_optimizer(config)
  rows = sched.batches()

  def one(xm, ym):
    _, traj = training.scan_steps(grad_fn, opt, (params, opt.init(params)), xm, ym, rows,
                                  trajectory=True)
    return traj
  return jax.jit(jax.vmap(one))(xs, ys)


@dataclasses.dataclass(frozen=True)
class PoisonReport:
  """Counts from `empirical_poisoning_test` (violation counts must be zero)."""
  retrained_models: int
  steps_checked: int
  feature_poisoned: int
  label_poisoned: int
  param_violations: int         # (model, step) pairs with a parameter outside the box
  max_excess: float             # largest distance outside the box (0 when sound)
  certified_points: int
  certified_checks: int         # (model, certified point) pairs compared
  prediction_changes: int       # certified predictions that changed under poisoning
  changed_models: int           # retrained models whose parameters differ from the nominal run


def box_excess(bounds_traj: Any, params_traj: Any) -> np.ndarray:
  """Largest distance of each retrained model's parameters outside the box, per step:
  shape (M, steps); ``bounds_traj`` leaves have a leading step axis, ``params_traj`` leaves
  (M, steps, ...)."""
  lo, hi = split_tree(bounds_traj)
  ex = [jnp.maximum(l[None] - r, r - h[None]).reshape(r.shape[0], r.shape[1], -1).max(-1)
        for l, h, r in zip(jax.tree_util.tree_leaves(lo), jax.tree_util.tree_leaves(hi),
                           jax.tree_util.tree_leaves(params_traj))]
  return np.max(np.stack([np.asarray(e) for e in ex]), 0)


def empirical_poisoning_test(apply_fn: Callable, params: Any, x: Array, y: Array,
                             config: Config, x_test: Array, *, n_sets: int = 20, seed: int = 0,
                             backend: str = "mlp", tol: float = 0.0,
                             schedule: Optional[Schedule] = None,
                             n_classes: Optional[int] = None) -> PoisonReport:
  """Runs the poisoning AGT once, retrains on ``n_sets`` poisoned datasets (`make_poisoned`,
  attacks computed against the final nominal model) and checks the box at every step and the
  certified predictions on ``x_test``."""
  traj = agt_trajectory(apply_fn, params, x, y, config, backend, schedule)
  final_params, final_box = traj.final()
  pois = make_poisoned(seed, apply_fn, final_params, x, y, config, n_sets, n_classes, schedule)
  rt = retrain(apply_fn, params, pois.x, pois.y, config, schedule)
  exc = box_excess(traj.bounds, rt)
  moved = [jnp.max(jnp.abs(r[:, -1] - p[-1]).reshape(r.shape[0], -1), -1)
           for r, p in zip(jax.tree_util.tree_leaves(rt), jax.tree_util.tree_leaves(traj.params))]
  changed = int(np.sum(np.max(np.stack([np.asarray(a) for a in moved]), 0) > 0))
  cert = certify(apply_fn, final_params, final_box, x_test, backend=backend,
                 matmul=config.matmul)
  nominal = np.asarray(predict(apply_fn, final_params, x_test))
  rt_final = jax.tree_util.tree_map(lambda a: a[:, -1], rt)
  preds = np.asarray(jax.vmap(lambda p: predict(apply_fn, p, x_test))(rt_final))
  changes = int(np.sum((preds != nominal[None]) & cert[None]))
  return PoisonReport(
      retrained_models=n_sets, steps_checked=int(exc.size), feature_poisoned=pois.n_feature,
      label_poisoned=pois.n_label, param_violations=int(np.sum(exc > tol)),
      max_excess=float(max(exc.max(), 0.0)), certified_points=int(cert.sum()),
      certified_checks=int(cert.sum()) * n_sets, prediction_changes=changes,
      changed_models=changed)

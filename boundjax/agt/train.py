"""Abstract Gradient Training, privacy variant (AGT, Alg. 1 in §4.2).

One step, for a fixed batch of size b and step size alpha_n = max(alpha / (1 + eta n), lr_min):

    g_i            = Clip_gamma(grad loss(theta; x_i, y_i))             nominal, per sample
    [dL_i, dU_i]   = Clip_gamma(bounds of grad loss over [theta_L, theta_U])   AGT, App. B
    [DL, DU]       = Thm 4.6 over the batch (streaming top-k, `boundjax.agt.descent`)
    theta   <- theta   - alpha_n * mean_i g_i
    theta_L <- theta_L - alpha_n * DU        (note the crossing of L and U)
    theta_U <- theta_U - alpha_n * DL

By induction (Thm 4.5) ``[theta_L, theta_U]`` contains the parameters that the same training
(same initialisation, batches and schedule) reaches from any dataset whose batches differ from the
nominal ones by at most k removals and k additions each, each batch's step being the mean over
the points it holds (``Config.normalise="actual"``, AGT's Alg. 1; "nominal" covers the fixed 1/b
convention as well, `boundjax.agt.descent`). With ``Config(neighbourhood="remove")``
(unlearning) only removals are allowed and each batch's mean is over the points left, so
``[D_L, D_U]`` is ``[SEMin_{b-k}(dL), SEMax_{b-k}(dU)] / (b - k)`` (SEMin/SEMax: sums of the
b - k smallest/largest, AGT's Thm 4.6, §4.2) and no clipping is needed;
``fit(..., schedule=...)`` follows any `boundjax.training.Schedule` (e.g. reshuffled epochs, a
smaller last batch): the box encloses the networks `boundjax.ensembles.train_ensemble` trains on
the *same* schedule object. Options (from the public code): L2 (monotone
scaling ``(1 - alpha lambda) theta``), L1 (case split at zero) and momentum (bounds carried for
the L, nominal and U sequences, valid since momentum and 1 - dampening are >= 0); and Adam
(interval moments, `boundjax.agt.optim`). The parameter update is the optax-style pair
``optim.transform(config)``; `make_step` and `fit` are drivers around it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from typing import Any, Callable, Iterator, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from boundjax import training
from boundjax.agt import bounds as bnd
from boundjax.core import options
from boundjax.agt import descent, diagnostics, losses, mlp, optim, poisoning
from boundjax.agt.certify import (certified_fraction, certified_mask, check_shared_nominal,
                                   predict)
from boundjax.agt.config import Config
from boundjax.training import Schedule

Array = jax.Array


class State(NamedTuple):
  """AGT training state (a pytree): the parameter box and the bounded optimiser's state.

  Attributes:
    params: nominal parameters (the deployed model).
    bounds: pytree like ``params`` with Interval leaves, the valid parameter box.
    opt: the `boundjax.agt.optim.BoundedState` of ``optim.transform(config)`` (step count,
      moments and their bounds).
  """
  params: Any
  bounds: Any
  opt: optim.BoundedState

  @property
  def step(self) -> Array:
    """Number of steps taken (drives the step-size schedule)."""
    return self.opt.count

  @property
  def box(self) -> optim.ParamBox:
    """``(params, bounds)`` as the `boundjax.agt.optim` pair takes them."""
    return optim.ParamBox(self.params, self.bounds)


def init(params: Any, config: Config) -> State:
  """State at the initialisation theta': the box is the point ``[theta', theta']``."""
  box = optim.point_box(params)
  return State(box.params, box.bounds, optim.transform(config).init(box.params))


def nominal_grad_fn(apply_fn: Callable, loss: str) -> Callable:
  """``fn(params, xs, ys)``: per-sample gradients (leading axis = sample), unclipped."""
  lf = losses.per_sample_loss(loss)

  def one(p, x, y):
    return lf(apply_fn(p, x[None])[0], y)
  return jax.vmap(jax.grad(one), in_axes=(None, 0, 0))


BACKEND_VALUES = ("mlp", "ibp")
"""The values of ``backend`` in `descent_directions` and `make_step` (``"auto"`` is resolved
from concrete parameters by `boundjax.agt.bounds.resolve`, as `fit` does)."""


def _backend_argument(backend: str | None, params: Any, box: Any, xs: Any, ys: Any,
                      legacy: tuple) -> tuple[str, Any, Any, Any, Any]:
  """``(backend, params, box, xs, ys)`` from a keyword call, or from the deprecated positional
  one ``descent_directions(apply_fn, config, "mlp", params, box, xs, ys)`` (with a
  `DeprecationWarning`)."""
  if isinstance(params, str):
    if backend is not None or len(legacy) != 1:
      raise TypeError("descent_directions(apply_fn, config, params, box, xs, ys, *, backend): "
                      f"got a positional backend {params!r} and {len(legacy) + 4} further "
                      "positional arguments" + (" and backend=" + repr(backend) if backend else ""))
    warnings.warn("descent_directions: pass the AGT back-end as the keyword backend='mlp' or "
                  "backend='ibp' after the batch: descent_directions(apply_fn, config, params, "
                  "box, xs, ys, backend=...); the positional form will be removed.",
                  DeprecationWarning, stacklevel=3)
    backend, params, box, xs, ys = params, box, xs, ys, legacy[0]
  elif legacy:
    raise TypeError(f"descent_directions takes 6 positional arguments (apply_fn, config, "
                    f"params, box, xs, ys) but {6 + len(legacy)} were given; the back-end is "
                    "the keyword backend='mlp' or 'ibp'.")
  if backend not in BACKEND_VALUES:
    raise ValueError(f"descent_directions: backend must be one of {BACKEND_VALUES} (keyword): "
                     "'mlp' for a Dense+ReLU stack that boundjax.agt.mlp.apply reproduces "
                     "(fast), 'ibp' for any model bj.ibp supports; got "
                     f"{backend!r}" + (" (not given)" if backend is None else ""))
  return backend, params, box, xs, ys


def descent_directions(apply_fn: Callable, config: Config, params: Any, box: Any, xs: Array,
                       ys: Array, *legacy: Any, backend: str | None = None
                       ) -> tuple[Any, Any, Any]:
  """Nominal mean clipped gradient and its Thm 4.6 bounds ``(D_n, D_L, D_U)`` for one batch
  (with ``config.poisoning``, the poisoning bounds of `boundjax.agt.poisoning` instead).

  Args:
    apply_fn: ``apply_fn(params, x) -> outputs`` on a batch ``x``.
    config: the run's `Config`.
    params, box: the nominal parameters and their box (pytree of `Interval`).
    xs, ys: the batch.
    backend: keyword, required: ``"mlp"`` (the Dense+ReLU passes of `boundjax.agt.mlp`, for a
      Dense stack that ``mlp.apply`` reproduces) or ``"ibp"`` (``bj.ibp`` of the per-sample
      gradient of any model the engine supports); see `boundjax.agt.bounds`. The old positional
      form ``descent_directions(apply_fn, config, "mlp", params, box, xs, ys)`` still works,
      with a `DeprecationWarning`.

  The batch is streamed in chunks of at most ``config.fragsize`` samples and
  `boundjax.agt.descent.CHUNK_BYTES` per per-sample array
  (`boundjax.agt.descent.scan_fragments`); each chunk is folded at once into running sums and
  the k extreme bounds per coordinate (`boundjax.agt.select`), so memory does not grow with
  b. For the "mlp" back-end the nominal
  per-sample gradients come from the batched passes of `boundjax.agt.mlp.per_sample_grads`.
  """
  backend, params, box, xs, ys = _backend_argument(backend, params, box, xs, ys, legacy)
  b = xs.shape[0]
  k, gamma = config.k_private, config.gamma
  if k >= b:
    raise ValueError(f"AGT step: k_private ({k}) must be < batch size ({b}).")
  if backend == "mlp":
    gfn = lambda p, x, y: mlp.per_sample_grads(p, x, y, config.loss)  # noqa: E731
  else:
    gfn = nominal_grad_fn(apply_fn, config.loss)
  bfn = bnd.grad_bounds_fn(apply_fn, config.loss, backend, config.matmul, config.bound_method)
  if config.poisoning:   # bounded modification of samples instead (`boundjax.agt.poisoning`)
    pfn = poisoning.poisoned_grad_bounds_fn(apply_fn, config, backend)
    stages = None
    if backend == "mlp" and config.bound_method == "interval":
      stages = poisoning.mlp_stages(config, gfn, params, box)
    return poisoning.descent_directions(config, gfn, bfn, pfn, params, box, xs, ys, stages)

  per_sample_like = None   # (the chunk's memory per sample: `descent.scan_fragments`)
  if backend == "mlp" and config.bound_method == "interval":
    # Two stages (`descent.scan_fragments`): the O(f * width) factors (nominal gradients,
    # activation and delta boxes), then the O(f * #params) per-sample boxes from them, each
    # written once, so the deltas are not recomputed for every input of a kernel's outer product.
    # The nominal per-sample gradients are computed in the second stage, from (x, y): the
    # first stage's output is then O(f * width), and each O(f * #params) array is written once.
    def first(x, y):
      return x, y, mlp.grad_parts(box, x, y, config.loss, config.matmul)

    def second(vals):
      x, y, parts = vals
      return (descent.clip(gfn(params, x, y), gamma),
              descent.clip(mlp.grads_from_parts(box, parts, config.matmul), gamma))

    def factors(vals):
      """The kernels' per-sample values as factors (`descent.Outer`, folded natively without
      forming the products; a kernel with fewer than `descent.FUSED_MIN_COLUMNS` columns forms
      them), the biases' clipped, as in ``second``."""
      x, y, parts = vals
      nominal = mlp.per_sample_factors(params, x, y, config.loss)
      boxes = mlp.factors_from_parts(box, parts, config.matmul)
      g_layers, b_layers = [], []
      for (zn, dn), (zb, db) in zip(nominal, boxes):
        g, bx = descent.Outer(zn, dn), descent.Outer(zb, db)
        if dn.shape[-1] < descent.FUSED_MIN_COLUMNS:
          g, bx = descent.outer_products(g, bx, gamma)
        g_layers.append({"kernel": g, "bias": descent.clip(dn, gamma)})
        b_layers.append({"kernel": bx, "bias": descent.clip(db, gamma)})
      return mlp.rebuild(params, g_layers), mlp.rebuild(params, b_layers)
    fused = descent.fused_outer(jnp.result_type(*jax.tree_util.tree_leaves(params)))
    per_sample = (first, factors if fused else second)
    if fused:
      per_sample_like = mlp.chunk_values(params)
  else:
    def per_sample(x, y):
      return descent.clip(gfn(params, x, y), gamma), descent.clip(bfn(box, x, y), gamma)

  def merge_leaf(acc, g_n, iv):
    if isinstance(g_n, descent.Outer):
      return descent.accumulate_outer(acc, g_n, iv, gamma, track_abs=config.sound)
    return descent.accumulate(acc, g_n, iv.lower, iv.upper, None, track_abs=config.sound)
  gam = gamma if math.isfinite(gamma) else 0.0
  return descent.scan_fragments(
      params, xs, ys, config.fragsize, lambda p: descent.init_accumulator(p, k), per_sample,
      merge_leaf, lambda a: descent.finalize(a, b, gam, config.sound,
                                             config.neighbourhood == "remove", config.normalise),
      per_sample_like)


def fold_chunk(params: Any, config: Config, backend: str = "mlp") -> int:
  """Samples per chunk of `descent_directions` for ``params`` and ``config``."""
  fused = (backend == "mlp" and config.bound_method == "interval"
           and descent.fused_outer(jnp.result_type(*jax.tree_util.tree_leaves(params))))
  like = mlp.chunk_values(params, 2 if config.poisoning else 1) if fused else params
  return descent.chunk_size(like, config.batch_size, config.fragsize)


def update(config: Config, state: State, d_n: Any, d_l: Any, d_u: Any) -> State:
  """The interval optimiser step (AGT, Alg. 1 line 10, with the public code's options): the
  ``update`` of ``optim.transform(config)`` (`boundjax.agt.optim`) on the state's box."""
  box, opt = optim.transform(config).update((d_n, d_l, d_u), state.opt, state.box)
  return State(box.params, box.bounds, opt)


def point_optimizer(config: Config) -> training.Optimizer:
  """AGT's nominal update as a `boundjax.training.Optimizer` (for retraining on other data).

  ``step(g, state, params)`` is `update` with ``d_n = d_L = d_U = g`` on a point box: the same
  step sizes, momentum, L1/L2 and arithmetic as the nominal parameters of `fit` (AGT Alg. 1).
  The optimizer state is the whole `State`; ``params`` is its ``params``.
  """
  def step(grads: Any, state: State, params: Any) -> tuple[Any, State]:
    del params   # carried in the state
    new = update(config, state, grads, grads, grads)
    return new.params, new
  return training.Optimizer(lambda p: init(p, config), step)


def make_step(apply_fn: Callable, config: Config, backend: str = "mlp"
              ) -> Callable[[State, Array, Array], State]:
  """A pure, jittable ``step(state, x_batch, y_batch) -> state`` (one batch of Alg. 1).

  Args:
    apply_fn: ``apply_fn(params, x) -> outputs`` on a batch ``x``.
    config: the run's `Config` (static).
    backend: "mlp" (the Dense+ReLU passes) or "ibp" (``boundjax.ibp`` on any model); see
      `boundjax.agt.bounds`. ``fit`` resolves "auto" before calling this.
  """
  if backend not in ("mlp", "ibp"):
    raise ValueError(f"make_step: backend must be 'mlp' or 'ibp', got {backend!r}.")
  bnd.check_matmul(backend, config.matmul)

  def step(state: State, x_batch: Array, y_batch: Array) -> State:
    # the sound floating-point mode assumes float32 products (u = 2^-24): no TF32 passes
    with jax.default_matmul_precision("highest" if config.sound else None):
      d_n, d_l, d_u = descent_directions(apply_fn, config, state.params, state.bounds,
                                         x_batch, y_batch, backend=backend)
      return update(config, state, d_n, d_l, d_u)
  return step


@functools.lru_cache(maxsize=64)
def _jitted_step(apply_fn: Callable, config: Config, backend: str):
  """One compiled step per (model, config, back-end), so k-sweeps and ensembles reuse it."""
  return jax.jit(make_step(apply_fn, config, backend))


def batches(n: int, config: Config) -> np.ndarray:
  """AGT's default batches, shape ``(n // b, b)``: the first epoch of ``config.schedule(n)``
  (one seeded order, last incomplete batch dropped), used in every epoch (AGT, §3.2)."""
  if n < config.batch_size:
    raise ValueError(f"fit: dataset has {n} points, fewer than batch_size={config.batch_size}.")
  return config.schedule(n).distinct_batches()


@dataclasses.dataclass(frozen=True)
class EpochRecord:
  """The state of `fit` after one epoch: the box against the weights, and validation.

  Attributes:
    epoch: epochs done (1-based).
    step: SGD steps done.
    val_accuracy: accuracy of the nominal model on the validation set (None for "mse" or
      without validation data).
    val_certified: fraction of validation points certified stable at ``k_private`` by the
      parameter box (AGT, Lemma 4.4; None for "mse" or without validation data).
    val_mse: mean squared error of the nominal model (for "mse" with validation data).
    probe_certified: without validation data, the fraction of the probe training points
      (`diagnostics.VacuityCheck`) certified stable by the box (None for "mse" or when the
      check is off).
    layers: names of the parameter leaves (``jax.tree_util.keystr`` paths).
    width_mean, width_max: mean and max width ``theta_U - theta_L`` of the box per leaf.
    weight_scale: mean ``|w|`` of the nominal parameters over each leaf's layer
      (`boundjax.agt.diagnostics`).
  """
  epoch: int
  step: int
  val_accuracy: Optional[float] = None
  val_certified: Optional[float] = None
  val_mse: Optional[float] = None
  probe_certified: Optional[float] = None
  layers: tuple[str, ...] = ()
  width_mean: tuple[float, ...] = ()
  width_max: tuple[float, ...] = ()
  weight_scale: tuple[float, ...] = ()

  @property
  def stats(self) -> diagnostics.BoxStats:
    """The box widths against the weights as a `diagnostics.BoxStats`."""
    return diagnostics.BoxStats(self.layers, self.width_mean, self.width_max, self.weight_scale)

  @property
  def width_ratio(self) -> tuple[float, ...]:
    """``width_mean / weight_scale`` per leaf (`diagnostics.BoxStats.ratio`)."""
    return self.stats.ratio

  @property
  def certified(self) -> Optional[float]:
    """The certified fraction of the validation points, else of the training probe."""
    return self.val_certified if self.val_certified is not None else self.probe_certified

  def as_dict(self) -> dict[str, Any]:
    """The fields that were measured (not None, not empty), e.g. for a JSON record."""
    return {k: v for k, v in dataclasses.asdict(self).items() if v is not None and v != ()}


@dataclasses.dataclass(frozen=True)
class FitResult:
  """Result of `fit`: the nominal parameters and the parameter box.

  Attributes:
    params: the nominal parameters (the config's optimiser on the clipped gradients of the
      schedule's batches).
    bounds: a pytree like ``params`` with `Interval` leaves: every model the same training
      reaches after up to ``k_private`` removals (and, for ``neighbourhood="add_remove"``,
      additions) per batch lies in it (Thm 4.5).
    schedule: the `boundjax.training.Schedule` the run followed.
    history: one `EpochRecord` per epoch (box width against the weights; validation
      metrics when validation data was given).

  Unpacks as ``params, bounds = fit(...)``.
  """
  params: Any
  bounds: Any
  schedule: Schedule
  history: tuple[EpochRecord, ...] = ()

  def __iter__(self) -> Iterator[Any]:
    return iter((self.params, self.bounds))


def fit(apply_fn: Callable, params: Any, x: Any, y: Any, config: Config, *,
        schedule: Optional[Schedule] = None, x_val: Any = None, y_val: Any = None,
        backend: str = "auto", progress: bool = True,
        history: Optional[list[EpochRecord]] = None, jit: bool = True,
        vacuity: Optional[diagnostics.VacuityCheck] = diagnostics.VacuityCheck()) -> FitResult:
  """Runs AGT over the steps of ``schedule``; returns a `FitResult` (``params, bounds``).

  Args:
    apply_fn: ``apply_fn(params, x) -> logits`` (batched).
    params: initial parameters theta'.
    x, y: training data (y: int labels for cross-entropy, {0,1} for BCE, targets for mse).
    config: the `Config`.
    schedule: the data order, a `boundjax.training.Schedule` for ``len(x)`` points with
      ``epochs == config.n_epochs`` and ``batch_size == config.batch_size``; default
      ``config.schedule(len(x))`` (one fixed order, last incomplete batch dropped). Give the
      schedule of a leave-k-out family (``Ensemble.schedule``) for a box that encloses it.
    x_val, y_val: optional validation data: the `EpochRecord` of each epoch then also holds
      the nominal accuracy or mse and the fraction of validation points certified stable at
      ``config.k_private``.
    backend: "auto", "mlp" or "ibp" (`boundjax.agt.bounds`).
    progress: show a tqdm bar over steps.
    history: optional list receiving one `EpochRecord` per epoch (also in
      ``FitResult.history``): the box width per leaf against the weight scale (also on the
      progress bar), and the validation metrics.
    jit: compile the step (turn off only to debug).
    vacuity: when to warn that the certificates are (nearly) vacuous
      (`diagnostics.VacuityCheck`: by default when after an epoch the box certifies fewer than
      25 % of the validation points, or without them of up to 256 training points; for "mse"
      when a leaf's mean width exceeds 0.5x its layer's mean |w|); None: no check.

  Warns with `diagnostics.VacuousCertificateWarning` (once) by the ``vacuity`` rule, and raises
  `diagnostics.BoxOverflowError` (naming the step and the leaves) when an endpoint of the box
  becomes infinite or NaN. Before any step, raises `boundjax.core.options.OptionError` when
  ``x`` (or ``x_val``) holds NaN or ±inf (naming the first index) or a label does not fit the
  loss and the network (`check_data`).
  """
  from tqdm.auto import tqdm
  if vacuity is not None and not isinstance(vacuity, diagnostics.VacuityCheck):
    raise TypeError(f"fit: vacuity must be a boundjax.agt.diagnostics.VacuityCheck or None, got "
                    f"{type(vacuity).__name__}.")
  x, y = jnp.asarray(x), jnp.asarray(y)
  if x.shape[0] != y.shape[0]:
    raise ValueError(f"fit: x has {x.shape[0]} rows but y has {y.shape[0]}.")
  check_data(apply_fn, params, x, y, config.loss)
  if x_val is not None and y_val is not None:
    check_data(apply_fn, params, x_val, y_val, config.loss, names=("x_val", "y_val"))
  sched, epochs = _epoch_batches(x.shape[0], config, schedule)
  backend = bnd.resolve(backend, apply_fn, params, x[:2], config.matmul)
  step = _jitted_step(apply_fn, config, backend) if jit else make_step(apply_fn, config, backend)
  state = init(params, config)
  layers = diagnostics.layer_names(state.params)
  records = [] if history is None else history
  total = sum(len(e) for e in epochs)
  bar = tqdm(total=total, desc=f"AGT k={config.k_private}", disable=not progress, leave=False)
  probe = _probe(x, epochs, config, vacuity, x_val)
  warned = False
  for epoch, rows in enumerate(epochs):
    flags = []          # per step and leaf: all endpoints finite (checked once per epoch)
    for idx in rows:
      state = step(state, x[idx], y[idx])
      flags.append(_finite_flags(state.bounds))
      bar.update(1)
    _check_finite(flags, int(state.step) - len(rows), layers, config)
    rec = _epoch_record(apply_fn, config, backend, state, epoch, x_val, y_val, probe)
    records.append(rec)
    bar.set_postfix(_postfix(rec), refresh=False)
    if not warned and vacuity is not None and vacuity.fires(rec.certified, rec.stats):
      warned = True
      where = ("validation" if rec.val_certified is not None
               else f"{len(probe)} training probe" if probe is not None else "")
      warnings.warn(diagnostics.vacuous_message(rec.stats, epoch + 1, config, rec.certified,
                                                where, vacuity),
                    diagnostics.VacuousCertificateWarning, stacklevel=2)
  bar.close()
  return FitResult(state.params, state.bounds, sched, tuple(records))


def check_data(apply_fn: Callable, params: Any, x: Any, y: Any, loss: str,
               names: tuple[str, str] = ("x", "y")) -> None:
  """The checks of `fit`'s data before training (`boundjax.core.options`).

  ``x`` must be finite: a NaN input makes every bound through it NaN, and AGT's box would only
  overflow steps later (`diagnostics.BoxOverflowError`) without naming the input. Labels must
  fit the loss (AGT, App. B): "cross_entropy" takes integer classes ``0 .. C - 1`` for a
  network with ``C`` logits (``optax``'s one-hot of a label outside that range is all zeros,
  so training would go on with a wrong gradient), "binary_cross_entropy" takes 0 or 1 (its
  logit gradient ``sigmoid(z) - y`` assumes it), and "mse" takes finite targets.
  """
  x_name, y_name = names
  options.finite_array(x_name, x)
  if loss == "cross_entropy":
    out = jax.eval_shape(apply_fn, params, jnp.asarray(x)[:1])
    n_classes = out.shape[-1] if out.ndim > 1 else 1
    options.class_labels(y_name, y, n_classes)
  elif loss == "binary_cross_entropy":
    options.binary_labels(y_name, y)
  else:
    options.finite_array(y_name, y)


_finite_flags = jax.jit(diagnostics.finite_flags)


def _check_finite(flags: list, first_step: int, layers: tuple[str, ...], config: Config) -> None:
  """Raises `diagnostics.BoxOverflowError` at the first step whose box has a non-finite
  endpoint (``flags``: one per-leaf bool vector per step of the epoch)."""
  if not flags:
    return
  ok = np.asarray(jnp.stack(flags))
  if ok.all():
    return
  t = int(np.argmin(ok.all(axis=1)))
  raise diagnostics.overflow_error(first_step + t + 1, layers, ok[t], config)


def _postfix(rec: EpochRecord) -> dict[str, str]:
  """Progress-bar summary: the worst leaf's mean box width against its mean |w|."""
  if not rec.layers:
    return {}
  i = int(np.argmax(rec.width_ratio))
  out = {"width": f"{rec.width_mean[i]:.3g}", "|w|": f"{rec.weight_scale[i]:.3g}",
         "max_width": f"{max(rec.width_max):.3g}"}
  if rec.certified is not None:
    out["cert"] = f"{rec.certified:.2f}"
  return out


def _probe(x: Array, epochs: list[list[np.ndarray]], config: Config,
           vacuity: Optional[diagnostics.VacuityCheck], x_val: Any) -> Optional[Array]:
  """The training points `diagnostics.VacuityCheck` certifies after each epoch: the first
  ``n_probe`` of the first epoch's order; None with validation data, for "mse" or without a
  check."""
  if vacuity is None or x_val is not None or config.loss == "mse":
    return None
  order = np.concatenate([np.asarray(r) for r in epochs[0]])
  return x[order[:vacuity.n_probe]]


def _epoch_record(apply_fn: Callable, config: Config, backend: str, state: State, epoch: int,
                  x_val: Any, y_val: Any, probe: Optional[Array] = None) -> EpochRecord:
  """Box width against the weights and, with validation data, accuracy (or mse) and the
  certified fraction after one epoch; without, the certified fraction of ``probe``."""
  stats = diagnostics.box_stats(state.params, state.bounds)
  done = dict(epoch=epoch + 1, step=int(state.step), layers=stats.layers,
              width_mean=stats.width_mean, width_max=stats.width_max,
              weight_scale=stats.weight_scale)
  if x_val is None:
    if probe is None:
      return EpochRecord(**done)
    return EpochRecord(**done, probe_certified=certified_fraction(
        apply_fn, config, backend, state.params, state.bounds, probe))
  if config.loss == "mse":
    per_sample = jax.vmap(losses.per_sample_loss("mse"))   # y (n,) against outputs (n, 1)
    mse = float(jnp.mean(per_sample(apply_fn(state.params, x_val), jnp.asarray(y_val))))
    return EpochRecord(**done, val_mse=mse)
  pred = predict(apply_fn, state.params, x_val, config.loss)
  accuracy = float(jnp.mean(pred == jnp.asarray(y_val).astype(pred.dtype)))
  certified = certified_fraction(apply_fn, config, backend, state.params, state.bounds, x_val)
  return EpochRecord(**done, val_accuracy=accuracy, val_certified=certified)


def _epoch_batches(n: int, config: Config, schedule: Optional[Schedule]
                   ) -> tuple[Schedule, list[list[np.ndarray]]]:
  """The schedule and, per epoch, the index arrays of its steps (empty slots dropped)."""
  if schedule is None:
    if n < config.batch_size:
      raise ValueError(f"fit: dataset has {n} points, fewer than batch_size={config.batch_size}.")
    schedule = config.schedule(n)
  if not isinstance(schedule, Schedule):
    raise TypeError(f"fit: schedule must be a boundjax.training.Schedule (e.g. "
                    f"Ensemble.schedule) or None, got {type(schedule).__name__}.")
  schedule.check_points(n, "agt.fit")
  if schedule.epochs != config.n_epochs or schedule.batch_size != config.batch_size:
    raise ValueError(f"fit: the schedule has epochs={schedule.epochs}, batch_size="
                     f"{schedule.batch_size}; the config has n_epochs={config.n_epochs}, "
                     f"batch_size={config.batch_size}. They must agree.")
  epochs = schedule.epoch_batches()
  for rows in epochs:
    for r in rows:
      if r.size <= config.k_private:
        raise ValueError(f"fit: a scheduled batch has {r.size} points, not more than "
                         f"k_private={config.k_private}.")
  return schedule, epochs


@dataclasses.dataclass(frozen=True)
class KGrid:
  """Result of `fit_k_grid`: one nominal model and its box for every k.

  Attributes:
    params: the nominal parameters shared by every run.
    bounds_by_k: ``{k: parameter box}``.

  Unpacks as ``params, bounds_by_k = fit_k_grid(...)``.
  """
  params: Any
  bounds_by_k: dict

  def __iter__(self) -> Iterator[Any]:
    return iter((self.params, self.bounds_by_k))


def fit_k_grid(apply_fn: Callable, params: Any, x: Any, y: Any, config: Config,
               ks: Sequence[int], **fit_kw: Any) -> KGrid:
  """Runs `fit` once per k in ``ks`` (same init, schedule and step sizes; AGT, §4.3).

  Raises ``ValueError`` if the nominal runs differ (`check_shared_nominal`).
  """
  params_by_k, bounds_by_k = {}, {}
  for k in ks:
    cfg = dataclasses.replace(config, k_private=int(k))
    params_by_k[k], bounds_by_k[k] = fit(apply_fn, params, x, y, cfg, **fit_kw)
  check_shared_nominal(params_by_k, atol=1e-6)
  return KGrid(params_by_k[list(ks)[0]], bounds_by_k)

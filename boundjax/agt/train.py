"""Abstract Gradient Training, privacy variant (AGT paper Alg. 1, spec §2.7).

One step, for a fixed batch of size b and step size alpha_n = max(alpha / (1 + eta n), lr_min):

    g_i            = Clip_gamma(grad loss(theta; x_i, y_i))             nominal, per sample
    [dL_i, dU_i]   = Clip_gamma(bounds of grad loss over [theta_L, theta_U])   spec §2.2–2.5
    [DL, DU]       = Thm 4.6 over the batch (streaming top-k, `boundjax.agt.descent`)
    theta   <- theta   - alpha_n * mean_i g_i
    theta_L <- theta_L - alpha_n * DU        (note the crossing of L and U)
    theta_U <- theta_U - alpha_n * DL

By induction (Thm 4.5) ``[theta_L, theta_U]`` contains the parameters that the same training
(same initialisation, batches and schedule) reaches from any dataset whose batches differ from the
nominal ones by at most k removals and k additions each. With ``Config(neighbourhood="remove")``
(unlearning) only removals are allowed and each batch's mean is over the points left, so
``[D_L, D_U]`` is ``[SEMin_{b-k}(dL), SEMax_{b-k}(dU)] / (b - k)`` and no clipping is needed;
``fit(..., schedule=...)`` follows any batch schedule (e.g. reshuffled epochs). Options (spec §2.7): L2 (monotone
scaling ``(1 - alpha lambda) theta``), L1 (case split at zero) and momentum (bounds carried for
the L, nominal and U sequences, valid since momentum and 1 - dampening are >= 0).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.agt import bounds as bnd
from boundjax.agt import descent, losses, mlp
from boundjax.agt.config import Config
from boundjax.interval import Interval

Array = jax.Array
_is_iv = lambda x: isinstance(x, Interval)  # noqa: E731


class State(NamedTuple):
  """AGT training state (a pytree).

  Attributes:
    params: nominal parameters (the deployed model).
    bounds: pytree like ``params`` with Interval leaves, the valid parameter box.
    step: number of steps taken (drives the step-size schedule).
    mom: momentum buffers ``(v_nominal, v_lower, v_upper)`` (pytrees like params) or ``()``.
  """
  params: Any
  bounds: Any
  step: Array
  mom: Any = ()


def init(params: Any, config: Config) -> State:
  """State at the initialisation theta': the box is the point ``[theta', theta']``."""
  params = jax.tree_util.tree_map(jnp.asarray, params)
  box = jax.tree_util.tree_map(lambda p: Interval(p, p, validate=False), params)
  mom = ()
  if config.optimizer == "sgdm":
    z = jax.tree_util.tree_map(jnp.zeros_like, params)
    mom = (z, z, z)
  return State(params, box, jnp.zeros((), jnp.int32), mom)


def _split(box: Any) -> tuple[Any, Any]:
  lo = jax.tree_util.tree_map(lambda b: b.lower, box, is_leaf=_is_iv)
  hi = jax.tree_util.tree_map(lambda b: b.upper, box, is_leaf=_is_iv)
  return lo, hi


def _join(lo: Any, hi: Any) -> Any:
  return jax.tree_util.tree_map(lambda l, h: Interval(l, h, validate=False), lo, hi)


def nominal_grad_fn(model_apply: Callable, loss: str) -> Callable:
  """``fn(params, xs, ys)``: per-sample gradients (leading axis = sample), unclipped."""
  lf = losses.per_sample_loss(loss)

  def one(p, x, y):
    return lf(model_apply(p, x[None])[0], y)
  return jax.vmap(jax.grad(one), in_axes=(None, 0, 0))


def descent_directions(model_apply: Callable, config: Config, backend: str,
                       params: Any, box: Any, xs: Array, ys: Array) -> tuple[Any, Any, Any]:
  """Nominal mean clipped gradient and its Thm 4.6 bounds ``(D_n, D_L, D_U)`` for one batch.

  The batch is processed in fragments of ``config.fragsize`` samples (``lax.scan`` over the
  full fragments, then the remainder); only running sums and the k extreme bounds per coordinate
  are kept, so memory does not grow with b. For the "mlp" back-end the nominal per-sample
  gradients come from the batched passes of `boundjax.agt.mlp.per_sample_grads`.
  """
  b = xs.shape[0]
  k, gamma = config.k_private, config.clip_gamma
  if k >= b:
    raise ValueError(f"AGT step: k_private ({k}) must be < batch size ({b}).")
  f = min(config.fragsize, b)
  nf, rem = divmod(b, f)
  if backend == "mlp":
    gfn = lambda p, x, y: mlp.per_sample_grads(p, x, y, config.loss)  # noqa: E731
  else:
    gfn = nominal_grad_fn(model_apply, config.loss)
  bfn = bnd.grad_bounds_fn(model_apply, config.loss, backend, config.interval_matmul)
  acc0 = jax.tree_util.tree_map(lambda p: descent.init_accumulator(p, k), params)
  tdef = jax.tree_util.tree_structure(params)

  def merge(acc, x, y):
    g = descent.clip(gfn(params, x, y), gamma)
    gb = descent.clip(bfn(box, x, y), gamma)
    leaves = zip(tdef.flatten_up_to(acc), jax.tree_util.tree_leaves(g),
                 jax.tree_util.tree_leaves(gb, is_leaf=_is_iv))
    new = [descent.accumulate(a, gn, iv.lower, iv.upper, None, track_abs=config.fp_margin)
           for a, gn, iv in leaves]
    return tdef.unflatten(new)

  # nf full fragments in a scan, then the remainder (no padding, so no masking is needed)
  xf = xs[: nf * f].reshape((nf, f) + xs.shape[1:])
  yf = ys[: nf * f].reshape((nf, f) + ys.shape[1:])
  if nf == 1:
    acc = merge(acc0, xf[0], yf[0])
  else:
    acc, _ = jax.lax.scan(lambda a, xy: (merge(a, *xy), None), acc0, (xf, yf))
  if rem:
    acc = merge(acc, xs[nf * f:], ys[nf * f:])
  gam = gamma if math.isfinite(gamma) else 0.0
  fin = [descent.finalize(a, b, gam, config.fp_margin, config.neighbourhood == "remove")
         for a in tdef.flatten_up_to(acc)]
  return tuple(tdef.unflatten([t[i] for t in fin]) for i in range(3))


def _l1_step(t_l, t_u, t_n, lam):
  """Range of ``theta - lam * sign(theta)`` over ``[t_l, t_u]`` (lam = alpha * l1_reg)."""
  lo = t_l - lam * jnp.sign(t_l)
  lo = jnp.where((t_l <= 0) & (t_u > 0), jnp.minimum(lo, -lam), lo)
  hi = t_u - lam * jnp.sign(t_u)
  hi = jnp.where((t_l < 0) & (t_u >= 0), jnp.maximum(hi, lam), hi)
  return lo, hi, t_n - lam * jnp.sign(t_n)


def _outward(config: Config, lo: Any, hi: Any, *terms) -> tuple[Any, Any]:
  """Widens ``[lo, hi]`` by 4 eps (|lo| + sum |terms|) (rounding of the update), if enabled."""
  if not config.fp_margin:
    return lo, hi
  tm = jax.tree_util.tree_map

  def w(l, h, *ts):
    eps = jnp.finfo(l.dtype).eps
    mag = jnp.maximum(jnp.abs(l), jnp.abs(h)) + sum(jnp.abs(t) for t in ts)
    return l - 4 * eps * mag, h + 4 * eps * mag
  lo = tm(lambda l, h, *ts: w(l, h, *ts)[0], lo, hi, *terms)
  hi = tm(lambda l, h, *ts: w(l, h, *ts)[1], lo, hi, *terms)
  return lo, hi


def update(config: Config, state: State, d_n: Any, d_l: Any, d_u: Any) -> State:
  """The interval optimiser step (Alg. 1 line 10 with the options of spec §2.7)."""
  a = config.lr(state.step).astype(jax.tree_util.tree_leaves(state.params)[0].dtype)
  t_l, t_u = _split(state.bounds)
  t_n = state.params
  tm = jax.tree_util.tree_map
  l2, l1 = config.l2_reg, config.l1_reg
  if config.optimizer == "sgd":
    if l1:
      s_l = tm(lambda l, u, n: _l1_step(l, u, n, a * l1)[0], t_l, t_u, t_n)
      s_u = tm(lambda l, u, n: _l1_step(l, u, n, a * l1)[1], t_l, t_u, t_n)
      s_n = tm(lambda l, u, n: _l1_step(l, u, n, a * l1)[2], t_l, t_u, t_n)
    else:
      s = 1.0 - a * l2
      s_l, s_u, s_n = (tm(lambda p: s * p, t) for t in (t_l, t_u, t_n))
    new_n = tm(lambda p, g: p - a * g, s_n, d_n)
    new_l = tm(lambda p, g: p - a * g, s_l, d_u)
    new_u = tm(lambda p, g: p - a * g, s_u, d_l)
    new_l, new_u = _outward(config, new_l, new_u, t_l, t_u, tm(lambda g: a * g, d_u),
                            tm(lambda g: a * g, d_l))
    return State(new_n, _join(new_l, new_u), state.step + 1, state.mom)
  # momentum (torch convention, v_0 = 0): v <- m v + (1 - d) g; nesterov g <- g + m v.
  m, damp = config.momentum, config.dampening
  g_n = tm(lambda g, p: g + l2 * p, d_n, t_n)
  g_l = tm(lambda g, p: g + l2 * p, d_l, t_l)     # lambda * theta is increasing in theta
  g_u = tm(lambda g, p: g + l2 * p, d_u, t_u)
  v_n, v_l, v_u = state.mom
  v_n, v_l, v_u = (tm(lambda v, g: m * v + (1 - damp) * g, v, g)
                   for v, g in ((v_n, g_n), (v_l, g_l), (v_u, g_u)))
  if config.nesterov:
    u_n, u_l, u_u = (tm(lambda g, v: g + m * v, g, v)
                     for g, v in ((g_n, v_n), (g_l, v_l), (g_u, v_u)))
  else:
    u_n, u_l, u_u = v_n, v_l, v_u
  new_n = tm(lambda p, u: p - a * u, t_n, u_n)
  new_l = tm(lambda p, u: p - a * u, t_l, u_u)
  new_u = tm(lambda p, u: p - a * u, t_u, u_l)
  new_l, new_u = _outward(config, new_l, new_u, t_l, t_u, tm(lambda u: a * u, u_u),
                          tm(lambda u: a * u, u_l))
  return State(new_n, _join(new_l, new_u), state.step + 1, (v_n, v_l, v_u))


def make_step(model_apply: Callable, config: Config, backend: str = "mlp"
              ) -> Callable[[State, Array, Array], State]:
  """A pure, jittable ``step(state, x_batch, y_batch) -> state`` (one batch of Alg. 1).

  Args:
    model_apply: ``model_apply(params, X) -> outputs`` on a batch ``X``.
    config: the run's `Config` (static).
    backend: "mlp" (explicit Dense+ReLU passes) or "ibp" (``boundjax.ibp`` on any model); see
      `boundjax.agt.bounds`. ``fit`` resolves "auto" before calling this.
  """
  if backend not in ("mlp", "ibp"):
    raise ValueError(f"make_step: backend must be 'mlp' or 'ibp', got {backend!r}.")
  if config.bound_method != "interval":
    raise ValueError("make_step: bound_method='crown' needs CROWN with interval parameters, "
                     "which boundjax does not provide yet (boundjax.crown bounds input boxes); "
                     "use bound_method='interval' (the paper's choice).")

  def step(state: State, x_batch: Array, y_batch: Array) -> State:
    # the sound floating-point mode assumes float32 products (u = 2^-24): no TF32 passes
    with jax.default_matmul_precision("highest" if config.fp_margin else None):
      d_n, d_l, d_u = descent_directions(model_apply, config, backend, state.params,
                                         state.bounds, x_batch, y_batch)
      return update(config, state, d_n, d_l, d_u)
  return step


@functools.lru_cache(maxsize=64)
def _jitted_step(model_apply: Callable, config: Config, backend: str):
  """One compiled step per (model, config, back-end), so k-sweeps and ensembles reuse it."""
  return jax.jit(make_step(model_apply, config, backend))


def batches(n: int, config: Config) -> np.ndarray:
  """The fixed batch schedule: indices of shape (n // b, b) (seeded order, last batch dropped).

  The same batches are used in every epoch (fixed data order, spec §1.1 / §2.7).
  """
  b = config.batch_size
  if n < b:
    raise ValueError(f"fit: dataset has {n} points, fewer than batch_size={b}.")
  order = np.random.default_rng(config.seed).permutation(n)
  nb = n // b
  return order[: nb * b].reshape(nb, b)


def fit(model_apply: Callable, params: Any, X: Any, y: Any, config: Config, *,
        X_val: Any = None, y_val: Any = None, backend: str = "auto", progress: bool = True,
        history: Optional[list] = None, jit: bool = True, schedule: Any = None
        ) -> tuple[Any, Any]:
  """Runs AGT over ``config.n_epochs`` epochs of fixed batches; returns ``(params, bounds)``.

  Args:
    model_apply: ``model_apply(params, X) -> logits`` (batched).
    params: initial parameters theta'.
    X, y: training data (y: int labels for cross-entropy, {0,1} for BCE, targets for mse).
    config: the `Config`.
    X_val, y_val: optional validation data; each epoch appends nominal accuracy (or mse) and the
      fraction of validation points certified stable at ``config.k_private`` to ``history``.
    backend: "auto", "mlp" or "ibp" (`boundjax.agt.bounds`).
    progress: show a tqdm bar over steps.
    history: optional list receiving one dict per epoch.
    jit: compile the step (turn off only to debug).
    schedule: optional index batches of *every* step, shape ``(steps, B)``, ``-1`` marking empty
      slots, e.g. `boundjax.ensembles.batch_schedule` (reshuffled epochs, a smaller last batch),
      so that the box encloses the networks `boundjax.ensembles.train_ensemble` trains. Its
      rows must split evenly into ``config.n_epochs`` epochs. Default: `batches` (one fixed
      order, last incomplete batch dropped) repeated every epoch.

  Returns:
    The nominal parameters (plain SGD with clipping on the fixed batches) and a pytree like them
    with Interval leaves: every model the same training reaches after up to ``k_private``
    removals (and, for ``neighbourhood="add_remove"``, additions) per batch lies in it.
  """
  from tqdm.auto import tqdm
  X, y = jnp.asarray(X), jnp.asarray(y)
  if X.shape[0] != y.shape[0]:
    raise ValueError(f"fit: X has {X.shape[0]} rows but y has {y.shape[0]}.")
  backend = bnd.resolve(backend, model_apply, params, X[:2])
  epochs = _epoch_batches(X.shape[0], config, schedule)
  step = _jitted_step(model_apply, config, backend) if jit else make_step(model_apply, config,
                                                                          backend)
  state = init(params, config)
  total = sum(len(e) for e in epochs)
  bar = tqdm(total=total, desc=f"AGT k={config.k_private}", disable=not progress, leave=False)
  for epoch, sched in enumerate(epochs):
    for idx in sched:
      state = step(state, X[idx], y[idx])
      bar.update(1)
    if history is not None and X_val is not None:
      from boundjax.agt.certify import certify, predict
      pred = predict(model_apply, state.params, X_val, config.loss)
      rec = {"epoch": epoch + 1, "step": int(state.step)}
      if config.loss == "mse":
        rec["val_mse"] = float(jnp.mean((model_apply(state.params, X_val) - y_val) ** 2))
      else:
        rec["val_accuracy"] = float(jnp.mean(pred == jnp.asarray(y_val).astype(pred.dtype)))
        rec["val_certified"] = float(jnp.mean(certify(
            model_apply, state.params, state.bounds, X_val, backend=backend)))
      history.append(rec)
  bar.close()
  return state.params, state.bounds


def _epoch_batches(n: int, config: Config, schedule: Any) -> list[list[np.ndarray]]:
  """Per epoch, the index arrays of its steps (padding ``-1`` dropped; none may be empty)."""
  if schedule is None:
    fixed = list(batches(n, config))
    return [fixed] * config.n_epochs
  sched = np.asarray(schedule)
  if sched.ndim != 2 or not np.issubdtype(sched.dtype, np.integer):
    raise ValueError(f"fit: schedule must be a 2-D integer array, got {sched.dtype} {sched.shape}.")
  if sched.shape[0] % config.n_epochs:
    raise ValueError(f"fit: schedule has {sched.shape[0]} steps, not a multiple of n_epochs="
                     f"{config.n_epochs}.")
  if sched.max() >= n or sched.min() < -1:
    raise ValueError(f"fit: schedule holds an index outside [-1, {n - 1}].")
  rows = [r[r >= 0] for r in sched]
  for r in rows:
    if r.size <= config.k_private:
      raise ValueError(f"fit: a scheduled batch has {r.size} points, not more than "
                       f"k_private={config.k_private}.")
  per = sched.shape[0] // config.n_epochs
  return [rows[e * per:(e + 1) * per] for e in range(config.n_epochs)]

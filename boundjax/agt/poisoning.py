"""Poisoning certificates: AGT bounds for bounded modifications of training points.

Sosnin, Müller, Baader, Tsay and Wicker, "Certified Robustness to Data Poisoning in
Gradient-Based Training" (arXiv 2406.05670; the public AGT code's ``poison_certified_training``
and ``PoisoningGradientAccumulator``), built on the same interval training as the privacy
variant (AGT, Alg. 1).

Threat model (per batch B of size b, `boundjax.agt.Config`):

* feature poisoning: up to ``k_poison`` samples ``x_i`` may each be replaced by any
  ``x_i'`` with ``|x_i' - x_i|_inf <= epsilon``;
* label poisoning: up to ``label_k_poison`` samples may have their label changed: for the
  classification losses to any other class (or only to ``poison_target_idx``), for "mse" each
  target moves by up to ``label_epsilon`` (only output ``poison_target_idx`` when given);
* ``paired_poison``: the same samples carry both, so at most ``max(k_poison, label_k_poison)``
  samples change (the public code's rule); otherwise the two sets may differ and up to
  ``k_poison + label_k_poison`` samples change. Call that number ``k``. (The public code
  always takes the max, so its box covers only the paired threat: with the feature- and
  label-poisoned samples distinct it can miss ``min(k_poison, label_k_poison)`` of them.)

Bound on the descent direction. For every sample, with the parameter box ``[theta_L, theta_U]``:
``[wp_L, wp_U]`` bounds the clipped gradient at the clean sample (weight perturbation only,
AGT, App. B) and ``[iwp_L, iwp_U]`` bounds it over the input box ``[x - eps, x + eps]`` and the
label set as well (input and weight perturbation). A poisoned batch's sum is a sum of b terms,
at most k of them from the poisoned boxes, so element-wise (Sosnin et al.; the public code's
``PoisoningGradientAccumulator``; SEMin_k / SEMax_k sum the k smallest / largest values per
coordinate, AGT's Thm 4.6 notation, §4.2)

    dtheta_L = (sum_i wp_L[i] + SEMin_k{min(iwp_L[i] - wp_L[i], 0)}) / b
    dtheta_U = (sum_i wp_U[i] + SEMax_k{max(iwp_U[i] - wp_U[i], 0)}) / b

(SEMax_k: per-coordinate sum of the k largest). The clamp at 0 makes the bound valid for
fewer than k poisoned samples even where rounding makes an ``iwp`` bound narrower than its
``wp`` bound (the public code does not clamp; in exact arithmetic the input box contains the
clean point, so the differences have these signs anyway). The batch keeps its size, so the
mean is over b in every convention. The streaming form keeps running sums and the k extreme
differences per coordinate (`boundjax.agt.descent.topk_leading`, exact), like the AGT
paper's Thm 4.6 (§4.2) bound in `boundjax.agt.descent`.

By induction over steps (AGT, Thm 4.5, with this descent bound), the parameter box contains
every model the same training (initialisation, schedule, step sizes, clipping, optimiser)
reaches from any dataset poisoned within the budget in every batch; `boundjax.agt.certify`
on that box certifies that a prediction is unchanged by every such poisoning.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from boundjax.agt import bounds as bnd
from boundjax.agt import descent, mlp, select
from boundjax.agt.config import Config
from boundjax.core.interval import Interval
from boundjax.core.transforms import ibp

Array = jax.Array
_is_iv = lambda x: isinstance(x, Interval)  # noqa: E731


# ----------------------------------------------------------------------------------------------
# Loss gradients over a set of labels
# ----------------------------------------------------------------------------------------------

def label_logit_grad_bounds(loss: str, logits: Interval, y: Array, label_epsilon: float = 0.0,
                            target_idx: int = -1) -> Interval:
  """Bounds on ``d loss / d logits`` over the logit box and every poisoned label of ``y``.

  One sample (no batch axis). The label set and the bounds (exact per coordinate for a fixed
  logit vector; Sosnin et al. and the public code's bounded losses, tightened for a target):

  * "cross_entropy", untargeted (any class y'): ``grad_j = p_j - 1[y' = j]`` lies in
    ``[p_L,j - 1, p_U,j]``; targeted (y' in {y, t}): ``[p_L - max(e_y, e_t), p_U - min(e_y,
    e_t)]`` (``p_L, p_U`` the softmax bounds of AGT, App. B; e the one-hot vectors);
  * "binary_cross_entropy": ``sigmoid(z) - y'`` with y' in {0, 1} (untargeted) or {y, t};
  * "mse": ``2 (z - y') / m`` with ``|y' - y|_inf <= label_epsilon`` (only output t moves
    when targeted).
  """
  from boundjax.agt.losses import softmax_bounds
  zl, zu = logits.lower, logits.upper
  if loss == "cross_entropy":
    pl, pu = softmax_bounds(zl, zu)
    c = zl.shape[-1]
    oh = jax.nn.one_hot(y.astype(jnp.int32), c, dtype=zl.dtype)
    if target_idx < 0:
      return Interval(pl - 1.0, pu, validate=False)
    ot = jax.nn.one_hot(target_idx, c, dtype=zl.dtype)
    return Interval(pl - jnp.maximum(oh, ot), pu - jnp.minimum(oh, ot), validate=False)
  if loss == "binary_cross_entropy":
    yy = jnp.broadcast_to(y, zl.shape).astype(zl.dtype)
    if target_idx < 0:
      y_hi, y_lo = jnp.ones_like(yy), jnp.zeros_like(yy)
    else:
      t = jnp.asarray(float(target_idx), zl.dtype)
      y_hi, y_lo = jnp.maximum(yy, t), jnp.minimum(yy, t)
    return Interval(jax.nn.sigmoid(zl) - y_hi, jax.nn.sigmoid(zu) - y_lo, validate=False)
  if loss == "mse":
    yy = jnp.broadcast_to(y, zl.shape).astype(zl.dtype)
    e = jnp.full(zl.shape, label_epsilon, zl.dtype)
    if target_idx >= 0:
      e = e * jax.nn.one_hot(target_idx, zl.shape[-1], dtype=zl.dtype).reshape(zl.shape)
    m = zl.size
    return Interval(2 * (zl - yy - e) / m, 2 * (zu - yy + e) / m, validate=False)
  raise ValueError(f"label_logit_grad_bounds: unknown loss {loss!r}.")


def input_box(xs: Array, epsilon: float) -> Any:
  """The feature-poisoning box ``[x - epsilon, x + epsilon]`` (``xs`` itself when 0)."""
  if epsilon == 0:
    return xs
  return Interval(xs - epsilon, xs + epsilon, validate=False)


def _check_target(config: Config, n_out: int) -> None:
  t = config.poison_target_idx
  if config.label_k_poison and t >= 0 and config.loss != "binary_cross_entropy" and t >= n_out:
    raise ValueError(f"agt poisoning: poison_target_idx={t} but the model has {n_out} outputs.")


def poisoned_grad_bounds_fn(apply_fn: Callable, config: Config, backend: str
                            ) -> Callable[[Any, Array, Array], Any]:
  """``fn(param_bounds, xs, ys)``: per-sample gradient bounds over the parameter box, the input
  box ``[x - epsilon, x + epsilon]`` (when ``k_poison > 0``) and the poisoned labels (when
  ``label_k_poison > 0``); leading axis = sample, Interval leaves (unclipped).

  "mlp": the bounded Dense+ReLU passes of AGT, App. B with an input box and
  `label_logit_grad_bounds` between the forward and the backward pass.
  "ibp": without label poisoning, `boundjax.ibp` of the per-sample gradient with an input box;
  with it, the logits are bounded first (`bounds.forward_bounds_fn`), the label-set bounds on
  ``d loss / d logits`` computed, and the vector-Jacobian product ``d logits / d theta`` applied
  to that box by `boundjax.ibp` (sound: the logit gradient is bounded over every logit the
  models in the box can produce, as in App. B's backward pass).
  """
  eps = config.epsilon if config.k_poison > 0 else 0.0
  labels = config.label_k_poison > 0
  lg = None
  if labels:
    lg = lambda z, y: label_logit_grad_bounds(  # noqa: E731
        config.loss, z, y, config.label_epsilon, config.poison_target_idx)
  if backend == "mlp":
    def fn_mlp(pb, xs, ys):
      last = mlp.layers(pb)[-1]["bias"]
      _check_target(config, (last.lower if _is_iv(last) else last).shape[-1])
      return mlp.grad_bounds(pb, input_box(xs, eps), ys, config.loss, config.matmul, lg)
    return fn_mlp
  if not labels:
    plain = bnd.grad_bounds_fn(apply_fn, config.loss, backend, config.matmul)
    return lambda pb, xs, ys: plain(pb, input_box(xs, eps), ys)
  fwd = bnd.forward_bounds_fn(apply_fn, backend, config.matmul)

  def vjp_one(p, x, d):
    _, pull = jax.vjp(lambda q: apply_fn(q, x[None])[0], p)
    return pull(d)[0]
  bounded = ibp(jax.vmap(vjp_one, in_axes=(None, 0, 0)), matmul=config.matmul)

  def fn_ibp(pb, xs, ys):
    xb = input_box(xs, eps)
    z = fwd(pb, xb)
    shape, n = z.lower.shape, xs.shape[0]
    _check_target(config, z.lower.reshape(n, -1).shape[-1])
    d = jax.vmap(lambda zl, zu, y: lg(Interval(zl, zu, validate=False), y))(
        z.lower.reshape(n, -1), z.upper.reshape(n, -1), ys)
    d = Interval(d.lower.reshape(shape), d.upper.reshape(shape), validate=False)
    out = bounded(pb, xb, d)
    return jax.tree_util.tree_map(lambda o: o if _is_iv(o) else Interval(o, o, validate=False),
                                  out, is_leaf=_is_iv)
  return fn_ibp


# ----------------------------------------------------------------------------------------------
# The descent-direction bound (streaming, with descent.py's exact top-k selection)
# ----------------------------------------------------------------------------------------------

class PoisonAccumulator(NamedTuple):
  """Running state of the poisoning bound for one parameter leaf.

  Attributes:
    sums: `descent.Accumulator` with k = 0: sums of the nominal gradients and of the clean
      (weight-perturbed) bounds ``wp_L``, ``wp_U``.
    top_du: the k largest ``max(iwp_U - wp_U, 0)`` per coordinate, shape (*leaf, k).
    bot_dl: the k smallest ``min(iwp_L - wp_L, 0)`` per coordinate, shape (*leaf, k).
    sum_abs: sum of the largest magnitude of any bound (for `rounding_margin`).
  """
  sums: descent.Accumulator
  top_du: Array
  bot_dl: Array
  sum_abs: Array


def init_accumulator(leaf: Array, k: int) -> PoisonAccumulator:
  """Empty accumulator (k extreme slots filled with zeros: a difference is never needed below
  0 / above 0, so zeros are the neutral values of the clamped differences)."""
  z = jnp.zeros_like(leaf)
  shape = jnp.shape(leaf) + (k,)
  return PoisonAccumulator(descent.init_accumulator(leaf, 0), jnp.zeros(shape, z.dtype),
                           jnp.zeros(shape, z.dtype), z)


def accumulate(acc: PoisonAccumulator, g_n: Array, wp_l: Array, wp_u: Array, iwp_l: Array,
               iwp_u: Array, track_abs: bool = True) -> PoisonAccumulator:
  """Merges one fragment (leading axis = samples): sums by `descent.accumulate`, the k extreme
  clamped differences by `descent.topk_leading` (exact; independent of the fragment order)."""
  sums = descent.accumulate(acc.sums, g_n, wp_l, wp_u, None, track_abs=False)
  k = acc.top_du.shape[-1]
  top_du, bot_dl = acc.top_du, acc.bot_dl
  if k:
    top_du = select.merge(jnp.maximum(iwp_u - wp_u, 0), acc.top_du)
    bot_dl = select.merge(jnp.minimum(iwp_l - wp_l, 0), acc.bot_dl, largest=False)
  sum_abs = acc.sum_abs
  if track_abs:
    mag = jnp.maximum(jnp.maximum(jnp.abs(wp_l), jnp.abs(wp_u)),
                      jnp.maximum(jnp.abs(iwp_l), jnp.abs(iwp_u)))
    sum_abs = sum_abs + jnp.sum(mag, axis=0)
  return PoisonAccumulator(sums, top_du, bot_dl, sum_abs)


def accumulate_outer(acc: PoisonAccumulator, g: descent.Outer, wp: descent.Outer,
                     iwp: descent.Outer, gamma: float, track_abs: bool = True
                     ) -> PoisonAccumulator:
  """`accumulate` of a Dense kernel from its factors (`boundjax.agt.descent.Outer`): nominal
  ``g``, clean boxes ``wp`` and poisoned boxes ``iwp``, each entry's box the engine's product of
  the factor boxes, clipped to ``[-gamma, gamma]``. Natively (`descent.fused_outer`) in one pass
  without forming the (f, n, m) products (`select.accumulate_poison`); otherwise formed
  (`descent.outer_products`) and folded by `accumulate`."""
  dt = acc.sum_abs.dtype
  parts = (wp.z.lower, wp.z.upper, wp.d.lower, wp.d.upper, iwp.z.lower, iwp.z.upper,
           iwp.d.lower, iwp.d.upper, g.z, g.d)
  if descent.fused_outer(dt) and all(a.dtype == dt for a in parts):
    s = acc.sums
    sum_n, sum_l, sum_u, sum_abs, top_du, bot_dl = select.accumulate_poison(
        g.z, g.d, ((wp.z.lower, wp.z.upper), (wp.d.lower, wp.d.upper)),
        ((iwp.z.lower, iwp.z.upper), (iwp.d.lower, iwp.d.upper)), gamma,
        (s.sum_n, s.sum_l, s.sum_u, acc.sum_abs), acc.top_du, acc.bot_dl, track_abs)
    return PoisonAccumulator(descent.Accumulator(sum_n, sum_l, sum_u, s.top_l, s.bot_u,
                                                 s.sum_abs), top_du, bot_dl, sum_abs)
  g_n, clean = descent.outer_products(g, wp, gamma)
  poisoned = descent.outer_products(g, iwp, gamma)[1]
  return accumulate(acc, g_n, clean.lower, clean.upper, poisoned.lower, poisoned.upper,
                    track_abs)


def rounding_margin(acc: PoisonAccumulator, b: int) -> Array:
  """A bound on the floating-point error of both the bound and a retrained batch mean.

  Each side sums at most b + 2k terms (b bounds or gradients, k differences and their
  operands) of total magnitude at most 2 ``sum_abs`` (every term is bounded by the largest
  bound of its sample); recursive summation errs by at most (n - 1) u sum|x_i|, so
  ``4 (b + 2k + 2) eps sum_abs / b`` covers both sides and the division, with room.
  """
  k = acc.top_du.shape[-1]
  eps = jnp.finfo(acc.sum_abs.dtype).eps
  return 4 * (b + 2 * k + 2) * eps * acc.sum_abs / b


def finalize(acc: PoisonAccumulator, b: int, fp_margin: bool = False
             ) -> tuple[Array, Array, Array]:
  """``(dtheta_nominal, dtheta_L, dtheta_U)`` (module docstring): the clean sums plus the k
  most extreme poisoned differences, over b."""
  lo = (acc.sums.sum_l + jnp.sum(acc.bot_dl, -1)) / b
  hi = (acc.sums.sum_u + jnp.sum(acc.top_du, -1)) / b
  if fp_margin:
    m = rounding_margin(acc, b)
    lo, hi = lo - m, hi + m
  return acc.sums.sum_n / b, lo, hi


def descent_bounds_dense(wp_l: Array, wp_u: Array, iwp_l: Array, iwp_u: Array, k: int,
                         gamma: float = math.inf) -> tuple[Array, Array]:
  """Reference form of the poisoning bound by sorting the whole batch (leading axis = b).

  Clips every bound to ``[-gamma, gamma]`` first (clipping is monotone, AGT, §4.2).
  """
  b = wp_l.shape[0]
  if not 0 <= k < b:
    raise ValueError(f"poisoning descent bounds: need 0 <= k < batch size, got k={k}, b={b}.")
  wp_l, wp_u, iwp_l, iwp_u = (descent.clip(a, gamma) for a in (wp_l, wp_u, iwp_l, iwp_u))
  du = jnp.sort(jnp.maximum(iwp_u - wp_u, 0), axis=0)
  dl = jnp.sort(jnp.minimum(iwp_l - wp_l, 0), axis=0)
  lo = (jnp.sum(wp_l, 0) + jnp.sum(dl[:k], 0)) / b
  hi = (jnp.sum(wp_u, 0) + jnp.sum(du[b - k:], 0)) / b
  return lo, hi


def mlp_stages(config: Config, gfn: Callable, params: Any, box: Any
               ) -> tuple[Callable, Callable]:
  """The per-sample work of `descent_directions` for the "mlp" back-end with interval bounds,
  as the two pipeline stages of `boundjax.agt.descent.scan_fragments`.

  ``first(x, y)``: the clipped nominal gradients and the O(f * width) factors of both bounds
  (`boundjax.agt.mlp.grad_parts` at the clean points, and over the input box
  ``[x - epsilon, x + epsilon]`` with `label_logit_grad_bounds`); ``second`` turns both into
  the clipped O(f * #params) per-sample boxes (`boundjax.agt.mlp.grads_from_parts`). The same
  values as ``(clip(gfn), clip(bfn), clip(pfn))`` with ``bfn = mlp.grad_bounds`` and ``pfn``
  of `poisoned_grad_bounds_fn`, each stage's output written once (AGT, App. B).
  """
  eps = config.epsilon if config.k_poison > 0 else 0.0
  gamma = config.gamma
  lg = None
  if config.label_k_poison > 0:
    lg = lambda z, y: label_logit_grad_bounds(  # noqa: E731
        config.loss, z, y, config.label_epsilon, config.poison_target_idx)
  last = mlp.layers(box)[-1]["bias"]
  _check_target(config, (last.lower if _is_iv(last) else last).shape[-1])

  def first(x: Array, y: Array) -> tuple:
    return (x, y, mlp.grad_parts(box, x, y, config.loss, config.matmul),
            mlp.grad_parts(box, input_box(x, eps), y, config.loss, config.matmul, lg))

  def second(vals: tuple) -> tuple:
    x, y, clean, poisoned = vals
    return (descent.clip(gfn(params, x, y), gamma),
            descent.clip(mlp.grads_from_parts(box, clean, config.matmul), gamma),
            descent.clip(mlp.grads_from_parts(box, poisoned, config.matmul), gamma))

  def factors(vals: tuple) -> tuple:
    """``second`` with the kernels' values as factors (`descent.Outer`, folded natively by
    `accumulate_outer`; a kernel with fewer than `descent.FUSED_MIN_COLUMNS` columns forms
    them)."""
    x, y, clean, poisoned = vals
    trees = ([], [], [])
    for (zn, dn), (zc, dc), (zp, dp) in zip(mlp.per_sample_factors(params, x, y, config.loss),
                                            mlp.factors_from_parts(box, clean, config.matmul),
                                            mlp.factors_from_parts(box, poisoned, config.matmul)):
      g, wp, iwp = descent.Outer(zn, dn), descent.Outer(zc, dc), descent.Outer(zp, dp)
      if dn.shape[-1] < descent.FUSED_MIN_COLUMNS:
        g, wp = descent.outer_products(g, wp, gamma)
        iwp = descent.outer_products(descent.Outer(zn, dn), iwp, gamma)[1]
      for tree, kernel, bias in zip(trees, (g, wp, iwp), (dn, dc, dp)):
        tree.append({"kernel": kernel, "bias": descent.clip(bias, gamma)})
    return tuple(mlp.rebuild(params, t) for t in trees)
  fused = descent.fused_outer(jnp.result_type(*jax.tree_util.tree_leaves(params)))
  return first, (factors if fused else second)


def descent_directions(config: Config, gfn: Callable, bfn: Callable, pfn: Callable,
                       params: Any, box: Any, xs: Array, ys: Array,
                       stages: tuple[Callable, Callable] | None = None
                       ) -> tuple[Any, Any, Any]:
  """Nominal mean clipped gradient and its poisoning bounds ``(D_n, D_L, D_U)`` for one batch.

  ``gfn(params, xs, ys)``: nominal per-sample gradients; ``bfn(box, xs, ys)``: clean bounds;
  ``pfn(box, xs, ys)``: poisoned bounds (`poisoned_grad_bounds_fn`). Fragments of
  ``config.fragsize`` samples (`boundjax.agt.descent.scan_fragments`), as in
  `boundjax.agt.train.descent_directions`. ``stages``: the same per-sample values as two
  pipeline stages (`mlp_stages`) instead of ``gfn, bfn, pfn``.
  """
  b = xs.shape[0]
  k, gamma = config.poison_budget, config.gamma
  if k >= b:
    raise ValueError(f"AGT poisoning step: {k} poisoned samples per batch must be < batch size "
                     f"({b}).")

  def per_sample(x, y):
    return (descent.clip(gfn(params, x, y), gamma), descent.clip(bfn(box, x, y), gamma),
            descent.clip(pfn(box, x, y), gamma))
  if stages is not None:
    per_sample = stages

  def merge_leaf(acc, g_n, wp, iwp):
    if isinstance(g_n, descent.Outer):
      return accumulate_outer(acc, g_n, wp, iwp, gamma, track_abs=config.sound)
    return accumulate(acc, g_n, wp.lower, wp.upper, iwp.lower, iwp.upper, track_abs=config.sound)
  like = None     # (the chunk: `descent.scan_fragments`)
  if stages is not None and descent.fused_outer(
      jnp.result_type(*jax.tree_util.tree_leaves(params))):
    like = mlp.chunk_values(params, boxes=2)
  return descent.scan_fragments(params, xs, ys, config.fragsize, lambda p: init_accumulator(p, k),
                                per_sample, merge_leaf, lambda a: finalize(a, b, config.sound),
                                like)

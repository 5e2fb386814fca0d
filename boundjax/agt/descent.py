"""Bounds on the descent direction of one batch (AGT, Thm 4.6 in §4.2).

Per-sample gradient bounds ``delta_L[i] <= Clip_gamma(grad_i) <= delta_U[i]`` (valid for every
parameter in the current box) give, for every batch B~ obtained from the nominal batch B of size
b by removing r <= k points and adding a <= k points, element-wise (AGT, Thm 4.6)

    dtheta_L = (SEMin_{b-k}{delta_L[i]} - k * gamma) / b
    dtheta_U = (SEMax_{b-k}{delta_U[i]} + k * gamma) / b

where SEMin_a / SEMax_a sum the a smallest / largest values per coordinate (AGT, Thm 4.6 in
§4.2; App. D.4).

Which mean is bounded (``normalise``):

* ``"actual"`` (default): ``sum_{B~} Clip(g) / |B~|``, SGD on the batch actually drawn. This is
  the training algorithm M of the privacy argument: Alg. 1 line 6 and App. D.3 (eq. 17) take
  the mean over the batch, and Thm 4.6 states its Delta theta with ``1 / |B~|``; a dataset at
  distance k (Def 4.3, Hamming distance of §3.1: additions and removals) is trained by the same
  M. The bound above covers it for every r, a <= k and is attained: the worst multiset is the
  b - r largest upper bounds plus a copies of gamma; its mean never decreases when one more
  smallest element is dropped (it is below the mean) or one more gamma is added (every element
  is <= gamma), so the maximum is at r = a = k, of size exactly b.
* ``"nominal"``: ``sum_{B~} Clip(g) / b``, the fixed-1/b convention (the public code's nominal
  and bound updates). Thm 4.6's bound covers it only when the batch does not grow (a <= r):
  with a > r the sum has more than b terms, e.g. every gradient negative and k additions at
  -gamma without removal give ``(sum_i delta_L[i] - k gamma) / b`` < dtheta_L. Its own worst
  case removes only the points that help, ``r`` of the k extreme ones with the wrong sign:

      dtheta_L = (sum_i delta_L[i] - sum top_k max(delta_L, 0) - k * gamma) / b
      dtheta_U = (sum_i delta_U[i] - sum bottom_k min(delta_U, 0) + k * gamma) / b

  which is never tighter than Thm 4.6's and also covers the "actual" mean (it is the maximum
  over r, a <= k of ``(SEMax_{b-r} + a gamma) / b``, and the "actual" maximum is its r = a = k
  term).

``neighbourhood="remove"`` (unlearning, no additions; the public code's rule): "actual" is
``SEMin_{b-k}(delta_L) / (b - k)``, ``SEMax_{b-k}(delta_U) / (b - k)`` (the mean of the b - r
smallest lower bounds only grows as r shrinks); "nominal" is the formula above without the
gamma terms. Neither needs clipping.

With k << b the sums are computed as ``sum - topk_k`` (streaming form, as in the public code):
the batch is processed in fragments keeping the running sums and only the k extreme values per
coordinate, so memory is O(k * d) instead of O(b * d). The k largest of a fragment are selected
exactly by a two-level search (`topk_leading`): group maxima first, then only the k best groups.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.agt import select
from boundjax.agt.select import topk_leading  # noqa: F401  (the exact XLA top-k, re-exported)
from boundjax.core.interval import Interval
from boundjax.core.transforms import ibp

Array = jax.Array
Normalise = Literal["actual", "nominal"]
Neighbourhood = Literal["add_remove", "remove"]
_is_iv = lambda x: isinstance(x, Interval)  # noqa: E731
NORMALISATIONS = ("actual", "nominal")
NEIGHBOURHOODS = ("add_remove", "remove")


def clip(g: Any, gamma: float) -> Any:
  """Element-wise clipping ``Clip_gamma(g) = min(max(g, -gamma), gamma)`` (AGT, §4.2).

  Monotone, so an Interval clips endpoint-wise. Works on arrays, Intervals and pytrees of them.
  """
  def one(x):
    if isinstance(x, Interval):
      return Interval(jnp.clip(x.lower, -gamma, gamma), jnp.clip(x.upper, -gamma, gamma),
                      validate=False)
    return jnp.clip(x, -gamma, gamma)
  return jax.tree_util.tree_map(one, g, is_leaf=lambda x: isinstance(x, Interval))


def semin(values: Array, a: int) -> Array:
  """``SEMin_a``: per-coordinate sum of the ``a`` smallest of ``values[0], ..., values[b-1]``."""
  return jnp.sum(jnp.sort(values, axis=0)[:a], axis=0)


def semax(values: Array, a: int) -> Array:
  """``SEMax_a``: per-coordinate sum of the ``a`` largest of ``values[0], ..., values[b-1]``."""
  b = values.shape[0]
  return jnp.sum(jnp.sort(values, axis=0)[b - a:], axis=0)


def descent_bounds_dense(delta_l: Array, delta_u: Array, k: int, gamma: float,
                         normalise: Normalise = "actual",
                         neighbourhood: Neighbourhood = "add_remove", sound: bool = False
                         ) -> tuple[Array, Array]:
  """Thm 4.6 by sorting the whole batch (reference form; leading axis = batch of size b).

  Same arguments and result as `descent_bounds` (without ``fragsize``).
  """
  b = delta_l.shape[0]
  _check(k, b, normalise, neighbourhood)
  _check_gamma(k, gamma, neighbourhood)
  delta_l, delta_u = clip(delta_l, gamma), clip(delta_u, gamma)
  s_l, s_u = jnp.sort(delta_l, axis=0), jnp.sort(delta_u, axis=0)
  acc = Accumulator(jnp.sum(delta_l, 0), jnp.sum(delta_l, 0), jnp.sum(delta_u, 0),
                    jnp.moveaxis(s_l[b - k:], 0, -1), jnp.moveaxis(s_u[:k], 0, -1),
                    jnp.sum(jnp.maximum(jnp.abs(delta_l), jnp.abs(delta_u)), 0))
  gam = gamma if neighbourhood == "add_remove" and k else 0.0
  _, lo, hi = finalize(acc, b, gam, sound, neighbourhood == "remove", normalise)
  return lo, hi


def _check_k(k: int, b: int) -> None:
  if k < 0 or k >= b:
    raise ValueError(f"descent bounds: need 0 <= k < batch size, got k={k}, b={b}.")


def _check(k: int, b: int, normalise: str, neighbourhood: str) -> None:
  _check_k(k, b)
  if normalise not in NORMALISATIONS:
    raise ValueError(f"descent bounds: normalise must be one of {NORMALISATIONS}, got "
                     f"{normalise!r}.")
  if neighbourhood not in NEIGHBOURHOODS:
    raise ValueError(f"descent bounds: neighbourhood must be one of {NEIGHBOURHOODS}, got "
                     f"{neighbourhood!r}.")


class Accumulator(NamedTuple):
  """Running state of the streaming Thm 4.6 bound for one parameter leaf.

  Attributes:
    sum_n: sum of nominal clipped per-sample gradients.
    sum_l, sum_u: sums of the lower / upper per-sample bounds.
    top_l: the k largest lower bounds per coordinate, shape (*leaf, k) (-inf until filled),
      in any order along the last axis (only their sum is used).
    bot_u: the k smallest upper bounds per coordinate, shape (*leaf, k) (+inf until filled),
      in any order.
    sum_abs: sum of max(|delta_L|, |delta_U|), for the rounding-error margin of `finalize`.
  """
  sum_n: Array
  sum_l: Array
  sum_u: Array
  top_l: Array
  bot_u: Array
  sum_abs: Array


def init_accumulator(leaf: Array, k: int) -> Accumulator:
  z = jnp.zeros_like(leaf)
  shape = jnp.shape(leaf) + (k,)
  return Accumulator(z, z, z, jnp.full(shape, -jnp.inf, z.dtype), jnp.full(shape, jnp.inf, z.dtype),
                     z)


_REDUCE_MAX = 8192   # leaf size up to which fragment sums are plain reductions (CPU timings)


def accumulate(acc: Accumulator, g_n: Array, d_l: Array, d_u: Array, mask: Array | None,
               track_abs: bool = True) -> Accumulator:
  """Merges one fragment (leading axis = samples; ``mask`` marks real samples, 0 for padding;
  ``None`` when every sample is real). ``track_abs=False`` leaves ``sum_abs`` (used only by the
  floating-point margin) untouched, saving a pass over the fragment.

  Merging selects the top k of the running k extremes and the fragment (exact), so the result
  does not depend on fragment size or order. On CPU the whole fold (sums and extremes) is one
  native pass over the fragment (`boundjax.agt.select.accumulate`; the sums then follow the
  sample order); the XLA form below is the reference and runs elsewhere.
  """
  f = g_n.shape[0]
  if mask is None and select.use_native(d_l.dtype) and d_l.dtype == d_u.dtype == g_n.dtype:
    sum_n, sum_l, sum_u, sum_abs, top_l, bot_u = select.accumulate(
        g_n, d_l, d_u, (acc.sum_n, acc.sum_l, acc.sum_u, acc.sum_abs), acc.top_l, acc.bot_u,
        track_abs)
    return Accumulator(sum_n, sum_l, sum_u, top_l, bot_u, sum_abs)
  if mask is None and g_n[0].size <= _REDUCE_MAX:
    # A plain reduction: XLA fuses it into the element-wise producer of the per-sample values
    # (outer product, clipping), so those are not written out just to be summed (3x faster
    # per fragment than the product below for the 128x32 kernel of benchmarks/agt.py).
    wsum = lambda a: jnp.sum(a, axis=0)  # noqa: E731
  else:
    # Sums over the sample axis as a (1, f) x (f, d) product: for large leaves (the 384x100
    # kernel) XLA's CPU reduction over a leading axis is an order of magnitude slower.
    w = jnp.ones((f,), g_n.dtype) if mask is None else mask.astype(g_n.dtype)  # 0/1: padding
    wsum = lambda a: (w @ a.reshape(f, -1)).reshape(a.shape[1:])  # noqa: E731
  sum_n = acc.sum_n + wsum(g_n)
  sum_l = acc.sum_l + wsum(d_l)
  sum_u = acc.sum_u + wsum(d_u)
  # g_n lies in [d_l, d_u] (the box contains the nominal parameters), so this bounds |g_n| too.
  sum_abs = acc.sum_abs
  if track_abs:
    sum_abs = sum_abs + wsum(jnp.maximum(jnp.abs(d_l), jnp.abs(d_u)))
  k = acc.top_l.shape[-1]
  if k == 0:
    return Accumulator(sum_n, sum_l, sum_u, acc.top_l, acc.bot_u, sum_abs)
  cand_l, cand_u = d_l, d_u
  if mask is not None:
    m = mask.reshape((-1,) + (1,) * (g_n.ndim - 1)).astype(bool)
    cand_l = jnp.where(m, d_l, -jnp.inf)
    cand_u = jnp.where(m, d_u, jnp.inf)
  top_l = select.merge(cand_l, acc.top_l)
  bot_u = select.merge(cand_u, acc.bot_u, largest=False)
  return Accumulator(sum_n, sum_l, sum_u, top_l, bot_u, sum_abs)


class Outer(NamedTuple):
  """A Dense kernel's per-sample values given by their factors: sample i's value is the outer
  product ``z[i] (x) d[i]`` (and, for boxes, the corner product of the two boxes, as
  ``boundjax.ibp`` forms it), ``z`` (f, n), ``d`` (f, m): arrays (nominal values) or Intervals
  (bounds). `accumulate_outer` folds them without forming the (f, n, m) products."""
  z: Any
  d: Any


def _outer_leaf(x: Any) -> bool:
  return isinstance(x, (Interval, Outer))


def fused_outer(dtype) -> bool:
  """True when `accumulate_outer` folds factors natively for ``dtype`` (else it forms the
  products, and callers that can should form them in a stage of their own)."""
  return select.use_native(dtype)


def accumulate_outer(acc: Accumulator, g: Outer, box: Outer, gamma: float,
                     track_abs: bool = True) -> Accumulator:
  """`accumulate` of a Dense kernel's clipped per-sample values from their factors: nominal
  ``Clip_gamma(g.z[i] (x) g.d[i])`` and bounds ``Clip_gamma`` of the engine's product of the
  boxes ``box.z[i]``, ``box.d[i]`` (corner products, ``0 · ∞ = 0``). Natively (`fused_outer`):
  one pass over the factors, the O(f · n · m) products never written (`select.accumulate_outer`;
  the same extremes as forming them, the same sums up to their order); otherwise the products
  are formed (`outer_products`) and folded by `accumulate`."""
  zl, zu, dl, du = box.z.lower, box.z.upper, box.d.lower, box.d.upper
  dt = acc.sum_l.dtype
  if fused_outer(dt) and all(a.dtype == dt for a in (zl, zu, dl, du, g.z, g.d)):
    sum_n, sum_l, sum_u, sum_abs, top_l, bot_u = select.accumulate_outer(
        g.z, g.d, (zl, zu), (dl, du), gamma, (acc.sum_n, acc.sum_l, acc.sum_u, acc.sum_abs),
        acc.top_l, acc.bot_u, track_abs)
    return Accumulator(sum_n, sum_l, sum_u, top_l, bot_u, sum_abs)
  g_n, prod = outer_products(g, box, gamma)
  return accumulate(acc, g_n, prod.lower, prod.upper, None, track_abs)


def outer_products(g: Outer, box: Outer, gamma: float) -> tuple[Array, Interval]:
  """The clipped per-sample values `accumulate_outer` folds, formed: ``Clip_gamma(g.z[i] (x)
  g.d[i])`` and ``Clip_gamma`` of the engine's product of the boxes, (f, n, m) each."""
  prod = ibp(  # the engine's product, as `boundjax.agt.mlp`'s
      lambda z, d: z[:, :, None] * d[:, None, :])(box.z, box.d)
  prod = prod if isinstance(prod, Interval) else Interval(prod, prod, validate=False)
  return clip(g.z[:, :, None] * g.d[:, None, :], gamma), clip(prod, gamma)


FUSED_MIN_COLUMNS = 16
"""Kernels with fewer output columns than this form their per-sample products instead (a row
of the native fold is too short to vectorise; `boundjax.agt.train.descent_directions`)."""


CHUNK_BYTES = 8 * 2 ** 20
"""Memory budget of one per-sample array of a chunk (`chunk_size`), in bytes."""


def chunk_size(params: Any, b: int, fragsize: int, budget: int | None = None) -> int:
  """Samples per chunk of `scan_fragments`: ``min(fragsize, b, budget // (#params * itemsize))``
  (at least 1), so that each per-sample array of a chunk (f x #params values) takes at most
  ``budget`` bytes (default `CHUNK_BYTES`).

  The budget keeps a chunk's arrays in the last-level cache and below the C allocator's
  threshold for fresh memory maps (32 MB with glibc: every larger buffer is mapped anew and
  page-faulted on first touch, about 6x the cost of an element-wise pass over it, measured in
  benchmarks/agt.py). The bounds do not depend on the chunk size (exact merges; the sums up to
  their rounding order).
  """
  leaves = jax.tree_util.tree_leaves(params)
  per_sample = sum(int(np.size(l)) * jnp.dtype(jnp.result_type(l)).itemsize for l in leaves)
  budget = CHUNK_BYTES if budget is None else budget
  return max(1, min(int(fragsize), int(b), budget // max(per_sample, 1)))


def scan_fragments(params: Any, xs: Array, ys: Array, fragsize: int,
                   init_leaf: Callable[[Array], Any],
                   per_sample: Callable[[Array, Array], tuple[Any, ...]],
                   merge_leaf: Callable[..., Any],
                   finalize_leaf: Callable[[Any], tuple[Array, Array, Array]],
                   per_sample_like: Any = None) -> tuple[Any, Any, Any]:
  """The streaming form of a batch's descent-direction bound (AGT, Thm 4.6 in §4.2; the
  poisoning bound of `boundjax.agt.poisoning` has the same shape), for any accumulator.

  The batch ``xs, ys`` (leading axis = b samples) is cut into fragments of `chunk_size`
  samples (at most ``fragsize``, and within the memory budget `CHUNK_BYTES` per array): a ``lax.scan`` over the full fragments, then the remainder on its own (no padding, so
  no masking is needed). Per fragment, ``per_sample(x, y)`` returns a tuple of pytrees shaped
  like ``params`` (per-sample gradients and their bounds, leading axis = sample; `Interval`
  leaves allowed); or ``per_sample`` is a pair ``(first, second)`` with ``first(x, y)`` any
  pytree and ``second(first(x, y))`` that tuple; and ``merge_leaf(acc, *leaves)`` folds one
  parameter leaf's values into its accumulator (``init_leaf(param_leaf)`` at the start).
  ``finalize_leaf(acc)`` turns each accumulator into ``(D_n, D_L, D_U)``; the result is that
  triple as three pytrees like ``params``. ``per_sample_like`` (default ``params``), a pytree
  as large as one sample's values, sets the chunk (`chunk_size`). Memory is O(fragsize *
  #params) plus the accumulators, whatever b (O(fragsize * width) for factors, `Outer`).

  Each stage's output is written once (`_written`) and read by the next stage or the merge.
  Computed and consumed in one expression, XLA fuses a long element-wise producer (the
  engine's bounds: NaN guards, 0 * inf products, a transposed product) into each of its
  consumers (sums, group maxima, the gathered groups of the top-k) and recomputes it there,
  through index-remapping reshapes; ``optimization_barrier`` does not prevent that on CPU (XLA
  removes it before fusion). Carrying the outputs to the next iteration of the scan forces one
  write as well, but XLA then copies every carried buffer twice per iteration (it cannot prove
  that the merge reads the old value before the next stage writes the new one). The
  per-sample values are the same in both forms, merged in the same order; the sums over a
  fragment are XLA's reductions of those values, whose summation order XLA picks per
  compiled reduction (bit for bit the same boxes on the public task of benchmarks/agt.py;
  last-bit differences on other shapes, which the ``sound`` margin covers for any order).
  """
  b = xs.shape[0]
  f = chunk_size(params if per_sample_like is None else per_sample_like, b, fragsize)
  nf, rem = divmod(b, f)
  tdef = jax.tree_util.tree_structure(params)
  acc0 = [init_leaf(p) for p in jax.tree_util.tree_leaves(params)]

  stages = tuple(per_sample) if isinstance(per_sample, (tuple, list)) else (per_sample,)

  def run(x: Array, y: Array) -> Any:
    never = _never(x)
    vals = _written(stages[0], never, x, y)
    for stage in stages[1:]:
      vals = _written(stage, never, vals)
    return vals

  def merge(acc: list, trees: Any) -> list:
    leaves = [jax.tree_util.tree_leaves(t, is_leaf=_outer_leaf) for t in trees]
    return [merge_leaf(a, *ls) for a, *ls in zip(acc, *leaves)]

  xf = xs[: nf * f].reshape((nf, f) + xs.shape[1:])
  yf = ys[: nf * f].reshape((nf, f) + ys.shape[1:])
  if nf == 1:
    acc = merge(acc0, run(xf[0], yf[0]))
  else:
    acc, _ = jax.lax.scan(lambda a, xy: (merge(a, run(*xy)), None), acc0, (xf, yf))
  if rem:
    acc = merge(acc, run(xs[nf * f:], ys[nf * f:]))
  fin = [finalize_leaf(a) for a in acc]
  return tuple(tdef.unflatten([t[i] for t in fin]) for i in range(3))


def _never(x: Array) -> Array:
  """A boolean scalar that is always False but not known to the compiler: ``v > v`` for the
  first element v of ``x`` (False for every number, NaN included)."""
  v = jnp.ravel(x)[0]
  return v > v


def _written(fn: Callable, never: Array, *args: Any) -> Any:
  """``fn(*args)``, computed as the taken branch of a ``lax.cond`` on ``never`` (always False;
  the other branch gives zeros of the same shapes).

  The result of a conditional is written to memory once and its consumers read it: XLA does
  not fuse the branch's element-wise producers into the consumers outside, so nothing is
  recomputed per consumer, and nothing is carried through a loop (no copies). The values are
  those of ``fn(*args)``: the zero branch is never taken.
  """
  shapes = jax.eval_shape(fn, *args)

  def zeros(*_: Any) -> Any:
    return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  return jax.lax.cond(never, zeros, fn, *args)


def rounding_margin(acc: Accumulator, b: int, gamma: float, remove_only: bool = False) -> Array:
  """A bound on the floating-point error of the batch means (bound side and retrained side).

  Recursive summation of n terms errs by at most (n - 1) u sum|x_i| (u = unit roundoff); the
  bound and any retrained run each sum at most b + k terms of magnitude <= sum_abs + k gamma,
  so ``2 (b + k + 2) eps (sum_abs + k gamma) / b`` covers both (and the final division, which
  XLA may do as a product with 1/b) with room to spare, for either normalisation. With
  ``remove_only`` no term is added (gamma is not used) and the means divide by ``b - k`` or
  more.
  """
  k = acc.top_l.shape[-1]
  eps = jnp.finfo(acc.sum_l.dtype).eps
  if remove_only:
    return 2 * (b + 2) * eps * acc.sum_abs / (b - k)
  return 2 * (b + k + 2) * eps * (acc.sum_abs + k * gamma) / b


def _selected_sums(acc: Accumulator, normalise: str) -> tuple[Array, Array]:
  """The sums over the kept nominal points that minimise / maximise the batch (numerators).

  "actual": ``SEMin_{b-k}(delta_L) = sum - topk_k`` and ``SEMax_{b-k}(delta_U) = sum -
  bottomk_k``. "nominal": only the extreme values that lower (raise) the sum are dropped,
  ``sum - sum topk_k max(delta_L, 0)`` and ``sum - sum bottomk_k min(delta_U, 0)``.
  """
  top_l, bot_u = acc.top_l, acc.bot_u
  if normalise == "nominal":
    top_l, bot_u = jnp.maximum(top_l, 0), jnp.minimum(bot_u, 0)
  return acc.sum_l - jnp.sum(top_l, -1), acc.sum_u - jnp.sum(bot_u, -1)


def finalize(acc: Accumulator, b: int, gamma: float, sound: bool = False,
             remove_only: bool = False, normalise: Normalise = "actual"
             ) -> tuple[Array, Array, Array]:
  """Returns ``(dtheta_nominal, dtheta_L, dtheta_U)`` from a full batch of size b.

  The bound on the mean of every batch with up to k removals and (unless ``remove_only``) up
  to k additions, for the ``normalise`` convention (module docstring; AGT, Thm 4.6):

  * "actual", add/remove: ``(SEMin_{b-k}(delta_L) - k gamma) / b``,
    ``(SEMax_{b-k}(delta_U) + k gamma) / b``;
  * "actual", ``remove_only`` (the public code's unlearning rule):
    ``SEMin_{b-k}(delta_L) / (b - k)``, ``SEMax_{b-k}(delta_U) / (b - k)``;
  * "nominal" (fixed 1/b): `_selected_sums` minus / plus ``k gamma`` (0 when ``remove_only``),
    over b.

  With ``sound`` the bounds are widened by `rounding_margin` (floating-point soundness).
  """
  k = acc.top_l.shape[-1]
  if normalise not in NORMALISATIONS:
    raise ValueError(f"finalize: normalise must be one of {NORMALISATIONS}, got {normalise!r}.")
  if k == 0:
    lo, hi = acc.sum_l / b, acc.sum_u / b
  else:
    sum_l, sum_u = _selected_sums(acc, normalise)
    if remove_only:
      n = b - k if normalise == "actual" else b
      lo, hi = sum_l / n, sum_u / n
    else:
      lo, hi = (sum_l - k * gamma) / b, (sum_u + k * gamma) / b
  if sound:
    m = rounding_margin(acc, b, gamma, remove_only)
    lo, hi = lo - m, hi + m
  return acc.sum_n / b, lo, hi


def descent_bounds(delta_l: Array, delta_u: Array, k: int, gamma: float,
                   fragsize: int | None = None, normalise: Normalise = "actual",
                   neighbourhood: Neighbourhood = "add_remove", sound: bool = False
                   ) -> tuple[Array, Array]:
  """Bounds on the batch mean under up to k removals and k additions (AGT, Thm 4.6), in
  streaming form (leading axis = batch); equals `descent_bounds_dense`.

  Args:
    delta_l, delta_u: per-sample gradient bounds, shape (b, ...); clipped to [-gamma, gamma]
      here (Clip is monotone, so clipped bounds bound the clipped gradient).
    k: removals and additions per batch, 0 <= k < b.
    gamma: clipping level (> 0; finite when k > 0 with "add_remove").
    fragsize: samples per fragment (default: the whole batch).
    normalise: which mean is bounded: "actual" (``/ |B~|``, SGD on the changed batch, the
      convention of the privacy argument) or "nominal" (``/ b`` fixed; a wider bound that
      covers both). See the module docstring.
    neighbourhood: "add_remove" (up to k removals and k additions) or "remove" (removals
      only).
    sound: widen by `rounding_margin` (floating-point soundness).
  """
  b = delta_l.shape[0]
  _check(k, b, normalise, neighbourhood)
  _check_gamma(k, gamma, neighbourhood)
  delta_l, delta_u = clip(delta_l, gamma), clip(delta_u, gamma)
  f = b if fragsize is None else min(fragsize, b)
  acc = init_accumulator(delta_l[0], k)
  for s in range(0, b, f):
    sl = slice(s, s + f)
    acc = accumulate(acc, delta_l[sl], delta_l[sl], delta_u[sl], None)
  gam = gamma if neighbourhood == "add_remove" and k else 0.0
  _, lo, hi = finalize(acc, b, gam, sound, neighbourhood == "remove", normalise)
  return lo, hi


def _check_gamma(k: int, gamma: float, neighbourhood: str) -> None:
  if not gamma > 0:
    raise ValueError(f"descent bounds: gamma must be > 0 (math.inf: no clipping), got {gamma!r}.")
  if k and neighbourhood == "add_remove" and not math.isfinite(gamma):
    raise ValueError("descent bounds: gamma must be finite when k > 0 with additions (each "
                     "added point moves the mean by up to gamma per coordinate, Thm 4.6).")

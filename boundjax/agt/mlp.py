"""Dense+ReLU networks for AGT: the nominal passes and their bounds (AGT, App. B).

AGT needs, for a box of parameters, bounds on the logits (forward IBP with interval parameters,
§2.2), on the gradient of the loss w.r.t. the logits (the tight rules of §2.3,
`boundjax.agt.losses`) and on the per-sample parameter gradients (the backward interval pass,
§2.4). Here the passes are written once, as plain JAX functions of the parameters
(`preactivations`, `backward`, `margins`), and bounded by the package's one engine,
``boundjax.ibp`` (`forward_bounds`, `backward_bounds`, `grad_bounds`, `margin_bounds`): every
product of two boxes is the engine's ``matmul`` ("midrad", "signsplit", "exact" or "best"); a
product with a point or with a sign-definite factor (``x (x) d``, ``relu(zhat) (x) d``) is exact,
and ``jnp.where(zhat > 0, v, 0)`` with a box ``zhat`` gives ``v``, ``0`` or the hull of both,
i.e. H(zhat) (.) v with H = 1[zhat > 0] applied to both ends. The loss-gradient step sits
between the bounded forward and the bounded backward pass, so a rule that is not a function of
the logits (a set of labels, `boundjax.agt.poisoning`) can replace it.

Parameters are a sequence of Dense layers ``{"kernel": (in, out), "bias": (out,)}`` applied as
``z = relu(z @ kernel + bias)`` with no ReLU after the last layer. Accepted containers: a list or
tuple of such dicts, a dict ``{"Dense_0": ..., "Dense_1": ...}`` (Flax ``nn.Dense`` naming, any
prefix, ordered by the trailing number) or that dict under a ``"params"`` key: whatever
`boundjax.models.dense_layers` reads (``layers`` and ``rebuild`` here are that parser).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from boundjax.agt import descent, losses
from boundjax.core.interval import Interval
from boundjax.core.transforms import ibp
from boundjax.models import dense_layers, mlp_layer_values, rebuild_dense

Array = jax.Array


# ----------------------------------------------------------------------------------------------
# Parameter containers: the package's one Dense-stack parser (`boundjax.models.dense_layers`)
# ----------------------------------------------------------------------------------------------

layers = dense_layers
rebuild = rebuild_dense

def init(key: Array, sizes: list[int], dtype=jnp.float32) -> list[dict]:
  """He-uniform (torch ``nn.Linear``-like) initialisation of a Dense+ReLU network."""
  out = []
  for din, dout in zip(sizes[:-1], sizes[1:]):
    key, k1, k2 = jax.random.split(key, 3)
    lim = 1.0 / jnp.sqrt(din)
    out.append({"kernel": jax.random.uniform(k1, (din, dout), dtype, -lim, lim),
                "bias": jax.random.uniform(k2, (dout,), dtype, -lim, lim)})
  return out


def apply(params: Any, x: Array) -> Array:
  """Nominal forward pass ``relu(... relu(x W1 + b1) ...) WK + bK`` (works batched)."""
  ls = layers(params)
  z = x
  for i, l in enumerate(ls):
    z = z @ l["kernel"] + l["bias"]
    if i < len(ls) - 1:
      z = jax.nn.relu(z)
  return z


# ----------------------------------------------------------------------------------------------
# The nominal passes, and their bounds through `boundjax.ibp`
# ----------------------------------------------------------------------------------------------

def preactivations(params: Any, x: Array) -> list:
  """``[zhat^1, ..., zhat^K]`` of the forward pass (``zhat^K`` = the logits); ``x`` with or without
  a batch axis."""
  return list(mlp_layer_values(params, x)[::2])


def deltas(params: Any, pre: list, d: Array) -> list:
  """``[d^1, ..., d^K]``: the gradient of the loss w.r.t. every pre-activation, from the logit
  gradient ``d = d^K``: ``d^{k-1} = (W^k d^k) (.) H(zhat^{k-1})``, H = 1[zhat > 0] (H(0) = 0, as
  the gradient of jax.nn.relu). ``pre`` = ``[zhat^1, ..., zhat^{K-1}]``; optional leading batch
  axis."""
  ls = layers(params)
  out = [d]
  for i in range(len(ls) - 1, 0, -1):
    wd = jnp.moveaxis(jnp.tensordot(ls[i]["kernel"], d, ([1], [d.ndim - 1])), 0, -1)
    d = jnp.where(pre[i - 1] > 0, wd, 0)
    out.insert(0, d)
  return out


def layer_factors(params: Any, x: Array, pre: list, ds: list) -> list:
  """The factors of every layer's per-sample gradients: ``[(z^0, d^1), ..., (z^{K-1}, d^K)]``
  with ``z^0 = x`` and ``z^k = relu(zhat^k)``; layer k's kernel gradient is their outer product
  ``z^{k-1} (x) d^k`` and its bias gradient ``d^k`` (`layer_grads`)."""
  del params   # (the signature of `layer_grads`)
  return [(x if i == 0 else jax.nn.relu(pre[i - 1]), d) for i, d in enumerate(ds)]


def layer_grads(params: Any, x: Array, pre: list, ds: list) -> Any:
  """Per-sample parameter gradients from `deltas` ``ds``: layer k's are ``z^{k-1} (x) d^k``
  (kernel, the outer product; ``z^0 = x``, ``z^k = relu(zhat^k)``) and ``d^k`` (bias). A pytree
  like ``params``."""
  return rebuild(params, [{"kernel": z[..., :, None] * d[..., None, :], "bias": d}
                          for z, d in layer_factors(params, x, pre, ds)])


def backward(params: Any, x: Array, pre: list, d: Array) -> Any:
  """Per-sample parameter gradients from the logit gradient ``d = d loss / d zhat^K``:
  ``layer_grads(params, x, pre, deltas(params, pre, d))``.

  ``pre`` holds the hidden pre-activations ``[zhat^1, ..., zhat^{K-1}]`` (`preactivations`
  without the logits). Layer k's gradients are ``z^{k-1} (x) d^k`` (kernel, the outer product)
  and ``d^k`` (bias), with ``d^{k-1} = (W^k d^k) (.) H(zhat^{k-1})``, H = 1[zhat > 0] (H(0) = 0, as
  the gradient of jax.nn.relu). ``x``, ``pre`` and ``d`` share an optional leading batch axis.
  Returns a pytree like ``params``.
  """
  return layer_grads(params, x, pre, deltas(params, pre, d))


def margins(params: Any, x: Array, cls: Array) -> Array:
  """``z_c - z_j`` for every class j (batched ``x``; ``cls`` the class c of each sample), with the
  difference folded into the last layer: ``(W_c - W_j) h + (b_c - b_j)``, ``h`` the last hidden
  activations."""
  ls = layers(params)
  h = x
  for l in ls[:-1]:
    h = jax.nn.relu(h @ l["kernel"] + l["bias"])
  w, b = ls[-1]["kernel"], ls[-1]["bias"]
  dw = jnp.take(w, cls, axis=1).T[:, :, None] - w[None]             # (batch, in, C)
  db = jnp.take(b, cls)[:, None] - b[None]                           # (batch, C)
  h = jnp.broadcast_to(h, (cls.shape[0],) + h.shape[-1:])[:, None, :]  # (batch, 1, in)
  return (h @ dw)[:, 0, :] + db


@functools.lru_cache(maxsize=64)
def _bounded(fn: Callable, matmul: str, precision: Any) -> Callable:
  """``boundjax.ibp(fn)``, one per (function, product, matmul precision): the traced program
  records the ambient ``jax.default_matmul_precision`` (AGT's sound step runs under "highest")."""
  del precision   # part of the cache key only
  return ibp(fn, matmul=matmul)


def _ibp(fn: Callable, matmul: str) -> Callable:
  return _bounded(fn, matmul, jax.config.jax_default_matmul_precision)


def _as_iv(x: Any) -> Interval:
  return x if isinstance(x, Interval) else Interval(x, x, validate=False)


def _as_ivs(tree: Any) -> Any:
  """Every leaf of ``tree`` as an Interval (outputs that depend on no box come back as arrays)."""
  return jax.tree_util.tree_map(_as_iv, tree, is_leaf=lambda v: isinstance(v, Interval))


def forward_bounds(param_bounds: Any, x: Any, matmul: str = "midrad",
                   keep: bool = False) -> Interval | tuple[Interval, list]:
  """Logit bounds over the parameter box: forward IBP with interval parameters (AGT, §2.2 and
  App. B), ``boundjax.ibp`` of `preactivations`.

  ``x`` may be a point or an Interval (an input box), with or without a batch axis. With
  ``keep=True`` also returns the bounds of every pre-activation ``[zhat^1, ..., zhat^K]``.
  """
  pre = [_as_iv(z) for z in _ibp(preactivations, matmul)(param_bounds, x)]
  return (pre[-1], pre) if keep else pre[-1]


def backward_bounds(param_bounds: Any, x: Any, pre: list, d: Interval,
                    matmul: str = "midrad") -> Any:
  """The interval backward pass (AGT, §2.4 and App. B): ``boundjax.ibp`` of `backward` over the
  parameter box, the pre-activation boxes ``pre`` (hidden layers), the logit-gradient box ``d``
  and ``x`` (a point or an Interval). Interval leaves like ``param_bounds``."""
  ds = [_as_iv(v) for v in _ibp(deltas, matmul)(param_bounds, list(pre), d)]
  return _as_ivs(_ibp(layer_grads, matmul)(param_bounds, x, list(pre), ds))


def grad_bounds(param_bounds: Any, xs: Any, ys: Array, loss: str, matmul: str = "midrad",
                logit_grad: Callable | None = None) -> Any:
  """Per-sample parameter-gradient bounds over a batch (AGT, App. B; leading axis of every
  output leaf = sample).

  Every Interval leaf contains ``d loss / d theta`` at ``(x_i, y_i)`` for every ``theta`` in
  ``param_bounds``: the bounded forward pass (`forward_bounds`), the tight loss-gradient rules
  of AGT, §2.3 on the logit box (`losses.logit_grad_bounds`, per sample), then the bounded
  backward pass (`backward_bounds`). ``xs`` may be an Interval (an input box: poisoning).
  ``logit_grad(logits: Interval, y) -> Interval`` (one sample) replaces
  `losses.logit_grad_bounds` (e.g. a set of labels, `boundjax.agt.poisoning`).
  """
  return grads_from_parts(param_bounds, grad_parts(param_bounds, xs, ys, loss, matmul,
                                                   logit_grad), matmul)


def grad_parts(param_bounds: Any, xs: Any, ys: Array, loss: str, matmul: str = "midrad",
               logit_grad: Callable | None = None) -> tuple:
  """The factors of `grad_bounds`: ``(xs, hidden pre-activation boxes, boxes of every delta
  d^k)`` (`forward_bounds`, the loss-gradient rule, ``boundjax.ibp`` of `deltas`), O(b * width)
  values; `grads_from_parts` turns them into the O(b * #params) per-sample boxes."""
  logits, pre = forward_bounds(param_bounds, xs, matmul, keep=True)
  lg = functools.partial(losses.logit_grad_bounds, loss) if logit_grad is None else logit_grad
  d = jax.vmap(lg)(logits, ys)                                   # d loss / d zhat^K
  ds = [_as_iv(v) for v in _ibp(deltas, matmul)(param_bounds, pre[:-1], d)]
  return xs, pre[:-1], ds


def grads_from_parts(param_bounds: Any, parts: tuple, matmul: str = "midrad") -> Any:
  """Per-sample gradient boxes from `grad_parts`: ``boundjax.ibp`` of `layer_grads`."""
  xs, pre, ds = parts
  return _as_ivs(_ibp(layer_grads, matmul)(param_bounds, xs, list(pre), list(ds)))


def factors_from_parts(param_bounds: Any, parts: tuple, matmul: str = "midrad") -> list:
  """The boxes of `layer_factors` from `grad_parts` (``boundjax.ibp``): per layer ``(z, d)``,
  two Intervals of O(b * width) values, whose corner product (the engine's product of two
  boxes) is `grads_from_parts`' kernel box and ``d`` its bias box."""
  xs, pre, ds = parts
  out = _ibp(layer_factors, matmul)(param_bounds, xs, list(pre), list(ds))
  return [(_as_iv(z), _as_iv(d)) for z, d in out]


def sample_grad_bounds(param_bounds: Any, x: Any, y: Array, loss: str,
                       matmul: str = "midrad", logit_grad: Callable | None = None) -> Any:
  """`grad_bounds` for ONE sample ``(x, y)`` (no batch axis)."""
  x1 = jax.tree_util.tree_map(lambda v: v[None], x)
  out = grad_bounds(param_bounds, x1, jnp.asarray(y)[None], loss, matmul, logit_grad)
  return jax.tree_util.tree_map(lambda v: v[0], out)


def margin_bounds(param_bounds: Any, x: Array, cls: Array, matmul: str = "midrad") -> Array:
  """Lower bounds of ``z_c - z_j`` for every class j (batched ``x``; ``cls`` the class c):
  ``boundjax.ibp`` of `margins`, whose difference folded into the last layer does not count the
  shared penultimate activations ``h`` twice (tighter than ``zL_c - zU_j``)."""
  return _as_iv(_ibp(margins, matmul)(param_bounds, x, jnp.asarray(cls))).lower


def per_sample_factors(params: Any, xs: Array, ys: Array, loss: str) -> list:
  """The factors of the nominal per-sample gradients (`per_sample_grads`): per layer
  ``(z^{k-1}, d^k)``, each (b, width), whose outer product is the kernel's gradient and ``d^k``
  the bias's.

  Written as batched passes: the forward and ``delta^{k-1} = (delta^k W^T) (.) H(zhat^{k-1})``
  are (b, d) x (d, m) products. XLA on CPU turns the vmapped per-sample gradient into b tiny
  batched matmuls, several times slower.
  """
  ls = layers(params)
  lf = losses.per_sample_loss(loss)
  zs, z = [], xs
  for i, l in enumerate(ls):
    zs.append(z)
    zh = z @ l["kernel"] + l["bias"]
    if i < len(ls) - 1:
      zs.append(zh)
      z = jax.nn.relu(zh)
  d = jax.vmap(jax.grad(lf))(zh, ys)                   # d loss / d zhat^K, (b, out)
  out = [None] * len(ls)
  for i in range(len(ls) - 1, -1, -1):
    out[i] = (zs[2 * i], d)
    if i > 0:
      d = (d @ ls[i]["kernel"].T) * (zs[2 * i - 1] > 0).astype(d.dtype)
  return out


def per_sample_grads(params: Any, xs: Array, ys: Array, loss: str) -> Any:
  """Nominal per-sample gradients ``d loss(f(x_i), y_i) / d theta`` (leading axis = sample).

  The same values as ``vmap(grad(loss))``, from `per_sample_factors`: the kernel gradient is the
  broadcast outer product ``z_i delta_i^T``.
  """
  return rebuild(params, [{"kernel": z[:, :, None] * d[:, None, :], "bias": d}
                          for z, d in per_sample_factors(params, xs, ys, loss)])


def chunk_values(params: Any, boxes: int = 1) -> list:
  """Arrays as large as one sample's values in the fused fold of the Dense kernels with
  ``boxes`` bounds per value (2 for poisoning: clean and poisoned), which set the chunk
  (`boundjax.agt.descent.chunk_size`): a kernel folded from its factors
  (`boundjax.agt.descent.accumulate_outer`) holds O(width) values per sample, one with fewer than
  `boundjax.agt.descent.FUSED_MIN_COLUMNS` columns its formed products, O(#params)."""
  return [jnp.zeros(boxes * (l["kernel"].shape[0] + 2 * l["kernel"].shape[1]), l["kernel"].dtype)
          if l["kernel"].shape[1] >= descent.FUSED_MIN_COLUMNS
          else jnp.zeros(boxes * l["kernel"].size, l["kernel"].dtype)
          for l in layers(params)]

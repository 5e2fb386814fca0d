"""Where AGT's bounds come from: the engine (`boundjax.ibp`, `boundjax.crown`) on one of two
nominal computations.

* ``"mlp"``: the Dense+ReLU passes of `boundjax.agt.mlp` (AGT, App. B): the bounded forward pass,
  AGT's tight loss-gradient rules (§2.3) on the logit box, then the bounded backward pass, and
  a margin bound with the class difference folded into the last layer.
* ``"ibp"``: `boundjax.ibp` applied to ``vmap(grad(per-sample loss))`` of any ``apply_fn`` the
  engine supports (Flax, conv, ...); the loss gradient is bounded by the engine's composites.

Both take every interval product of `boundjax.ibp` (``matmul`` = "midrad", "signsplit", "exact",
"best"). ``"auto"`` picks ``"mlp"`` when the parameters are a Dense stack that
`boundjax.agt.mlp.apply` reproduces, and ``"ibp"`` otherwise.

``bound_method`` picks the forward bound through the parameter box: "interval" (the paper's
IBP) or "crown" (`boundjax.agt.crown`: the engine's `boundjax.crown` over the parameter box with
a fixed input, intersected with the interval bounds, so never looser), with either back-end:
the logit bounds (certification, poisoning's label sets) come from `boundjax.crown` of
``apply_fn`` itself. The gradient bounds of the "mlp" back-end take CROWN's pre-activation bounds
of every layer into the bounded backward pass; those of the "ibp" back-end are `boundjax.ibp`
of the per-sample gradient, which has no way to receive CROWN's intermediate bounds (the same
as with "interval").
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from boundjax import nn as bnn
from boundjax.agt import crown, losses, mlp
from boundjax.agt.config import BOUND_METHODS, MATMULS
from boundjax.core.interval import Interval
from boundjax.core.transforms import ibp

BACKENDS = ("auto", "mlp", "ibp")


def _engine_loss(name: str) -> Callable:
  """Per-sample loss written with `boundjax.nn` composites (their tight interval rules)."""
  if name == "cross_entropy":
    return lambda z, y: bnn.softmax_cross_entropy(
        z, jax.nn.one_hot(y.astype(jnp.int32), z.shape[-1], dtype=z.dtype))
  if name == "binary_cross_entropy":
    return lambda z, y: jnp.sum(bnn.sigmoid_binary_cross_entropy(
        z.reshape(-1), jnp.broadcast_to(y, z.reshape(-1).shape).astype(z.dtype)))
  return losses.per_sample_loss(name)


def check_matmul(backend: str, matmul: str) -> None:
  """Raises ``ValueError`` unless ``matmul`` is an interval product of `boundjax.ibp` (both
  back-ends compute every one)."""
  del backend
  if matmul not in MATMULS:
    raise ValueError(f"AGT: matmul must be one of {MATMULS}, got {matmul!r}.")


def check_bound_method(backend: str, bound_method: str) -> None:
  """Raises ``ValueError`` unless ``backend`` implements the forward bound ``bound_method``."""
  if bound_method not in BOUND_METHODS:
    raise ValueError(f"AGT: bound_method must be one of {BOUND_METHODS}, got {bound_method!r}.")
  if backend not in BACKENDS:
    raise ValueError(f"AGT backend must be one of {BACKENDS}, got {backend!r}.")


def is_mlp(apply_fn: Callable, params: Any, x_example: Any) -> bool:
  """True when ``params`` is a Dense stack and ``mlp.apply`` reproduces ``apply_fn`` on x."""
  try:
    mlp.layers(params)
    ref = np.asarray(apply_fn(params, x_example))
    ours = np.asarray(mlp.apply(params, x_example))
  except (ValueError, TypeError, KeyError):
    return False
  return ref.shape == ours.shape and np.allclose(ref, ours, rtol=1e-5, atol=1e-6)


def resolve(backend: str, apply_fn: Callable, params: Any, x_example: Any,
            matmul: str = "midrad") -> str:
  """The back-end to use: ``backend``, or for "auto" "mlp" when it applies, else "ibp"."""
  if backend not in BACKENDS:
    raise ValueError(f"AGT backend must be one of {BACKENDS}, got {backend!r}.")
  if backend == "auto":
    backend = "mlp" if is_mlp(apply_fn, params, x_example) else "ibp"
  check_matmul(backend, matmul)
  if backend == "mlp" and not is_mlp(apply_fn, params, x_example):
    raise ValueError("AGT backend 'mlp' needs a Dense+ReLU stack that boundjax.agt.mlp.apply "
                     "reproduces; apply_fn gives different outputs. Use backend='ibp'.")
  return backend


def grad_bounds_fn(apply_fn: Callable, loss: str, backend: str, matmul: str = "midrad",
                   bound_method: str = "interval") -> Callable[[Any, Any, Any], Any]:
  """``fn(param_bounds, xs, ys)``: per-sample parameter-gradient bounds (leading axis = sample).

  Every leaf of the result is an Interval containing ``d loss(apply_fn(theta, x_i), y_i) /
  d theta`` for every ``theta`` in ``param_bounds``; ``matmul`` is the interval product and
  ``bound_method`` the forward bound whose logit and activation bounds feed the bounded
  backward pass ("crown": `boundjax.agt.crown.grad_bounds`).
  """
  check_matmul(backend, matmul)
  check_bound_method(backend, bound_method)
  if bound_method == "crown" and backend == "mlp":
    return lambda pb, xs, ys: crown.grad_bounds(pb, xs, ys, loss, matmul)
  if backend == "mlp":
    return lambda pb, xs, ys: mlp.grad_bounds(pb, xs, ys, loss, matmul)
  lf = _engine_loss(loss)

  def one(p, x, y):
    return lf(apply_fn(p, x[None])[0], y)
  bounded = ibp(jax.vmap(jax.grad(one), in_axes=(None, 0, 0)), matmul=matmul)

  def fn(pb, xs, ys):
    out = bounded(pb, xs, ys)
    return jax.tree_util.tree_map(
        lambda o: o if isinstance(o, Interval) else Interval(o, o, validate=False), out,
        is_leaf=lambda o: isinstance(o, Interval))
  return fn


def forward_bounds_fn(apply_fn: Callable, backend: str, matmul: str = "midrad",
                      bound_method: str = "interval") -> Callable[[Any, Any], Interval]:
  """``fn(param_bounds, x)``: Interval over the outputs of every model in the box (batched x)."""
  check_matmul(backend, matmul)
  check_bound_method(backend, bound_method)
  if bound_method == "crown":
    model = None if backend == "mlp" else apply_fn  # (the "mlp" stack takes unbatched x too)
    return lambda pb, x: crown.forward_bounds(pb, x, matmul, apply_fn=model)
  if backend == "mlp":
    return lambda pb, x: mlp.forward_bounds(pb, x, matmul)
  bounded = ibp(apply_fn, matmul=matmul)

  def fn(pb, x):
    out = bounded(pb, x)
    return out if isinstance(out, Interval) else Interval(out, out, validate=False)
  return fn


def margin_bounds_fn(backend: str, matmul: str = "midrad", bound_method: str = "interval",
                     apply_fn: Callable | None = None) -> Callable[[Any, Any, Any], Any] | None:
  """``fn(param_bounds, x, cls)``: lower bounds of ``z_c - z_j`` for every class j, or None when
  the margins are no tighter than the logit bounds' ``l_c - u_j``. "mlp" back-end: the last layer
  folded (`boundjax.agt.mlp.margin_bounds`; with "crown" the tighter of that and
  `boundjax.agt.crown.margin_bounds`). "ibp" back-end (any ``apply_fn``): with "crown" the
  engine bounds the margins themselves (`boundjax.agt.crown.margin_bounds` with ``apply_fn``);
  with "interval" None (an interval pass of ``z_c - z_j`` is ``l_c - u_j``)."""
  check_matmul(backend, matmul)
  check_bound_method(backend, bound_method)
  if backend == "mlp":
    if bound_method == "crown":
      return lambda pb, x, cls: crown.margin_bounds(pb, x, cls, matmul)
    return lambda pb, x, cls: mlp.margin_bounds(pb, x, cls, matmul)
  if apply_fn is None:
    raise ValueError(f"AGT margin bounds with the {backend!r} back-end need apply_fn.")
  if bound_method == "crown":
    return lambda pb, x, cls: crown.margin_bounds(pb, x, cls, matmul, apply_fn=apply_fn)
  return None

"""Where AGT's interval bounds come from: the generic engine or the explicit Dense+ReLU passes.

Two back-ends give the same guarantees:

* ``"ibp"``: ``boundjax.ibp`` applied to ``vmap(grad(per-sample loss))`` with interval parameter
  leaves; works for any ``model_apply`` the engine supports (Flax, conv, ...).
* ``"mlp"``: the layer-wise passes of spec §2.2–2.4 in `boundjax.agt.mlp` (Dense+ReLU only), with
  the spec's tight loss-gradient rules and a margin bound folded into the last layer.

``"auto"`` picks ``"mlp"`` when the parameters are a Dense stack that `boundjax.agt.mlp.apply`
reproduces, and ``"ibp"`` otherwise.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.agt import losses, mlp
from boundjax.interval import Interval

BACKENDS = ("auto", "mlp", "ibp")


def _engine():
  try:
    from boundjax.transforms import ibp
  except ImportError as e:  # pragma: no cover - depends on the engine being installed
    raise ValueError("AGT backend 'ibp' needs boundjax.ibp (boundjax.transforms), which is not "
                     "available; use backend='mlp' for Dense+ReLU networks.") from e
  return ibp


def _engine_loss(name: str):
  """Per-sample loss written with boundjax.nn composites (tight gradient rules) when present."""
  try:
    from boundjax import nn as bnn
  except ImportError:
    return losses.per_sample_loss(name)
  if name == "cross_entropy" and hasattr(bnn, "softmax_cross_entropy"):
    return lambda z, y: bnn.softmax_cross_entropy(
        z, jax.nn.one_hot(y.astype(jnp.int32), z.shape[-1], dtype=z.dtype))
  if name == "binary_cross_entropy" and hasattr(bnn, "sigmoid_binary_cross_entropy"):
    return lambda z, y: jnp.sum(bnn.sigmoid_binary_cross_entropy(
        z.reshape(-1), jnp.broadcast_to(y, z.reshape(-1).shape).astype(z.dtype)))
  if name == "mse" and hasattr(bnn, "mse"):
    return lambda z, y: bnn.mse(z, jnp.broadcast_to(y, z.shape).astype(z.dtype))
  return losses.per_sample_loss(name)


def is_mlp(model_apply: Callable, params: Any, x_example: Any) -> bool:
  """True when ``params`` is a Dense stack and ``mlp.apply`` reproduces ``model_apply`` on x."""
  try:
    ls = mlp.layers(params)
    ls = [l for l in ls]
    ref = np.asarray(model_apply(params, x_example))
    ours = np.asarray(mlp.apply(params, x_example))
  except (ValueError, TypeError, KeyError):
    return False
  return ref.shape == ours.shape and np.allclose(ref, ours, rtol=1e-5, atol=1e-6)


def resolve(backend: str, model_apply: Callable, params: Any, x_example: Any) -> str:
  if backend not in BACKENDS:
    raise ValueError(f"AGT backend must be one of {BACKENDS}, got {backend!r}.")
  if backend == "mlp" and not is_mlp(model_apply, params, x_example):
    raise ValueError("AGT backend 'mlp' needs a Dense+ReLU stack that boundjax.agt.mlp.apply "
                     "reproduces; model_apply gives different outputs. Use backend='ibp'.")
  if backend == "auto":
    return "mlp" if is_mlp(model_apply, params, x_example) else "ibp"
  return backend


def grad_bounds_fn(model_apply: Callable, loss: str, backend: str, method: str = "rump"
                   ) -> Callable[[Any, Any, Any], Any]:
  """``fn(param_bounds, xs, ys)``: per-sample parameter-gradient bounds (leading axis = sample).

  Every leaf of the result is an Interval containing ``d loss(model_apply(theta, x_i), y_i) /
  d theta`` for every ``theta`` in ``param_bounds``.
  """
  if backend == "mlp":
    return lambda pb, xs, ys: mlp.grad_bounds(pb, xs, ys, loss, method)
  ibp = _engine()
  lf = _engine_loss(loss)

  def one(p, x, y):
    return lf(model_apply(p, x[None])[0], y)
  bounded = ibp(jax.vmap(jax.grad(one), in_axes=(None, 0, 0)))

  def fn(pb, xs, ys):
    out = bounded(pb, xs, ys)
    return jax.tree_util.tree_map(
        lambda o: o if isinstance(o, Interval) else Interval(o, o, validate=False), out,
        is_leaf=lambda o: isinstance(o, Interval))
  return fn


def forward_bounds_fn(model_apply: Callable, backend: str, method: str = "rump"
                      ) -> Callable[[Any, Any], Interval]:
  """``fn(param_bounds, X)``: Interval over the outputs of every model in the box (batched X)."""
  if backend == "mlp":
    return lambda pb, X: mlp.forward_bounds(pb, X, method)
  ibp = _engine()
  bounded = ibp(model_apply)

  def fn(pb, X):
    out = bounded(pb, X)
    return out if isinstance(out, Interval) else Interval(out, out, validate=False)
  return fn

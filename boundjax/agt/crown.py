"""CROWN bounds over a parameter box with a fixed input (AGT forward pass), on the engine.

AGT bounds the logits of one sample ``x`` for every parameter vector in the box
``[theta_L, theta_U]`` (AGT, §4.2 and App. B use interval bound propagation). The public AGT code
offers a tighter forward pass, CROWN with interval parameters (its ``CROWNBoundedModel``). Here
that is `boundjax.crown` applied to ``params -> apply_fn(params, x)`` with the parameter leaves
as boxes and ``x`` concrete, one sample at a time (vmapped over the batch):

* ``x W^1`` with ``x`` a point is affine in the parameters, so the first layer's box is exact;
* ``h W`` with both ``h`` (an activation) and ``W`` in boxes is a product of two boxes, relaxed
  by the engine's McCormick planes (`boundjax.domains.linear.backward._dot_planes`; McCormick
  1976, §3) with ``h`` as pivot: the weight box ``W`` is a parameter read once, so its term is
  concretised at once and the sign of ``h >= 0`` picks the worst weight (the coefficient on
  ``h`` is ``c^+ W_L^T + c^- W_U^T``, exactly what this module computed by hand before);
* ReLUs take CROWN-Ada's lines (Zhang et al. 2018, "Efficient Neural Network Robustness
  Certification with General Activation Functions", §3.2) on pre-activation bounds computed by
  their own backward passes (``intermediate="crown"``), each intersected with the interval pass
  (whose product of two boxes is midpoint-radius met with sign-split: exact per coordinate for
  ``h >= 0``, so the second layer's box is exact too).

The engine runs in its sound mode (every bound holds in exact arithmetic; outward rounding with
a-priori error bounds), so a point box gives the nominal logits up to rounding and never cuts
into them. ``matmul`` does not reach CROWN (its own interval products are at least as tight as
"midrad" and "signsplit"); it is the product of the interval passes beside it: the backward pass
of the gradient bounds and the folded margin bound (`boundjax.agt.mlp`).

Tightness against the hand-written pass this module used to be (which concretised the first
hidden layer ``h^1 = relu(zhat^1)`` on its box, exact because its coordinates use disjoint
parameters): the engine relaxes that ReLU with CROWN-Ada's lower slope 1 for unstable neurons
with ``u > -l``, which is looser for a positive coefficient there (``l`` instead of 0); on the
3- and 4-layer test networks the logit widths agree to about 0.1 % on average (up to a few % on
single logits, either way: the engine's intermediate bounds are tighter elsewhere).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from boundjax.agt import losses, mlp
from boundjax.domains.linear import crown as _engine_crown
from boundjax.core.interval import Interval

Array = jax.Array


def _check_point(x: Any) -> None:
  if isinstance(x, Interval):
    raise TypeError("agt.crown: x must be a point (array), not an Interval: CROWN over the "
                    "parameter box assumes a fixed input (use bound_method='interval' for "
                    "input boxes).")


def _bound(fn: Callable) -> Callable:
  """The engine over the parameter box, one sample (the parameter box is shared, so it is not a
  batch: ``batch_axis=None``; the batch is a vmap outside)."""
  return _engine_crown(fn, batch_axis=None, sound=True)


def _one_sample(apply_fn: Callable | None) -> Callable:
  """``(params, x_i) -> logits_i`` for one sample ``x_i`` (no batch axis)."""
  if apply_fn is None:
    return mlp.apply
  return lambda p, xi: apply_fn(p, xi[None])[0]


@functools.lru_cache(maxsize=32)
def _forward_fn(apply_fn: Callable | None) -> Callable:
  f = _bound(_one_sample(apply_fn))
  return jax.jit(jax.vmap(f, in_axes=(None, 0)))


def forward_bounds(param_bounds: Any, x: Array, matmul: str = "midrad",
                   apply_fn: Callable | None = None) -> Interval:
  """Logit bounds over the parameter box (`boundjax.agt.crown`'s module docstring) for a point
  ``x``, batched (n, d) or single (d,). ``apply_fn``: the batched model (default: the Dense+ReLU
  stack of `boundjax.agt.mlp`)."""
  del matmul  # the engine's products are at least as tight (this module's docstring)
  _check_point(x)
  x = jnp.asarray(x)
  if x.ndim == 1:
    out = _forward_fn(apply_fn)(param_bounds, x[None])
    return Interval(out.lower[0], out.upper[0], validate=False)
  return _forward_fn(apply_fn)(param_bounds, x)


@functools.lru_cache(maxsize=32)
def _margin_fn(apply_fn: Callable | None) -> Callable:
  one = _one_sample(apply_fn)

  def margins(p, xi, ci):
    z = one(p, xi)
    return jax.nn.one_hot(ci, z.shape[-1], dtype=z.dtype) @ z - z
  f = _bound(margins)
  return jax.jit(jax.vmap(lambda pb, xi, ci: f(pb, xi, ci).lower, in_axes=(None, 0, 0)))


def margin_bounds(param_bounds: Any, x: Array, cls: Array, matmul: str = "midrad",
                  apply_fn: Callable | None = None) -> Array:
  """Lower bounds of ``z_c - z_j`` for every class j (batched x, ``cls`` the class c): the
  engine bounds the margins themselves (the difference folded into the backward pass, CROWN
  §3.3), met with the interval bound of `boundjax.agt.mlp.margin_bounds` (the last layer
  folded) for the Dense stack."""
  _check_point(x)
  x, cls = jnp.asarray(x), jnp.asarray(cls)
  lo = _margin_fn(apply_fn)(param_bounds, x, cls)
  if apply_fn is None:
    lo = jnp.maximum(lo, mlp.margin_bounds(param_bounds, x, cls, matmul))
  return lo


_bound_preactivations = _bound(mlp.preactivations)


def grad_bounds(param_bounds: Any, xs: Array, ys: Array, loss: str, matmul: str = "midrad") -> Any:
  """Per-sample parameter-gradient bounds (AGT, App. B) with the forward pass bounded by CROWN
  (leading axis of every output leaf = sample): the logit bounds feed the loss-gradient rule
  (AGT, §2.3) and the pre-activation bounds of every layer feed the interval backward pass,
  `boundjax.agt.mlp.backward_bounds` (``boundjax.ibp`` of the nominal backward pass)."""
  _check_point(xs)
  pre = jax.vmap(_bound_preactivations, in_axes=(None, 0))(param_bounds, xs)
  d = jax.vmap(functools.partial(losses.logit_grad_bounds, loss))(pre[-1], ys)
  return mlp.backward_bounds(param_bounds, xs, pre[:-1], d, matmul)


def sample_grad_bounds(param_bounds: Any, x: Array, y: Array, loss: str,
                       matmul: str = "midrad") -> Any:
  """`grad_bounds` for ONE sample ``(x, y)`` (no batch axis)."""
  out = grad_bounds(param_bounds, jnp.asarray(x)[None], jnp.asarray(y)[None], loss, matmul)
  return jax.tree_util.tree_map(lambda v: v[0], out)

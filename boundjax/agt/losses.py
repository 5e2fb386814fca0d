"""Per-sample losses of AGT and tight bounds on their gradient w.r.t. the logits (AGT, App. B).

Labels: "cross_entropy" takes integer class labels and one logit per class;
"binary_cross_entropy" takes labels in {0, 1} and a single logit; "mse" takes targets shaped
like the outputs and averages the squared error over them.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from boundjax.core.interval import Interval

Array = jax.Array


def per_sample_loss(name: str) -> Callable[[Array, Array], Array]:
  """The scalar loss ``loss(logits, y)`` of one sample (logits without a batch axis)."""
  if name == "cross_entropy":
    return lambda z, y: optax.softmax_cross_entropy_with_integer_labels(z, y.astype(jnp.int32))
  if name == "binary_cross_entropy":
    return lambda z, y: jnp.sum(optax.sigmoid_binary_cross_entropy(
        z.reshape(-1), jnp.broadcast_to(y, z.reshape(-1).shape).astype(z.dtype)))
  if name == "mse":
    return lambda z, y: jnp.mean((z - jnp.broadcast_to(y, z.shape).astype(z.dtype)) ** 2)
  raise ValueError(f"unknown loss {name!r}; expected cross_entropy, binary_cross_entropy or mse.")


def softmax_bounds(zl: Array, zu: Array) -> tuple[Array, Array]:
  """Bounds on softmax(z) over ``zl <= z <= zu`` (last axis = classes), AGT, App. B.

    p_L[i] = 1 / sum_j exp(zU[j] - zL[i])   (own logit at its lower, others at their upper)
    p_U[i] = 1 / sum_j exp(zL[j] - zU[i])   (the paper prints this one as p_L again: a typo)

  The j = i term is exp(0) = 1 in both. Each is the softmax of a vector built so, hence stable.
  """
  c = zl.shape[-1]
  eye = jnp.eye(c, dtype=bool)
  ml = jnp.where(eye, zl[..., :, None], zu[..., None, :])   # row i: zL_i at i, zU_j elsewhere
  mu = jnp.where(eye, zu[..., :, None], zl[..., None, :])
  pl = jnp.diagonal(jax.nn.softmax(ml, axis=-1), axis1=-2, axis2=-1)
  pu = jnp.diagonal(jax.nn.softmax(mu, axis=-1), axis1=-2, axis2=-1)
  return pl, pu


def logit_grad_bounds(name: str, logits: Interval, y: Array) -> Interval:
  """Bounds on d loss / d logits for every logit vector in ``logits`` (one sample).

  cross-entropy: ``[p_L - onehot(y), p_U - onehot(y)]``; BCE with logits: sigmoid is monotone,
  ``[sigmoid(zL) - y, sigmoid(zU) - y]``; mse: ``2 (z - y) / m`` is monotone.
  """
  zl, zu = logits.lower, logits.upper
  if name == "cross_entropy":
    pl, pu = softmax_bounds(zl, zu)
    oh = jax.nn.one_hot(y.astype(jnp.int32), zl.shape[-1], dtype=zl.dtype)
    return Interval(pl - oh, pu - oh, validate=False)
  if name == "binary_cross_entropy":
    yy = jnp.broadcast_to(y, zl.shape).astype(zl.dtype)
    return Interval(jax.nn.sigmoid(zl) - yy, jax.nn.sigmoid(zu) - yy, validate=False)
  if name == "mse":
    yy = jnp.broadcast_to(y, zl.shape).astype(zl.dtype)
    m = zl.size
    return Interval(2 * (zl - yy) / m, 2 * (zu - yy) / m, validate=False)
  raise ValueError(f"unknown loss {name!r}.")

"""Composite functions with tight bound rules: softmax, log-softmax, logsumexp, cross-entropy.

Composing interval rules for ``exp(x - max x) / sum(exp(x - max x))`` forgets that the same
logit appears in numerator and denominator, and the bounds blow up. The functions here compute
exactly what `jax.nn` computes, but each is a named call (``jit[name=boundjax_softmax]`` ...)
that the interval domain recognises and bounds directly. `jax.nn.log_softmax`, which JAX itself
wraps in a named call, gets the same rule, so optax's softmax cross-entropy is tight too.

Softmax bound (AGT spec §2.3, with the paper's typo p_L -> p_U fixed):

    p_L,i = 1 / (1 + Σ_{j≠i} exp(u_j − l_i)),   p_U,i = 1 / (1 + Σ_{j≠i} exp(l_j − u_i)),

i.e. the softmax of the vector whose own logit is at its lower (upper) bound and all others at
their upper (lower) bounds. We evaluate it in the log domain: ``log p_L,i = l_i −
logaddexp(l_i, LSE_{j≠i} u_j)``, with the leave-one-out log-sum-exp from prefix and suffix
cumulative log-sum-exps (O(n), no cancellation). Each bound is attained by a point of the box,
so the bound is exact coordinate-wise.

The cross-entropy losses carry a custom JVP whose derivative is ``softmax(z) − y`` written with
the named softmax, so ``bj.ibp(jax.grad(loss))`` bounds the logit gradient by
``[p_L − y, p_U − y]`` (AGT spec §2.3) instead of differentiating the composition.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from boundjax.interval import Interval

# ----------------------------------------------------------------------------------------------
# the functions (concrete semantics = jax.nn)
# ----------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("axis",))
def boundjax_softmax(x, axis: int = -1):
  return jax.nn.softmax(x, axis=axis)


@functools.partial(jax.jit, static_argnames=("axis",))
def boundjax_log_softmax(x, axis: int = -1):
  return jax.nn.log_softmax(x, axis=axis)


@functools.partial(jax.jit, static_argnames=("axis",))
def boundjax_logsumexp(x, axis: int = -1):
  return jax.nn.logsumexp(x, axis=axis)


def softmax(x, axis: int = -1):
  """`jax.nn.softmax` with a tight interval rule."""
  return boundjax_softmax(x, axis=axis)


def log_softmax(x, axis: int = -1):
  """`jax.nn.log_softmax` with a tight interval rule."""
  return boundjax_log_softmax(x, axis=axis)


def logsumexp(x, axis: int = -1):
  """`jax.nn.logsumexp` over one axis with a tight (exact) interval rule."""
  return boundjax_logsumexp(x, axis=axis)


@jax.custom_jvp
def boundjax_softmax_cross_entropy(logits, labels):
  return -jnp.sum(labels * jax.nn.log_softmax(logits, axis=-1), axis=-1)


def _is_zero(t) -> bool:
  return isinstance(t, jax.custom_derivatives.SymbolicZero)


def _sce_jvp(primals, tangents):
  logits, labels = primals
  dlogits, dlabels = tangents
  out = boundjax_softmax_cross_entropy(logits, labels)
  dout = jnp.zeros_like(out)
  if not _is_zero(dlogits):
    grad_logits = softmax(logits) - labels  # dL/dz = p - y (for labels summing to one)
    dout = dout + jnp.sum(grad_logits * dlogits, axis=-1)
  if not _is_zero(dlabels):
    dout = dout - jnp.sum(dlabels * log_softmax(logits), axis=-1)
  return out, dout


boundjax_softmax_cross_entropy.defjvp(_sce_jvp, symbolic_zeros=True)


def softmax_cross_entropy(logits, labels):
  """``-Σ_i y_i log softmax(z)_i`` over the last axis; labels are probabilities (one-hot).

  Its gradient with respect to the logits is ``softmax(z) − y`` (exact for labels that sum to
  one), computed with the named softmax so that interval bounds of the gradient are tight.
  """
  return boundjax_softmax_cross_entropy(logits, labels)


def softmax_cross_entropy_with_integer_labels(logits, labels):
  """Cross-entropy with integer class labels (one-hot encoded internally)."""
  return softmax_cross_entropy(logits, jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype))


@jax.custom_jvp
def boundjax_sigmoid_binary_cross_entropy(logits, labels):
  return jnp.logaddexp(0.0, logits) - labels * logits


def _bce_jvp(primals, tangents):
  logits, labels = primals
  dlogits, dlabels = tangents
  out = boundjax_sigmoid_binary_cross_entropy(logits, labels)
  dout = jnp.zeros_like(out)
  if not _is_zero(dlogits):
    dout = dout + (jax.nn.sigmoid(logits) - labels) * dlogits
  if not _is_zero(dlabels):
    dout = dout - logits * dlabels
  return out, dout


boundjax_sigmoid_binary_cross_entropy.defjvp(_bce_jvp, symbolic_zeros=True)


def sigmoid_binary_cross_entropy(logits, labels):
  """``softplus(z) − y·z`` element-wise (binary cross-entropy with logits); d/dz = σ(z) − y."""
  return boundjax_sigmoid_binary_cross_entropy(logits, labels)


# ----------------------------------------------------------------------------------------------
# interval rules
# ----------------------------------------------------------------------------------------------


def _lse_excluding(v):
  """``out[..., i] = log Σ_{j≠i} exp(v[..., j])`` along the last axis, in O(n)."""
  neg_inf = jnp.full(v.shape[:-1] + (1,), -jnp.inf, v.dtype)
  inclusive = lax.cumlogsumexp(v, axis=v.ndim - 1)
  prefix = jnp.concatenate([neg_inf, inclusive[..., :-1]], axis=-1)
  suffix_incl = lax.cumlogsumexp(v, axis=v.ndim - 1, reverse=True)
  suffix = jnp.concatenate([suffix_incl[..., 1:], neg_inf], axis=-1)
  return jnp.logaddexp(prefix, suffix)


def log_softmax_bounds(lower, upper, axis: int = -1):
  """Exact coordinate-wise bounds of log_softmax over the box [lower, upper] along ``axis``."""
  l, u = jnp.moveaxis(lower, axis, -1), jnp.moveaxis(upper, axis, -1)
  lo = l - jnp.logaddexp(l, _lse_excluding(u))
  hi = u - jnp.logaddexp(u, _lse_excluding(l))
  hi = jnp.minimum(hi, 0.0)
  return jnp.moveaxis(lo, -1, axis), jnp.moveaxis(hi, -1, axis)


def softmax_bounds(lower, upper, axis: int = -1):
  """Exact coordinate-wise bounds of softmax over the box (AGT spec §2.3)."""
  lo, hi = log_softmax_bounds(lower, upper, axis)
  return jnp.clip(jnp.exp(lo), 0.0, 1.0), jnp.clip(jnp.exp(hi), 0.0, 1.0)


def _find_axis(closed) -> int | None:
  """The single reduction axis of a softmax-like jaxpr (from its reduce_sum), or None."""
  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "reduce_sum":
        return eqn.params["axes"], eqn.invars[0].aval.ndim
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        found = walk(sub)
        if found is not None:
          return found
    return None
  found = walk(closed.jaxpr)
  if found is None or len(found[0]) != 1:
    return None
  return found[0][0]


def _single_interval(args, jaxpr) -> Interval | None:
  """The one Interval argument of a unary call with one output of the same shape, else None."""
  if len(args) != 1 or not isinstance(args[0], Interval) or len(jaxpr.jaxpr.outvars) != 1:
    return None
  return args[0]


def _finish(ctx, lo, hi):
  if ctx.sound:
    from boundjax import rounding
    lo, hi = rounding.outward(lo, hi, ulps=8)
  return Interval(lo, hi, validate=False)


def _softmax_rule(ctx, *args, jaxpr):
  x, axis = _single_interval(args, jaxpr), _find_axis(jaxpr)
  if x is None or axis is None:
    return NotImplemented
  lo, hi = softmax_bounds(x.lower, x.upper, axis)
  out = _finish(ctx, lo, hi)
  return Interval(jnp.clip(out.lower, 0.0, 1.0), jnp.clip(out.upper, 0.0, 1.0), validate=False)


def _log_softmax_rule(ctx, *args, jaxpr):
  x, axis = _single_interval(args, jaxpr), _find_axis(jaxpr)
  if x is None or axis is None:
    return NotImplemented
  return _finish(ctx, *log_softmax_bounds(x.lower, x.upper, axis))


def _logsumexp_rule(ctx, *args, jaxpr):
  x, axis = _single_interval(args, jaxpr), _find_axis(jaxpr)
  if x is None or axis is None:
    return NotImplemented
  # logsumexp is increasing in every coordinate.
  return _finish(ctx, jax.nn.logsumexp(x.lower, axis=axis), jax.nn.logsumexp(x.upper, axis=axis))


def _sce_rule(ctx, logits, labels, *, jaxpr):
  if (not isinstance(logits, Interval) or isinstance(labels, Interval)
      or len(jaxpr.jaxpr.outvars) != 1):
    return NotImplemented
  lo_lp, hi_lp = log_softmax_bounds(logits.lower, logits.upper, -1)
  y_pos, y_neg = jnp.maximum(labels, 0), jnp.minimum(labels, 0)
  lo = -(jnp.sum(y_pos * hi_lp, -1) + jnp.sum(y_neg * lo_lp, -1))
  hi = -(jnp.sum(y_pos * lo_lp, -1) + jnp.sum(y_neg * hi_lp, -1))
  return _finish(ctx, lo, hi)


def _bce_rule(ctx, logits, labels, *, jaxpr):
  """f(z) = softplus(z) − y z is convex in z: max at an end, min at clip(logit(y), l, u)."""
  if (not isinstance(logits, Interval) or isinstance(labels, Interval)
      or len(jaxpr.jaxpr.outvars) != 1):
    return NotImplemented
  f = lambda z: jnp.logaddexp(0.0, z) - labels * z
  y = jnp.clip(labels, 0.0, 1.0)
  z_star = jnp.clip(jnp.log(y) - jnp.log1p(-y), logits.lower, logits.upper)
  in_range = (labels >= 0) & (labels <= 1)
  lo = jnp.where(in_range, f(z_star), jnp.minimum(f(logits.lower), f(logits.upper)))
  hi = jnp.maximum(f(logits.lower), f(logits.upper))
  return _finish(ctx, lo, hi)


COMPOSITES = {
    "boundjax_softmax": _softmax_rule,
    "boundjax_log_softmax": _log_softmax_rule,
    "log_softmax": _log_softmax_rule,
    "boundjax_logsumexp": _logsumexp_rule,
    "boundjax_softmax_cross_entropy": _sce_rule,
    "boundjax_sigmoid_binary_cross_entropy": _bce_rule,
}

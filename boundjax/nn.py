"""Composite functions with tight bound rules: softmax, log-softmax, logsumexp, cross-entropy.

Composing interval rules for ``exp(x - max x) / sum(exp(x - max x))`` forgets that the same
logit appears in numerator and denominator, and the bounds blow up. The functions here compute
exactly what `jax.nn` computes, but each binds a private primitive (`boundjax.core.composite`)
that every domain's rule table knows by identity. `jax.nn.softmax` and `jax.nn.log_softmax` are
rewritten to the same primitives when their traced body is JAX's own (never by name), so optax's
softmax cross-entropy is tight too.

Softmax bound (AGT, App. B; with the paper's typo p_L -> p_U fixed):

    p_L,i = 1 / (1 + Σ_{j≠i} exp(u_j − l_i)),   p_U,i = 1 / (1 + Σ_{j≠i} exp(l_j − u_i)),

i.e. the softmax of the vector whose own logit is at its lower (upper) bound and all others at
their upper (lower) bounds. We evaluate it in the log domain: ``log p_L,i = l_i −
logaddexp(l_i, LSE_{j≠i} u_j)``, with the leave-one-out log-sum-exp from prefix and suffix
cumulative log-sum-exps (O(n), no cancellation). Each bound is attained by a point of the box,
so the bound is exact coordinate-wise.

The cross-entropy losses differentiate to ``softmax(z)·Σy − y`` and ``σ(z) − y`` written with
the composite softmax, so ``bj.ibp(jax.grad(loss))`` bounds the logit gradient by
``[p_L − y, p_U − y]`` (AGT, App. B) instead of differentiating the composition.

Sound mode. Every bound is computed in the working precision; the rounding error of the log-domain
formulas is bounded a priori by ``(n + 4)·4u·(M + 1)`` on the log scale, with ``n`` the length of
the softmax axis, ``u`` the unit roundoff and ``M`` the largest logit magnitude of the row (each
of the ≤ n log-add-exp steps errs by at most ``2u`` relative on operands of size ≤ M + log n), and
the exponentials by 4 ulps; sums over classes use Higham's γ_n.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from boundjax.core import rounding
from boundjax.core.composite import define, negative_axis
from boundjax.core.interval import Interval

# ----------------------------------------------------------------------------------------------
# the primitives (concrete semantics = jax.nn)
# ----------------------------------------------------------------------------------------------


def _softmax_impl(x, *, axis):
  return jax.nn.softmax(x, axis=axis)


def _log_softmax_impl(x, *, axis):
  return jax.nn.log_softmax(x, axis=axis)


def _logsumexp_impl(x, *, axis):
  return jax.nn.logsumexp(x, axis=axis)


def _sce_impl(logits, labels):
  return -jnp.sum(labels * jax.nn.log_softmax(logits, axis=-1), axis=-1)


def _bce_impl(logits, labels):
  return jnp.logaddexp(jnp.zeros((), logits.dtype), logits) - labels * logits


def _softmax_jvp(primals, tangents, *, axis):
  (x,), (t,) = primals, tangents
  s = softmax_p.bind(x, axis=axis)
  if t is None:
    return s, None
  return s, s * (t - jnp.sum(s * t, axis=axis, keepdims=True))


def _log_softmax_jvp(primals, tangents, *, axis):
  (x,), (t,) = primals, tangents
  y = log_softmax_p.bind(x, axis=axis)
  if t is None:
    return y, None
  return y, t - jnp.sum(softmax_p.bind(x, axis=axis) * t, axis=axis, keepdims=True)


def _logsumexp_jvp(primals, tangents, *, axis):
  (x,), (t,) = primals, tangents
  y = logsumexp_p.bind(x, axis=axis)
  if t is None:
    return y, None
  return y, jnp.sum(softmax_p.bind(x, axis=axis) * t, axis=axis)


def _sce_jvp(primals, tangents):
  (logits, labels), (dlogits, dlabels) = primals, tangents
  out = sce_p.bind(logits, labels)
  dout = None
  if dlogits is not None:
    # d/dz of -Σ y log softmax(z) = softmax(z)·Σy − y (exact for any labels)
    grad = softmax_p.bind(logits, axis=-1) * jnp.sum(labels, -1, keepdims=True) - labels
    dout = jnp.sum(grad * dlogits, axis=-1)
  if dlabels is not None:
    t = -jnp.sum(dlabels * log_softmax_p.bind(logits, axis=-1), axis=-1)
    dout = t if dout is None else dout + t
  return out, dout


def _bce_jvp(primals, tangents):
  (logits, labels), (dlogits, dlabels) = primals, tangents
  out = bce_p.bind(logits, labels)
  dout = None
  if dlogits is not None:
    dout = (jax.nn.sigmoid(logits) - labels) * dlogits
  if dlabels is not None:
    t = -logits * dlabels
    dout = t if dout is None else dout + t
  return out, dout


softmax_p = define("softmax", _softmax_impl, _softmax_jvp)
log_softmax_p = define("log_softmax", _log_softmax_impl, _log_softmax_jvp)
logsumexp_p = define("logsumexp", _logsumexp_impl, _logsumexp_jvp)
sce_p = define("softmax_cross_entropy", _sce_impl, _sce_jvp)
bce_p = define("sigmoid_binary_cross_entropy", _bce_impl, _bce_jvp)


def _float(x):
  x = jnp.asarray(x)
  return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)


def softmax(x, axis: int = -1):
  """`jax.nn.softmax` over one axis, with a tight bound rule."""
  x = _float(x)
  return softmax_p.bind(x, axis=negative_axis(axis, x.ndim))


def log_softmax(x, axis: int = -1):
  """`jax.nn.log_softmax` over one axis, with a tight bound rule."""
  x = _float(x)
  return log_softmax_p.bind(x, axis=negative_axis(axis, x.ndim))


def logsumexp(x, axis: int = -1):
  """`jax.nn.logsumexp` over one axis, with a tight (exact) bound rule."""
  x = _float(x)
  return logsumexp_p.bind(x, axis=negative_axis(axis, x.ndim))


def softmax_cross_entropy(logits, labels):
  """``-Σ_i y_i log softmax(z)_i`` over the last axis; ``labels`` are probabilities (one-hot).

  Its gradient with respect to the logits is ``softmax(z)·Σy − y``, computed with the composite
  softmax so that interval bounds of the gradient are tight.
  """
  logits = _float(logits)
  labels = jnp.broadcast_to(jnp.asarray(labels, logits.dtype), logits.shape)
  return sce_p.bind(logits, labels)


def softmax_cross_entropy_with_integer_labels(logits, labels):
  """Cross-entropy with integer class labels (one-hot encoded internally)."""
  logits = _float(logits)
  return softmax_cross_entropy(logits, jax.nn.one_hot(labels, logits.shape[-1],
                                                      dtype=logits.dtype))


def sigmoid_binary_cross_entropy(logits, labels):
  """``softplus(z) − y·z`` element-wise (binary cross-entropy with logits); d/dz = σ(z) − y."""
  logits = _float(logits)
  labels = jnp.asarray(labels, logits.dtype)
  shape = jnp.broadcast_shapes(logits.shape, labels.shape)
  return bce_p.bind(jnp.broadcast_to(logits, shape), jnp.broadcast_to(labels, shape))


# ----------------------------------------------------------------------------------------------
# bounds over boxes (plain functions of endpoint arrays)
# ----------------------------------------------------------------------------------------------


def _lse_excluding(v):
  """``out[..., i] = log Σ_{j≠i} exp(v[..., j])`` along the last axis, in O(n)."""
  neg_inf = jnp.full(v.shape[:-1] + (1,), -jnp.inf, v.dtype)
  inclusive = lax.cumlogsumexp(v, axis=v.ndim - 1)
  prefix = jnp.concatenate([neg_inf, inclusive[..., :-1]], axis=-1)
  suffix_incl = lax.cumlogsumexp(v, axis=v.ndim - 1, reverse=True)
  suffix = jnp.concatenate([suffix_incl[..., 1:], neg_inf], axis=-1)
  return jnp.logaddexp(prefix, suffix)


def _log_slack(l, u, sound: bool):
  """A priori error bound of the log-domain formulas along the last axis (module docstring)."""
  if not sound:
    return None
  n = l.shape[-1]
  m = jnp.maximum(jnp.max(jnp.abs(l), -1, keepdims=True), jnp.max(jnp.abs(u), -1, keepdims=True))
  return (n + 4) * 4 * rounding.unit_roundoff(l.dtype) * (m + 1 + jnp.log(float(n)))


def log_softmax_bounds(lower, upper, axis: int = -1, sound: bool = False):
  """Exact coordinate-wise bounds of log_softmax over the box [lower, upper] along ``axis``
  (outward-rounded by the module's error bound when ``sound``)."""
  l, u = jnp.moveaxis(lower, axis, -1), jnp.moveaxis(upper, axis, -1)
  if l.shape[-1] == 1:
    z = jnp.zeros_like(l)
    return jnp.moveaxis(z, -1, axis), jnp.moveaxis(z, -1, axis)
  lo = l - jnp.logaddexp(l, _lse_excluding(u))
  hi = u - jnp.logaddexp(u, _lse_excluding(l))
  slack = _log_slack(l, u, sound)
  if slack is not None:
    lo, hi = rounding.outward(lo, hi, ulps=2, abs_err=slack)
  hi = jnp.minimum(hi, 0.0)
  lo = jnp.minimum(lo, hi)
  return jnp.moveaxis(lo, -1, axis), jnp.moveaxis(hi, -1, axis)


def softmax_bounds(lower, upper, axis: int = -1, sound: bool = False):
  """Exact coordinate-wise bounds of softmax over the box (AGT, App. B)."""
  lo, hi = log_softmax_bounds(lower, upper, axis, sound)
  lo, hi = jnp.exp(lo), jnp.exp(hi)
  if sound:
    lo, hi = rounding.outward(lo, hi, ulps=4)
  return jnp.clip(lo, 0.0, 1.0), jnp.clip(hi, 0.0, 1.0)


def logsumexp_bounds(lower, upper, axis: int = -1, sound: bool = False):
  """logsumexp is increasing in every coordinate: ``[lse(l), lse(u)]``."""
  lo, hi = jax.nn.logsumexp(lower, axis=axis), jax.nn.logsumexp(upper, axis=axis)
  if sound:
    slack = _log_slack(jnp.moveaxis(lower, axis, -1), jnp.moveaxis(upper, axis, -1), True)
    lo, hi = rounding.outward(lo, hi, ulps=2, abs_err=slack[..., 0])
  return lo, hi


def softmax_cross_entropy_bounds(lower, upper, labels, sound: bool = False):
  """``-Σ y log softmax(z)`` over the box, term by term with the exact log-softmax bounds."""
  lo_lp, hi_lp = log_softmax_bounds(lower, upper, -1, sound)
  y_pos, y_neg = jnp.maximum(labels, 0), jnp.minimum(labels, 0)
  lo = -(jnp.sum(y_pos * hi_lp, -1) + jnp.sum(y_neg * lo_lp, -1))
  hi = -(jnp.sum(y_pos * lo_lp, -1) + jnp.sum(y_neg * hi_lp, -1))
  if sound:
    mag = jnp.abs(labels) * jnp.maximum(jnp.abs(lo_lp), jnp.abs(hi_lp))
    err = rounding.gamma(2 * labels.shape[-1] + 2, lo.dtype) * jnp.sum(mag, -1)
    lo, hi = rounding.outward(lo, hi, ulps=1, abs_err=err)
  return lo, hi


def sigmoid_binary_cross_entropy_bounds(lower, upper, labels, sound: bool = False):
  """f(z) = softplus(z) − y z is convex in z: the maximum is at an end of [l, u]; the minimum is
  bounded below by the tangent at z* = clip(logit(y), l, u),
  ``f(z) ≥ f(z*) + f'(z*)(z − z*)``, minimised over the two ends (exact when z* is the true
  minimiser, sound for any z*)."""
  f = lambda z: jnp.logaddexp(jnp.zeros((), z.dtype), z) - labels * z
  y = jnp.clip(labels, 0.0, 1.0)
  z_star = jnp.clip(jnp.log(y) - jnp.log1p(-y), lower, upper)
  slope = jax.nn.sigmoid(z_star) - labels
  lo = f(z_star) + jnp.minimum(slope * (lower - z_star), slope * (upper - z_star))
  lo = jnp.minimum(lo, jnp.minimum(f(lower), f(upper)))
  hi = jnp.maximum(f(lower), f(upper))
  if sound:
    def mag(z):
      return jnp.abs(jnp.logaddexp(jnp.zeros((), z.dtype), z)) + jnp.abs(labels * z) + 1
    scale = jnp.maximum(jnp.maximum(mag(lower), mag(upper)), mag(z_star))
    err = 8 * rounding.unit_roundoff(lo.dtype) * (scale + jnp.abs(slope) * (upper - lower))
    lo, hi = rounding.outward(lo, hi, ulps=2, abs_err=err)
  return lo, hi


# ----------------------------------------------------------------------------------------------
# interval rules, keyed by primitive (used by the interval domain's table)
# ----------------------------------------------------------------------------------------------

def _iv(lo, hi) -> Interval:
  return Interval(lo, hi, validate=False)


def _bounds(x):
  return (x.lower, x.upper) if isinstance(x, Interval) else (x, x)


def _exact_on_points(ctx, lo, hi, is_point, value):
  """Outside sound mode, a degenerate box (every input of the output at one value) gives the
  function's own value bit for bit, not the bound formula's rounding of it."""
  if ctx.sound:
    return _iv(lo, hi)
  return _iv(jnp.where(is_point, value, lo), jnp.where(is_point, value, hi))


def _row_point(l, u, axis, keepdims=True):
  return jnp.all(l == u, axis=axis, keepdims=keepdims)


def _softmax_rule(ctx, x, *, axis):
  l, u = _bounds(x)
  return _exact_on_points(ctx, *softmax_bounds(l, u, axis, ctx.sound), _row_point(l, u, axis),
                          _softmax_impl(l, axis=axis))


def _log_softmax_rule(ctx, x, *, axis):
  l, u = _bounds(x)
  return _exact_on_points(ctx, *log_softmax_bounds(l, u, axis, ctx.sound),
                          _row_point(l, u, axis), _log_softmax_impl(l, axis=axis))


def _logsumexp_rule(ctx, x, *, axis):
  l, u = _bounds(x)
  return _exact_on_points(ctx, *logsumexp_bounds(l, u, axis, ctx.sound),
                          _row_point(l, u, axis, keepdims=False), _logsumexp_impl(l, axis=axis))


def _sce_rule(ctx, logits, labels):
  if isinstance(labels, Interval):
    return NotImplemented
  l, u = _bounds(logits)
  return _exact_on_points(ctx, *softmax_cross_entropy_bounds(l, u, labels, ctx.sound),
                          _row_point(l, u, -1, keepdims=False), _sce_impl(l, labels))


def _bce_rule(ctx, logits, labels):
  if isinstance(labels, Interval):
    return NotImplemented
  l, u = _bounds(logits)
  return _exact_on_points(ctx, *sigmoid_binary_cross_entropy_bounds(l, u, labels, ctx.sound),
                          l == u, _bce_impl(l, labels))


INTERVAL_RULES = {
    softmax_p.name: _softmax_rule,
    log_softmax_p.name: _log_softmax_rule,
    logsumexp_p.name: _logsumexp_rule,
    sce_p.name: _sce_rule,
    bce_p.name: _bce_rule,
}
"""Interval rules of the composites; a rule returning NotImplemented (interval labels) makes
the domain bound the primitive's body equation by equation instead."""

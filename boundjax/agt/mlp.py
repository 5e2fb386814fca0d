"""Explicit interval passes for Dense+ReLU networks (AGT, App. B).

This is the layer-wise reference implementation of the bounds AGT needs for fully connected
ReLU networks: forward IBP with interval parameters and a point input (§2.2), the tight
loss-gradient rules (§2.3) and the backward interval pass to per-sample parameter-gradient
bounds (§2.4). The generic path through ``boundjax.ibp`` bounds any ``apply_fn``; this module
is kept beside it as an independent cross-check and for its tighter final-layer margin bound.

Parameters are a sequence of Dense layers ``{"kernel": (in, out), "bias": (out,)}`` applied as
``z = relu(z @ kernel + bias)`` with no ReLU after the last layer. Accepted containers: a list or
tuple of such dicts, a dict ``{"Dense_0": ..., "Dense_1": ...}`` (Flax ``nn.Dense`` naming, any
prefix, ordered by the trailing number) or that dict under a ``"params"`` key: whatever
`boundjax.models.dense_layers` reads (``layers`` and ``rebuild`` here are that parser).

``matmul`` names the interval product as `boundjax.ibp` does: "midrad" or "signsplit".
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from boundjax.agt import losses
from boundjax.core.interval import Interval, bilinear_midrad, bilinear_signsplit, mul_bounds
from boundjax.models import dense_layers, rebuild_dense

Array = jax.Array


# ----------------------------------------------------------------------------------------------
# Parameter containers: the package's one Dense-stack parser (`boundjax.models.dense_layers`)
# ----------------------------------------------------------------------------------------------

layers = dense_layers
rebuild = rebuild_dense

#: Interval products the explicit passes implement (`boundjax.ibp`'s names).
MATMULS = ("midrad", "signsplit")


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
# Interval passes
# ----------------------------------------------------------------------------------------------

def _as_iv(x: Any) -> Interval:
  return x if isinstance(x, Interval) else Interval(x, x, validate=False)


def _bilinear(matmul: str) -> Callable:
  """The interval product of two boxes: midpoint-radius or sign-split (`boundjax.core.interval`)."""
  if matmul == "midrad":
    return bilinear_midrad
  if matmul == "signsplit":
    return bilinear_signsplit
  raise ValueError(f"agt.mlp: matmul must be one of {MATMULS} (the explicit Dense passes), got "
                   f"{matmul!r}; use the 'ibp' back-end for {matmul!r}.")


def interval_matmul(a: Any, b: Any, matmul: str) -> Interval:
  if not isinstance(a, Interval) and not isinstance(b, Interval):
    v = a @ b
    return Interval(v, v, validate=False)
  lo, hi = _bilinear(matmul)(jnp.matmul, a, b)
  return Interval(lo, hi, validate=False)


def _add(a: Interval, b: Any) -> Interval:
  b = _as_iv(b)
  return Interval(a.lower + b.lower, a.upper + b.upper, validate=False)


def interval_relu(a: Interval) -> Interval:
  return Interval(jax.nn.relu(a.lower), jax.nn.relu(a.upper), validate=False)


def forward_bounds(param_bounds: Any, x: Any, matmul: str = "midrad",
                   keep: bool = False) -> Interval | tuple[Interval, list]:
  """Forward IBP with interval parameters (AGT, App. B): ``z^k = relu(W^k (x) z^{k-1} (+) b^k)``.

  ``x`` may be a point or an Interval, with or without a batch axis. With ``keep=True`` also
  returns the cached ``[(z^{k-1}, zhat^k)]`` per layer for the backward pass.
  """
  ls = layers(param_bounds)
  z: Any = x
  cache = []
  for i, l in enumerate(ls):
    zh = _add(interval_matmul(z, l["kernel"], matmul), l["bias"])
    cache.append((z, zh))
    z = interval_relu(zh) if i < len(ls) - 1 else zh
  return (z, cache) if keep else z


def interval_outer(z: Any, d: Interval, nonneg: bool = False) -> Interval:
  """Bounds of the outer product ``z d^T`` (one sample), exact element-wise.

  A point ``z`` or a non-negative interval ``z`` (post-ReLU) needs two products per entry
  (the sign of one factor picks the corner); otherwise the four corner products are compared.
  """
  dl, du = d.lower[None, :], d.upper[None, :]
  if not isinstance(z, Interval):
    x = z[:, None]
    pos = x >= 0
    return Interval(jnp.where(pos, x * dl, x * du), jnp.where(pos, x * du, x * dl),
                    validate=False)
  zl, zu = z.lower[:, None], z.upper[:, None]
  if nonneg:   # 0 <= zl <= z <= zu
    return Interval(jnp.where(dl >= 0, zl * dl, zu * dl), jnp.where(du >= 0, zu * du, zl * du),
                    validate=False)
  lo, hi = mul_bounds(zl, zu, dl, du)
  return Interval(lo, hi, validate=False)


def heaviside_times(zh: Interval, d: Interval) -> Interval:
  """``H(zhat) (.) d`` with H = 1[zhat > 0] applied to both bounds (H(0) = 0, as jax.nn.relu)."""
  hl, hu = zh.lower > 0, zh.upper > 0
  zero = jnp.zeros_like(d.lower)
  lo = jnp.where(hl, d.lower, jnp.where(hu, jnp.minimum(d.lower, 0), zero))
  hi = jnp.where(hl, d.upper, jnp.where(hu, jnp.maximum(d.upper, 0), zero))
  return Interval(lo, hi, validate=False)


def sample_grad_bounds(param_bounds: Any, x: Any, y: Array, loss: str,
                       matmul: str = "midrad", logit_grad: Callable | None = None) -> Any:
  """Per-sample parameter-gradient bounds (AGT, App. B) for ONE sample ``(x, y)``.

  Returns a pytree like ``param_bounds`` whose Interval leaves contain ``d loss / d theta`` at
  ``(x, y)`` for every ``theta`` in ``param_bounds`` (vmap it over a batch). ``x`` may be an
  Interval (an input box: poisoning). ``logit_grad(logits: Interval, y) -> Interval`` replaces
  `losses.logit_grad_bounds` (e.g. a set of labels, `boundjax.agt.poisoning`).
  """
  ls = layers(param_bounds)
  logits, cache = forward_bounds(param_bounds, x, matmul, keep=True)
  if logit_grad is None:
    d = losses.logit_grad_bounds(loss, logits, y)      # d loss / d zhat^K
  else:
    d = logit_grad(logits, y)
  grads = [None] * len(ls)
  for i in range(len(ls) - 1, -1, -1):
    z_prev, _ = cache[i]
    grads[i] = {"kernel": interval_outer(z_prev, d, nonneg=i > 0), "bias": d}
    if i > 0:
      w = ls[i]["kernel"]                              # (in, out)
      dz = interval_matmul(w, d, matmul)                       # d loss / d z^{i-1} = W (x) d
      d = heaviside_times(cache[i - 1][1], dz)        # d loss / d zhat^{i-1}
  return rebuild(param_bounds, grads)


def per_sample_grads(params: Any, xs: Array, ys: Array, loss: str) -> Any:
  """Nominal per-sample gradients ``d loss(f(x_i), y_i) / d theta`` (leading axis = sample).

  The same values as ``vmap(grad(loss))``, written as batched passes: the forward and
  ``delta^{k-1} = (delta^k W^T) (.) H(zhat^{k-1})`` are (b, d) x (d, m) products and the kernel
  gradient is the broadcast outer product ``z_i delta_i^T``. XLA on CPU turns the vmapped
  per-sample gradient into b tiny batched matmuls, several times slower.
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
  grads = [None] * len(ls)
  for i in range(len(ls) - 1, -1, -1):
    z_prev = zs[2 * i]
    grads[i] = {"kernel": z_prev[:, :, None] * d[:, None, :], "bias": d}
    if i > 0:
      d = (d @ ls[i]["kernel"].T) * (zs[2 * i - 1] > 0).astype(d.dtype)
  return rebuild(params, grads)


def grad_bounds(param_bounds: Any, xs: Any, ys: Array, loss: str, matmul: str = "midrad",
                logit_grad: Callable | None = None) -> Any:
  """`sample_grad_bounds` over a batch (leading axis of every output leaf = sample; ``xs`` may
  be an Interval of inputs)."""
  return jax.vmap(lambda x, y: sample_grad_bounds(param_bounds, x, y, loss, matmul, logit_grad)
                  )(xs, ys)


def margin_bounds(param_bounds: Any, x: Array, cls: Array, matmul: str = "midrad") -> Array:
  """Lower bounds of ``z_c - z_j`` for every class j (batched ``x``; ``cls`` the class c).

  The difference is folded into the last layer, ``(W_c - W_j) h + (b_c - b_j)``, so the shared
  penultimate activations ``h`` are not counted twice (tighter than ``zL_c - zU_j``).
  """
  ls = layers(param_bounds)
  h: Any = x
  for l in ls[:-1]:
    h = interval_relu(_add(interval_matmul(h, l["kernel"], matmul), l["bias"]))
  w, b = _as_iv(ls[-1]["kernel"]), _as_iv(ls[-1]["bias"])
  wc_l = jnp.take(w.lower, cls, axis=1).T[:, :, None]       # (batch, in, 1)
  wc_u = jnp.take(w.upper, cls, axis=1).T[:, :, None]
  dw = Interval(wc_l - w.upper[None], wc_u - w.lower[None], validate=False)   # (batch, in, C)
  db_l = jnp.take(b.lower, cls)[:, None] - b.upper[None]
  h = _as_iv(h)
  if h.lower.ndim == 1:
    h = Interval(jnp.broadcast_to(h.lower, (cls.shape[0],) + h.lower.shape),
                 jnp.broadcast_to(h.upper, (cls.shape[0],) + h.upper.shape), validate=False)
  hb = Interval(h.lower[:, None, :], h.upper[:, None, :], validate=False)   # (batch, 1, in)
  lo, _ = _bilinear(matmul)(jnp.matmul, hb, dw)
  return lo[:, 0, :] + db_l

"""CROWN bounds over a parameter box for Dense+ReLU networks with a fixed input (AGT forward pass).

AGT bounds the logits of one sample ``x`` for every parameter vector in the box
``[theta_L, theta_U]`` (AGT, §4.2 and App. B use interval bound propagation). The public AGT code
offers a tighter forward pass, CROWN with interval parameters (its ``CROWNBoundedModel``, listed
in the AGT paper's code release beside the interval model). This module is an MLP-specialised
linear bound propagation for that setting.

Setting. ``zhat^1 = x W^1 + b^1``, ``h^i = relu(zhat^i)``, ``zhat^{i+1} = h^i W^{i+1} + b^{i+1}``,
with every ``W^i`` in ``[W^i_L, W^i_U]``, every ``b^i`` in ``[b^i_L, b^i_U]`` and ``x`` a point.

Three facts give the scheme (layers numbered from 1):

1. ``zhat^1`` is linear in the parameters of layer 1 and its coordinates use disjoint
   parameters, so its box is exact and its coordinates vary independently; so do the
   coordinates of ``h^1 = relu(zhat^1)``, over exactly ``[relu(l^1), relu(u^1)]``.
2. For ``h >= 0`` and ``c`` a point vector, ``sum_j c_j (h W)_j = sum_m h_m v_m`` with
   ``v_m = sum_j c_j W_mj``, whose exact range is ``[A_m, B_m]``,
   ``A_m = sum_j (c_j^+ W_L,mj + c_j^- W_U,mj)`` (and ``B`` with L and U swapped). Since
   ``h_m >= 0``, ``h_m v_m >= A_m h_m`` for every weight in the box. This is the McCormick
   plane ``v h >= A h + h_L (v - A) - ...`` with its parameter term concretised at once
   (McCormick 1976, "Computability of global solutions to factorable nonconvex programs",
   §3), which is sound because every parameter enters the linear form in one layer only. The
   bias adds ``sum_j min(c_j b_L,j, c_j b_U,j)``.
3. A ReLU between layers is replaced by CROWN's lines on its pre-activation bounds ``[l, u]``
   (Zhang et al. 2018, "Efficient Neural Network Robustness Certification with General
   Activation Functions", §3.2, CROWN-Ada): exact on stable neurons; on unstable ones the
   upper line ``u (t - l) / (u - l)`` for negative coefficients and the lower line ``a t``,
   ``a = 1[u > -l]``, for non-negative ones.

So the lower bound of ``c . zhat^K`` is a backward pass: at layer ``i`` the coefficient on
``h^{i-1}`` is ``A`` (fact 2), which the ReLU lines (fact 3) turn into a coefficient on
``zhat^{i-1}``, and so on down to ``h^1``, where the form ``sum_m A_m h^1_m + const`` is
concretised *exactly* on ``h^1``'s independent box (fact 1): ``sum_m min(A_m relu(l_m),
A_m relu(u_m))``. The upper bound is minus the lower bound of ``-c``. Unlike the public code,
which carries interval-valued coefficients (``Lambda``, concretising mixed-sign entries at each
node), the coefficients here stay points: the sign of ``h >= 0`` fixes the worst weight.

Consequences: the bounds of ``zhat^1`` and ``zhat^2`` (a network with one hidden layer) are
already exact per coordinate with the sign-split interval product, so CROWN tightens the logits
only from two hidden layers on (or against the midpoint-radius product). Intermediate
pre-activations from ``zhat^3`` on are bounded by the same backward pass (``c`` = unit vectors),
each intersected with the interval bound, so nothing is ever looser than interval arithmetic.

Floating point: the backward pass uses ordinary rounding; before intersecting, each CROWN bound
is widened by ``2 (N + 4 K) eps S``, where ``N`` is the total fan-in of the pass, ``K`` its depth
and ``S`` the sum of the magnitudes of every term it adds (an absolute-value pass beside the
real one), a first-order bound on the accumulated rounding error of the sums (Higham 2002,
"Accuracy and Stability of Numerical Algorithms", §3.1), so that a bound equal to the true value
in exact arithmetic is not rounded past it; the exact first-layer and sign-split second-layer
boxes are widened the same way (`_widen`) before they are intersected with the interval pass.
So on a point box the result is the interval pass's (the nominal logits with "midrad").
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from boundjax.agt import losses, mlp
from boundjax.core.interval import Interval

Array = jax.Array


def _iv(a: Any) -> Interval:
  return a if isinstance(a, Interval) else Interval(a, a, validate=False)


def _relu_lines(l: Array, u: Array) -> tuple[Array, Array, Array]:
  """CROWN-Ada lines of ``relu`` on ``[l, u]`` (Zhang et al. 2018, §3.2): ``a_lo t <= relu(t) <=
  a_up t + b_up``. Stable neurons are exact; unstable ones take the chord above and slope
  ``1[u > -l]`` below."""
  act, ina = l >= 0, u <= 0
  unst = ~(act | ina)
  den = jnp.where(unst, u - l, 1.0)
  s = jnp.where(unst, u / den, jnp.where(act, 1.0, 0.0))
  a_lo = jnp.where(unst, (u > -l).astype(l.dtype), s)
  b_up = jnp.where(unst, -s * l, 0.0)
  return a_lo, s, b_up


def _coef(c: Array, w: Interval) -> tuple[Array, Array]:
  """``A = c^+ W_L^T + c^- W_U^T`` (the exact minimum of ``c . W_m`` over the box, per row m of
  the (in, out) kernel) and its magnitude bound ``|c| max(|W_L|, |W_U|)^T``."""
  cp, cn = jnp.maximum(c, 0), jnp.minimum(c, 0)
  a = cp @ w.lower.T + cn @ w.upper.T
  mag = jnp.abs(c) @ jnp.maximum(jnp.abs(w.lower), jnp.abs(w.upper)).T
  return a, mag


def _bias(c: Array, b: Interval) -> tuple[Array, Array]:
  """``sum_j min(c_j b_L,j, c_j b_U,j)`` and its magnitude."""
  lo = jnp.maximum(c, 0) @ b.lower + jnp.minimum(c, 0) @ b.upper
  return lo, jnp.abs(c) @ jnp.maximum(jnp.abs(b.lower), jnp.abs(b.upper))


def backward_lower(ls: list, pre: list[Interval], c: Array, top: int) -> Array:
  """Lower bounds of ``c_s . zhat^{top}`` for every row ``c_s`` of ``c`` (shape (S, n_top)), over
  the parameter box, for one sample.

  ``ls`` are the layers of the box (`boundjax.agt.mlp.layers`, 0-based: ``ls[0]`` acts on x),
  ``pre[i]`` sound bounds of ``zhat`` at layer i (``pre[0]`` the exact first-layer box) for
  ``i < top``; ``top >= 1``. The backward pass of the module docstring, widened by its rounding
  margin.
  """
  const, mag = _bias(c, _iv(ls[top]["bias"]))
  terms = c.shape[-1]
  for i in range(top, 0, -1):
    w = _iv(ls[i]["kernel"])
    a, amag = _coef(c, w)                   # coefficient on h^{i-1} >= 0, and |.| bound
    terms += w.lower.shape[1]
    l, u = pre[i - 1].lower, pre[i - 1].upper
    if i == 1:                              # h^0 = relu(zhat^0): exact, independent box
      hl, hu = jax.nn.relu(l), jax.nn.relu(u)
      const = const + jnp.maximum(a, 0) @ hl + jnp.minimum(a, 0) @ hu
      mag = mag + amag @ hu
      break
    a_lo, a_up, b_up = _relu_lines(l, u)
    c = jnp.where(a >= 0, a * a_lo, a * a_up)
    const = const + jnp.minimum(a, 0) @ b_up
    mag = mag + amag @ (jnp.abs(b_up) + jnp.maximum(jnp.abs(l), jnp.abs(u)))   # + slope error
    bc, bmag = _bias(c, _iv(ls[i - 1]["bias"]))
    const, mag = const + bc, mag + bmag
    terms += c.shape[-1]
  eps = jnp.finfo(const.dtype).eps
  return const - 2 * (terms + 4 * (top + 1)) * eps * mag


def _widen(iv: Interval, mag: Array, n: int) -> Interval:
  """``iv`` widened by ``2 (n + 2) eps mag``: the rounding bound of a sum of n terms whose
  magnitudes add up to ``mag`` (Higham 2002, §3.1), so that a bound computed in a different
  summation order than the interval pass does not cut into it."""
  m = 2 * (n + 2) * jnp.finfo(iv.lower.dtype).eps * mag
  return Interval(iv.lower - m, iv.upper + m, validate=False)


def _wmag(w: Interval) -> Array:
  return jnp.maximum(jnp.abs(w.lower), jnp.abs(w.upper))


def _first_layer(l0: dict, x: Array) -> Interval:
  """The exact box of ``zhat^1 = x W + b`` for a point x: each entry is a sum of the exact
  products ``x_m W_mj`` (sign of ``x_m`` picks the corner) plus the bias (widened by `_widen`)."""
  w, b = _iv(l0["kernel"]), _iv(l0["bias"])
  xs = x[:, None]
  p, q = xs * w.lower, xs * w.upper
  iv = Interval(jnp.sum(jnp.minimum(p, q), 0) + b.lower,
                jnp.sum(jnp.maximum(p, q), 0) + b.upper, validate=False)
  return _widen(iv, jnp.abs(x) @ _wmag(w) + _wmag(b), x.shape[0])


def _intersect(a: Interval, lo: Array, hi: Array) -> Interval:
  return Interval(jnp.maximum(a.lower, lo), jnp.minimum(a.upper, hi), validate=False)


def _sample_forward(param_bounds: Any, x: Array, matmul: str) -> tuple[Interval, list]:
  """Per-layer pre-activation bounds of one sample: exact on layer 1, sign-split intervals on
  layer 2 (exact there too, fact 1 of the module docstring), CROWN intersected with the
  interval pass (in ``matmul``) from layer 3 on. Returns the logits and the cache
  ``[(z^{i-1}, zhat^i)]`` of `boundjax.agt.mlp.forward_bounds`."""
  ls = mlp.layers(param_bounds)
  pre: list[Interval] = []
  cache = []
  z: Any = x
  for i, l in enumerate(ls):
    ibp = mlp._add(mlp._matmul(z, l["kernel"], matmul), l["bias"])
    if i == 0:
      first = _first_layer(l, x)
      zh = _intersect(ibp, first.lower, first.upper)
    else:
      if i == 1:
        sign = _widen(mlp._add(mlp._matmul(z, l["kernel"], "signsplit"), l["bias"]),
                      z.upper @ _wmag(_iv(l["kernel"])) + _wmag(_iv(l["bias"])),
                      z.upper.shape[0])
        zh = _intersect(ibp, sign.lower, sign.upper)
      else:
        n = _iv(l["bias"]).lower.shape[0]
        eye = jnp.eye(n, dtype=ibp.lower.dtype)
        lo = backward_lower(ls, pre, jnp.concatenate([eye, -eye]), i)
        zh = _intersect(ibp, lo[:n], -lo[n:])
    pre.append(zh)
    cache.append((z, zh))
    z = mlp._relu(zh) if i < len(ls) - 1 else zh
  return z, cache


def _check_point(x: Any) -> None:
  if isinstance(x, Interval):
    raise TypeError("agt.crown: x must be a point (array), not an Interval: CROWN over the "
                    "parameter box assumes a fixed input (use bound_method='interval' for "
                    "input boxes).")


def forward_bounds(param_bounds: Any, x: Array, matmul: str = "midrad") -> Interval:
  """Logit bounds over the parameter box, CROWN (module docstring) intersected with interval
  propagation; ``x`` a point, batched (n, d) or single (d,)."""
  _check_point(x)
  x = jnp.asarray(x)
  if x.ndim == 1:
    return _sample_forward(param_bounds, x, matmul)[0]
  return jax.vmap(lambda xi: _sample_forward(param_bounds, xi, matmul)[0])(x)


def margin_bounds(param_bounds: Any, x: Array, cls: Array, matmul: str = "midrad") -> Array:
  """Lower bounds of ``z_c - z_j`` for every class j (batched x, ``cls`` the class c): the
  backward pass with ``c = e_c - e_j`` on the logits, intersected with the interval bound of
  `boundjax.agt.mlp.margin_bounds` (the last layer folded)."""
  _check_point(x)
  ls = mlp.layers(param_bounds)
  ibp = mlp.margin_bounds(param_bounds, x, cls, matmul)
  if len(ls) == 1:
    return ibp
  n = _iv(ls[-1]["bias"]).lower.shape[0]
  eye = jnp.eye(n, dtype=ibp.dtype)

  def one(xi, ci):
    _, cache = _sample_forward(param_bounds, xi, matmul)
    pre = [zh for _, zh in cache]
    return backward_lower(ls, pre, eye[ci][None, :] - eye, len(ls) - 1)
  return jnp.maximum(ibp, jax.vmap(one)(jnp.asarray(x), jnp.asarray(cls)))


def sample_grad_bounds(param_bounds: Any, x: Array, y: Array, loss: str,
                       matmul: str = "midrad") -> Any:
  """Per-sample parameter-gradient bounds for ONE sample (AGT, App. B) with the forward pass
  bounded by CROWN: the logit bounds feed the loss-gradient rule and the intermediate
  activation bounds feed the interval backward pass of `boundjax.agt.mlp`."""
  ls = mlp.layers(param_bounds)
  logits, cache = _sample_forward(param_bounds, x, matmul)
  d = losses.logit_grad_bounds(loss, logits, y)
  grads = [None] * len(ls)
  for i in range(len(ls) - 1, -1, -1):
    z_prev, _ = cache[i]
    grads[i] = {"kernel": mlp._outer(z_prev, d, nonneg=i > 0), "bias": d}
    if i > 0:
      dz = mlp._matmul(ls[i]["kernel"], d, matmul)
      d = mlp._heaviside_times(cache[i - 1][1], dz)
  return mlp.rebuild(param_bounds, grads)


def grad_bounds(param_bounds: Any, xs: Array, ys: Array, loss: str, matmul: str = "midrad") -> Any:
  """`sample_grad_bounds` over a batch (leading axis of every output leaf = sample)."""
  _check_point(xs)
  return jax.vmap(sample_grad_bounds, in_axes=(None, 0, 0, None, None))(
      param_bounds, xs, ys, loss, matmul)

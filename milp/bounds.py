"""Pre-activation bounds (big-M constants) for a `Network` over an input box, in float64.

Two methods, both sound for interval parameters (hyper-networks) and for inputs of either sign:

* ``"ibp"`` — interval bound propagation layer by layer (the per-neuron intervals of Tjeng et al.
  that Sphynx, §5.2, inherits without saying how to compute them). For ``W in [W_l, W_u]`` and
  ``h in [l, u]``, split both into sign-definite parts,
  ``h = h+ + h-``, ``W = W+ + W-``; every product of sign-definite factors is bounded by a single
  corner, so

      L = W_l+ l+ + W_l- u+ + W_u+ l- + W_u- u-   (summed over inputs, with a+ = max(a, 0) ...)

  (the same eight products as `boundjax.core.interval.bilinear_signsplit`). This equals the
  four-corner minimum ``sum_j min(W_l l, W_l u, W_u l, W_u u)`` whenever ``h >= 0`` (inputs in
  [0, 1], post-ReLU values) and is sound in general.
* ``"crown"`` — backward linear bounds (CROWN, Zhang et al. 2018) computed for every layer in
  turn, intersected with IBP. Interval parameters are handled by writing each layer as its centre
  plus a bounded perturbation: ``W h + b = W_c h + b_c + d`` with ``|d| <= W_r |h| + b_r`` and
  ``|h| <= max(|l|, |u|)`` from the bounds already computed, so the backward pass runs on the
  centre network and pays ``-|Lambda| r`` for each layer's perturbation.

Floating point: each layer's bounds are widened outward by ``1e-10 * (|W| |h|_max + |b|) +
1e-12``, which dominates the float64 rounding error of the products for any layer under 10^5
inputs, so the big-M constants never cut off a real point.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from milp.network import AffineLayer, Network

Bounds = list[tuple[np.ndarray, np.ndarray]]


def _pos(m):
  return m.maximum(0) if sp.issparse(m) else np.maximum(m, 0)


def _neg(m):
  return m.minimum(0) if sp.issparse(m) else np.minimum(m, 0)


def _abs(m):
  return abs(m)


def _mv(m, v: np.ndarray) -> np.ndarray:
  """Matrix-vector product for dense or sparse ``m``."""
  return np.asarray(m @ v, dtype=np.float64).reshape(-1)


def _rm(lam: np.ndarray, m) -> np.ndarray:
  """``lam @ m`` for a dense ``lam`` (k, out) and dense or sparse ``m`` (out, in)."""
  if sp.issparse(m):
    return np.asarray((m.T @ lam.T).T, dtype=np.float64)
  return lam @ m


def _slack(layer: AffineLayer, hmax: np.ndarray) -> np.ndarray:
  mag = _mv(_abs(layer.w_lower) + _abs(layer.w_upper), hmax) + np.abs(layer.b_lower) + np.abs(
      layer.b_upper)
  return 1e-10 * mag + 1e-12


def affine_ibp(layer: AffineLayer, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Sound bounds on ``W h + b`` over ``W, b`` in the layer's intervals and ``h in [lo, hi]``."""
  lp, hp = np.maximum(lo, 0), np.maximum(hi, 0)
  ln, hn = np.minimum(lo, 0), np.minimum(hi, 0)
  wl, wu = layer.w_lower, layer.w_upper
  # term w*h+ (h+ >= 0): min at w_l (positive part) with l+, or w_l (negative part) with h+ ...
  low = (_mv(_pos(wl), lp) + _mv(_neg(wl), hp)      # w * h+ : h+ in [lp, hp]
         + _mv(_pos(wu), ln) + _mv(_neg(wu), hn)    # w * h- : h- in [ln, hn] (<= 0)
         + layer.b_lower)
  up = (_mv(_pos(wu), hp) + _mv(_neg(wu), lp)
        + _mv(_pos(wl), hn) + _mv(_neg(wl), ln)
        + layer.b_upper)
  s = _slack(layer, np.maximum(np.abs(lo), np.abs(hi)))
  return low - s, up + s


def ibp(net: Network, lo: Any, hi: Any) -> Bounds:
  """Pre-activation bounds ``[(L_m, U_m)]`` for every layer (the last is the output)."""
  lo = np.asarray(lo, np.float64).reshape(-1)
  hi = np.asarray(hi, np.float64).reshape(-1)
  _check_box(net, lo, hi)
  out = []
  for m, layer in enumerate(net.layers):
    L, U = affine_ibp(layer, lo, hi)
    out.append((L, U))
    lo, hi = np.maximum(L, 0), np.maximum(U, 0)
  return out


def _check_box(net: Network, lo: np.ndarray, hi: np.ndarray) -> None:
  if lo.shape != (net.input_size,) or hi.shape != (net.input_size,):
    raise ValueError(
        f"bounds: input box has {lo.size}/{hi.size} entries, the network takes {net.input_size}.")
  if np.any(lo > hi) or not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
    raise ValueError("bounds: input box must be finite with lower <= upper.")


def relu_relaxation(L: np.ndarray, U: np.ndarray):
  """CROWN ReLU relaxation: ``a_lo z <= relu(z) <= a_up z + c_up`` on ``[L, U]``."""
  act = L >= 0
  dead = U <= 0
  unst = ~act & ~dead
  a_up = np.where(act, 1.0, 0.0)
  c_up = np.zeros_like(L)
  denom = np.where(unst, U - L, 1.0)
  a_up = np.where(unst, U / denom, a_up)
  c_up = np.where(unst, -L * U / denom, c_up)
  a_lo = np.where(act, 1.0, 0.0)
  a_lo = np.where(unst & (U > -L), 1.0, a_lo)
  return a_lo, a_up, c_up


def _crown_layer(net: Network, m: int, lo0, hi0, bounds: Bounds, radii) -> tuple[np.ndarray, np.ndarray]:
  """CROWN bounds on the pre-activations of layer ``m`` given bounds of layers ``< m``."""
  centers = [((l.w_lower + l.w_upper) / 2, (l.b_lower + l.b_upper) / 2) for l in net.layers]
  res = []
  for sign in (1.0, -1.0):  # lower bound of sign * z_m
    wc, bc = centers[m]
    n_out = net.layers[m].shape[0]
    lam = sign * np.eye(n_out)
    const = lam @ bc - np.abs(lam) @ radii[m]
    A = _rm(lam, wc)  # coefficients on h_{m-1}
    for k in range(m - 1, -1, -1):
      L, U = bounds[k]
      a_lo, a_up, c_up = relu_relaxation(L, U)
      pos, neg = np.maximum(A, 0), np.minimum(A, 0)
      # lower bound of A relu(z): positive coeffs use lower relaxation, negative the upper.
      coef = pos * a_lo + neg * a_up
      const = const + neg @ c_up
      wc, bc = centers[k]
      const = const + coef @ bc - np.abs(coef) @ radii[k]
      A = _rm(coef, wc)
    const = const + np.maximum(A, 0) @ lo0 + np.minimum(A, 0) @ hi0
    res.append(sign * const)
  low, up = res[0], res[1]
  return low, up


def crown(net: Network, lo: Any, hi: Any) -> Bounds:
  """CROWN pre-activation bounds for every layer, intersected with IBP (both are sound)."""
  lo = np.asarray(lo, np.float64).reshape(-1)
  hi = np.asarray(hi, np.float64).reshape(-1)
  _check_box(net, lo, hi)
  ib = ibp(net, lo, hi)
  bounds: Bounds = []
  radii = []
  hmax = np.maximum(np.abs(lo), np.abs(hi))
  for m, layer in enumerate(net.layers):
    wr = (layer.w_upper - layer.w_lower) / 2
    radii.append(_mv(wr, hmax) + (layer.b_upper - layer.b_lower) / 2)
    cl, cu = _crown_layer(net, m, lo, hi, bounds, radii)
    s = _slack(layer, hmax) * 10.0  # CROWN chains more products than IBP: widen more.
    L = np.maximum(ib[m][0], cl - s)
    U = np.minimum(ib[m][1], cu + s)
    U = np.maximum(U, L)
    bounds.append((L, U))
    hmax = np.maximum(np.abs(np.maximum(L, 0)), np.abs(np.maximum(U, 0)))
  return bounds


def compute(net: Network, lo: Any, hi: Any, method: str = "ibp") -> Bounds:
  """Dispatch: ``method`` is ``"ibp"`` or ``"crown"``."""
  if method == "ibp":
    return ibp(net, lo, hi)
  if method == "crown":
    return crown(net, lo, hi)
  raise ValueError(f"bounds: unknown method {method!r}; use 'ibp' or 'crown'.")


def count_unstable(bounds: Bounds) -> int:
  """Number of hidden neurons whose pre-activation interval straddles 0 (binaries needed)."""
  return int(sum(np.sum((L < 0) & (U > 0)) for L, U in bounds[:-1]))


def crown_output(net: Network, lo: Any, hi: Any, hidden: Bounds) -> tuple[np.ndarray, np.ndarray]:
  """CROWN bounds on the last layer's outputs given sound bounds ``hidden`` on every hidden
  layer's pre-activations (e.g. from `crown`, or from another sound method), widened like `crown`.

  Fold a specification matrix into the last layer first (``C W_L``, ``C b_L - d``) to bound the
  rows ``C y - d`` by back-substitution instead of by the interval of ``y``.
  """
  lo = np.asarray(lo, np.float64).reshape(-1)
  hi = np.asarray(hi, np.float64).reshape(-1)
  _check_box(net, lo, hi)
  if len(hidden) != len(net.layers) - 1:
    raise ValueError(f"crown_output: need {len(net.layers) - 1} hidden-layer bounds, got "
                     f"{len(hidden)}.")
  radii, hmax = [], np.maximum(np.abs(lo), np.abs(hi))
  for m, layer in enumerate(net.layers):
    radii.append(_mv((layer.w_upper - layer.w_lower) / 2, hmax)
                 + (layer.b_upper - layer.b_lower) / 2)
    if m < len(hidden):
      hmax = np.maximum(np.maximum(hidden[m][0], 0), np.maximum(hidden[m][1], 0))
  low, up = _crown_layer(net, len(net.layers) - 1, lo, hi, list(hidden), radii)
  s = _slack(net.layers[-1], hmax) * 10.0
  return low - s, up + s

"""Difference intervals between a network N and a hyper-network N# on one input box (float64).

LUCID, §5.4 and §6.2. For matching neurons of a concrete network ``N`` (weights
``w``, biases ``b``) and a hyper-network ``N#`` of the same architecture (``w# in [w#_l, w#_u]``,
``b# in [b#_l, b#_u]``), evaluated on the *same* input ``x`` in a box, `difference_bounds` returns
sound intervals ``[dl, du]`` containing ``zhat#_m(x) - zhat_m(x)`` (pre-activation, every affine
layer, the logits included) and ``z#_m(x) - z_m(x)`` (post-ReLU, every hidden layer), over every
``x`` in the box and every network whose parameters lie in the hyper-network's box. They are the
matching dependencies and the relax-if-similar test (LUCID, §5.4) of the iDP-DB MILP.

Affine part (the paper's formula, bias included). With ``I_w = [w#_l - w, w#_u - w]`` and
``I_b = [b#_l - b, b#_u - b]`` (these need not contain 0),

    I_zhat_m = I_b + sum_k' ( w * I_z[k'] + I_w * (z[k'] + I_z[k']) ),

the exact identity ``w# z# - w z = (w# - w) z# + w (z# - z)`` evaluated in interval arithmetic,
where ``z + I_z`` encloses the hyper-network's previous-layer value ``z#``. ``z`` is replaced by
N's sound post-ReLU bounds ``[max(0, l), max(0, u)]`` (the input box for the first layer) and
``I_z`` by the previous layer's difference interval (``[0, 0]`` for the shared input). We also
intersect ``z + I_z`` with the hyper-network's own post-ReLU bounds: both enclose ``z#``, so the
intersection is sound and never looser than the paper's enclosure. **The public code
(``HyperlinearDepsIn``) drops ``I_b``, multiplies by the *minimum* weights ``w#_l`` instead of
``w`` and uses the previous pre-activation bounds; it can fail to enclose. We implement the
paper's formula.**

ReLU (LUCID, §6.2): ``relu(a + d) - relu(a) in [min(0, d), max(0, d)]`` (monotone, 1-Lipschitz), so

    I_z = [-max(0, -dl), max(0, du)],

refined by cheap, sound cases of ours (not in the paper): both stably inactive (``u <= 0`` and
``u# <= 0``) gives ``[0, 0]``; both stably active (``l >= 0`` and ``l# >= 0``) gives ``I_zhat``; and always
``I_z ∩ [max(0, l#) - max(0, u), max(0, u#) - max(0, l)]``. Two more one-sided cases (ours, same
reasoning): if only N is stably active, ``z# - z = max(d, -zhat) in [max(dl, -u), max(du, -l)]``;
if only N# is stably active, ``z# - z = min(d, zhat#) in [min(dl, l#), min(du, u#)]``.

Feeding forward (our choice; LUCID, §6.2, only says "bound propagation"): the hyper-network's
pre-activation bounds are interval arithmetic from its previous (refined) post-ReLU bounds,
intersected with ``[l + dl, u + du]``; and the pre-activation difference is intersected with ``[l# - u, u# - l]``.

Floating point: every affine bound is widened outward by ``1e-10 * magnitude + 1e-12`` (the
magnitude of the products involved, as in `milp.bounds`), which dominates float64 rounding of
the parameter differences and the sums, so concrete float64 replays lie inside.

Sparse layer matrices (convolutions from `milp.network.from_flax`) are supported: every product
goes through the dense/sparse helpers of `milp.bounds`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import scipy.sparse as sp

from milp import bounds as bounds_mod
from milp.bounds import Bounds, _mv, _neg, _pos
from milp.network import AffineLayer, Network

Pair = tuple[np.ndarray, np.ndarray]

_REL = 1e-10
_ABS = 1e-12


@dataclasses.dataclass(frozen=True)
class DifferenceBounds:
  """Difference intervals of ``N#`` against ``N`` over one input box (LUCID, §6.2).

  Attributes:
    pre: per affine layer ``m`` (the logits included), ``(dlo, dhi)`` bounding
      ``zhat#_m(x) - zhat_m(x)``.
    post: per hidden layer ``m`` (all but the last), ``(dlo, dhi)`` bounding
      ``relu(zhat#_m(x)) - relu(zhat_m(x))``.
    ref: N's own pre-activation bounds ``[(l_m, u_m)]`` used (as `milp.bounds.compute` returns).
    hyper: N#'s pre-activation bounds ``[(l#_m, u#_m)]``, intersected with
      ``[l_m + dlo_m, u_m + dhi_m]`` (sound, since both enclose ``zhat#_m``).
  """

  pre: tuple[Pair, ...]
  post: tuple[Pair, ...]
  ref: Bounds
  hyper: Bounds

  def widths(self, which: str = "post") -> list[np.ndarray]:
    """Per-layer widths ``dhi - dlo`` of ``pre`` or ``post``."""
    if which not in ("pre", "post"):
      raise ValueError(f"widths: which must be 'pre' or 'post', got {which!r}.")
    return [hi - lo for lo, hi in getattr(self, which)]

  def similar(self, tau: float = 0.01) -> list[np.ndarray]:
    """Per hidden layer, the mask of neurons whose post-ReLU width is ``<= tau`` (LUCID, §5.4)."""
    return [w <= tau for w in self.widths("post")]


def _check_pair(net: Network, hyper: Network) -> None:
  if not isinstance(net, Network) or not isinstance(hyper, Network):
    raise ValueError("difference_bounds: net and hyper must be milp.network.Network instances.")
  if not net.is_point:
    raise ValueError("difference_bounds: net (N) must be a concrete network (point parameters); "
                     "pass the hyper-network as the second argument.")
  if len(net.layers) != len(hyper.layers):
    raise ValueError(f"difference_bounds: net has {len(net.layers)} affine layers but hyper has "
                     f"{len(hyper.layers)}.")
  for m, (a, h) in enumerate(zip(net.layers, hyper.layers)):
    if a.shape != h.shape:
      raise ValueError(f"difference_bounds: layer {m} of net has shape {a.shape} but hyper's "
                       f"has {h.shape}.")
  if tuple(net.input_shape) != tuple(hyper.input_shape):
    raise ValueError(f"difference_bounds: input shapes differ: net {net.input_shape}, hyper "
                     f"{hyper.input_shape}.")


def _abs_mv(m, v: np.ndarray) -> np.ndarray:
  return _mv(abs(m), v)


def _point_times_interval(w, lo: np.ndarray, hi: np.ndarray) -> Pair:
  """``w [lo, hi]`` for a point matrix ``w`` (exact interval product, before rounding)."""
  wp, wn = _pos(w), _neg(w)
  return _mv(wp, lo) + _mv(wn, hi), _mv(wp, hi) + _mv(wn, lo)


def _param_diff(h: AffineLayer, a: AffineLayer) -> AffineLayer:
  """The layer ``(I_w, I_b)``: ``[w#_l - w, w#_u - w]``, ``[b#_l - b, b#_u - b]``."""
  w, hl, hu = a.w_lower, h.w_lower, h.w_upper
  if sp.issparse(w) and sp.issparse(hl) and sp.issparse(hu):
    dwl, dwu = sp.csr_array(hl - w), sp.csr_array(hu - w)
  else:  # mixed storage: subtract densely
    w, hl, hu = (m.toarray() if sp.issparse(m) else np.asarray(m) for m in (w, hl, hu))
    dwl, dwu = hl - w, hu - w
  return AffineLayer(dwl, dwu, h.b_lower - a.b_lower, h.b_upper - a.b_lower)


def affine_difference(a: AffineLayer, h: AffineLayer, z: Pair, dz: Pair, zh: Pair) -> Pair:
  """``I_zhat = I_b + w I_z + I_w (z + I_z)`` for one affine layer (LUCID, §6.2), widened outward.

  Args:
    a: N's (point) layer.
    h: N#'s (interval) layer.
    z: bounds on N's layer input.
    dz: the difference interval ``I_z`` of the layer input.
    zh: bounds on N#'s layer input; intersected with ``z + I_z`` (both enclose it).
  """
  zs_lo = np.maximum(z[0] + dz[0], zh[0])
  zs_hi = np.minimum(z[1] + dz[1], zh[1])
  zs_hi = np.maximum(zs_hi, zs_lo)  # only equal up to rounding when the two touch
  diff = _param_diff(h, a)
  t_lo, t_hi = bounds_mod.affine_ibp(diff, zs_lo, zs_hi)  # I_w (z + I_z) + I_b, already widened
  p_lo, p_hi = _point_times_interval(a.w_lower, dz[0], dz[1])
  hmax = np.maximum.reduce([np.abs(z[0]), np.abs(z[1]), np.abs(zs_lo), np.abs(zs_hi)])
  mag = (_abs_mv(a.w_lower, hmax) + _abs_mv(h.w_lower, hmax) + _abs_mv(h.w_upper, hmax)
         + _abs_mv(a.w_lower, np.maximum(np.abs(dz[0]), np.abs(dz[1])))
         + np.abs(a.b_lower) + np.abs(h.b_lower) + np.abs(h.b_upper))
  s = _REL * mag + _ABS
  return t_lo + p_lo - s, t_hi + p_hi + s


def relu_difference(d: Pair, ref: Pair, hyp: Pair) -> Pair:
  """Bounds on ``relu(zhat#) - relu(zhat)`` from ``zhat# - zhat in d``, ``zhat in ref``,
  ``zhat# in hyp`` (LUCID, §6.2, and our refinements; see the module docstring)."""
  dl, du = d
  l, u = ref
  lh, uh = hyp
  lo, hi = np.minimum(dl, 0.0), np.maximum(du, 0.0)
  act, actn = l >= 0, lh >= 0
  both_act = act & actn
  lo = np.where(both_act, dl, lo)
  hi = np.where(both_act, du, hi)
  only_ref = act & ~actn   # z = zhat: z# - z = max(d, -zhat)
  lo = np.where(only_ref, np.maximum(lo, np.maximum(dl, -u)), lo)
  hi = np.where(only_ref, np.minimum(hi, np.maximum(du, -l)), hi)
  only_hyp = actn & ~act   # z# = zhat#: z# - z = min(d, zhat#)
  lo = np.where(only_hyp, np.maximum(lo, np.minimum(dl, lh)), lo)
  hi = np.where(only_hyp, np.minimum(hi, np.minimum(du, uh)), hi)
  lo = np.maximum(lo, np.maximum(lh, 0.0) - np.maximum(u, 0.0))
  hi = np.minimum(hi, np.maximum(uh, 0.0) - np.maximum(l, 0.0))
  dead = (u <= 0) & (uh <= 0)
  lo = np.where(dead, 0.0, lo)
  hi = np.where(dead, 0.0, hi)
  return lo, np.maximum(hi, lo)


def difference_bounds(net: Network, hyper: Network, lo: Any, hi: Any,
                      method: str = "ibp", ref_bounds: Bounds | None = None,
                      hyper_bounds: list | None = None) -> DifferenceBounds:
  """Difference intervals of ``hyper`` (N#) against ``net`` (N) over the input box ``[lo, hi]``.

  Args:
    net: the concrete network N.
    hyper: a network with interval parameters and N's architecture (N itself need not lie in it).
    lo, hi: the input box (any shape with ``net.input_size`` entries).
    method: how N's pre-activation bounds are computed, ``"ibp"`` or ``"crown"``
      (`milp.bounds.compute`). The hyper-network's bounds are interval arithmetic refined by the
      differences; with ``"crown"`` they are also intersected with CROWN on the hyper-network.
    ref_bounds: optional precomputed sound pre-activation bounds ``[(l_m, u_m)]`` of N over the
      box (e.g. LP-tightened, `milp.idpdb.tighten_net`); they replace ``method``'s bounds for N.
    hyper_bounds: optional sound bounds on N#'s pre-activations, one ``(l#_m, u#_m)`` or
      ``None`` per layer (a shorter list leaves the later layers alone); each is intersected
      with the computed ones before they feed forward. The caller vouches for their soundness.

  Returns:
    `DifferenceBounds` (float64).

  Raises:
    ValueError: ``net`` is not concrete, the two architectures differ, or the box is invalid.
  """
  _check_pair(net, hyper)
  lo = np.asarray(lo, np.float64).reshape(-1)
  hi = np.asarray(hi, np.float64).reshape(-1)
  ref = bounds_mod.compute(net, lo, hi, method)  # validates the box
  if ref_bounds is not None:
    if len(ref_bounds) != len(net.layers):
      raise ValueError(f"difference_bounds: ref_bounds has {len(ref_bounds)} layers, net has "
                       f"{len(net.layers)}.")
    ref = [(np.asarray(a, np.float64), np.asarray(b, np.float64)) for a, b in ref_bounds]
  hyp_extra = bounds_mod.crown(hyper, lo, hi) if method == "crown" else None
  pre: list[Pair] = []
  post: list[Pair] = []
  hyp: Bounds = []
  z, zh = (lo, hi), (lo, hi)
  dz = (np.zeros_like(lo), np.zeros_like(lo))
  n = len(net.layers)
  for m, (a, h) in enumerate(zip(net.layers, hyper.layers)):
    d_lo, d_hi = affine_difference(a, h, z, dz, zh)
    L, U = ref[m]
    Lh, Uh = bounds_mod.affine_ibp(h, zh[0], zh[1])
    if hyp_extra is not None:
      Lh, Uh = np.maximum(Lh, hyp_extra[m][0]), np.minimum(Uh, hyp_extra[m][1])
    if hyper_bounds is not None and m < len(hyper_bounds) and hyper_bounds[m] is not None:
      Lh, Uh = np.maximum(Lh, hyper_bounds[m][0]), np.minimum(Uh, hyper_bounds[m][1])
    Lh, Uh = np.maximum(Lh, L + d_lo), np.minimum(Uh, U + d_hi)
    d_lo, d_hi = np.maximum(d_lo, Lh - U), np.minimum(d_hi, Uh - L)
    # Rounding in the sums above is covered by the slack; guard against crossing anyway.
    Uh, d_hi = np.maximum(Uh, Lh), np.maximum(d_hi, d_lo)
    pre.append((d_lo, d_hi))
    hyp.append((Lh, Uh))
    if m == n - 1:
      break
    dz = relu_difference((d_lo, d_hi), (L, U), (Lh, Uh))
    post.append(dz)
    z = (np.maximum(L, 0.0), np.maximum(U, 0.0))
    zh_lo = np.maximum(np.maximum(Lh, 0.0), z[0] + dz[0])
    zh_hi = np.minimum(np.maximum(Uh, 0.0), z[1] + dz[1])
    zh = (zh_lo, np.maximum(zh_hi, zh_lo))
  return DifferenceBounds(tuple(pre), tuple(post), list(ref), hyp)


def naive_difference(net: Network, hyper: Network, lo: Any, hi: Any) -> tuple[list[Pair], list[Pair]]:
  """The baseline the difference intervals beat: ``IBP(N#) - IBP(N)`` per layer.

  Returns ``(pre, post)`` in the layout of `DifferenceBounds`:
  ``[l# - u, u# - l]`` before the ReLU and ``[max(0, l#) - max(0, u), max(0, u#) - max(0, l)]``
  after it, with both networks' bounds from plain `milp.bounds.ibp`.
  """
  _check_pair(net, hyper)
  ref = bounds_mod.ibp(net, lo, hi)
  hb = bounds_mod.ibp(hyper, lo, hi)
  pre = [(Lh - U, Uh - L) for (L, U), (Lh, Uh) in zip(ref, hb)]
  post = [(np.maximum(Lh, 0) - np.maximum(U, 0), np.maximum(Uh, 0) - np.maximum(L, 0))
          for (L, U), (Lh, Uh) in zip(ref[:-1], hb[:-1])]
  return pre, post

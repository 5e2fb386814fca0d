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
intersected with ``[l + dl, u + du]``; and the pre-activation difference is intersected with
``[l# - u, u# - l]``.

Every bound comes from the engine, in one call: ``bj.difference(affine_chain, form="paper",
sound=True, return_info=True)`` (`boundjax.domains.difference`, which implements the formulas
above) on float64 arrays, where `milp.network.affine_chain` is the `Network`'s affine view. N's
given bounds (``method``'s `milp.bounds.compute`, or ``ref_bounds``) and N#'s (CROWN with
``"crown"``, and the caller's) enter as the call's ``known`` enclosures of every ReLU input: the
engine meets them with its own where each layer is computed and refines the difference
(`boundjax.domains.difference.meet`), so every later layer starts from them; the logits are met
with the last layer's bounds the same way. Every sum is rounded outward by the engine's sound
mode, so concrete float64 replays and the exact networks lie inside. Sparse layer matrices
(convolutions from `milp.network.from_flax`) are densified for the engine.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import boundjax as bj
from boundjax.domains import difference as diff_domain
from boundjax.core.interval import Interval
from milp import bounds as bounds_mod
from milp.bounds import Bounds
from milp.network import Network

Pair = tuple[np.ndarray, np.ndarray]


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


def _relu(params: tuple, z: jax.Array) -> jax.Array:
  del params
  return jnp.maximum(z, 0.0)


@functools.lru_cache(maxsize=None)
def _relu_step():
  """``DiffInterval -> DiffInterval`` of ``max(z, 0)``: the engine's ReLU rule, sound mode."""
  bound = bj.difference(_relu, form="paper", sound=True)
  return jax.jit(lambda v: bound((), (), v))


@functools.lru_cache(maxsize=None)
def _whole_network():
  """``(p_ref, p_hyp, lo, hi, known, last) -> (pre-activation DiffIntervals, DifferenceInfo)``:
  one engine call bounding every layer of `milp.network.affine_chain` (sound mode), the logits
  met with ``last``."""
  bound = bj.difference(bounds_mod.affine_chain, form="paper", sound=True, return_info=True)

  def run(p_ref, p_hyp, lo, hi, known, last):
    outs, info = bound(p_ref, p_hyp, Interval(lo, hi, validate=False), known=known)
    outs = list(outs)
    outs[-1] = diff_domain.meet(outs[-1], last, sound=True)
    return outs, info
  return jax.jit(run)


def _iv64(lo: Any, hi: Any) -> Interval:
  return Interval(jnp.asarray(lo, jnp.float64), jnp.asarray(hi, jnp.float64), validate=False)


def _diff(ref: Pair, hyp: Pair, delta: Pair) -> bj.DiffInterval:
  return bj.DiffInterval(_iv64(*ref), _iv64(*hyp), _iv64(*delta))


def _pairs(v: bj.DiffInterval) -> tuple[Pair, Pair, Pair]:
  get = lambda iv: (np.asarray(iv.lower, np.float64), np.asarray(iv.upper, np.float64))
  return get(v.ref), get(v.other), get(v.delta)


def relu_difference(d: Pair, ref: Pair, hyp: Pair) -> Pair:
  """Bounds on ``relu(zhat#) - relu(zhat)`` from ``zhat# - zhat in d``, ``zhat in ref``,
  ``zhat# in hyp`` (LUCID, §6.2, and our refinements; see the module docstring): the engine's
  ReLU rule of the difference domain in sound mode."""
  with jax.enable_x64(True):
    out = _relu_step()(_diff(ref, hyp, d))
    return _pairs(out)[2]


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
  bounds_mod.check_box(net, lo, hi)
  if method not in ("ibp", "crown"):
    raise ValueError(f"bounds: unknown method {method!r}; use 'ibp' or 'crown'.")
  if ref_bounds is not None:
    if len(ref_bounds) != len(net.layers):
      raise ValueError(f"difference_bounds: ref_bounds has {len(ref_bounds)} layers, net has "
                       f"{len(net.layers)}.")
    ref = [(np.asarray(a, np.float64), np.asarray(b, np.float64)) for a, b in ref_bounds]
  else:
    ref = bounds_mod.compute(net, lo, hi, method)
  extra: list = [None] * len(hyper.layers)
  if method == "crown":
    extra = list(bounds_mod.crown(hyper, lo, hi))
  if hyper_bounds is not None:
    for m, hb in enumerate(hyper_bounds[:len(extra)]):
      if hb is not None:
        extra[m] = hb if extra[m] is None else (np.maximum(extra[m][0], hb[0]),
                                                np.minimum(extra[m][1], hb[1]))

  def known(m: int) -> bj.DiffInterval:
    hb = None if extra[m] is None else _iv64(*extra[m])
    return bj.DiffInterval(_iv64(*ref[m]), hb, None)

  n = len(net.layers)
  with jax.enable_x64(True):
    outs, info = _whole_network()(bounds_mod.network_params(net), bounds_mod.network_params(hyper),
                                  jnp.asarray(lo), jnp.asarray(hi),
                                  [known(m) for m in range(n - 1)], known(n - 1))
    layers = [_pairs(v) for v in outs]
    post = tuple(_pairs(v)[2] for v in info.post)
  return DifferenceBounds(tuple(d for _, _, d in layers), post, [r for r, _, _ in layers],
                          [h for _, h, _ in layers])


def naive_difference(net: Network, hyper: Network, lo: Any, hi: Any) -> tuple[list[Pair], list[Pair]]:
  """The baseline the difference intervals beat: ``IBP(N#) - IBP(N)`` per layer.

  Returns ``(pre, post)`` in the layout of `DifferenceBounds`:
  ``[l# - u, u# - l]`` before the ReLU and ``[max(0, l#) - max(0, u), max(0, u#) - max(0, l)]``
  after it, with both networks' bounds from plain `milp.bounds.ibp`. Each difference is one
  correctly rounded float64 subtraction, moved outward by one ulp (so the intervals are sound).
  """
  _check_pair(net, hyper)
  ref = bounds_mod.ibp(net, lo, hi)
  hb = bounds_mod.ibp(hyper, lo, hi)

  def outward(a, b):
    return np.nextafter(a, -np.inf), np.nextafter(b, np.inf)
  pre = [outward(Lh - U, Uh - L) for (L, U), (Lh, Uh) in zip(ref, hb)]
  post = [outward(np.maximum(Lh, 0) - np.maximum(U, 0), np.maximum(Uh, 0) - np.maximum(L, 0))
          for (L, U), (Lh, Uh) in zip(ref[:-1], hb[:-1])]
  return pre, post

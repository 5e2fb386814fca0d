"""The generic path: input splitting with `bj.crown` for graphs that are not affine/ReLU chains
(sigmoid, tanh, ... ONNX networks).

Each batch of sub-boxes is bounded by ``bj.crown(g, batch_axis=0)`` where ``g`` maps a batch of
flattened inputs to flattened outputs. With ``sound=True`` the outputs' bounds are computed with
``sound=True`` (valid in exact arithmetic) and combined with the disjunct's rows by interval
arithmetic rounded outward (`boundjax.core.rounding.outward`); otherwise ``spec=C`` bounds ``C y``
directly (CROWN §3.3). A box is proven when a row's lower bound of ``C_i y - d_i`` is > 0;
open boxes are checked at their centre and split in half along ``width_j · |∂g/∂x_j|`` at the
centre (``g`` the best row's margin).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import boundjax as bj
from boundjax.core import rounding
from boundjax.verify.outcome import Deadline
from boundjax.verify.spec import Region, split_boxes


def _rows_lower(y_lo: np.ndarray, y_hi: np.ndarray, C: np.ndarray, d: np.ndarray, sound: bool):
  """Lower bounds of ``C y - d`` for ``y`` in ``[y_lo, y_hi]`` (B, m): (B, k), outward."""
  Cp, Cn = np.maximum(C, 0.0), np.minimum(C, 0.0)
  low = y_lo @ Cp.T + y_hi @ Cn.T - d
  if sound:
    mag = np.maximum(np.abs(y_lo), np.abs(y_hi)) @ np.abs(C).T + np.abs(d)
    err = rounding.gamma(2 * C.shape[1] + 4, np.float64) * mag * 2 + 1e-300
    low = np.nextafter(low - err, -np.inf)
  return low


def input_split_generic(apply_fn: Callable, params: Any, input_shape: Sequence[int],
                        regions: Sequence[Region], replay: Any, deadline: Deadline, *,
                        sound: bool = True, batch: int = 128, max_boxes: int = 200_000,
                        progress: bool = False) -> tuple[str, Any, int]:
  """Input-splitting BaB with `bj.crown` on every (region, disjunct); ``(status, cex, nodes)``."""
  shape = tuple(input_shape)

  def g(xb):
    return jax.vmap(lambda x: jnp.reshape(apply_fn(params, jnp.reshape(x, shape)), (-1,)))(xb)

  bound_fn = jax.jit(bj.crown(g, batch_axis=0, sound=sound))
  nodes = 0
  for region in regions:
    for dj in region.disjuncts:
      if dj.C.shape[0] == 0:  # no output condition: any point of the box is a counterexample
        hit = replay.find(Region(region.lower, region.upper, (dj,)),
                          ((region.lower + region.upper) / 2)[None])
        if hit is not None:
          return "sat", hit, nodes + 1
        return "unknown", None, nodes
      C32 = jnp.asarray(dj.C, jnp.float32)
      d32 = jnp.asarray(dj.d, jnp.float32)

      def margin(x):
        return jnp.max(C32 @ g(x[None])[0] - d32)

      grad = jax.jit(jax.vmap(jax.grad(margin)))
      los, his = [region.lower[None]], [region.upper[None]]
      sub = Region(region.lower, region.upper, (dj,))
      while sum(len(a) for a in los):
        if deadline.expired():
          return "timeout", None, nodes
        lo_all, hi_all = np.concatenate(los), np.concatenate(his)
        if len(lo_all) > max_boxes:
          return "unknown", None, nodes
        take = min(batch, len(lo_all))
        lo, hi = lo_all[-take:], hi_all[-take:]
        los, his = [lo_all[:-take]], [hi_all[:-take]]
        pad = batch - take
        lo_p = np.concatenate([lo, np.repeat(lo[-1:], pad, 0)])
        hi_p = np.concatenate([hi, np.repeat(hi[-1:], pad, 0)])
        # float32 box containing the float64 box
        l32 = np.nextafter(lo_p.astype(np.float32), np.float32(-np.inf))
        h32 = np.nextafter(hi_p.astype(np.float32), np.float32(np.inf))
        out = bound_fn(bj.Interval(jnp.asarray(l32), jnp.asarray(h32)))
        low = _rows_lower(np.asarray(out.lower, np.float64)[:take],
                          np.asarray(out.upper, np.float64)[:take], dj.C, dj.d, sound)
        nodes += take
        open_ = ~(np.max(low, axis=1) > 0)
        if not np.any(open_):
          continue
        lo, hi = lo[open_], hi[open_]
        centre = (lo + hi) / 2
        hit = replay.find(sub, centre)
        if hit is not None:
          return "sat", hit, nodes
        gr = np.asarray(grad(jnp.asarray(centre, jnp.float32)), np.float64)
        lo1, hi1, lo2, hi2 = split_boxes(lo, hi, gr)
        los += [lo1, lo2]
        his += [hi1, hi2]
  return "unsat", None, nodes

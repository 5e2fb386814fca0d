"""The generic path: input splitting with `bj.crown` for graphs that are not affine/ReLU chains
(sigmoid, tanh, ... ONNX networks).

Each batch of sub-boxes is bounded by the engine's bound of ``g(x) = C' y(x) - d'``
(`boundjax.verify.engine`: ``bj.crown(batch_axis=0, sound=sound)`` with the disjunct's rows
composed into the function, ``C' = C`` exact in float32 and ``d' >= d``; CROWN, Zhang et al.
2018, §3.3), or, when ``C`` is not exact in float32, of the outputs combined with ``C, d`` by
outward-rounded interval arithmetic. Parameters must be float32 numbers (float64 arrays
holding them are fine; otherwise ``unknown``). Intermediate bounds are CROWN's, or CROWN-IBP's
when CROWN's backward state of one box exceeds ``memory_bytes`` (the engine's memory check).
A box is proven when a row's lower bound of ``C_i y - d_i`` is > 0; open boxes are checked at
their centre and split in half along ``width_j · |∂g/∂x_j|`` at the centre (``g`` the best
row's margin).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import boundjax as bj
from boundjax.verify import engine
from boundjax.verify.outcome import Deadline
from boundjax.verify.spec import Region, split_boxes


def input_split_generic(apply_fn: Callable, params: Any, input_shape: Sequence[int],
                        regions: Sequence[Region], replay: Any, deadline: Deadline, *,
                        sound: bool = True, batch: int = 128, max_boxes: int = 200_000,
                        progress: bool = False, memory_bytes: int = 1 << 30
                        ) -> tuple[str, Any, int]:
  """Input-splitting BaB with `bj.crown` on every (region, disjunct); ``(status, cex, nodes)``.
  A batch of ``batch`` boxes is bounded in chunks that fit ``memory_bytes``."""
  shape = tuple(input_shape)

  def g(xb):
    return jax.vmap(lambda x: jnp.reshape(apply_fn(params, jnp.reshape(x, shape)), (-1,)))(xb)

  if not engine.params_exact_f32(params):  # the engine bounds float32 weights: not this network
    return "unknown", None, 0
  key = engine.fingerprint(apply_fn, params, shape)
  p32 = jax.tree_util.tree_map(engine._to_f32, params)
  modes = ["crown", "ibp"]

  def bound_rows(l32, h32, C, d):
    """Lower bounds (B, k) of ``C y - d`` on the float32 boxes, NaN as -inf."""
    exact = engine.spec_f32(C, d)
    box = bj.Interval(jnp.asarray(l32), jnp.asarray(h32))
    while True:
      entry = engine._bound_function(apply_fn, key, shape, sound, modes[0], memory_bytes)
      try:
        with entry.lock:
          if exact is not None:
            out = entry.fn(p32, jnp.asarray(exact[0]), jnp.asarray(exact[1]), box)
            low = np.asarray(out.lower, np.float64)
          else:
            m = C.shape[1]
            out = entry.fn(p32, jnp.eye(m, dtype=jnp.float32), jnp.zeros(m, jnp.float32), box)
            low = engine.rows_lower(np.asarray(out.lower, np.float64),
                              np.asarray(out.upper, np.float64), C, d, sound)
        return np.where(np.isnan(low), -np.inf, low)
      except MemoryError:
        if len(modes) == 1:
          raise
        modes.pop(0)

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
        l32, h32 = engine.box_f32(lo_p, hi_p)  # float32 box containing the float64 box
        # a first call compiles (minutes for a big CNN on a loaded CPU): never past the deadline
        finished, low = engine.call_with_budget(
            lambda: bound_rows(l32, h32, dj.C, dj.d), deadline.remaining())
        if not finished:
          return "timeout", None, nodes
        low = low[:take]
        nodes += take
        open_ = ~(np.max(low, axis=1) > 0)
        if not np.any(open_):
          continue
        lo, hi = lo[open_], hi[open_]
        centre = (lo + hi) / 2
        hit = replay.find(sub, centre)
        if hit is not None:
          return "sat", hit, nodes
        finished, gr = engine.call_with_budget(  # compiles on the first call
            lambda: np.asarray(grad(jnp.asarray(centre, jnp.float32)), np.float64),
            deadline.remaining())
        if not finished:
          return "timeout", None, nodes
        lo1, hi1, lo2, hi2 = split_boxes(lo, hi, gr)
        los += [lo1, lo2]
        his += [hi1, hi2]
  return "unsat", None, nodes

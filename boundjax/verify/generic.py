"""The generic path: input splitting with `bj.crown` for graphs that are not affine/ReLU chains
(sigmoid, tanh, ... ONNX networks).

Each batch of sub-boxes is bounded by the engine's bound of ``g(x) = C' y(x) - d'``
(`boundjax.verify.engine`: ``bj.crown(batch_axis=0, sound=sound)`` with the disjunct's rows
composed into the function; CROWN, Zhang et al. 2018, §3.3). With ``sound`` it runs in
float64 on the boxes, ``C``, ``d`` and the parameters as they are (sound mode's a-priori
rounding slack is negligible there, see `engine.region_lower`). Without, in float32: ``C' = C``
exact in float32 and ``d' >= d``, or, when ``C`` is not exact in float32, the outputs are
bounded and combined with ``C, d`` by outward-rounded interval arithmetic; parameters must be
float32 numbers (float64 arrays holding them are fine; otherwise ``unknown``). Intermediate
bounds are CROWN's, or CROWN-IBP's when CROWN's backward state of one box exceeds
``memory_bytes`` (the engine's memory check).
A box is proven when a row's lower bound of ``C_i y - d_i`` is > 0; open boxes are checked at
their centre and split in half along ``width_j · |∂g/∂x_j|`` at the centre (``g`` the best
row's margin). The search is `boundjax.verify.bab.search`, depth first (a `bab.Stack` of the
open boxes, ``batch // 2`` of them split at a time, their children bounded ``batch`` at a time).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.verify import bab, engine
from boundjax.verify.outcome import Deadline
from boundjax.verify.spec import Region, split_boxes


def input_split_generic(apply_fn: Callable, params: Any, input_shape: Sequence[int],
                        regions: Sequence[Region], replay: Any, deadline: Deadline, *,
                        sound: bool = True, batch: int = 128, max_boxes: int = 200_000,
                        progress: bool = False, memory_bytes: int = 1 << 30,
                        frontier_bytes: int | None = None) -> tuple[str, Any, int]:
  """Input-splitting BaB with `bj.crown` on every (region, disjunct); ``(status, cex, nodes)``.
  A batch of ``batch`` boxes is bounded in chunks that fit ``memory_bytes``; the frontier of
  open boxes stops the search ("unknown") past ``max_boxes / 2`` boxes or ``frontier_bytes``."""
  shape = tuple(input_shape)

  def g(xb):
    return jax.vmap(lambda x: jnp.reshape(apply_fn(params, jnp.reshape(x, shape)), (-1,)))(xb)

  if not sound and not engine.params_exact_f32(params):  # float32 would bound another network
    return "unknown", None, 0
  key = engine.fingerprint(apply_fn, params, shape)
  with engine.bound_precision(sound):
    p_eng = engine.engine_params(params, sound)
  modes = ["crown", "ibp"]

  def bound_rows(lo, hi, C, d):
    """Lower bounds (B, k) of ``C y - d`` on the float64 boxes ``[lo, hi]`` (float32 boxes
    containing them without ``sound``), NaN as -inf."""
    with engine.bound_precision(sound):
      exact = engine.engine_spec(C, d, sound)
      box = engine.engine_box(lo, hi, sound)
      dt = box.lower.dtype
      while True:
        entry = engine.bound_function(apply_fn, key, shape, sound, modes[0], memory_bytes)
        try:
          with entry.lock:
            if exact is not None:  # padded: one compilation for every disjunct's rows
              Cp, dp = engine.padded_rows(*exact)
              out = entry.fn(p_eng, jnp.asarray(Cp, dt), jnp.asarray(dp, dt), box)
              low = np.asarray(out.lower, np.float64)[:, :C.shape[0]]
            else:
              m = C.shape[1]
              out = entry.fn(p_eng, jnp.eye(m, dtype=dt), jnp.zeros(m, dt), box)
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
      sub = Region(region.lower, region.upper, (dj,))
      out = bab.search({"lo": region.lower[None], "hi": region.upper[None]},
                       _bounder(bound_rows, grad, dj, sub, replay, deadline, batch), _bisect,
                       frontier=bab.Stack(), batch=batch, pop=max(1, batch // 2),
                       deadline=deadline, max_frontier=max_boxes // 2,
                       max_bytes=frontier_bytes)
      nodes += out.bounded
      if out.reason != bab.PROVED:  # frontier over max_boxes: "unknown"
        return bab.VERDICTS.get(out.reason, "unknown"), out.counterexample, nodes
  return "unsat", None, nodes


def _bounder(bound_rows: Callable, grad: Callable, dj: Any, sub: Region, replay: Any,
             deadline: Deadline, batch: int) -> Callable[[dict], bab.Bounded]:
  """The bounding function of `bab.search` for one disjunct: boxes ``{"lo", "hi"}`` (at most
  ``batch``, padded to ``batch`` so that one compiled bound serves every call) are bounded by
  the engine; the proven ones are dropped, the others' centres are replayed as counterexample
  candidates, and the open boxes come back with ``grad``, the gradient of the best row's margin
  at the centre (the branching direction, `_bisect`)."""

  def bound(boxes: dict) -> bab.Bounded:
    lo, hi = boxes["lo"], boxes["hi"]
    take = len(lo)
    pad = batch - take
    lo_p = np.concatenate([lo, np.repeat(lo[-1:], pad, 0)])
    hi_p = np.concatenate([hi, np.repeat(hi[-1:], pad, 0)])
    # a first call compiles (minutes for a big CNN on a loaded CPU): never past the deadline
    finished, low = engine.call_with_budget(
        lambda: bound_rows(lo_p, hi_p, dj.C, dj.d), deadline.remaining())
    if not finished:
      raise bab.OutOfTime
    open_ = ~(np.max(low[:take], axis=1) > 0)
    lo, hi = lo[open_], hi[open_]
    if not len(lo):
      return bab.Bounded({"lo": lo, "hi": hi, "grad": lo})
    centre = (lo + hi) / 2
    hit = replay.find(sub, centre)
    if hit is not None:
      return bab.Bounded({}, counterexample=hit)
    finished, gr = engine.call_with_budget(  # compiles on the first call
        lambda: np.asarray(grad(jnp.asarray(centre, jnp.float32)), np.float64),
        deadline.remaining())
    if not finished:
      raise bab.OutOfTime
    return bab.Bounded({"lo": lo, "hi": hi, "grad": gr})

  return bound


def _bisect(boxes: dict) -> dict:
  """Both halves of every box, split along ``width_j · |grad_j|`` (`spec.split_boxes`)."""
  lo1, hi1, lo2, hi2 = split_boxes(boxes["lo"], boxes["hi"], boxes["grad"])
  return {"lo": np.concatenate([lo1, lo2]), "hi": np.concatenate([hi1, hi2])}

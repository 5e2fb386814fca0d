"""Branch and bound by input splitting, for networks with few inputs (ACAS Xu has 5).

A sub-box is *proven* when one row of the disjunct has a certified lower bound
``min_x C_i f(x) - d_i > 0`` on it (`milp.complete.layered.crown_batch`). Unproven boxes are
checked for counterexamples at their centre and at the box corner that minimises the linear
lower bound (``x* = lo where Λ > 0 else hi``), then split in half along the input with the
largest estimated influence ``width_j · |Λ_j|`` (Λ: the input coefficients of the best row's
CROWN bound; the "smear" heuristic of ReluVal, Wang et al. 2018, with linear instead of
interval gradients). Boxes are processed last-in first-out in batches of fixed (bucketed) sizes,
so the jitted bound is compiled once per size and the frontier stays small.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from milp.complete import layered
from milp.complete.outcome import Deadline
from milp.complete.spec import Disjunct, Region


def _bucket(n: int, cap: int) -> int:
  """Two batch sizes only (each compiles once): small frontiers and full batches."""
  return min(64, cap) if n <= 64 else cap


def input_split(lay: layered.Layers, region: Region, disjunct: Disjunct, replay: Any,
                deadline: Deadline, *, sound: bool = True, batch: int = 1024,
                intermediate: str = "crown", alpha_steps: int = 0, max_boxes: int = 2_000_000,
                progress: Any = None) -> tuple[str, Any, int]:
  """Input-splitting BaB for one region and one disjunct.

  Returns ``(status, counterexample or None, nodes)``; status is ``"unsat"`` (every box
  proven), ``"sat"``, ``"timeout"`` or ``"unknown"`` (frontier over ``max_boxes``).
  """
  C = jnp.asarray(disjunct.C)
  d = jnp.asarray(disjunct.d)
  los = [region.lower[None].copy()]
  his = [region.upper[None].copy()]
  pending = 1
  nodes = 0
  hidden = lay.hidden
  while pending:
    if deadline.expired():
      return "timeout", None, nodes
    if pending > max_boxes:
      return "unknown", None, nodes
    lo_all = np.concatenate(los)
    hi_all = np.concatenate(his)
    take = min(batch, len(lo_all))
    lo, hi = lo_all[-take:], hi_all[-take:]
    los, his = [lo_all[:-take]], [hi_all[:-take]]
    size = _bucket(take, batch)
    pad = size - take
    lo_p = np.concatenate([lo, np.repeat(lo[-1:], pad, 0)])
    hi_p = np.concatenate([hi, np.repeat(hi[-1:], pad, 0)])
    splits = tuple(jnp.zeros((size, n), jnp.int8) for n in hidden)
    if alpha_steps and intermediate == "crown":
      bound, lam0, _, _, _ = layered.crown_alpha_batch(
          lay, C, d, jnp.asarray(lo_p), jnp.asarray(hi_p), splits, sound, alpha_steps)
    else:
      bound, lam0, _, _, _ = layered.crown_batch(lay, C, d, jnp.asarray(lo_p), jnp.asarray(hi_p),
                                                 splits, sound, intermediate)
    bound = np.asarray(bound)[:take]
    lam0 = np.asarray(lam0)[:take]
    nodes += take
    if progress is not None:
      progress.update(take)
    best_row = np.argmax(bound, axis=1)
    proven = bound[np.arange(take), best_row] > 0
    open_ = ~proven
    if not np.any(open_):
      pending = len(los[0])
      continue
    lo, hi, lam = lo[open_], hi[open_], lam0[open_, best_row[open_]]
    # counterexample candidates: centres and the minimising corners of the linear bound
    cand = np.concatenate([(lo + hi) / 2, np.where(lam > 0, lo, hi)])
    y = np.asarray(layered.forward(lay, jnp.asarray(cand)))
    if np.any(disjunct.violated_by(y)):
      hit = replay.find(Region(region.lower, region.upper, (disjunct,)),
                        cand[disjunct.violated_by(y)])
      if hit is not None:
        return "sat", hit, nodes
    width = hi - lo
    score = width * np.abs(lam)
    score = np.where(np.all(score <= 0, axis=1, keepdims=True), width, score)
    dim = np.argmax(score, axis=1)
    rows = np.arange(len(lo))
    mid = (lo[rows, dim] + hi[rows, dim]) / 2
    lo2, hi1 = lo.copy(), hi.copy()
    hi1[rows, dim] = mid
    lo2[rows, dim] = mid
    los += [lo, lo2]
    his += [hi1, hi]
    pending = sum(len(a) for a in los)
  return "unsat", None, nodes

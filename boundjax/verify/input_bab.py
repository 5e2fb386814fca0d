"""Branch and bound by input splitting, for networks with few inputs (ACAS Xu has 5).

A sub-box is *proven* when one row of the disjunct has a certified lower bound
``min_x C_i f(x) - d_i > 0`` on it (`boundjax.verify.chain.crown_batch`, the engine's bound of
the dense chain). Unproven boxes are
checked for counterexamples at their centre and at the box corner that minimises the linear
lower bound (``x* = lo where Λ > 0 else hi``), then split in half along the input with the
largest estimated influence ``width_j · |Λ_j|`` (Λ: the input coefficients of the best row's
CROWN bound; the "smear" heuristic of ReluVal, Wang et al. 2018, with linear instead of
interval gradients). The search is `boundjax.verify.bab.search` with a `bab.Stack` (depth
first): the open boxes are popped ``batch // 2`` at a time and their children bounded
together (the engine runs them in chunks of `chain.CHUNK` boxes, fewer when they do not fit the
memory budget, `chunk_for`, so the bound compiles once whatever the batch), and the frontier
stays small.

``branching="lookahead"`` replaces the smear score by a one-step look-ahead: both halves of
every input's bisection are bounded (CROWN intermediate bounds met with the box's own, one
output pass, `chain.estimate_batch`) and the input with the best product of the two halves'
gains is split (the "strong branching" of MIP solvers, applied to input splitting). It costs
``2 n_0 + 1`` extra bounds per box but the trees shrink far more on ACAS Xu: 2_7 prop_1 from
> 200k boxes (smear, post mode, 120 s) to 543, 1_8 prop_2 from > 189k to 463; on 1_1
prop_5, where smear needs 8.7k boxes, it is slower, hence the portfolio in `boundjax.verify.api`.

Two refinements, both sound: a child box's intermediate bounds are intersected with its
parent's (which hold on the larger box), layer by layer or, in the "post" mode, only for a
second output pass so that the branching coefficients stay the box's own. Neither mode wins
everywhere on ACAS Xu: 2_2 prop_1 takes > 30k boxes layer-wise and 1,059 post, 2_4 prop_1
takes 449 layer-wise and > 19k post; `boundjax.verify.api` runs one then the other. And a
conjunction of rows is also bounded through sums of its rows (`combined_rows`):
``λ^T (C y - d) > 0`` with ``λ >= 0`` rules the conjunction out
where no single row does (ACAS Xu's "Y_0 is minimal" properties: 1_1 prop_4 went from a
timeout at 90 s, 52k boxes, to unsat in 14 s, 121 boxes, on a loaded 2-core machine).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from boundjax.verify import bab, chain, memory
from boundjax.verify.outcome import Deadline
from boundjax.verify.spec import Disjunct, Region, split_boxes


def _pad_rows(C: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """``C, d`` with zero rows appended up to a power of two (>= 16) rows, so that properties with
  different numbers of rows share one compiled bound (every ACAS Xu property has 4 or 16 rows
  with `combined_rows`: one compilation serves them all, in a process and in the persistent
  cache; the output pass is a small part of a bound); the padding rows lie outside every
  disjunct's row range and are never read."""
  R = C.shape[0]
  size = max(16, 1 << (R - 1).bit_length())
  return (np.concatenate([C, np.zeros((size - R, C.shape[1]))]),
          np.concatenate([d, np.zeros(size - R)]))


def spec_rows(disjuncts: Sequence[Disjunct], combine: bool = True) -> int:
  """How many rows `input_split` bounds for these disjuncts (with `combined_rows`, padded by
  `_pad_rows`): the shape of its compiled bound, for `chain.warm_up`."""
  parts = [combined_rows(dj) if combine else (dj.C, dj.d) for dj in disjuncts]
  return _pad_rows(np.concatenate([p[0] for p in parts]),
                   np.concatenate([p[1] for p in parts]))[0].shape[0]


def chunk_for(lay: chain.Layers, rows: int, memory_bytes: int | None,
              alpha_steps: int = 0) -> int:
  """Boxes per call of the compiled bound for ``rows`` specification rows (`spec_rows`):
  `chain.CHUNK`, or the largest power of two below it whose estimate fits ``memory_bytes``
  (`memory.split_chunk`, which raises `MemoryBudgetError` when one box does not); None: no
  budget."""
  if memory_bytes is None:
    return chain.CHUNK
  return memory.split_chunk(lay.widths, rows, memory_bytes, chain.CHUNK, alpha=bool(alpha_steps))


def combined_rows(disjunct: Disjunct, max_rows: int = 8) -> tuple[np.ndarray, np.ndarray]:
  """``(C', d')``: the disjunct's rows followed by sums of pairs of rows and of all rows.

  For ``λ >= 0``, ``λ^T (C y - d) > 0`` on a box means some row of ``C y - d`` is positive at
  every point: the conjunction ``C y <= d`` is unreachable there, though no single row may be
  (the rows' witnesses change across the box). A combination is kept only if ``λ^T C`` and
  ``λ^T d`` are exact in float64 (checked with rationals), so that a sound bound of the
  combined row is a sound bound of ``λ^T (C y - d)``."""
  from fractions import Fraction
  C, d = disjunct.C, disjunct.d
  R = C.shape[0]
  if R < 2:
    return C, d
  lams = [np.ones(R)]
  if R > 2:
    for i in range(R):
      for j in range(i + 1, R):
        lam = np.zeros(R)
        lam[[i, j]] = 1.0
        lams.append(lam)
  rows, ds = [], []
  for lam in lams[:max_rows]:
    c, dd = lam @ C, lam @ d
    exact_c = [sum((Fraction(float(v)) * Fraction(float(C[i, k])) for i, v in enumerate(lam)),
                   Fraction(0)) for k in range(C.shape[1])]
    exact_d = sum((Fraction(float(v)) * Fraction(float(d[i])) for i, v in enumerate(lam)),
                  Fraction(0))
    if all(Fraction(float(a)) == b for a, b in zip(c, exact_c)) and Fraction(float(dd)) == exact_d:
      rows.append(c)
      ds.append(dd)
  if not rows:
    return C, d
  return np.concatenate([C, np.array(rows)]), np.concatenate([d, np.array(ds)])


def _search_records(Wb, region: Region, cand: np.ndarray, y: np.ndarray, best: float,
                    replay: Any, deadline: Deadline, per_batch: int = 2):
  """LP local search (`attack.local_search`) from the counterexample candidates whose loss
  ``min_disjunct max_i C_i y - d_i`` beats every candidate seen so far (at most ``per_batch``
  of them): the open boxes with the lowest bounds close in on the violations, and a thin
  violating sliver that their centres and corners miss is found by the LP from a nearby point
  (ACAS Xu 1_9 prop_7). Returns ``(hit or None, best loss so far)``."""
  from boundjax.verify import attack
  loss = np.min([np.max(y @ dj.C.T - dj.d, axis=1) for dj in region.disjuncts], axis=0)
  order = np.argsort(loss)[:per_batch]
  order = order[loss[order] < best]
  if not order.size:
    return None, best
  hit = attack.local_search(Wb[0], Wb[1], region, cand[order], replay, deadline, iters=8)
  return hit, float(loss[order[0]])


def _lookahead_scores(lay, C, d, lo, hi, bl, bu, lam, groups, parent: np.ndarray,
                      root: np.ndarray, batch: int, deadline: Deadline,
                      max_aspect: float = 1024.0, sound: bool = False,
                      chunk: int = chain.CHUNK) -> np.ndarray:
  """Per box and input ``j``, a sensitivity whose ``width × |.|`` is the product score of
  strong branching (Achterberg, Koch & Martin 2005, "Branching rules revisited", §3),
  ``max(g_lo, ε) · max(g_hi, ε)``, where ``g`` are the gains of the two halves' bounds over the
  box's after bisecting input ``j`` (`chain.estimate_batch` on both halves of every input
  and on the box, with the box's bounds as prior; the box's bound is the larger of ``parent``
  and its estimate). The product favours splits that help both halves: the worse half's gain
  alone is myopic (splitting a vanishing input gains a little on both halves and would win
  for ever). Gains within ``ε = 1e-9 (1 + |parent|)`` count as none, and so do inputs whose
  width relative to the region's (``root``) is below ``1 / max_aspect`` of the box's largest;
  a box where no input gains keeps ``lam`` (the smear heuristic's coefficients), and so does
  every box when ``deadline`` expires during the estimates (the caller then stops).
  ``sound``, ``chunk``: the estimates' mode and boxes per call (input splitting passes its own,
  so that they share the compilation of its bounds)."""
  B, n0 = lo.shape
  mid = (lo + hi) / 2
  eye = np.eye(n0, dtype=bool)
  # children (B, n0, 2, n0): lower half of input j, upper half of input j
  clo = np.stack([np.broadcast_to(lo[:, None], (B, n0, n0)),
                  np.where(eye[None], mid[:, None], lo[:, None])], axis=2).reshape(-1, n0)
  chi = np.stack([np.where(eye[None], mid[:, None], hi[:, None]),
                  np.broadcast_to(hi[:, None], (B, n0, n0))], axis=2).reshape(-1, n0)
  reps = 2 * n0 + 1  # the box itself last: its estimate is the reference of the gains
  clo = np.concatenate([clo.reshape(B, 2 * n0, n0), lo[:, None]], axis=1).reshape(-1, n0)
  chi = np.concatenate([chi.reshape(B, 2 * n0, n0), hi[:, None]], axis=1).reshape(-1, n0)
  out = np.empty(len(clo))
  step = batch
  for s in range(0, len(clo), step):
    if deadline.expired():  # 2 n_0 + 1 bounds per box: do not overrun the time limit
      return lam
    e = min(s + step, len(clo))
    idx = np.arange(s, e) // reps
    prior = (tuple(np.maximum(a[idx], -1e300) for a in bl),
             tuple(np.minimum(a[idx], 1e300) for a in bu))
    est = chain.estimate_batch(lay, C, d, clo[s:e], chi[s:e], prior, sound, chunk)
    rows = np.asarray(groups)[idx]  # (take, 2): the row range of each box's open disjunct
    cols = np.arange(est.shape[1])
    inside = (cols >= rows[:, :1]) & (cols < rows[:, 1:])
    out[s:e] = np.max(np.where(inside, est, -np.inf), axis=1)
  out = out.reshape(B, reps)
  parent = np.maximum(parent, out[:, -1])
  halves = out[:, :-1].reshape(B, n0, 2)
  gains = np.clip(np.where(np.isnan(halves), -np.inf, halves) - parent[:, None, None], 0, 1e150)
  # a gain within rounding noise of the box's bound is none
  eps = 1e-9 * (1.0 + np.abs(parent))[:, None]
  width = hi - lo
  # inputs much narrower (relative to the region) than the box's widest are not split: a
  # safety net against splitting a vanishing input for ever
  rel = width / np.where(root > 0, root, 1.0)
  useful = np.any(gains > eps[..., None], axis=2) & (rel * max_aspect
                                                     >= rel.max(axis=1, keepdims=True))
  score = np.maximum(gains[..., 0], eps) * np.maximum(gains[..., 1], eps)
  score = np.where(useful, score, 0.0)
  sens = np.where(width > 0, score / np.where(width > 0, width, 1.0), 0.0)
  flat = ~np.any(useful, axis=1, keepdims=True)  # no input helps: the smear heuristic
  return np.where(flat, lam, sens)


def input_split(lay: chain.Layers, region: Region, disjunct: Disjunct | Sequence[Disjunct],
                replay: Any,
                deadline: Deadline, *, sound: bool = True, batch: int = 1024,
                intermediate: str = "crown", alpha_steps: int = 0, max_boxes: int = 2_000_000,
                progress: Any = None, reuse_bounds: bool | str = True,
                combine: bool = True, local_search: bool = True,
                branching: str = "smear", memory_bytes: int | None = None,
                frontier_bytes: int | None = None) -> tuple[str, Any, int]:
  """Input-splitting BaB for one region and one disjunct, or several at once.

  With several disjuncts, every box is bounded on all their rows in one pass (the intermediate
  bounds, most of the cost, are shared); a box is closed when each disjunct has a positive row
  on it or on an ancestor box (the mask of proven disjuncts is inherited), and it is split for
  the open disjunct with the lowest bound.

  Returns ``(status, counterexample or None, nodes)``; status is ``"unsat"`` (every box
  proven), ``"sat"``, ``"timeout"`` or ``"unknown"`` (frontier over ``max_boxes``).
  ``reuse_bounds``: a box's intermediate bounds are intersected with its parent's (valid on
  the parent box, hence on the child): ``"layer"`` (or True, default) or ``"post"``, see
  `chain.crown_batch`'s ``prior_mode``; False: not at all. ``combine``: also bound sums of
  rows (`combined_rows`). ``local_search``: run `_search_records` on the candidates.
  ``branching``: ``"smear"`` (width × |Λ| of the box's own bound) or ``"lookahead"`` (the
  input whose bisection gives the best product of the halves' gains, `_lookahead_scores`).
  ``memory_bytes``: the budget of one bound call's buffers (`chunk_for`; None: `chain.CHUNK`
  boxes per call); `MemoryBudgetError` before any work when one box does not fit. ``batch``
  (boxes per round) is host memory only: the calls run ``chunk`` boxes at a time.
  """
  if reuse_bounds not in (True, False, "layer", "post"):
    raise ValueError(f"input_split: reuse_bounds must be True, False, 'layer' or 'post', got "
                     f"{reuse_bounds!r}.")
  if branching not in ("smear", "lookahead"):
    raise ValueError(f"input_split: branching must be 'smear' or 'lookahead', got "
                     f"{branching!r}.")
  disjuncts = (disjunct,) if isinstance(disjunct, Disjunct) else tuple(disjunct)
  parts = [combined_rows(dj) if combine else (dj.C, dj.d) for dj in disjuncts]
  G = len(parts)
  ends = np.cumsum([len(p[1]) for p in parts])
  starts = ends - np.array([len(p[1]) for p in parts])
  C, d = _pad_rows(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
  chunk = chunk_for(lay, C.shape[0], memory_bytes, alpha_steps)
  sub = Region(region.lower, region.upper, disjuncts)
  hidden = lay.hidden
  use_prior = reuse_bounds and not alpha_steps
  Wb = ([np.asarray(w) for w in lay.Ws], [np.asarray(b) for b in lay.bs])
  best_loss = np.inf

  def bound(boxes: dict) -> bab.Bounded:
    """Bounds a batch of boxes (their parents' bounds as prior), drops the proven ones, looks
    for counterexamples among the others and gives them their branching coefficients."""
    nonlocal best_loss
    lo, hi, pl, pu, done = boxes["lo"], boxes["hi"], boxes["pl"], boxes["pu"], boxes["done"]
    take = len(lo)
    prior = (tuple(pl), tuple(pu)) if use_prior else None
    bounds, lam0, _, lbs, ubs = chain.crown_batch(
        lay, C, d, lo, hi, sound, intermediate, prior,
        "post" if reuse_bounds == "post" else "layer", alpha_steps=alpha_steps, chunk=chunk)
    if progress is not None:
      progress.update(take)
    gbound = np.stack([bounds[:, a:b].max(axis=1) for a, b in zip(starts, ends)], axis=1)
    done = done | (gbound > 0)
    open_ = ~np.all(done, axis=1)
    if not np.any(open_):
      return bab.Bounded(boxes, closed=np.ones(take, bool))
    # branch for the open disjunct with the lowest bound, on its best row's coefficients
    worst = np.argmin(np.where(done, np.inf, gbound), axis=1)
    row = np.array([starts[g] + np.argmax(bounds[i, starts[g]:ends[g]])
                    for i, g in enumerate(worst)], dtype=int)
    lo, hi, lam = lo[open_], hi[open_], lam0[open_, row[open_]]
    done = done[open_]
    if use_prior:
      bl = tuple(a[open_] for a in lbs)
      bu = tuple(a[open_] for a in ubs)
    else:
      bl = tuple(np.full((len(lo), n), -np.inf) for n in hidden)
      bu = tuple(np.full((len(lo), n), np.inf) for n in hidden)
    # counterexample candidates: centres and the minimising corners of the linear bound
    cand = np.concatenate([(lo + hi) / 2, np.where(lam > 0, lo, hi)])
    y = chain.forward_np(lay, cand)
    viol = np.any([dj.violated_by(y) for dj in disjuncts], axis=0)
    if np.any(viol):
      hit = replay.find(sub, cand[viol])
      if hit is not None:
        return bab.Bounded({}, counterexample=hit)
    if local_search:
      hit, best_loss = _search_records(Wb, sub, cand, y, best_loss, replay, deadline)
      if hit is not None:
        return bab.Bounded({}, counterexample=hit)
    if branching == "lookahead":
      lam = _lookahead_scores(lay, C, d, lo, hi, bl, bu, lam, [
          (starts[g], ends[g]) for g in worst[open_]], gbound[open_, worst[open_]],
          region.upper - region.lower, batch, deadline, sound=sound, chunk=chunk)
    return bab.Bounded({"lo": lo, "hi": hi, "bl": bl, "bu": bu, "done": done, "lam": lam})

  root = {"lo": region.lower[None].copy(), "hi": region.upper[None].copy(),
          # bounds known on each box (its parent's; none at the root), the prior of
          # `chain.crown_batch`
          "pl": tuple(np.full((1, n), -np.inf) for n in hidden),
          "pu": tuple(np.full((1, n), np.inf) for n in hidden),
          "done": np.zeros((1, G), bool)}  # disjuncts proven on an ancestor box
  # depth first; a frontier of P open boxes stands for the 2 P boxes of their children
  out = bab.search(root, bound, _bisect, frontier=bab.Stack(), batch=batch,
                   pop=max(1, batch // 2), deadline=deadline, max_frontier=max_boxes // 2,
                   max_bytes=frontier_bytes)
  return bab.VERDICTS.get(out.reason, "unknown"), out.counterexample, out.bounded


def _bisect(boxes: dict) -> dict:
  """Both halves of every open box (`spec.split_boxes` along ``width_j · |lam_j|``), with the
  box's bounds as their prior and its proven disjuncts."""
  lo1, hi1, lo2, hi2 = split_boxes(boxes["lo"], boxes["hi"], boxes["lam"])
  twice = lambda a: np.concatenate([a, a])
  return {"lo": np.concatenate([lo1, lo2]), "hi": np.concatenate([hi1, hi2]),
          "pl": tuple(twice(a) for a in boxes["bl"]), "pu": tuple(twice(a) for a in boxes["bu"]),
          "done": twice(boxes["done"])}

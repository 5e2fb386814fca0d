"""Pre-activation bound tightening before the node MILPs (LUCID, §6.2, MIPVerify-style).

`tighten_net` tightens N's bounds over the input box once; `tighten_hyper` tightens N#'s bounds
of one node over the joint model of N, N# and their matching dependencies, and returns the
difference bounds (`milp.difference.difference_bounds`) computed from them. Each unstable neuron
is maximised and minimised by an LP (the earlier ReLUs relaxed to their triangle) or a MILP; the
bound kept (an LP's safe dual bound, `milp.safe_dual`; a MILP's dual bound widened by
`milp.tighten.MARGIN`) is intersected with the old interval.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from milp import bounds as bounds_lib
from milp.difference import DifferenceBounds, difference_bounds
from milp.encode import Encoding
from milp.idpdb.config import IdpDbConfig
from milp.idpdb.rows import add_hyper, pair_rows
from milp.network import Network
from milp.solve import SolveConfig
from milp.tighten import MARGIN, prefix, relax_integers, tighten_vars


def _tighten_layer(enc: Encoding, z: np.ndarray, L: np.ndarray, U: np.ndarray, which: np.ndarray,
                   cfg: IdpDbConfig) -> tuple[np.ndarray, np.ndarray, int]:
  """Maximises and minimises each variable ``z[j]`` (``which[j]``) over ``enc``
  (`milp.tighten.tighten_vars`): a new bound only from a proven solve (``OPTIMAL``; in
  ``"milp"`` mode also a time-out's dual bound): an LP's safe dual bound, a MILP's moved outward
  by `milp.tighten.MARGIN`, met with the old ``[L, U]``. Returns the new ``(L, U)`` and the number of solves."""
  L, U = L.copy(), U.copy()
  scfg = SolveConfig(solver="highs", time_limit=cfg.tighten_time_limit, threads=cfg.threads,
                     relative_gap=cfg.relative_gap)
  ok = ("OPTIMAL",) if cfg.tighten == "lp" else ("OPTIMAL", "FEASIBLE", "NO_SOLUTION_FOUND")
  jobs = iter([(j, mx) for j in np.flatnonzero(which) for mx in (True, False)])
  n = tighten_vars(enc, z, L, U, jobs, scfg, accept=ok, margin=MARGIN)
  return L, U, n


def _to_tighten(m: int, n_layers: int, L: np.ndarray, U: np.ndarray) -> np.ndarray:
  """Neurons worth an LP: the unstable ones of a hidden layer, every logit of the last layer."""
  if m == n_layers - 1:
    return L < U
  return (L < 0) & (U > 0)


def tighten_net(net: Network, lo: Any, hi: Any, cfg: IdpDbConfig = IdpDbConfig(),
                bounds: list | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
  """N's pre-activation bounds over ``[lo, hi]`` tightened layer by layer (LUCID, §6.2).

  Layer ``m >= 1``: each unstable neuron (every logit in the last layer) is maximised and
  minimised over the model of layers ``0..m`` with the already tightened bounds: the LP
  relaxation (``cfg.tighten == "lp"``: stable ReLUs exact, unstable ones the triangle) or the
  MILP (``"milp"``, per solve ``cfg.tighten_time_limit``, dual bound kept on a time-out).
  Layer 0 is skipped: interval arithmetic is already exact for one affine map of a box.
  Sound: every real ``x`` is feasible in the relaxation and the bound kept is an LP's safe dual
  bound (or a MILP's dual bound widened by `milp.tighten.MARGIN`); results are intersected with the starting bounds
  (``bounds``, else ``cfg.bounds`` from `milp.bounds`). ``cfg.tighten == "none"`` returns them.
  """
  lo = np.asarray(lo, np.float64).reshape(-1)
  hi = np.asarray(hi, np.float64).reshape(-1)
  out = [(np.asarray(a, np.float64).copy(), np.asarray(b, np.float64).copy())
         for a, b in (bounds if bounds is not None
                      else bounds_lib.compute(net, lo, hi, cfg.bounds))]
  if cfg.tighten == "none":
    return out
  if cfg.tighten == "lp-net":
    cfg = dataclasses.replace(cfg, tighten="lp")
  n_layers = len(net.layers)
  for m in range(1, n_layers):
    which = _to_tighten(m, n_layers, *out[m])
    if not which.any():
      continue
    enc = Encoding("tighten-N")
    x = enc.add_variables(lo, hi)
    nv = enc.add_network(prefix(net, m), x, lo, hi, bounds=out[:m + 1])
    if cfg.tighten == "lp":
      relax_integers(enc, nv.binaries)
    L, U, _ = _tighten_layer(enc, nv.pre[m], out[m][0], out[m][1], which, cfg)
    out[m] = (L, U)
  return out


def tighten_hyper(net: Network, hyper: Network, lo: Any, hi: Any,
                  ref: list[tuple[np.ndarray, np.ndarray]], cfg: IdpDbConfig = IdpDbConfig()
                  ) -> DifferenceBounds:
  """Difference bounds (`milp.difference.difference_bounds`) with N#'s bounds tightened.

  ``ref``: N's (tightened) pre-activation bounds, reused for every node. For each layer
  ``m >= 1`` the difference intervals are recomputed from the bounds tightened so far, and each
  unstable neuron of N# (every logit in the last layer) is maximised and minimised over the
  *joint* model of layers ``0..m``: N (exact stable ReLUs, triangle or binary unstable ones),
  N# (interval rows, Eq. 3e), and the matching dependencies of LUCID, §5.4 (post-ReLU for layers
  ``< m``, pre-activation for ``<= m``), which are sound whatever ``cfg.matching`` says.
  Same soundness argument and margins as `tighten_net`.
  """
  lo = np.asarray(lo, np.float64).reshape(-1)
  hi = np.asarray(hi, np.float64).reshape(-1)
  n_layers = len(net.layers)
  hb: list = [None] * n_layers
  diff = difference_bounds(net, hyper, lo, hi, cfg.bounds, ref_bounds=ref)
  if cfg.tighten in ("none", "lp-net"):
    return diff
  for m in range(1, n_layers):
    which = _to_tighten(m, n_layers, *diff.hyper[m])
    if not which.any():
      continue
    enc = Encoding("tighten-N#")
    x = enc.add_variables(lo, hi)
    nv = enc.add_network(prefix(net, m), x, lo, hi, bounds=list(diff.ref[:m + 1]))
    relax = [np.full(h[0].shape, cfg.tighten == "lp") for h in diff.hyper[:m]]
    h_pre, h_post, _ = add_hyper(enc, prefix(hyper, m), x, lo, hi, list(diff.hyper[:m + 1]),
                                  relax)
    if cfg.tighten == "lp":
      relax_integers(enc, nv.binaries)
    for k in range(m):
      pair_rows(enc, h_post[k], nv.post[k], *diff.post[k])
    for k in range(m + 1):
      pair_rows(enc, h_pre[k], nv.pre[k], *diff.pre[k])
    L, U, _ = _tighten_layer(enc, h_pre[m], diff.hyper[m][0], diff.hyper[m][1], which, cfg)
    hb[m] = (L, U)
    diff = difference_bounds(net, hyper, lo, hi, cfg.bounds, ref_bounds=ref, hyper_bounds=hb)
  return diff


def n_unstable(bounds) -> int:
  """Unstable hidden neurons (``l < 0 < u``) in a list of pre-activation bounds."""
  return bounds_lib.count_unstable(list(bounds))

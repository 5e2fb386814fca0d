"""One node of the branch-and-bound: the iDP-DB MILP over N and a hyper-network (LUCID, §6.2,
Eq. 3), and the picklable job that solves it in a worker.

    max beta  s.t.  C^c_N(x) >= beta   (one row per c' != c)
                    C^c_{N#}(x) <= 0   (2 classes: one row; more: big-M with binaries alpha_c',
                                        sum alpha >= 1, M_c' = u#_c - l#_c' from sound
                                        hyper-network output bounds)
                    x in [0, 1]^d, N exact (Tjeng), N# with interval weights (Eq. 3e)

plus the matching dependencies ``z + dl <= z# <= z + du`` and relax-if-similar (LUCID, §5.4).
The answer is the solver's **dual bound** (sound under a time-out, never the incumbent); an
infeasible model (N# can never disagree) gives ``-inf``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import numpy as np

from boundjax.executor import Executor
from milp import network as net_lib
from milp.difference import DifferenceBounds, difference_bounds
from milp.encode import Encoding, reconstruct_member
from milp.idpdb.config import IdpDbConfig, NodeResult
from milp.idpdb.family import check_compatible, check_label, confidence, confidence_cap
from milp.idpdb.rows import add_hyper, confidence_rows, disagreement_rows, pair_rows
from milp.idpdb.screening import screen_bound
from milp.idpdb.tighten import n_unstable, tighten_hyper, tighten_net
from milp.network import Network
from milp.solve import solve


def node_bound(net: Network, hyper: Network, label: int, cfg: IdpDbConfig = IdpDbConfig(), *,
               input_lower: Any = 0.0, input_upper: Any = 1.0,
               time_limit: float | None = None,
               diff: DifferenceBounds | None = None,
               ref_bounds: list | None = None) -> NodeResult:
  """Eq. 3: ``max beta`` s.t. ``C^c_N(x) >= beta``, ``C^c_{N#}(x) <= 0``, ``x`` in the box.

  Args:
    net: N (concrete).
    hyper: N# (interval parameters; a concrete member gives the per-point MILP of LUCID, §5.1).
    label: the class c.
    cfg: `IdpDbConfig` (MD, RiS, tau, bounds, solver, ``node_time_limit``).
    input_lower, input_upper: the input domain, ``[0, 1]^d`` in LUCID (scalars or arrays).
    time_limit: overrides ``cfg.node_time_limit`` (the branch-and-bound passes what is left).
    diff: precomputed difference bounds (else `milp.difference.difference_bounds`, or
      `tighten_hyper` when ``cfg.tighten`` is not ``"none"``).
    ref_bounds: precomputed sound bounds of N (e.g. `tighten_net`, shared by every node);
      computed here when ``None``.

  Returns:
    `NodeResult` whose ``upper`` is the solver's dual bound (sound).

  Raises:
    ValueError: mismatched architectures, a label out of range, an interval layer with a
      possibly negative input, or an invalid box.
  """
  t0 = time.perf_counter()
  check_compatible(net, hyper, "the hyper-network")
  label = check_label(net, label)
  d = net.input_size
  lo = np.broadcast_to(np.asarray(input_lower, np.float64), (d,)).copy()
  hi = np.broadcast_to(np.asarray(input_upper, np.float64), (d,)).copy()
  t_tight = 0.0
  if diff is None:
    if cfg.tighten == "none":
      diff = difference_bounds(net, hyper, lo, hi, cfg.bounds, ref_bounds=ref_bounds)
    else:
      if ref_bounds is None:
        ref_bounds = tighten_net(net, lo, hi, cfg)
      diff = tighten_hyper(net, hyper, lo, hi, ref_bounds, cfg)
      t_tight = time.perf_counter() - t0
  n_layers = len(net.layers)
  relax_masks = []
  n_relaxed = 0
  for m in range(n_layers - 1):
    Lh, Uh = diff.hyper[m]
    dlo, dhi = diff.post[m]
    mask = (dhi - dlo <= cfg.tau) if cfg.relax else np.zeros(Lh.shape, bool)
    mask = mask & (Lh < 0) & (Uh > 0)
    relax_masks.append(mask)
    n_relaxed += int(mask.sum())

  enc = Encoding("idpdb")
  x = enc.add_variables(lo, hi)
  enc.inputs = x
  nv = enc.add_network(net, x, lo, hi, bounds=list(diff.ref))
  h_pre, h_post, h_bins = add_hyper(enc, hyper, x, lo, hi, list(diff.hyper), relax_masks)
  if cfg.matching:
    for m in range(n_layers - 1):
      pair_rows(enc, h_post[m], nv.post[m], *diff.post[m])
    if cfg.matching_pre:
      for m in range(n_layers):
        pair_rows(enc, h_pre[m], nv.pre[m], *diff.pre[m])
  b_hi = confidence_cap(net, diff.ref[-1], label)
  beta = enc.add_variables([-np.inf], [b_hi])[0]
  confidence_rows(enc, net, nv.outputs, label, beta)
  disagreement_rows(enc, hyper, h_pre[-1], label, diff.hyper[-1])
  enc.set_objective([beta], [1.0], maximize=True)

  limit = cfg.node_time_limit if time_limit is None else time_limit
  if limit is not None and t_tight > 0:  # the tightening counts against the node's time
    limit = max(limit - t_tight, 0.1 * limit)
  out = solve(enc, cfg.solve_config(limit))
  upper = out.dual_bound
  if out.reason not in ("OPTIMAL", "INFEASIBLE", "FEASIBLE", "NO_SOLUTION_FOUND"):
    upper = math.inf  # numerical trouble or an unbounded report: nothing is proven
  if math.isnan(upper):
    upper = math.inf
  if cfg.matching:  # the difference intervals' own bound (what MD adds, without the solver)
    upper = min(upper, screen_bound(net, diff, label))
  upper = min(upper, b_hi) if out.reason != "INFEASIBLE" else -math.inf
  x_val = x_conf = w_margin = None
  if out.has_solution:
    x_val = np.clip(enc.values(out.result, x), lo, hi)
    x_conf = float(confidence(net, net_lib.forward(net, x_val)[None], label)[0])
    pre_vals = [enc.values(out.result, p) for p in h_pre]
    post_vals = [x_val] + [enc.values(out.result, p) for p in h_post]
    member = reconstruct_member(hyper, x_val, pre_vals, post_vals)
    w_margin = float(confidence(member, net_lib.forward(member, x_val)[None], label)[0])
    if x_conf < out.primal_value - max(cfg.tol, 1e-6 * abs(out.primal_value)) - 1e-4:
      raise RuntimeError(
          f"idpdb: the incumbent's confidence replays to {x_conf:.6g} in float64, below the MILP "
          f"value {out.primal_value:.6g}: the encoding of N is wrong.")
  return NodeResult(upper, out.primal_value, x_val, x_conf, w_margin, out.reason,
                    time.perf_counter() - t0, enc.num_binaries, n_relaxed,
                    n_unstable(diff.ref) + n_unstable(diff.hyper), t_tight)


# ------------------------------------------------------------------------------------------------
# Node jobs for the executor
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class NodeJob:
  """A picklable description of one `node_bound` call (OR-Tools models are not picklable)."""

  net: Network
  hyper: Network
  label: int
  cfg: IdpDbConfig
  time_limit: float | None
  ref_bounds: list | None = None


def run_node(job: NodeJob) -> NodeResult:
  """Builds and solves one node MILP (runs in the worker)."""
  return node_bound(job.net, job.hyper, job.label, job.cfg, time_limit=job.time_limit,
                    ref_bounds=job.ref_bounds)


def node_executor(cfg: IdpDbConfig) -> Executor:
  """The `boundjax.executor.Executor` of ``cfg``: ``cfg.workers`` processes or Ray tasks, or this
  process for one worker (`IdpDbConfig.executor_kind`)."""
  return Executor(cfg.executor_kind, workers=cfg.workers, address=cfg.address)


def solve_nodes(runner: Executor, jobs: list[NodeJob]) -> list[NodeResult]:
  """`run_node` of every job, in order; a single job runs in this process (no pool round trip)."""
  if len(jobs) <= 1:
    return [run_node(j) for j in jobs]
  return runner.map(run_node, jobs)

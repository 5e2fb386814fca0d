"""LUCID-Compute (LUCID, §5.3 and §6.1, Alg. 1): the branch-and-bound over hyper-networks.

A max-priority queue on the node bounds; the popped node is split by k-means over its members'
parameters (`milp.idpdb.branching.partition`) and its children are solved as node MILPs
(`milp.idpdb.node.node_bound`, several at once on the executor of ``cfg``), each child's bound
being ``min(MILP bound, parent bound)``. The search stops when a singleton is popped: its bound is
then the family's β*_c up to the MILP gap. With ``IdpDbConfig(screen=True)`` the root is bounded by
screening (`milp.idpdb.screening.member_bounds`) and the members of largest screening bound are
peeled off as singleton MILPs instead.

Deviations from LUCID's public code, on purpose: no 0.001 "not c" margin (ties count as
disagreement: sound); relax-if-similar uses ``<=`` as the paper does (the code uses ``<``); the
root set holds only the given members (the code adds N itself, which is harmless); the elbow k is
used as found (``max_k`` caps it; the code caps it at 2) and raised to the worker count; children
of a popped node are solved together (the code's workers pop from a shared queue).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from typing import Any, Sequence

import numpy as np

from milp import network as net_lib
from milp.idpdb.branching import partition
from milp.idpdb.config import IdpDbConfig, IdpDbResult, NodeRecord, NodeResult
from milp.idpdb.family import (as_family, check_compatible, check_label, confidence, flat_rows,
                               hyper_of)
from milp.idpdb.node import NodeJob, node_executor, solve_nodes
from milp.idpdb.screening import member_bounds
from milp.idpdb.tighten import n_unstable, tighten_net
from milp.ldcp import Family
from milp.network import Network


def _confirm(net: Network, family: Family, rows: np.ndarray, res: NodeResult, label: int,
             tol: float) -> tuple[float, int] | None:
  """``(C^c_N(x), member)`` if a real member among ``rows`` disagrees at the incumbent.

  "Disagrees" is ``C^c_member(x) <= tol``: a maximiser lies on the member's decision boundary, so
  its replayed confidence is 0 up to the solver's feasibility tolerance.
  """
  if res.x is None:
    return None
  outs = family.select(rows).outputs(res.x[None])[:, 0, :]
  conf = confidence(net, outs, label)
  bad = np.flatnonzero(conf <= tol)
  if not bad.size:
    return None
  return res.x_confidence, int(rows[bad[np.argmin(conf[bad])]])


def lucid_compute(net: Network, members: Sequence[Network] | Family, label: int,
                  cfg: IdpDbConfig = IdpDbConfig(), progress: bool = True) -> IdpDbResult:
  """LUCID-Compute (LUCID, §6.1, Alg. 1): a sound ``beta >= beta*_c`` for the given family.

  Args:
    net: N (concrete).
    members: the leave-one-out networks (concrete `Network`s, a `milp.ldcp.Family`, or stacked
      Flax MLP params).
    label: the class c.
    cfg: `IdpDbConfig`.
    progress: tqdm bar over node MILPs with the current bound.

  Returns:
    `IdpDbResult`. On a total time-out, ``beta`` is the max over the queue and the nodes whose
    solve did not finish (their parent's bound), and ``exact`` is False.

  With ``cfg.screen`` the root is not a MILP: every member gets its `member_bounds` value ``u_i``,
  a node's bound is ``min(MILP bound, parent bound, max_{i in node} u_i)``, and a popped node is
  split into its ``cfg.workers`` members of largest ``u`` (singleton MILPs, solved together) and
  the rest (no MILP). The stop rule is LUCID's: a solved singleton on top of the queue, unless
  ``cfg.retry_singletons`` and its MILP timed out: then it is solved again with twice the time.
  """
  t0 = time.perf_counter()
  family = as_family(members, net.output)
  check_compatible(net, family.member(0), "the family")
  label = check_label(net, label)
  features = flat_rows(family)
  t_ref = time.perf_counter()
  ref = tighten_net(net, np.zeros(net.input_size), np.ones(net.input_size), cfg)
  t_ref = time.perf_counter() - t_ref
  u, t_screen = None, 0.0
  if cfg.screen:
    t_screen = time.perf_counter()
    u = member_bounds(net, family, label, cfg, ref_bounds=ref, progress=progress)
    t_screen = time.perf_counter() - t_screen
  bar = None
  if progress:
    from tqdm.auto import tqdm
    bar = tqdm(desc=f"iDP-DB class {label}", unit="milp")
  runner = node_executor(cfg)
  tree: list[NodeRecord] = []
  anytime: list[tuple[float, float]] = []
  queue: list[tuple[float, int, int]] = []  # (-bound, tie, node id)
  tie = itertools.count()
  lower, lower_x, lower_member = -math.inf, None, None
  timed_out = False

  def remaining() -> float | None:
    if cfg.total_time_limit is None:
      return None
    return cfg.total_time_limit - (time.perf_counter() - t0)

  def screened(rows: np.ndarray) -> float:
    return math.inf if u is None else float(np.max(u[rows]))

  def push_unsolved(g: np.ndarray, parent: NodeRecord | None, status: str) -> None:
    """A node without a MILP: its parent's bound, or its members' screening bounds if lower."""
    bound = min(math.inf if parent is None else parent.bound, screened(g))
    rec = NodeRecord(len(tree), None if parent is None else parent.id, g, bound, math.inf,
                     status, 0.0, 0, 0, 0 if parent is None else parent.depth + 1)
    tree.append(rec)
    heapq.heappush(queue, (-bound, next(tie), rec.id))

  def expand(groups: list[np.ndarray], parent: NodeRecord | None,
             node_limit: float | None = cfg.node_time_limit) -> bool:
    """Solves the nodes of ``groups`` and pushes them; False if the total time ran out."""
    nonlocal lower, lower_x, lower_member, timed_out
    parent_bound = math.inf if parent is None else parent.bound
    pending = list(groups)
    while pending:
      left = remaining()
      if left is not None and left <= 0.05:
        timed_out = True
        for g in pending:
          push_unsolved(g, parent, "NOT_SOLVED")
        return False
      batch, pending = pending[:cfg.workers], pending[cfg.workers:]
      limit = node_limit
      if left is not None:
        limit = left if limit is None else min(limit, left)
      jobs = [NodeJob(net, hyper_of(family, g), label, cfg, limit, ref) for g in batch]
      for g, res in zip(batch, solve_nodes(runner, jobs)):
        bound = min(res.upper, parent_bound, screened(g))
        rec = NodeRecord(len(tree), None if parent is None else parent.id, g, bound, res.upper,
                         res.status, res.seconds, res.n_binaries, res.n_relaxed,
                         0 if parent is None else parent.depth + 1, res.optimal, res.n_unstable,
                         res.tighten_seconds)
        tree.append(rec)
        heapq.heappush(queue, (-bound, next(tie), rec.id))
        hit = _confirm(net, family, g, res, label, cfg.tol)
        if hit is not None and hit[0] > lower:
          lower, lower_x, lower_member = hit[0], res.x, hit[1]
        if bar is not None:
          bar.update(1)
          bar.set_postfix(bound=f"{max(-queue[0][0], -math.inf):.4g}", nodes=len(queue))
    return True

  def branch(node: NodeRecord) -> bool:
    """LUCID: k-means children, each solved. Screening: the ``workers`` members of largest
    screening bound become singleton MILPs; the rest stays one node bounded by its screening."""
    if u is None:
      return expand(partition(features, node.members, cfg), node)
    vals = u[node.members]
    order = node.members   # a rest node is already sorted: its child is a view, not a copy
    if np.any(vals[:-1] < vals[1:]):
      order = order[np.argsort(-vals, kind="stable")]
    peel, rest = order[:cfg.workers], order[cfg.workers:]
    if rest.size:
      push_unsolved(rest, node, "SCREENED")
    return expand([peel[j:j + 1] for j in range(peel.size)], node)

  try:
    beta, exact = math.inf, False
    if cfg.screen:
      push_unsolved(np.arange(family.size), None, "SCREENED")
      started = True
    else:
      started = expand([np.arange(family.size)], None)
    if started:
      while queue:
        neg, _, nid = heapq.heappop(queue)
        node = tree[nid]
        beta = -neg
        anytime.append((time.perf_counter() - t0, beta))
        if (cfg.retry_singletons and node.members.size == 1 and node.solved and not node.optimal
            and beta > -math.inf):
          # nothing left to split: the same MILP again with twice the time
          if not expand([node.members], node, 2.0 * node.seconds):
            beta = max(-queue[0][0], -math.inf) if queue else beta
            anytime.append((time.perf_counter() - t0, beta))
            break
          continue
        if (node.members.size == 1 and (node.solved or u is None)) or beta == -math.inf:
          exact = node.optimal and node.n_relaxed == 0
          if beta == -math.inf:  # every set left is infeasible: no member can ever disagree
            exact = all(r.optimal for r in tree if r.status != "SCREENED")
          break
        if not branch(node):
          beta = max(-queue[0][0], -math.inf) if queue else beta
          anytime.append((time.perf_counter() - t0, beta))
          break
    else:
      beta = math.inf
    if timed_out:
      exact = False
  finally:
    runner.close()
    if bar is not None:
      bar.close()
  n_milps = sum(r.solved for r in tree)
  return IdpDbResult(label, float(beta), exact, timed_out, n_milps, anytime, tree,
                     time.perf_counter() - t0, lower, lower_x, lower_member, n_unstable(ref),
                     t_ref, u, t_screen)


def betas(model_or_net: Any, params: Any, stacked_members: Any, cfg: IdpDbConfig = IdpDbConfig(),
          classes: Sequence[int] | None = None, progress: bool = True) -> dict[int, IdpDbResult]:
  """``{c: lucid_compute(N, members, c)}`` for every class (or ``classes``).

  Args:
    model_or_net: a `milp.network.Network` (then ``params`` is ignored), ``None`` or a Flax MLP
      (N is read from ``params`` with `milp.network.from_params`).
    params: N's Flax parameters.
    stacked_members: the leave-one-out networks: stacked Flax params (leading member axis, e.g.
      ``Ensemble.params`` without N's row), a `Family`, or a list of `Network`.
  """
  if isinstance(model_or_net, Network):
    net = model_or_net
  else:
    net = net_lib.from_params(params)
  family = as_family(stacked_members, net.output)
  classes = range(net.num_classes) if classes is None else classes
  return {int(c): lucid_compute(net, family, int(c), cfg, progress) for c in classes}

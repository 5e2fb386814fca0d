"""LUCID-Compute (LUCID, §5.3 and §6.1, Alg. 1): the branch-and-bound over hyper-networks.

A max-priority queue on the node bounds; the popped node is split by k-means over its members'
parameters (`milp.idpdb.branching.partition`) and its children are solved as node MILPs
(`milp.idpdb.node.node_bound`, several at once on the executor of ``cfg``), each child's bound
being ``min(MILP bound, parent bound)``. The search stops when a singleton is popped: its bound is
then the family's β*_c up to the MILP gap. With ``IdpDbConfig(screen=True)`` the root is bounded by
screening (`milp.idpdb.screening.member_bounds`) and the members of largest screening bound are
peeled off as singleton MILPs instead.

The loop is the project's branch-and-bound skeleton, `boundjax.verify.bab.search`: a `bab.Heap`
with priority ``-bound`` (the largest bound first), one node popped at a time, its children's
MILPs solved ``cfg.workers`` at a time, the total time limit (less 50 ms) checked before each
such batch; the stop rule above is a *leaf* (``branch`` returns None).

Deviations from LUCID's public code, on purpose: no 0.001 "not c" margin (ties count as
disagreement: sound); relax-if-similar uses ``<=`` as the paper does (the code uses ``<``); the
root set holds only the given members (the code adds N itself, which is harmless); the elbow k is
used as found (``max_k`` caps it; the code caps it at 2) and raised to the worker count; children
of a popped node are solved together (the code's workers pop from a shared queue).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Sequence

import numpy as np

from boundjax.verify import bab
from milp import network as net_lib
from milp.idpdb.branching import partition
from milp.idpdb.config import IdpDbConfig, IdpDbResult, NodeRecord, NodeResult
from milp.idpdb.family import (as_family, check_compatible, check_label, confidence, flat_rows,
                               hyper_of, is_mlp)
from milp.idpdb.node import NodeJob, node_executor, solve_nodes
from milp.idpdb.screening import member_bounds
from milp.idpdb.tighten import n_unstable, tighten_net
from milp.ldcp import Family
from milp.network import Network


@dataclasses.dataclass(frozen=True)
class _Child:
  """A node to bound: its members, its parent's record, its MILP's time limit."""

  members: np.ndarray
  parent: NodeRecord | None
  time_limit: float | None


@dataclasses.dataclass(frozen=True)
class _TimeLeft:
  """``remaining() - margin`` seconds of the total time (`bab.search`'s deadline); a huge
  number without a total time limit."""

  remaining_total: Callable[[], float | None]
  margin: float

  def remaining(self) -> float:
    left = self.remaining_total()
    return math.inf if left is None else left - self.margin


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
  front = bab.Heap()  # priority -bound: the largest bound first, ties first-in first-out
  state = {"lower": (-math.inf, None, None), "beta": math.inf, "exact": False}

  def remaining() -> float | None:
    if cfg.total_time_limit is None:
      return None
    return cfg.total_time_limit - (time.perf_counter() - t0)

  def screened(rows: np.ndarray) -> float:
    return math.inf if u is None else float(np.max(u[rows]))

  def unsolved(child: _Child, status: str) -> NodeRecord:
    """A node without a MILP: its parent's bound, or its members' screening bounds if lower."""
    parent, g = child.parent, child.members
    bound = min(math.inf if parent is None else parent.bound, screened(g))
    rec = NodeRecord(len(tree), None if parent is None else parent.id, g, bound, math.inf,
                     status, 0.0, 0, 0, 0 if parent is None else parent.depth + 1)
    tree.append(rec)
    return rec

  def known(child: _Child) -> bab.Bounded:
    """A screened node, pushed without a MILP."""
    rec = unsolved(child, "SCREENED")
    return bab.Bounded([rec], np.array([-rec.bound]))

  def bound(children: list[_Child]) -> bab.Bounded:
    """Solves the node MILPs of ``children`` (at most ``cfg.workers``, together)."""
    left = remaining()
    jobs = []
    for child in children:
      limit = child.time_limit
      if left is not None:
        limit = left if limit is None else min(limit, left)
      jobs.append(NodeJob(net, hyper_of(family, child.members), label, cfg, limit, ref))
    recs = []
    for child, res in zip(children, solve_nodes(runner, jobs)):
      parent, g = child.parent, child.members
      value = min(res.upper, math.inf if parent is None else parent.bound, screened(g))
      rec = NodeRecord(len(tree), None if parent is None else parent.id, g, value, res.upper,
                       res.status, res.seconds, res.n_binaries, res.n_relaxed,
                       0 if parent is None else parent.depth + 1, res.optimal, res.n_unstable,
                       res.tighten_seconds)
      tree.append(rec)
      recs.append(rec)
      hit = _confirm(net, family, g, res, label, cfg.tol)
      if hit is not None and hit[0] > state["lower"][0]:
        state["lower"] = (hit[0], res.x, hit[1])
      if bar is not None:
        top = max([r.bound for r in recs] + [-front.peek()])
        bar.update(1)
        bar.set_postfix(bound=f"{top:.4g}", nodes=len(front) + len(recs))
    return bab.Bounded(recs, np.array([-r.bound for r in recs]))

  def branch(popped: list[NodeRecord]) -> Any:
    """LUCID, Alg. 1, on the popped node (the largest bound): stop on a solved singleton or an
    infeasible node (``None``: a leaf), solve a singleton again with twice the time
    (``cfg.retry_singletons``), or split it: k-means children, each solved; with screening,
    the ``workers`` members of largest screening bound become singleton MILPs and the rest
    stays one node bounded by its screening."""
    node, = popped
    beta = state["beta"] = node.bound
    anytime.append((time.perf_counter() - t0, beta))
    if (cfg.retry_singletons and node.members.size == 1 and node.solved and not node.optimal
        and beta > -math.inf):
      # nothing left to split: the same MILP again with twice the time
      return [_Child(node.members, node, 2.0 * node.seconds)]
    if (node.members.size == 1 and (node.solved or u is None)) or beta == -math.inf:
      exact = node.optimal and node.n_relaxed == 0
      if beta == -math.inf:  # every set left is infeasible: no member can ever disagree
        exact = all(r.optimal for r in tree if r.status != "SCREENED")
      state["exact"] = exact
      return None
    if u is None:
      return [_Child(g, node, cfg.node_time_limit)
              for g in partition(features, node.members, cfg)]
    vals = u[node.members]
    order = node.members   # a rest node is already sorted: its child is a view, not a copy
    if np.any(vals[:-1] < vals[1:]):
      order = order[np.argsort(-vals, kind="stable")]
    peel, rest = order[:cfg.workers], order[cfg.workers:]
    peels = [_Child(peel[j:j + 1], node, cfg.node_time_limit) for j in range(peel.size)]
    if rest.size:
      return bab.Parts(known(_Child(rest, node, None)), peels)
    return peels

  root = _Child(np.arange(family.size), None, cfg.node_time_limit)
  try:
    out = bab.search(known(root) if cfg.screen else [root], bound, branch, frontier=front,
                     batch=cfg.workers, pop=1, deadline=_TimeLeft(remaining, 0.05))
  finally:
    runner.close()
    if bar is not None:
      bar.close()
  beta, exact = state["beta"], state["exact"]
  timed_out = out.reason == bab.DEADLINE
  if timed_out:  # the children left unsolved keep their parent's bound
    left = [unsolved(c, "NOT_SOLVED") for part in out.pending for c in part]
    if out.pops:
      beta = max([-p for p, _ in front.items()] + [r.bound for r in left] + [-math.inf])
      anytime.append((time.perf_counter() - t0, beta))
    else:  # the root's MILP did not run
      beta = math.inf
    exact = False
  lower, lower_x, lower_member = state["lower"]
  n_milps = sum(r.solved for r in tree)
  return IdpDbResult(label, float(beta), exact, timed_out, n_milps, anytime, tree,
                     time.perf_counter() - t0, lower, lower_x, lower_member, n_unstable(ref),
                     t_ref, u, t_screen)


def betas(model_or_net: Any, params: Any, stacked_members: Any, cfg: IdpDbConfig = IdpDbConfig(),
          classes: Sequence[int] | None = None, progress: bool = True,
          input_shape: Sequence[int] | None = None) -> dict[int, IdpDbResult]:
  """``{c: lucid_compute(N, members, c)}`` for every class (or ``classes``).

  Args:
    model_or_net: a `milp.network.Network` (then ``params`` is ignored), ``None`` or a Flax MLP
      (N is read from ``params`` with `milp.network.from_params`), or another Flax chain of
      ``nn.Dense``/``nn.Conv`` layers with ReLU between (e.g. `boundjax.models.Conv1dNet`; N and
      the members are read with `milp.network.from_flax`, which needs ``input_shape``).
    params: N's Flax parameters.
    stacked_members: the leave-one-out networks: stacked Flax params (leading member axis, e.g.
      ``Ensemble.params`` without N's row), a `Family`, or a list of `Network`.
    input_shape: one input's shape (no batch axis), for a model that is not an MLP.
  """
  model = None
  if isinstance(model_or_net, Network):
    net = model_or_net
  elif model_or_net is None or is_mlp(model_or_net):
    net = net_lib.from_params(params)
  else:
    if input_shape is None:
      raise ValueError("idpdb.betas: input_shape is required with a Flax model that is not an "
                       "MLP.")
    model = model_or_net
    net = net_lib.from_flax(model, params, input_shape, sparse_threshold=0.0)
  family = as_family(stacked_members, net.output, model=model, input_shape=input_shape)
  classes = range(net.num_classes) if classes is None else classes
  return {int(c): lucid_compute(net, family, int(c), cfg, progress) for c in classes}

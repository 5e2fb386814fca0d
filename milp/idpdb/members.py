"""Per-member β: one MILP per leave-one-out network (the per-point MILPs of LUCID, §5.1).

* `naive_compute(net, members, label, cfg)` — ``β_c = max_i P_i`` for one class, each ``P_i`` the
  node MILP with the member itself as N#: exact when every solve is optimal, and the reference the
  branch-and-bound (`milp.idpdb.search.lucid_compute`) is checked against.
* `per_member_betas(params, members)` — the same for every class, from Flax parameters, with β
  made safe for the guard (`boundjax.privacy.guard.guard_beta`). Linear in the family and
  exponential in the network size: for small families (tests, demos).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Sequence

import numpy as np

from boundjax.privacy.guard import guard_beta
from milp import network as net_lib
from milp.idpdb.config import IdpDbConfig, MemberBetas, NaiveBetaResult, NodeResult
from milp.idpdb.family import as_family, check_compatible, check_label
from milp.idpdb.node import NodeJob, node_executor, solve_nodes
from milp.idpdb.tighten import tighten_net
from milp.ldcp import Family
from milp.network import Network

PyTree = Any


def naive_compute(net: Network, members: Sequence[Network] | Family, label: int,
                  cfg: IdpDbConfig = IdpDbConfig(), progress: bool = False) -> NaiveBetaResult:
  """Per-point MILPs (LUCID, §5.1): ``max_i`` of the per-member MILP ``P_i`` (Eq. 3 with N# = N_-i).

  ``P_i = max {C^c_N(x) : x in [0, 1]^d, C^c_{N_-i}(x) <= 0}``, each solved by
  `milp.idpdb.node.node_bound` with the member as its (concrete) hyper-network. Matching
  dependencies and relax-if-similar are off (LUCID's "Naive" variant), so with optimal solves the
  answer is the exact ``beta*_c`` of the family; every value is a solver dual bound, sound under
  a time-out. ``cfg.workers`` members are solved at once on ``cfg``'s executor.
  ``cfg.total_time_limit`` stops early; ``complete`` is then False and ``beta`` is not a bound
  for the whole family.
  """
  t0 = time.perf_counter()
  family = as_family(members, net.output)
  check_compatible(net, family.member(0), "the family")
  label = check_label(net, label)
  ncfg = dataclasses.replace(cfg, matching=False, matching_pre=False, relax=False)
  ref = tighten_net(net, np.zeros(net.input_size), np.ones(net.input_size), ncfg)
  runner = node_executor(ncfg)
  per = np.full(family.size, np.nan)
  nodes: list[NodeResult] = []
  bar = None
  if progress:
    from tqdm.auto import tqdm
    bar = tqdm(total=family.size, desc=f"naive iDP-DB class {label}", unit="milp")
  try:
    for s in range(0, family.size, cfg.workers):
      left = (None if cfg.total_time_limit is None
              else cfg.total_time_limit - (time.perf_counter() - t0))
      if left is not None and left <= 0.05:
        break
      limit = cfg.node_time_limit
      if left is not None:
        limit = left if limit is None else min(limit, left)
      idx = range(s, min(s + cfg.workers, family.size))
      res = solve_nodes(runner, [NodeJob(net, family.member(i), label, ncfg, limit, ref)
                                 for i in idx])
      for i, r in zip(idx, res):
        per[i] = r.upper
        nodes.append(r)
      if bar is not None:
        bar.update(len(res))
  finally:
    runner.close()
    if bar is not None:
      bar.close()
  done = ~np.isnan(per)
  beta = float(np.max(per[done])) if done.any() else math.inf
  return NaiveBetaResult(label, beta, bool(done.all() and all(r.optimal for r in nodes)),
                         per, int(np.nanargmax(np.where(done, per, -np.inf))) if done.any() else -1,
                         len(nodes), time.perf_counter() - t0, bool(done.all()), nodes)


def per_member_betas(params: PyTree, members: PyTree, *, classes: Sequence[int] | None = None,
                     cfg: IdpDbConfig = IdpDbConfig(node_time_limit=30.0), slack: float = 1e-4,
                     output: str | None = None, progress: bool = False) -> MemberBetas:
  """Sound β per class by one MILP per (member, class): `naive_compute` for every class.

  ``β_c = max_members max_x {C^c_N(x) : member does not predict c}`` over ``x ∈ [0, 1]^d``
  (LUCID, §5.1). Each value is a solver dual bound, so it is sound even at a time-out
  (``cfg.node_time_limit`` per MILP); `boundjax.privacy.guard.guard_beta` then adds ``slack``
  (absolute, plus the same relative) for the solver's feasibility tolerance and the guard's
  float32 forward pass, and maps ``-inf`` (no member can ever disagree) to 0.

  Args:
    params: N's Flax MLP parameters.
    members: the leave-one-out family, stacked (leading member axis), a `milp.ldcp.Family` or a
      list of concrete `milp.network.Network`.
    classes: the classes to bound (default: all).
    cfg: the MILP settings (HiGHS, per-MILP time limit, workers and executor).
    slack: see `guard_beta`.
    output: ``"logits"``, ``"sign"`` or None (by the number of outputs).
    progress: tqdm bars over members.
  """
  t0 = time.perf_counter()
  net = net_lib.from_params(params, output)
  family = as_family(members, net.output)
  cls = list(range(net.num_classes)) if classes is None else [int(c) for c in classes]
  per_class = {c: naive_compute(net, family, c, cfg, progress) for c in cls}
  table = np.stack([per_class[c].per_member for c in cls], axis=1)
  betas = {c: guard_beta(per_class[c].beta, slack) for c in cls}
  return MemberBetas(betas, table, all(r.exact for r in per_class.values()),
                     time.perf_counter() - t0, sum(r.n_milps for r in per_class.values()),
                     per_class)

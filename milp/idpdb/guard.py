"""β per class for boundjax's guarded label-only predictor (`boundjax.privacy.LabelOnlyGuard`).

`compute_betas(params, members)` runs LUCID's branch-and-bound (`milp.idpdb.search.betas`) or the
per-member MILPs (`milp.idpdb.members.per_member_betas`) for every class of N and returns the
values the guard takes, each a solver dual bound passed through
`boundjax.privacy.guard.guard_beta` (slack for tolerances and float32, ``-inf`` -> 0).
"""

from __future__ import annotations

import time
from typing import Any

from boundjax.privacy.guard import guard_beta
from milp.idpdb.config import BetaResult, IdpDbConfig
from milp.idpdb.members import per_member_betas
from milp.idpdb.search import betas as lucid_betas

PyTree = Any
BETA_METHODS = ("idpdb", "per_member")


def compute_betas(params: PyTree, members: PyTree, *, method: str = "idpdb",
                  time_limit: float | None = None, node_time_limit: float | None = 60.0,
                  slack: float = 1e-4, screen: bool = False, progress: bool = False
                  ) -> BetaResult:
  """β per class for N (Flax MLP ``params``) and its leave-one-out family (stacked ``members``).

  Args:
    params: N's Flax MLP parameters.
    members: the leave-one-out networks, stacked (leading member axis), e.g. an ensemble's
      parameters without N's row.
    method: ``"idpdb"`` (LUCID's branch-and-bound with matching dependencies and
      relax-if-similar, `milp.idpdb.lucid_compute`) or ``"per_member"`` (one MILP per member and
      class, `milp.idpdb.per_member_betas`).
    time_limit: seconds per class for the branch-and-bound (``None``: none).
    node_time_limit: seconds per MILP (a time-out keeps a sound, looser dual bound).
    slack: see `boundjax.privacy.guard.guard_beta`.
    screen: bound every member by its difference intervals first (`milp.idpdb.member_bounds`;
      the choice for large families, e.g. all 32k leave-one-out networks of Adult).
    progress: tqdm bars.

  β is sound for *this* family: the guard is iDP for D only if ``members`` holds every
  leave-one-out network of D.
  """
  if method not in BETA_METHODS:
    raise ValueError(f"compute_betas: method must be one of {BETA_METHODS}, got {method!r}.")
  t0 = time.perf_counter()
  if method == "idpdb":
    cfg = IdpDbConfig(node_time_limit=node_time_limit, total_time_limit=time_limit, screen=screen)
    res = lucid_betas(None, params, members, cfg, progress=progress)
    return BetaResult({c: guard_beta(r.beta, slack) for c, r in res.items()},
                      {c: float(r.beta) for c, r in res.items()},
                      {c: bool(r.exact) for c, r in res.items()}, method,
                      int(sum(r.n_milps for r in res.values())), time.perf_counter() - t0)
  cfg = IdpDbConfig(node_time_limit=node_time_limit or 30.0, total_time_limit=time_limit)
  res = per_member_betas(params, members, cfg=cfg, slack=slack, progress=progress)
  return BetaResult(res.betas, {c: float(r.beta) for c, r in res.per_class.items()},
                    {c: bool(r.exact) for c, r in res.per_class.items()}, method, res.n_milps,
                    time.perf_counter() - t0)

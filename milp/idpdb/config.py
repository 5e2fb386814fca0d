"""Settings and result types of the iDP-DB computation (LUCID, §6.1 and §7).

* `IdpDbConfig` — every option of the node MILPs, the tightening, the branch-and-bound and the
  executor, checked when the config is built.
* `NodeResult` (one node MILP), `NodeRecord` (a node of the search tree), `IdpDbResult`
  (`lucid_compute`), `NaiveBetaResult` (`naive_compute`), `MemberBetas` (`per_member_betas`),
  `BetaResult` (`compute_betas`) and `AttackResult` (`attack`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from boundjax.executor import EXECUTORS, check_executor
from milp.solve import SolveConfig

UNSOLVED = ("NOT_SOLVED", "SCREENED")   # node statuses without a MILP of their own
TIGHTEN_MODES = ("none", "lp-net", "lp", "milp")


# ------------------------------------------------------------------------------------------------
# Configuration and results
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class IdpDbConfig:
  """Settings of the iDP-DB MILPs and of the branch-and-bound (defaults as in LUCID, §7).

  Attributes:
    tau: relax-if-similar threshold on the post-ReLU difference width (LUCID, §5.4 and §6.2; 0.01 as
      in §7).
    matching: add the matching dependencies on post-ReLU neurons (LUCID, §5.4 and §6.2, "MD").
    matching_pre: also on pre-activations and logits (our addition, not LUCID's: implied rows,
      so sound); ignored without ``matching``.
    relax: relax-if-similar ("RiS").
    bounds: N's pre-activation bounds, ``"ibp"`` or ``"crown"`` (`milp.difference`).
    node_time_limit: seconds per MILP (``None``: none). A time-out keeps the sound dual bound.
    total_time_limit: seconds for the whole branch-and-bound (``None``: none).
    solver: ``"highs"`` (default; open source, about 10x faster than SCIP on these
      models here) or ``"scip"``.
    threads: solver threads per MILP.
    relative_gap: MILP relative gap (the dual bound stays sound whatever the gap).
    workers: node MILPs solved at once (and the least k of a split).
    executor: ``"serial"``, ``"process"`` or ``"ray"`` (used when ``workers > 1``).
    address: a Ray cluster address (implies ``executor="ray"``); see `boundjax.executor`.
    key: the k-means seed (an int: scikit-learn's ``random_state``).
    kmeans_ks: the candidate k of the elbow rule.
    max_k: cap on the elbow k before it is raised to ``workers`` (``None``: no cap; LUCID's code
      uses 2, which refines the anytime bound sooner when every MILP hits its time limit).
    tol: replay tolerance of incumbents.
    tighten: pre-activation bound tightening before the node MILPs (LUCID, §6.2, MIPVerify-style):
      ``"none"`` (interval/CROWN bounds only), ``"lp"`` (maximise/minimise every unstable
      neuron over the LP relaxation of the earlier layers, `tighten_net` / `tighten_hyper`) or
      ``"milp"`` (the same with the earlier ReLUs exact, each solve capped at
      ``tighten_time_limit``; the dual bound is kept on a time-out); ``"lp-net"`` tightens N
      by LP once and leaves every N# to interval arithmetic (cheap nodes, for many small ones).
    tighten_time_limit: seconds per tightening LP/MILP (a solve that does not finish keeps the
      old bound in ``"lp"`` mode and its dual bound in ``"milp"`` mode).
    screen: screen every member with its difference-interval bound first (`member_bounds`, no
      MILP) and branch by peeling the members of largest bound off as singleton MILPs
      (`lucid_compute`); ``False`` runs LUCID's k-means branching from the root hyper-network.
    retry_singletons: a popped singleton whose MILP did not finish is solved again with twice
      the time it took, while the total time lasts, instead of ending the search (LUCID stops).
  """

  tau: float = 0.01
  matching: bool = True
  matching_pre: bool = True
  relax: bool = True
  bounds: str = "ibp"
  node_time_limit: float | None = 60.0
  total_time_limit: float | None = None
  solver: str = "highs"
  threads: int = 1
  relative_gap: float = 1e-4
  workers: int = 1
  executor: str = "serial"
  address: str | None = None
  key: int = 0
  kmeans_ks: tuple[int, ...] = (2, 4, 8)
  max_k: int | None = None
  tol: float = 1e-5
  tighten: str = "none"
  tighten_time_limit: float = 5.0
  screen: bool = False
  retry_singletons: bool = False

  def __post_init__(self):
    if self.tighten not in TIGHTEN_MODES:
      raise ValueError(f"IdpDbConfig: tighten must be one of {TIGHTEN_MODES}, got "
                       f"{self.tighten!r}.")
    if not self.tighten_time_limit > 0:
      raise ValueError(f"IdpDbConfig: tighten_time_limit must be > 0 seconds, got "
                       f"{self.tighten_time_limit}.")
    if not self.tau >= 0:
      raise ValueError(f"IdpDbConfig: tau must be >= 0, got {self.tau}.")
    if self.bounds not in ("ibp", "crown"):
      raise ValueError(f"IdpDbConfig: bounds must be 'ibp' or 'crown', got {self.bounds!r}.")
    if self.solver not in ("scip", "highs"):
      raise ValueError(f"IdpDbConfig: solver must be 'scip' or 'highs', got {self.solver!r}.")
    for name in ("node_time_limit", "total_time_limit"):
      v = getattr(self, name)
      if v is not None and not v > 0:
        raise ValueError(f"IdpDbConfig: {name} must be > 0 seconds or None, got {v}.")
    if self.workers < 1 or self.threads < 1:
      raise ValueError("IdpDbConfig: workers and threads must be >= 1.")
    if self.executor not in EXECUTORS:
      raise ValueError(f"IdpDbConfig: executor must be one of {EXECUTORS}, got {self.executor!r}.")
    if not isinstance(self.key, (int, np.integer)):
      raise ValueError(f"IdpDbConfig: key must be an int (the k-means seed), got {self.key!r}.")
    if self.max_k is not None and self.max_k < 2:
      raise ValueError(f"IdpDbConfig: max_k must be >= 2 or None, got {self.max_k}.")
    if not self.kmeans_ks or any(int(k) < 2 for k in self.kmeans_ks):
      raise ValueError(f"IdpDbConfig: kmeans_ks must be integers >= 2, got {self.kmeans_ks}.")

  @property
  def executor_kind(self) -> str:
    """The executor the node MILPs run on: ``"serial"`` for one worker (unless Ray is asked
    for), else `boundjax.executor.check_executor` of ``executor`` and ``address``."""
    kind = check_executor(self.executor, self.address)
    return "serial" if self.workers == 1 and kind != "ray" else kind

  def solve_config(self, time_limit: float | None) -> SolveConfig:
    return SolveConfig(solver=self.solver, time_limit=time_limit, threads=self.threads,
                       relative_gap=self.relative_gap)


@dataclasses.dataclass
class NodeResult:
  """One node MILP (Eq. 3).

  Attributes:
    upper: the solver's dual bound: every ``x`` where N# may disagree has ``C^c_N(x) <= upper``
      (sound; ``-inf`` when infeasible, ``+inf`` when nothing was proven).
    incumbent: the best feasible objective found (not sound as a bound), or ``None``.
    x: the incumbent input (flat, clipped to [0, 1]).
    x_confidence: ``C^c_N(x)`` replayed in float64 (``>= incumbent - tol`` is checked).
    witness_margin: ``C^c`` of a member of N#'s box rebuilt from the MILP trace at ``x``
      (``<= tol`` when the trace is a real disagreement; RiS-relaxed neurons may break it).
    status: MathOpt termination reason (``OPTIMAL``, ``INFEASIBLE``, ``FEASIBLE``,
      ``NO_SOLUTION_FOUND``, ...).
    seconds: build + solve time.
    n_binaries: binaries in the model; n_relaxed: N# neurons relaxed by RiS.
    n_unstable: unstable hidden neurons of N and N# in the model (after any tightening).
    tighten_seconds: time spent tightening N#'s bounds for this node (included in ``seconds``).
  """

  upper: float
  incumbent: float | None
  x: np.ndarray | None
  x_confidence: float | None
  witness_margin: float | None
  status: str
  seconds: float
  n_binaries: int
  n_relaxed: int
  n_unstable: int = 0
  tighten_seconds: float = 0.0

  @property
  def optimal(self) -> bool:
    return self.status in ("OPTIMAL", "INFEASIBLE")


@dataclasses.dataclass
class NodeRecord:
  """A node of the branch-and-bound tree: the member rows it abstracts and its bound."""

  id: int
  parent: int | None
  members: np.ndarray
  bound: float            # min(MILP bound, parent bound)
  milp_bound: float
  status: str
  seconds: float
  n_binaries: int
  n_relaxed: int
  depth: int
  optimal: bool = False
  n_unstable: int = 0
  tighten_seconds: float = 0.0

  @property
  def solved(self) -> bool:
    """The node's own MILP ran (a time-out included)."""
    return self.status not in UNSOLVED

  def as_dict(self) -> dict:
    return dict(id=self.id, parent=self.parent, size=int(self.members.size),
                members=self.members.tolist() if self.members.size <= 16 else None,
                bound=json_float(self.bound), milp_bound=json_float(self.milp_bound),
                status=self.status, optimal=self.optimal, seconds=self.seconds,
                n_binaries=self.n_binaries, n_relaxed=self.n_relaxed, depth=self.depth,
                n_unstable=self.n_unstable, tighten_seconds=self.tighten_seconds)


@dataclasses.dataclass
class IdpDbResult:
  """Outcome of `lucid_compute`.

  Attributes:
    beta: sound iDP-DB for the class (``>= beta*_c`` of the given family).
    exact: a singleton was popped whose MILP was solved to optimality without relaxation, so
      ``beta`` equals ``beta*_c`` up to the MILP gap.
    timed_out: the total time limit stopped the search.
    n_milps: node MILPs solved.
    anytime: ``[(seconds, bound)]`` after every pop (non-increasing).
    tree: every node solved.
    seconds: wall-clock time.
    lower: the best *confirmed* leaking confidence found on the way (an incumbent ``x`` where a
      real member disagrees with class c), so ``lower <= beta*_c <= beta``; ``-inf`` if none.
    lower_x, lower_member: that input and the member row that disagrees there.
    n_unstable_net: N's unstable hidden neurons over the input box (after tightening, if any).
    tighten_seconds_net: time spent tightening N's bounds (once per call).
    member_bounds: with ``cfg.screen``, every member's screening bound (`member_bounds`).
    screen_seconds: time spent screening.
  """

  label: int
  beta: float
  exact: bool
  timed_out: bool
  n_milps: int
  anytime: list[tuple[float, float]]
  tree: list[NodeRecord]
  seconds: float
  lower: float = -math.inf
  lower_x: np.ndarray | None = None
  lower_member: int | None = None
  n_unstable_net: int = -1
  tighten_seconds_net: float = 0.0
  member_bounds: np.ndarray | None = dataclasses.field(default=None, repr=False)
  screen_seconds: float = 0.0

  def screen_summary(self) -> dict | None:
    """Quantiles and the largest values of the screening bounds (``None`` without screening)."""
    u = self.member_bounds
    if u is None:
      return None
    qs = (0.5, 0.9, 0.99, 0.999, 1.0)
    return dict(members=int(u.size), seconds=self.screen_seconds,
                quantiles={str(q): float(np.quantile(u, q)) for q in qs},
                largest=[float(v) for v in np.sort(u)[::-1][:16]])

  def as_dict(self) -> dict:
    return dict(label=self.label, beta=json_float(self.beta), exact=self.exact,
                timed_out=self.timed_out, n_milps=self.n_milps,
                n_unstable_net=self.n_unstable_net, tighten_seconds_net=self.tighten_seconds_net,
                screen=self.screen_summary(),
                anytime=[(t, json_float(b)) for t, b in self.anytime],
                seconds=self.seconds, lower=json_float(self.lower),
                lower_member=self.lower_member,
                tree=[r.as_dict() for r in self.tree])


@dataclasses.dataclass
class NaiveBetaResult:
  """Outcome of `naive_compute`: per-member MILPs (LUCID, §5.1).

  Attributes:
    beta: ``max_i`` of the member bounds (sound; exact when ``exact``).
    exact: every member MILP was solved to optimality.
    per_member: each member's dual bound (``nan`` for members not reached before the time-out).
    argmax: the member with the largest bound.
    n_milps, seconds: work done.
    complete: every member was solved (otherwise ``beta`` is *not* a bound for the family).
  """

  label: int
  beta: float
  exact: bool
  per_member: np.ndarray
  argmax: int
  n_milps: int
  seconds: float
  complete: bool
  nodes: list[NodeResult] = dataclasses.field(default_factory=list, repr=False)


def json_float(v: float) -> float | str:
  """``v`` as a JSON-safe value: the float, or ``"inf"`` / ``"-inf"``."""
  v = float(v)
  return v if math.isfinite(v) else ("inf" if v > 0 else "-inf")


@dataclasses.dataclass
class MemberBetas:
  """β per class from per-member MILPs for every class (`per_member_betas`).

  Attributes:
    betas: ``{class: β}`` made safe for the guard (`boundjax.privacy.guard.guard_beta` of the
      largest member bound): sound, finite or ``+inf``.
    per_member: ``(members, classes)`` dual bounds (``-inf``: the member can never disagree).
    proven: every MILP finished (optimal or infeasible); otherwise some β is a time-out's dual
      bound (still sound, maybe loose).
    seconds: total solve time.
    n_milps: MILPs solved.
    per_class: the `NaiveBetaResult` of each class.
  """

  betas: dict[int, float]
  per_member: np.ndarray
  proven: bool
  seconds: float
  n_milps: int
  per_class: dict[int, NaiveBetaResult] = dataclasses.field(default_factory=dict, repr=False)


@dataclasses.dataclass
class BetaResult:
  """β per class for the guard (`compute_betas`).

  Attributes:
    betas: ``{class: β}`` for `boundjax.privacy.LabelOnlyGuard` (solver bound plus slack,
      `boundjax.privacy.guard.guard_beta`).
    raw: ``{class: the solver's bound}`` before the slack.
    exact: ``{class: the bound is β*_c up to the MILP gap}``.
    method: ``"idpdb"`` (LUCID's branch-and-bound) or ``"per_member"``.
    n_milps: MILPs solved over all classes.
    seconds: wall-clock time.
  """

  betas: dict[int, float]
  raw: dict[int, float]
  exact: dict[int, bool]
  method: str
  n_milps: int
  seconds: float

  @property
  def all_exact(self) -> bool:
    return all(self.exact.values())


@dataclasses.dataclass
class AttackResult:
  """A confirmed leaking input found by `attack` (a lower bound on β*_c).

  Attributes:
    confidence: ``C^c_N(x)`` replayed in float64 (``-inf`` when no leaking input was found).
    x: that input (flat), or ``None``.
    member: the family row that disagrees with class c at ``x``, or ``None``.
  """

  confidence: float
  x: np.ndarray | None
  member: int | None

  @property
  def found(self) -> bool:
    return self.x is not None

"""LUCID's iDP deterministic bound (iDP-DB): a MILP over N and a hyper-network, and the
branch-and-bound over hyper-networks that tightens it (LUCID spec 000 §1.4, §2.2–2.9).

For a class ``c`` the per-class iDP-DB is (spec §1.4, Eq. 1)

    beta*_c = max { C^c_N(x) : x in [0, 1]^d, some leave-one-out network N_-i has C^c_{N_-i}(x) <= 0 },

with the confidence ``C^c_N(x) = z_c - max_{c' != c} z_c'``. For a one-output *sign* network
(`milp.network`'s Sphynx convention: class 1 iff ``N(x) >= 0``) we use ``C^1 = z`` and
``C^0 = -z``; "N# does not predict c" is then relaxed to ``C^c_{N#} <= 0`` (ties included), a
superset of the real disagreement set, so every bound stays sound.

* `node_bound(net, hyper, label, cfg)` — one node: the MILP of spec §2.4, Eq. 3,

      max beta  s.t.  C^c_N(x) >= beta   (one row per c' != c)
                      C^c_{N#}(x) <= 0   (2 classes: one row; more: big-M with binaries alpha_c',
                                          sum alpha >= 1, M_c' = u#_c - l#_c' from sound
                                          hyper-network output bounds, never a magic constant)
                      x in [0, 1]^d, N exact (Tjeng), N# with interval weights (Eq. 3e)

  plus the matching dependencies ``z + dl <= z# <= z + du`` (spec §2.6; post-ReLU always, and
  pre-activations and logits too when ``matching_pre``, spec [impl]) from
  `milp.difference.difference_bounds`, and relax-if-similar (spec §2.7): an *unstable* neuron of
  N# whose post-ReLU difference width is ``<= tau`` loses its binary and gets the triangle
  relaxation (N is never relaxed). The interval rows of Eq. 3e are exact only because every layer
  input of N# is ``>= 0`` (inputs in [0, 1], post-ReLU values): this is checked and a negative
  input bound raises ``ValueError``. The answer is the solver's **dual bound** (sound under a
  time-out, never the incumbent); an infeasible model (N# can never disagree) gives ``-inf``.
  The incumbent ``x`` is replayed in float64 through N and through a member of N#'s box
  reconstructed from the MILP trace (`milp.encode.reconstruct_member`).
* `lucid_compute(net, members, label, cfg)` — Alg. 1 (spec §2.8): a max-priority queue on the
  bounds, branching by k-means over the members' flattened parameters with k chosen by the elbow
  rule over ``{2, 4, 8}``, child bound ``min(MILP bound, parent bound)``, stop when a singleton is
  popped; anytime history; per-node and total time limits (on a total time-out the answer is the
  max over the queue and the nodes still being solved); children of one node solved in parallel
  (process pool or Ray) when ``workers > 1``.
* `member_bounds` / ``IdpDbConfig(screen=True)`` — ours, not LUCID's: every member alone is
  bounded by its difference intervals against N (`screen_bound`, ``beta <= du_c' - dl_c``; one
  interval pass per member, no MILP). The maximum is already a sound iDP-DB of the family, and
  for a leave-one-out family of 32k Adult networks it is far tighter than the MILP over their
  hyper-network (whose box forgets which parameters move together). The branch-and-bound then
  peels the members of largest screening bound off as singleton MILPs; the rest stays one node
  bounded by its largest screening bound.
* `naive_compute(net, members, label, cfg)` — the per-point MILPs of spec §2.2 (no MD, no RiS):
  exact beta*_c when every solve is optimal.
* `betas(...)` — both classes (or the given ones) from Flax parameters.
* `attack(net, members, label)` — a lower bound by projected gradient search: the best confidence
  of a real leaking input found (``attack <= beta*_c <= beta``).

Deviations from LUCID's public code (spec §7), on purpose: no 0.001 "not c" margin (ties count as
disagreement: sound); RiS uses ``<=`` as the paper does (the code uses ``<``); the root set holds
only the given members (the code adds N itself, which is harmless); the elbow k is used as
found (``max_k`` caps it; the code caps it at 2) and raised to the worker count; children of a popped
node are solved together (the code's workers pop from a shared queue).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import heapq
import itertools
import math
import multiprocessing as mp
import os
import time
import warnings
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from milp import bounds as bounds_lib
from milp import network as net_lib
from milp.difference import DifferenceBounds, difference_bounds
from milp.encode import Encoding, reconstruct_member
from milp.ldcp import Family, family_from_stacked
from milp.network import AffineLayer, Network
from milp.solve import SolveConfig, solve

_EXECUTORS = ("serial", "process", "ray")
_UNSOLVED = ("NOT_SOLVED", "SCREENED")   # node statuses without a MILP of their own
_TIGHTEN = ("none", "lp-net", "lp", "milp")
# Outward margin on a tightening LP/MILP optimum: HiGHS's default primal/dual feasibility
# tolerances are 1e-7, so the reported optimum may overshoot the true one by a few 1e-7 relative
# to the magnitudes involved (the objective and the old interval's width).
_TIGHT_REL = 4e-7
_TIGHT_ABS = 1e-9


# ------------------------------------------------------------------------------------------------
# Configuration and results
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class IdpDbConfig:
  """Settings of the iDP-DB MILPs and of the branch-and-bound (spec §2.12 defaults).

  Attributes:
    tau: relax-if-similar threshold on the post-ReLU difference width (spec §2.7; 0.01).
    matching: add the matching dependencies on post-ReLU neurons (spec §2.6, "MD").
    matching_pre: also on pre-activations and logits (spec §2.6 [impl]); needs ``matching``.
    relax: relax-if-similar ("RiS").
    bounds: N's pre-activation bounds, ``"ibp"`` or ``"crown"`` (`milp.difference`).
    node_time_limit: seconds per MILP (``None``: none). A time-out keeps the sound dual bound.
    total_time_limit: seconds for the whole branch-and-bound (``None``: none).
    solver: ``"highs"`` (default; the spec's open backend, about 10x faster than SCIP on these
      models here) or ``"scip"``.
    threads: solver threads per MILP.
    relative_gap: MILP relative gap (the dual bound stays sound whatever the gap).
    workers: node MILPs solved at once (and the least k of a split).
    executor: ``"serial"``, ``"process"`` or ``"ray"`` (used when ``workers > 1``).
    ray_address: a Ray cluster address (implies ``executor="ray"``).
    seed: k-means seed.
    kmeans_ks: the candidate k of the elbow rule.
    max_k: cap on the elbow k before it is raised to ``workers`` (``None``: no cap; LUCID's code
      uses 2, which refines the anytime bound sooner when every MILP hits its time limit).
    tol: replay tolerance of incumbents.
    tighten: pre-activation bound tightening before the node MILPs (spec §2.4, MIPVerify-style):
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
  ray_address: str | None = None
  seed: int = 0
  kmeans_ks: tuple[int, ...] = (2, 4, 8)
  max_k: int | None = None
  tol: float = 1e-5
  tighten: str = "none"
  tighten_time_limit: float = 5.0
  screen: bool = False
  retry_singletons: bool = False

  def __post_init__(self):
    if self.tighten not in _TIGHTEN:
      raise ValueError(f"IdpDbConfig: tighten must be one of {_TIGHTEN}, got {self.tighten!r}.")
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
    if self.executor not in _EXECUTORS:
      raise ValueError(f"IdpDbConfig: executor must be one of {_EXECUTORS}, got {self.executor!r}.")
    if self.max_k is not None and self.max_k < 2:
      raise ValueError(f"IdpDbConfig: max_k must be >= 2 or None, got {self.max_k}.")
    if not self.kmeans_ks or any(int(k) < 2 for k in self.kmeans_ks):
      raise ValueError(f"IdpDbConfig: kmeans_ks must be integers >= 2, got {self.kmeans_ks}.")

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
    return self.status not in _UNSOLVED

  def as_dict(self) -> dict:
    return dict(id=self.id, parent=self.parent, size=int(self.members.size),
                members=self.members.tolist() if self.members.size <= 16 else None,
                bound=_json_float(self.bound), milp_bound=_json_float(self.milp_bound),
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
    return dict(label=self.label, beta=_json_float(self.beta), exact=self.exact,
                timed_out=self.timed_out, n_milps=self.n_milps,
                n_unstable_net=self.n_unstable_net, tighten_seconds_net=self.tighten_seconds_net,
                screen=self.screen_summary(),
                anytime=[(t, _json_float(b)) for t, b in self.anytime],
                seconds=self.seconds, lower=_json_float(self.lower),
                lower_member=self.lower_member,
                tree=[r.as_dict() for r in self.tree])


@dataclasses.dataclass
class NaiveBetaResult:
  """Outcome of `naive_compute`: per-member MILPs (spec §2.2).

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


def _json_float(v: float) -> float | str:
  v = float(v)
  return v if math.isfinite(v) else ("inf" if v > 0 else "-inf")


# ------------------------------------------------------------------------------------------------
# Families and hyper-networks
# ------------------------------------------------------------------------------------------------

def as_family(members: Sequence[Network] | Family | Any, output: str | None = None) -> Family:
  """A `milp.ldcp.Family` from concrete `Network`s, a `Family`, or stacked Flax MLP params."""
  if isinstance(members, Family):
    return members
  if isinstance(members, dict):
    return family_from_stacked(members, output)
  members = list(members)
  if not members:
    raise ValueError("idpdb: the family has no members.")
  first = members[0]
  for i, m in enumerate(members):
    if not isinstance(m, Network) or not m.is_point:
      raise ValueError(f"idpdb: member {i} is not a concrete milp.network.Network.")
    if [l.shape for l in m.layers] != [l.shape for l in first.layers]:
      raise ValueError(f"idpdb: member {i} has layer shapes {[l.shape for l in m.layers]}, "
                       f"member 0 has {[l.shape for l in first.layers]}.")
  dense = lambda a: a.toarray() if sp.issparse(a) else np.asarray(a, np.float64)
  ws = [np.stack([dense(m.layers[k].w_lower) for m in members]) for k in range(len(first.layers))]
  bs = [np.stack([m.layers[k].b_lower for m in members]) for k in range(len(first.layers))]
  return Family(ws, bs, first.output)


def hyper_of(family: Family, rows: Any) -> Network:
  """The hyper-network over ``rows`` of the family: coordinate-wise [min, max] (spec §2.3)."""
  rows = np.asarray(rows)
  if rows.size == 0:
    raise ValueError("hyper_of: no member rows.")
  layers = tuple(AffineLayer(w[rows].min(0), w[rows].max(0), b[rows].min(0), b[rows].max(0))
                 for w, b in zip(family.ws, family.bs))
  return Network(layers, (family.ws[0].shape[2],), family.output)


def flat_rows(family: Family) -> np.ndarray:
  """``(K, P)`` flattened parameters of every member (the k-means features, spec §2.8)."""
  parts = [w.reshape(family.size, -1) for w in family.ws] + [b for b in family.bs]
  return np.concatenate(parts, axis=1)


def _check_compatible(net: Network, other: Network, what: str) -> None:
  if not net.is_point:
    raise ValueError("idpdb: N must be a concrete network (point parameters).")
  if len(net.layers) != len(other.layers) or any(
      a.shape != b.shape for a, b in zip(net.layers, other.layers)):
    raise ValueError(f"idpdb: {what} has layer shapes {[l.shape for l in other.layers]} but N has "
                     f"{[l.shape for l in net.layers]} (mismatched architectures).")
  if net.output != other.output:
    raise ValueError(f"idpdb: N's output rule is {net.output!r} but {what}'s is {other.output!r}.")


def _check_label(net: Network, label: int) -> int:
  if not isinstance(label, (int, np.integer)) or not 0 <= int(label) < net.num_classes:
    raise ValueError(f"idpdb: label {label!r} out of range for {net.num_classes} classes.")
  return int(label)


def confidence(net: Network, outputs: np.ndarray, label: int) -> np.ndarray:
  """``C^c_N`` from outputs ``(n, out)``: ``z_c - max_{c' != c} z_c'``; sign nets: ``±z``."""
  return net_lib.margins(net, outputs, label)


# ------------------------------------------------------------------------------------------------
# One node: the MILP of Eq. 3
# ------------------------------------------------------------------------------------------------

def _pair_rows(enc: Encoding, a: np.ndarray, b: np.ndarray, lo: np.ndarray, hi: np.ndarray
               ) -> int:
  """Rows ``lo <= v_a - v_b <= hi`` where an id of -1 is the constant 0; returns rows added."""
  a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
  keep = ((a >= 0) | (b >= 0)) & (np.isfinite(lo) | np.isfinite(hi))
  idx = np.flatnonzero(keep)
  if idx.size == 0:
    return 0
  rows, cols, vals = [], [], []
  for r, k in enumerate(idx):
    if a[k] >= 0:
      rows.append(r), cols.append(a[k]), vals.append(1.0)
    if b[k] >= 0:
      rows.append(r), cols.append(b[k]), vals.append(-1.0)
  enc.add_rows(rows, cols, vals, lo[idx], hi[idx])
  return int(idx.size)


def _add_hyper(enc: Encoding, hyper: Network, x: np.ndarray, in_lo: np.ndarray,
               in_hi: np.ndarray, hb: list[tuple[np.ndarray, np.ndarray]],
               relax_masks: list[np.ndarray]):
  """Encodes N# on ``x`` with its refined bounds ``hb``; unstable neurons in ``relax_masks``
  get the triangle relaxation instead of a binary (spec §2.7). Returns (pre ids, post ids, bins).

  The interval layers use the two-inequality form of Eq. 3e, exact only for non-negative layer
  inputs: hidden inputs are post-ReLU, so only the input box is checked.
  """
  if not hyper.layers[0].is_point and np.any(in_lo < 0):
    raise ValueError(
        f"idpdb: layer 0 of the hyper-network has interval parameters but an input whose lower "
        f"bound is {float(in_lo.min()):g} < 0; the two-inequality encoding (Eq. 3e) is exact "
        "only for non-negative inputs (use inputs in [0, 1]).")
  nv = enc.add_network(hyper, x, in_lo, in_hi, bounds=list(hb), relax=relax_masks)
  return nv.pre, nv.post, nv.binaries


def _confidence_rows(enc: Encoding, net: Network, outs: np.ndarray, label: int, beta: int) -> None:
  """``C^c_N(x) >= beta``: ``z_c - z_c' - beta >= 0`` for every ``c' != c`` (sign: ``±z``)."""
  if net.output == "sign":
    s = 1.0 if label == 1 else -1.0
    enc.add_rows([0, 0], [outs[0], beta], [s, -1.0], [0.0], [np.inf])
    return
  others = [k for k in range(net.num_outputs) if k != label]
  n = len(others)
  r = np.arange(n)
  enc.add_rows(np.r_[r, r, r], np.r_[np.full(n, outs[label]), outs[others], np.full(n, beta)],
               np.r_[np.ones(n), -np.ones(n), -np.ones(n)], np.zeros(n), np.full(n, np.inf))


def _disagreement_rows(enc: Encoding, hyper: Network, outs: np.ndarray, label: int,
                       hb_out: tuple[np.ndarray, np.ndarray]) -> None:
  """``C^c_{N#}(x) <= 0`` (Eq. 3c right): one row for 2 classes, big-M over ``alpha`` otherwise.

  ``M_c' = max(0, u#_c - l#_c')`` from the hyper-network's sound output bounds, so the row is
  vacuous exactly when ``alpha_c' = 0``.
  """
  L, U = hb_out
  if hyper.output == "sign":
    s = 1.0 if label == 1 else -1.0
    enc.add_rows([0], [outs[0]], [s], [-np.inf], [0.0])
    return
  others = [k for k in range(hyper.num_outputs) if k != label]
  if len(others) == 1:
    enc.add_rows([0, 0], [outs[label], outs[others[0]]], [1.0, -1.0], [-np.inf], [0.0])
    return
  n = len(others)
  M = np.maximum(U[label] - L[others], 0.0)
  alpha = enc.add_binaries(n)
  impossible = L[label] - U[others] > 0   # N# can never prefer c' over c here
  r = np.arange(n)
  # z_c - z_c' + M alpha_c' <= M
  enc.add_rows(np.r_[r, r, r], np.r_[np.full(n, outs[label]), outs[others], alpha],
               np.r_[np.ones(n), -np.ones(n), M], np.full(n, -np.inf), M)
  enc.add_rows(np.zeros(n), alpha, np.ones(n), [1.0], [np.inf])
  if impossible.any():
    idx = np.flatnonzero(impossible)
    enc.add_rows(np.arange(idx.size), alpha[idx], np.ones(idx.size), np.zeros(idx.size),
                 np.zeros(idx.size))


# ------------------------------------------------------------------------------------------------
# Bound tightening (spec §2.4): per-neuron LP/MILP on the partially built model
# ------------------------------------------------------------------------------------------------

def _prefix(net: Network, m: int) -> Network:
  """The first ``m + 1`` affine layers of ``net`` (layer ``m``'s pre-activations as outputs)."""
  return Network(tuple(net.layers[:m + 1]), net.input_shape)


def _relax_integers(enc: Encoding, ids: np.ndarray) -> None:
  """Makes the variables ``ids`` continuous: a Tjeng ReLU with ``a in [0, 1]`` projects onto
  the triangle relaxation of ``(z, y)``."""
  from ortools.math_opt.elemental.python import enums
  ids = np.asarray(ids, np.int64)
  if ids.size:
    enc._el.set_attrs(enums.BoolAttr1.VARIABLE_INTEGER, ids[:, None], np.zeros(ids.size, bool))


def _tighten_layer(enc: Encoding, z: np.ndarray, L: np.ndarray, U: np.ndarray, which: np.ndarray,
                   cfg: IdpDbConfig) -> tuple[np.ndarray, np.ndarray, int]:
  """Maximises and minimises each variable ``z[j]`` (``which[j]``) over ``enc``.

  A new bound is accepted only from a proven solve (``OPTIMAL``; in ``"milp"`` mode also a
  time-out's dual bound), moved outward by ``_TIGHT_REL * (|v| + U - L) + _TIGHT_ABS`` for the
  solver's tolerances, and intersected with the old ``[L, U]``. A failed or timed-out LP keeps
  the old bound. Returns the new ``(L, U)`` and the number of solves.
  """
  L, U = L.copy(), U.copy()
  scfg = SolveConfig(solver="highs", time_limit=cfg.tighten_time_limit, threads=cfg.threads,
                     relative_gap=cfg.relative_gap)
  ok = ("OPTIMAL",) if cfg.tighten == "lp" else ("OPTIMAL", "FEASIBLE", "NO_SOLUTION_FOUND")
  n = 0
  for j in np.flatnonzero(which):
    for maximize in (True, False):
      if not L[j] < U[j]:
        break
      enc.set_objective([z[j]], [1.0], maximize=maximize)
      out = solve(enc, scfg)
      n += 1
      v = out.dual_bound
      if out.reason not in ok or not math.isfinite(v):
        continue
      pad = _TIGHT_REL * (abs(v) + (U[j] - L[j])) + _TIGHT_ABS
      if maximize:
        U[j] = max(min(U[j], v + pad), L[j])
      else:
        L[j] = min(max(L[j], v - pad), U[j])
  return L, U, n


def _to_tighten(m: int, n_layers: int, L: np.ndarray, U: np.ndarray) -> np.ndarray:
  """Neurons worth an LP: the unstable ones of a hidden layer, every logit of the last layer."""
  if m == n_layers - 1:
    return L < U
  return (L < 0) & (U > 0)


def tighten_net(net: Network, lo: Any, hi: Any, cfg: IdpDbConfig = IdpDbConfig(),
                bounds: list | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
  """N's pre-activation bounds over ``[lo, hi]`` tightened layer by layer (spec §2.4).

  Layer ``m >= 1``: each unstable neuron (every logit in the last layer) is maximised and
  minimised over the model of layers ``0..m`` with the already tightened bounds: the LP
  relaxation (``cfg.tighten == "lp"``: stable ReLUs exact, unstable ones the triangle) or the
  MILP (``"milp"``, per solve ``cfg.tighten_time_limit``, dual bound kept on a time-out).
  Layer 0 is skipped: interval arithmetic is already exact for one affine map of a box.
  Sound: every real ``x`` is feasible in the relaxation and the accepted optimum is the solver's
  proven bound widened by its tolerance; results are intersected with the starting bounds
  (``bounds``, else ``cfg.bounds`` from `milp.bounds`). ``cfg.tighten == "none"`` returns them.
  """
  lo = np.asarray(lo, np.float64).reshape(-1)
  hi = np.asarray(hi, np.float64).reshape(-1)
  out = [(np.asarray(a, np.float64).copy(), np.asarray(b, np.float64).copy())
         for a, b in (bounds if bounds is not None else bounds_lib.compute(net, lo, hi, cfg.bounds))]
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
    nv = enc.add_network(_prefix(net, m), x, lo, hi, bounds=out[:m + 1])
    if cfg.tighten == "lp":
      _relax_integers(enc, nv.binaries)
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
  N# (interval rows, Eq. 3e), and the matching dependencies of spec §2.6 (post-ReLU for layers
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
    nv = enc.add_network(_prefix(net, m), x, lo, hi, bounds=list(diff.ref[:m + 1]))
    relax = [np.full(h[0].shape, cfg.tighten == "lp") for h in diff.hyper[:m]]
    h_pre, h_post, _ = _add_hyper(enc, _prefix(hyper, m), x, lo, hi, list(diff.hyper[:m + 1]),
                                  relax)
    if cfg.tighten == "lp":
      _relax_integers(enc, nv.binaries)
    for k in range(m):
      _pair_rows(enc, h_post[k], nv.post[k], *diff.post[k])
    for k in range(m + 1):
      _pair_rows(enc, h_pre[k], nv.pre[k], *diff.pre[k])
    L, U, _ = _tighten_layer(enc, h_pre[m], diff.hyper[m][0], diff.hyper[m][1], which, cfg)
    hb[m] = (L, U)
    diff = difference_bounds(net, hyper, lo, hi, cfg.bounds, ref_bounds=ref, hyper_bounds=hb)
  return diff


def _n_unstable(bounds) -> int:
  return bounds_lib.count_unstable(list(bounds))


def _confidence_cap(net: Network, out_bounds: tuple[np.ndarray, np.ndarray], label: int) -> float:
  """The largest ``C^c_N(x)`` N's sound logit bounds allow: ``u_c - max_{c'} l_c'`` (sign: ``±z``)."""
  L_out, U_out = out_bounds
  if net.output == "sign":
    return float(U_out[0] if label == 1 else -L_out[0])
  others = [k for k in range(net.num_outputs) if k != label]
  return float(np.min(U_out[label] - L_out[others]))


def node_bound(net: Network, hyper: Network, label: int, cfg: IdpDbConfig = IdpDbConfig(), *,
               input_lower: Any = 0.0, input_upper: Any = 1.0,
               time_limit: float | None = None,
               diff: DifferenceBounds | None = None,
               ref_bounds: list | None = None) -> NodeResult:
  """Eq. 3: ``max beta`` s.t. ``C^c_N(x) >= beta``, ``C^c_{N#}(x) <= 0``, ``x`` in the box.

  Args:
    net: N (concrete).
    hyper: N# (interval parameters; a concrete member gives the per-point MILP of spec §2.2).
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
  _check_compatible(net, hyper, "the hyper-network")
  label = _check_label(net, label)
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
  h_pre, h_post, h_bins = _add_hyper(enc, hyper, x, lo, hi, list(diff.hyper), relax_masks)
  if cfg.matching:
    for m in range(n_layers - 1):
      _pair_rows(enc, h_post[m], nv.post[m], *diff.post[m])
    if cfg.matching_pre:
      for m in range(n_layers):
        _pair_rows(enc, h_pre[m], nv.pre[m], *diff.pre[m])
  b_hi = _confidence_cap(net, diff.ref[-1], label)
  beta = enc.add_variables([-np.inf], [b_hi])[0]
  _confidence_rows(enc, net, nv.outputs, label, beta)
  _disagreement_rows(enc, hyper, h_pre[-1], label, diff.hyper[-1])
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
                    _n_unstable(diff.ref) + _n_unstable(diff.hyper), t_tight)


def screen_bound(net: Network, diff: DifferenceBounds, label: int) -> float:
  """A sound iDP-DB of one node from its logit difference intervals alone (no MILP).

  If N# does not predict ``c`` at ``x`` then some ``c' != c`` has ``z#_c' >= z#_c``, so with
  ``Delta = z# - z`` (`milp.difference`, logits ``[dl, du]``)

      C^c_N(x) <= z_c - z_c' <= (z_c - z_c') - (z#_c - z#_c') = Delta_c' - Delta_c <= du_c' - dl_c,

  hence ``beta*_c <= max_{c' != c} (du_c' - dl_c)``, capped by N's largest confidence. Sign
  networks: ``C^1 = z <= z - z# <= -dl`` and ``C^0 = -z <= du``. Tight when N# is one member close
  to N, loose for a wide hyper-network (there the MILP's joint encoding matters).
  """
  dl, du = diff.pre[-1]
  if net.output == "sign":
    b = float(-dl[0] if label == 1 else du[0])
  else:
    others = [k for k in range(net.num_outputs) if k != label]
    b = float(np.max(du[others] - dl[label]))
  return min(b, _confidence_cap(net, diff.ref[-1], label))


def member_bounds(net: Network, members: Sequence[Network] | Family, label: int,
                  cfg: IdpDbConfig = IdpDbConfig(), *, input_lower: Any = 0.0,
                  input_upper: Any = 1.0, ref_bounds: list | None = None,
                  progress: bool = False) -> np.ndarray:
  """``u_i >= beta*_c({N_-i})`` for every member: `screen_bound` on each member alone.

  One difference-interval pass per member (about 0.6 ms for Adult 2x50 in float64), so a whole
  leave-one-out family of 32k networks is screened in seconds, where one MILP over the
  hyper-network of all of them is far looser (the box over 32k members loses which parameters
  move together). ``max_i u_i`` is a sound iDP-DB of the family.

  Args:
    net: N (concrete).
    members: the leave-one-out networks (as `lucid_compute` takes them).
    label: the class c.
    cfg: ``cfg.bounds`` and ``cfg.tighten`` choose N's bounds when ``ref_bounds`` is ``None``.
    input_lower, input_upper: the input box.
    ref_bounds: precomputed sound pre-activation bounds of N (shared by every member).
    progress: tqdm bar over members.

  Returns:
    ``(K,)`` float64 bounds, in member order.
  """
  family = as_family(members, net.output)
  _check_compatible(net, family.member(0), "the family")
  label = _check_label(net, label)
  d = net.input_size
  lo = np.broadcast_to(np.asarray(input_lower, np.float64), (d,)).copy()
  hi = np.broadcast_to(np.asarray(input_upper, np.float64), (d,)).copy()
  if ref_bounds is None:
    ref_bounds = tighten_net(net, lo, hi, cfg)
  rows = range(family.size)
  if progress:
    from tqdm.auto import tqdm
    rows = tqdm(rows, desc=f"screen members, class {label}", unit="net", mininterval=2.0)
  out = np.empty(family.size)
  for i in rows:
    diff = difference_bounds(net, family.member(i), lo, hi, cfg.bounds, ref_bounds=ref_bounds)
    out[i] = screen_bound(net, diff, label)
  return out


# ------------------------------------------------------------------------------------------------
# Executors for independent node solves
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _NodeJob:
  net: Network
  hyper: Network
  label: int
  cfg: IdpDbConfig
  time_limit: float | None
  ref_bounds: list | None = None


def _run_node(job: _NodeJob) -> NodeResult:
  return node_bound(job.net, job.hyper, job.label, job.cfg, time_limit=job.time_limit,
                    ref_bounds=job.ref_bounds)


def _worker_init() -> None:
  os.environ.setdefault("JAX_PLATFORMS", "cpu")


class _Runner:
  """Runs lists of `_NodeJob` serially, on a spawn process pool, or as Ray tasks (in order)."""

  def __init__(self, cfg: IdpDbConfig):
    kind = "ray" if cfg.ray_address is not None else cfg.executor
    self.kind = "serial" if cfg.workers == 1 and kind != "ray" else kind
    self.pool = None
    self._ray_started = False
    if self.kind == "process":
      self.pool = cf.ProcessPoolExecutor(max_workers=cfg.workers, mp_context=mp.get_context("spawn"),
                                         initializer=_worker_init)
    elif self.kind == "ray":
      try:
        import ray
      except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("idpdb executor='ray' needs the optional extra: pip install ray") from e
      if not ray.is_initialized():
        if cfg.ray_address is not None:
          ray.init(address=cfg.ray_address)
        else:
          ray.init(num_cpus=cfg.workers, include_dashboard=False, log_to_driver=False)
        self._ray_started = True
      self._remote = ray.remote(_run_node)

  def map(self, jobs: Sequence[_NodeJob]) -> list[NodeResult]:
    if self.kind == "serial" or len(jobs) <= 1:
      return [_run_node(j) for j in jobs]
    if self.kind == "process":
      return list(self.pool.map(_run_node, jobs))
    import ray
    return list(ray.get([self._remote.remote(j) for j in jobs]))

  def close(self) -> None:
    if self.pool is not None:
      self.pool.shutdown(cancel_futures=True)
    if self._ray_started:
      import ray
      ray.shutdown()


# ------------------------------------------------------------------------------------------------
# Branching: k-means with the elbow rule
# ------------------------------------------------------------------------------------------------

def elbow_k(ks: Sequence[int], distortions: Sequence[float]) -> int:
  """The knee of a decreasing distortion curve (the Kneedle idea, Satopää et al. 2011).

  Both axes are scaled to [0, 1]; for a decreasing convex curve the knee is where the scaled
  curve lies furthest below the chord from the first to the last point, i.e. the argmax of
  ``(1 - y_n) - x_n``. With fewer than three candidates, or a flat curve, the first ``k`` is
  returned (LUCID's code falls back to 2).
  """
  ks = np.asarray(ks, np.float64)
  ds = np.asarray(distortions, np.float64)
  if ks.size < 3 or not np.isfinite(ds).all() or ds.max() - ds.min() <= 0:
    return int(ks[0])
  xn = (ks - ks[0]) / (ks[-1] - ks[0])
  yn = (ds - ds.min()) / (ds.max() - ds.min())
  gain = (1.0 - yn) - xn
  return int(ks[int(np.argmax(gain))])


def partition(features: np.ndarray, rows: np.ndarray, cfg: IdpDbConfig) -> list[np.ndarray]:
  """Splits member ``rows`` into clusters by k-means on their parameters (spec §2.8).

  ``k`` is the elbow over the candidates ``cfg.kmeans_ks`` below ``|S|``, capped at
  ``cfg.max_k``, raised to ``cfg.workers``, capped at ``|S|``; two members split into singletons. Empty clusters are
  dropped; if k-means puts every member in one cluster (identical parameters) the set is halved.
  """
  from sklearn.cluster import KMeans

  rows = np.asarray(rows)
  n = rows.size
  if n <= 2:
    return [rows[i:i + 1] for i in range(n)]
  X = features[rows]
  cands = sorted({int(k) for k in cfg.kmeans_ks if int(k) < n}) or [min(2, n)]
  fits = {}
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # ConvergenceWarning on duplicate members
    for k in cands:
      fits[k] = KMeans(n_clusters=k, random_state=cfg.seed, n_init="auto").fit(X)
    k = elbow_k(cands, [fits[k].inertia_ for k in cands])
    if cfg.max_k is not None:
      k = min(k, cfg.max_k)
    k = min(max(k, cfg.workers), n)
    km = fits.get(k) or KMeans(n_clusters=k, random_state=cfg.seed, n_init="auto").fit(X)
  groups = [rows[km.labels_ == j] for j in range(k)]
  groups = [g for g in groups if g.size]
  if len(groups) < 2:
    groups = [g for g in np.array_split(rows, 2) if g.size]
  return groups


# ------------------------------------------------------------------------------------------------
# LUCID-Compute (Alg. 1) and the naive baseline
# ------------------------------------------------------------------------------------------------

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
  """LUCID-Compute (spec §2.8, Alg. 1): a sound ``beta >= beta*_c`` for the given family.

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
  _check_compatible(net, family.member(0), "the family")
  label = _check_label(net, label)
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
  runner = _Runner(cfg)
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
      jobs = [_NodeJob(net, hyper_of(family, g), label, cfg, limit, ref) for g in batch]
      for g, res in zip(batch, runner.map(jobs)):
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
                     time.perf_counter() - t0, lower, lower_x, lower_member, _n_unstable(ref),
                     t_ref, u, t_screen)


def naive_compute(net: Network, members: Sequence[Network] | Family, label: int,
                  cfg: IdpDbConfig = IdpDbConfig(), progress: bool = False) -> NaiveBetaResult:
  """NaiveCompute (spec §2.2): ``max_i`` of the per-member MILP ``P_i`` (Eq. 3 with N# = N_-i).

  Matching dependencies and relax-if-similar are off (the spec's "Naive" variant), so with
  optimal solves the answer is the exact ``beta*_c`` of the family. ``cfg.total_time_limit``
  stops early; ``complete`` is then False and ``beta`` is not a bound for the whole family.
  """
  t0 = time.perf_counter()
  family = as_family(members, net.output)
  _check_compatible(net, family.member(0), "the family")
  label = _check_label(net, label)
  ncfg = dataclasses.replace(cfg, matching=False, matching_pre=False, relax=False)
  ref = tighten_net(net, np.zeros(net.input_size), np.ones(net.input_size), ncfg)
  runner = _Runner(ncfg)
  per = np.full(family.size, np.nan)
  nodes: list[NodeResult] = []
  bar = None
  if progress:
    from tqdm.auto import tqdm
    bar = tqdm(total=family.size, desc=f"naive iDP-DB class {label}", unit="milp")
  try:
    for s in range(0, family.size, cfg.workers):
      left = None if cfg.total_time_limit is None else cfg.total_time_limit - (time.perf_counter() - t0)
      if left is not None and left <= 0.05:
        break
      limit = cfg.node_time_limit
      if left is not None:
        limit = left if limit is None else min(limit, left)
      idx = range(s, min(s + cfg.workers, family.size))
      res = runner.map([_NodeJob(net, family.member(i), label, ncfg, limit, ref) for i in idx])
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


def attack(net: Network, members: Sequence[Network] | Family, label: int, starts: int = 1024,
           steps: int = 300, lr: float = 0.02, penalty: float = 20.0, seed: int = 0,
           search_members: int | None = None
           ) -> tuple[float, np.ndarray | None, int | None]:
  """A lower bound on beta*_c by search: the best leaking confidence found, confirmed in float64.

  Projected sign-gradient ascent (vmapped over ``starts`` uniform points of [0, 1]^d, float32
  JAX) on ``C^c_N(x) - penalty * relu(min_i C^c_{N_-i}(x) + 1e-4)``, i.e. on N's confidence with
  a penalty until some member disagrees. The final points are replayed in float64 through N and
  every member; among those where a member disagrees (``C^c_{N_-i}(x) <= 0``) the largest
  ``C^c_N(x)`` is returned with its input and member (``(-inf, None, None)`` if none).
  Every ``x`` returned is a real leaking input, so ``result <= beta*_c <= beta``.

  ``search_members`` caps the members inside the gradient search (a seeded random subset; the
  search costs ``starts * members`` forward passes per step, too much for a whole leave-one-out
  family of Adult); the float64 replay still checks every member of the family.
  """
  import jax
  import jax.numpy as jnp

  family = as_family(members, net.output)
  _check_compatible(net, family.member(0), "the family")
  label = _check_label(net, label)
  searched = family
  if search_members is not None and search_members < family.size:
    if search_members < 1:
      raise ValueError(f"attack: search_members must be >= 1, got {search_members}.")
    pick = np.sort(np.random.default_rng(seed).choice(family.size, search_members, replace=False))
    searched = family.select(pick)
  ws = [jnp.asarray(w, jnp.float32) for w in searched.ws]
  bs = [jnp.asarray(b, jnp.float32) for b in searched.bs]
  nw = [jnp.asarray(l.w_lower, jnp.float32) for l in net.layers]
  nb = [jnp.asarray(l.b_lower, jnp.float32) for l in net.layers]

  def conf(z):
    if z.shape[-1] == 1:
      return z[..., 0] if label == 1 else -z[..., 0]
    others = jnp.delete(z, label, axis=-1, assume_unique_indices=True)
    return z[..., label] - jnp.max(others, axis=-1)

  def objective(x):
    h = x
    for m, (w, b) in enumerate(zip(nw, nb)):
      h = w @ h + b
      h = jax.nn.relu(h) if m < len(nw) - 1 else h
    g = jnp.broadcast_to(x, (searched.size, x.size))
    for m, (w, b) in enumerate(zip(ws, bs)):
      g = jnp.einsum("koi,ki->ko", w, g) + b
      g = jax.nn.relu(g) if m < len(ws) - 1 else g
    return conf(h) - penalty * jax.nn.relu(jnp.min(conf(g)) + 1e-4)

  grad = jax.vmap(jax.grad(objective))

  @jax.jit
  def run(x0):
    def step(x, _):
      return jnp.clip(x + lr * jnp.sign(grad(x)), 0.0, 1.0), None
    return jax.lax.scan(step, x0, None, length=steps)[0]

  x0 = jax.random.uniform(jax.random.PRNGKey(seed), (starts, net.input_size))
  xs = np.asarray(run(x0), np.float64)
  c_n = confidence(net, net_lib.forward_batch(net, xs), label)
  c_m = confidence(net, family.outputs(xs), label)            # (K, starts)
  leaking = np.min(c_m, axis=0) <= 0.0
  if not leaking.any():
    return -math.inf, None, None
  best = int(np.flatnonzero(leaking)[np.argmax(c_n[leaking])])
  return float(c_n[best]), xs[best], int(np.argmin(c_m[:, best]))


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

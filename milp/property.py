"""Exact check of one VNN-COMP-style property on a concrete `Network`: sat (with a replayed
counterexample), unsat (with a proof), or timeout / unknown.

A property's unsafe condition is a disjunction of conjunctions of linear output constraints over
an input box (the VNNLIB format). `check_property` decides one conjunction:

    exists x in [lower, upper]:  C N(x) <= d      (every row; C of shape (k, n_out), d (k,))

and `check_disjunction` a disjunction of them (sat as soon as one disjunct is sat, unsat when
every disjunct is). Steps:

1. **Bounds.** Pre-activation bounds (``milp.bounds`` CROWN by default, or the caller's, e.g. from
   ``bj.crown``). Each row's lower bound is the better of the engine's CROWN with ``C`` composed
   into the network (`milp.bounds.spec_bounds`) and the interval of ``y``; a row whose lower
   bound is ``> 0`` everywhere proves unsat without a MILP.
2. **Sampling.** The centre, box corners and uniform points are run through the network in
   float64; a point satisfying every row is a counterexample.
3. **MILP** (the big-M ReLU encoding of Tjeng et al. 2019, §3, built by `milp.encode.Encoding`):
   ``min t`` subject to the network, ``C_i y - t <= d_i`` for every row and ``t <= tol``, so
   ``t = max_i (C_i y - d_i)`` at the optimum. An ``INFEASIBLE`` answer proves
   ``max_i (C_i y - d_i) > tol >= 0`` for every ``x`` in the box: unsat. A feasible point is a
   *candidate*, clipped to the box and replayed through the network in float64 (`forward`); it is
   reported as ``sat`` only if ``C y <= d`` holds there exactly. The first solve stops at the
   first feasible point (like `milp.verify`); if no candidate replays, the model is solved again
   to optimality (the best point is the most robust candidate). Any other ending (time limit,
   numerical trouble, an optimum too close to 0 to replay) is ``timeout`` or ``unknown``, never
   ``unsat``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Sequence

import numpy as np

from milp import bounds as bounds_lib
from milp.encode import Encoding
from milp.network import Network, forward, forward_batch
from milp.solve import SolveConfig, check_nonneg_finite, solve

Bounds = list[tuple[np.ndarray, np.ndarray]]

SAT, UNSAT, TIMEOUT, UNKNOWN = "sat", "unsat", "timeout", "unknown"


@dataclasses.dataclass
class PropertyResult:
  """Outcome of `check_property` / `check_disjunction`.

  Attributes:
    status: ``"sat"`` (``counterexample`` replayed: every row of ``C N(x) <= d`` holds in
      float64), ``"unsat"`` (proven: by bounds or an ``INFEASIBLE`` MILP), ``"timeout"`` or
      ``"unknown"``.
    counterexample: for sat, the flat input ``x`` (inside ``[lower, upper]``).
    output: for sat, ``N(x)`` in float64.
    method: what settled the answer: ``"bounds"``, ``"sampling"`` or ``"milp"``.
    disjunct: for `check_disjunction`, the index of the disjunct that is sat (or that stopped the
      search); 0 for `check_property`.
    seconds, build_seconds, solve_seconds: wall-clock times.
    n_binaries, n_unstable: size of the MILP (ReLU binaries) and unstable neurons of the bounds.
    reason: the solver's termination reason (``INFEASIBLE``, ``FEASIBLE``, ``OPTIMAL``, ...).
    note: free text.
  """

  status: str
  counterexample: np.ndarray | None = None
  output: np.ndarray | None = None
  method: str = ""
  disjunct: int = 0
  seconds: float = 0.0
  build_seconds: float = 0.0
  solve_seconds: float = 0.0
  n_binaries: int = 0
  n_unstable: int = 0
  reason: str = ""
  note: str = ""


def _as_box(net: Network, lower: Any, upper: Any) -> tuple[np.ndarray, np.ndarray]:
  lo = np.asarray(lower, np.float64).reshape(-1)
  hi = np.asarray(upper, np.float64).reshape(-1)
  if lo.shape != (net.input_size,) or hi.shape != (net.input_size,):
    raise ValueError(f"check_property: the box has {lo.size}/{hi.size} entries, the network "
                     f"takes {net.input_size}.")
  if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))) or np.any(lo > hi):
    raise ValueError("check_property: the box must be finite with lower <= upper.")
  return lo, hi


def _as_spec(net: Network, C: Any, d: Any) -> tuple[np.ndarray, np.ndarray]:
  C = np.atleast_2d(np.asarray(C, np.float64))
  d = np.atleast_1d(np.asarray(d, np.float64)).reshape(-1)
  if C.ndim != 2 or C.shape[1] != net.num_outputs or d.shape != (C.shape[0],):
    raise ValueError(f"check_property: C must have shape (k, {net.num_outputs}) and d (k,); got "
                     f"{C.shape} and {d.shape}.")
  if not (np.all(np.isfinite(C)) and np.all(np.isfinite(d))):
    raise ValueError("check_property: C and d must be finite.")
  return C, d


def _bounds(net: Network, lo: np.ndarray, hi: np.ndarray, bounds: str | Bounds | None,
            C: np.ndarray, d: np.ndarray) -> tuple[Bounds, tuple[np.ndarray, np.ndarray]]:
  """Pre-activation bounds and sound lower bounds of the rows ``C N(x) - d`` from one engine
  call (`milp.bounds.compute_with_spec`: ``"crown"``/``"ibp"``, CROWN with ``C`` composed into
  the network); caller's bounds are intersected with the computed ones (both sound, so the
  intersection is) and then also give the rows of their interval of ``y``."""
  method = bounds if isinstance(bounds, str) else "crown"
  # one compilation per network (a concrete one: CROWN alone, no IBP intersection)
  computed, rows = bounds_lib.compute_with_spec(net, lo, hi, C, d, method, with_ibp=False)
  if bounds is None or isinstance(bounds, str):
    return computed, rows
  if len(bounds) != len(net.layers):
    raise ValueError(f"check_property: bounds= needs one (L, U) pair per layer "
                     f"({len(net.layers)}), got {len(bounds)}.")
  out = []
  for m, ((L, U), (Li, Ui), layer) in enumerate(zip(bounds, computed, net.layers)):
    L = np.asarray(L, np.float64).reshape(-1)
    U = np.asarray(U, np.float64).reshape(-1)
    if L.shape != (layer.shape[0],) or U.shape != (layer.shape[0],):
      raise ValueError(f"check_property: bounds of layer {m} have shapes {L.shape}/{U.shape}, "
                       f"the layer has {layer.shape[0]} outputs.")
    L, U = np.maximum(L, Li), np.minimum(U, Ui)
    if np.any(L > U):
      raise ValueError(f"check_property: the given bounds of layer {m} are disjoint from its "
                       "interval bounds, so they are not sound.")
    out.append((L, U))
  if len(d):
    il, iu = bounds_lib.interval_rows(C, d, *out[-1])
    rows = (np.maximum(rows[0], il), np.minimum(rows[1], iu))
  return out, rows


def _samples(lo: np.ndarray, hi: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
  """Centre, box corners (all of them for up to 10 inputs, else random ones) and uniform points."""
  dim = lo.size
  pts = [(lo + hi)[None] / 2]
  if dim <= 10:
    bits = (np.arange(2 ** dim)[:, None] >> np.arange(dim)) & 1
  else:
    bits = rng.integers(0, 2, (n, dim))
  pts.append(np.where(bits == 1, hi, lo))
  pts.append(lo + (hi - lo) * rng.random((n, dim)))
  return np.concatenate(pts)


def _solution_inputs(result: Any, x_ids: np.ndarray) -> list[np.ndarray]:
  """The input values of every primal solution the solver returned (best first)."""
  out = []
  for s in result.solutions:
    sol = s.primal_solution
    if sol is None:
      continue
    lookup = {v.id: val for v, val in sol.variable_values.items()}
    out.append(np.array([lookup.get(int(i), 0.0) for i in x_ids]))
  return out


Spec = tuple[np.ndarray, np.ndarray]


class _Checker:
  """Shared state of one network and box: bounds, samples, counters."""

  def __init__(self, net: Network, lower: Any, upper: Any, bounds, time_limit: float,
               solver: str, threads: int, tol: float, samples: int, seed: int):
    if not net.is_point:
      raise ValueError("check_property: the network has interval parameters; take a member.")
    if not (time_limit is not None and time_limit > 0):
      raise ValueError(f"check_property: time_limit must be > 0 seconds, got {time_limit}.")
    self.t0 = time.perf_counter()
    self.net, self.time_limit = net, float(time_limit)
    self.tol = check_nonneg_finite(tol, "check_property: tol")
    self.solver, self.threads = solver, int(threads)
    self.lo, self.hi = _as_box(net, lower, upper)
    self.bounds_arg = bounds
    self.bnds: Bounds = []
    self.rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    self.n_unstable = 0
    self.build = self.solve_s = 0.0
    self.n_bin = 0
    self._xs = _samples(self.lo, self.hi, samples, np.random.default_rng(seed)) if samples else None
    self._ys = forward_batch(net, self._xs) if samples else None

  def remaining(self) -> float:
    return self.time_limit - (time.perf_counter() - self.t0)

  def result(self, status: str, method: str, **kw) -> PropertyResult:
    return PropertyResult(status, method=method, seconds=time.perf_counter() - self.t0,
                          build_seconds=self.build, solve_seconds=self.solve_s,
                          n_binaries=self.n_bin, n_unstable=self.n_unstable, **kw)

  def replay(self, specs: dict[int, Spec], xs: Sequence[np.ndarray],
             ys: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, int] | None:
    """``(x, y, j)``: a candidate (clipped into the box) whose output, recomputed one point at a
    time by `forward` (the replay every consumer uses), satisfies every row of disjunct ``j``;
    the most robust (most negative ``min_j max_i (C_ji y - d_ji)``) first; None if none does."""
    if not len(xs):
      return None
    xs = np.clip(np.asarray(xs, np.float64).reshape(len(xs), -1), self.lo, self.hi)
    ys = forward_batch(self.net, xs) if ys is None else ys
    worst = np.min([np.max(ys @ C.T - d, axis=1) if len(d) else np.full(len(xs), -np.inf)
                    for C, d in specs.values()], axis=0)
    for i in np.argsort(worst, kind="stable")[:8]:
      if worst[i] > 1e-9:  # not even close in the batched product
        break
      y = forward(self.net, xs[i])
      for j, (C, d) in specs.items():
        if np.all(C @ y <= d):
          return xs[i].copy(), y, j
    return None

  def prepare(self, specs: Sequence[Spec]) -> None:
    """Bounds of every layer and the row lower bounds of every disjunct, in one engine call
    (the disjuncts' rows stacked)."""
    C = np.vstack([C for C, _ in specs] + [np.zeros((0, self.net.num_outputs))])
    d = np.concatenate([d for _, d in specs] + [np.zeros(0)])
    if not len(d):  # no output condition anywhere: bound a placeholder row
      C, d = np.zeros((1, self.net.num_outputs)), np.zeros(1)
    self.bnds, rows = _bounds(self.net, self.lo, self.hi, self.bounds_arg, C, d)
    self.n_unstable = bounds_lib.count_unstable(self.bnds)
    start = 0
    for j, (Cj, _) in enumerate(specs):
      self.rows[j] = (rows[0][start:start + len(Cj)], rows[1][start:start + len(Cj)])
      start += len(Cj)

  def bounds_unsat(self, j: int) -> bool:
    """Disjunct ``j`` has a row whose sound lower bound is ``> 0`` on the whole box."""
    rows = self.rows[j][0]
    if not len(rows):  # no output condition: every input of the box is unsafe
      return False
    return bool(np.max(rows) > 0)

  def milp(self, specs: dict[int, Spec]) -> PropertyResult:
    """Step 3 of the module docstring, for the disjunction of ``specs`` (index -> ``(C, d)``).

    One model: ``t_j >= C_ji y - d_ji`` for every row of disjunct ``j``, and with several
    disjuncts binaries ``delta_j`` (``sum_j delta_j >= 1``) selecting one:
    ``tau >= t_j - M_j (1 - delta_j)``, ``M_j = max t_j - min tau`` (so the row is void when
    ``delta_j = 0``); minimise ``tau <= tol``. At the optimum ``tau = min_j max_i (C_ji y -
    d_ji)``; infeasibility proves every disjunct unsat.
    """
    tb = time.perf_counter()
    enc = Encoding("property")
    x = enc.add_variables(self.lo, self.hi)
    enc.inputs = x
    nv = enc.add_network(self.net, x, self.lo, self.hi, bounds=self.bnds)
    L, U = self.bnds[-1]
    t_lo, t_hi = [], []
    for j in specs:  # the range of max_i (C_i y - d_i), sound (engine, float64, `prepare`)
      r_lo, r_hi = self.rows[j]
      t_lo.append(float(np.max(r_lo)))
      t_hi.append(float(np.max(r_hi)))
    t_lo, t_hi = np.array(t_lo), np.array(t_hi)
    many = len(specs) > 1
    t = enc.add_variables(np.minimum(t_lo, self.tol), t_hi if many else np.full(1, self.tol))
    for k, (C, d) in enumerate(specs.values()):  # C y - t_k <= d
      A = np.hstack([C, -np.ones((len(d), 1))])
      enc.add_dense_rows(A, np.concatenate([nv.outputs, t[k:k + 1]]), np.full(len(d), -np.inf), d)
    if many:
      m = len(specs)
      tau_lo = float(np.min(np.minimum(t_lo, self.tol)))
      tau = enc.add_variables([tau_lo], [self.tol])
      delta = enc.add_binaries(m)
      big = np.maximum(t_hi - tau_lo, 0.0)
      r = np.arange(m)
      # t_k - tau + M_k delta_k <= M_k ;  sum delta >= 1
      enc.add_rows(np.r_[r, r, r], np.r_[t, np.repeat(tau, m), delta],
                   np.r_[np.ones(m), -np.ones(m), big], np.full(m, -np.inf), big)
      enc.add_rows(np.zeros(m), delta, np.ones(m), [1.0], [np.inf])
      objective = tau
    else:
      objective = t
    enc.set_objective(objective, [1.0])
    self.n_bin = enc.num_binaries
    self.build += time.perf_counter() - tb
    reason, note = "", ""
    for solution_limit in (1, None):  # first feasible point; then the optimum if it did not replay
      left = self.remaining()
      if left <= 0:
        return self.result(TIMEOUT, "milp", reason=reason or "TIME_LIMIT",
                           note="time limit reached before the MILP finished")
      cfg = SolveConfig(solver=self.solver, time_limit=left, threads=self.threads, tol=self.tol)
      out = solve(enc, cfg, solution_limit=solution_limit)
      self.solve_s += out.seconds
      reason = out.reason + (f"/{out.limit}" if out.limit else "")
      if out.reason == "INFEASIBLE":
        return self.result(UNSAT, "milp", reason=reason,
                           note=f"MILP proves max_i (C_i y - d_i) > {self.tol:g} on the box for "
                                "every disjunct")
      if out.has_solution:
        hit = self.replay(specs, _solution_inputs(out.result, x))
        if hit is not None:
          return self.result(SAT, "milp", counterexample=hit[0], output=hit[1], disjunct=hit[2],
                             reason=reason,
                             note="MILP counterexample replayed through the network in float64")
        note = (f"MILP candidate (objective {out.primal_value:.3g}) did not replay: the optimum "
                "is within solver tolerance of the boundary")
        if out.reason == "OPTIMAL":
          return self.result(UNKNOWN, "milp", reason=reason, note=note)
        continue
      if out.limit == "TIME" or self.remaining() <= 0:
        return self.result(TIMEOUT, "milp", reason=reason,
                           note="solver stopped at the time limit without proof")
      return self.result(UNKNOWN, "milp", reason=reason,
                         note="solver stopped without proof or solution")
    status = TIMEOUT if self.remaining() <= 0 else UNKNOWN
    return self.result(status, "milp", reason=reason, note=note)

  def check(self, specs: Sequence[Spec]) -> PropertyResult:
    """Bounds, then sampling, then one MILP over the disjuncts left open."""
    self.prepare(specs)
    open_ = {j: spec for j, spec in enumerate(specs) if not self.bounds_unsat(j)}
    if not open_:
      return self.result(UNSAT, "bounds", note="every disjunct has a row whose lower bound is > 0 "
                                               "on the whole box")
    if self._xs is not None:
      hit = self.replay(open_, self._xs, self._ys)
      if hit is not None:
        return self.result(SAT, "sampling", counterexample=hit[0], output=hit[1], disjunct=hit[2])
    return self.milp(open_)


def check_property(net: Network, lower: Any, upper: Any, C: Any, d: Any, *, time_limit: float,
                   bounds: str | Bounds | None = None, solver: str = "scip", threads: int = 1,
                   tol: float = 1e-6, samples: int = 256, seed: int = 0) -> PropertyResult:
  """Is there an ``x`` in ``[lower, upper]`` with ``C N(x) <= d`` (every row)? Exactly, by MILP.

  Args:
    net: a concrete `Network` (e.g. from `milp.network.from_function` of an imported graph).
    lower, upper: the input box, flattened like the network's input (``x.reshape(-1)``).
    C, d: the unsafe condition ``C y <= d``, ``C`` of shape ``(k, n_out)``, ``d`` of ``(k,)``
      (``k = 0``: every input is unsafe).
    time_limit: seconds for the whole check (bounds, sampling, model building and solving).
    bounds: pre-activation bounds for the big-M constants: ``None``/``"crown"`` (default),
      ``"ibp"``, or one sound ``(L, U)`` pair per layer (pre-activations of each layer, the last
      being the outputs), e.g. from ``bj.crown``; they are intersected with IBP.
    solver: ``"scip"`` (default) or ``"highs"``.
    threads: solver threads.
    tol: the MILP's unsat margin: infeasibility of ``max_i (C_i y - d_i) <= tol`` proves unsat
      (``tol`` covers the solver's feasibility tolerance, like `milp.solve.SolveConfig.tol`).
    samples: random points (and corners) tried before the MILP; 0 disables sampling.
    seed: for the samples.

  Returns:
    A `PropertyResult`: ``"sat"`` with a counterexample replayed in float64, ``"unsat"`` with a
    proof (bounds, or a MILP answered ``INFEASIBLE``), else ``"timeout"`` / ``"unknown"``.
  """
  return check_disjunction(net, lower, upper, [(C, d)], time_limit=time_limit, bounds=bounds,
                           solver=solver, threads=threads, tol=tol, samples=samples, seed=seed)


def check_disjunction(net: Network, lower: Any, upper: Any,
                      disjuncts: Sequence[tuple[Any, Any]], *, time_limit: float,
                      bounds: str | Bounds | None = None, solver: str = "scip",
                      threads: int = 1, tol: float = 1e-6, samples: int = 256,
                      seed: int = 0) -> PropertyResult:
  """Is there an ``x`` in the box satisfying some disjunct ``C_j N(x) <= d_j``?

  ``disjuncts`` is a sequence of ``(C_j, d_j)`` (see `check_property` for the other arguments).
  Disjuncts proven unsat by bounds are dropped; sampling tries the rest; then one MILP decides
  their disjunction (binaries select the disjunct, see `_Checker.milp`). ``"sat"`` names the
  satisfied disjunct in ``disjunct``; ``"unsat"`` means every disjunct is proven unsat.
  """
  chk = _Checker(net, lower, upper, bounds, time_limit, solver, threads, tol, samples, seed)
  specs = [_as_spec(net, C, d) for C, d in disjuncts]
  if not specs:
    raise ValueError("check_disjunction: needs at least one disjunct (C, d).")
  return chk.check(specs)

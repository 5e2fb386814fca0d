"""Solving encodings with SCIP, HiGHS or CP-SAT through MathOpt, and reading sound answers.

* `SolveConfig` — solver (``"scip"`` | ``"highs"`` | ``"cpsat"``), time limit, threads, gaps.
* `solve(enc, cfg)` — one solve; returns a `SolveOutcome` with the termination reason, the
  solver's **dual bound** (the sound value of an optimisation query) and the incumbent.
* `optimise(enc, ids, coeffs, maximize, cfg)` — an optimisation query: the sound value is the
  dual bound (an upper bound when maximising, a lower bound when minimising), never the
  incumbent.

CP-SAT only accepts purely integer models (it silently rounds continuous variables otherwise), so
it is refused with `ValueError` when the model has a continuous variable. HiGHS takes its thread
count from a global setting, so ``threads`` is not passed to it.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import time
from typing import Any

import numpy as np
from ortools.math_opt.core.python import solver as _solver
from ortools.math_opt.python import callback, init_arguments, mathopt, model_parameters
from ortools.math_opt.python import result as result_lib
from pybind11_abseil.status import StatusNotOk

from milp.encode import Encoding

_SOLVERS = {
    "scip": mathopt.SolverType.GSCIP,
    "highs": mathopt.SolverType.HIGHS,
    "cpsat": mathopt.SolverType.CP_SAT,
}


@dataclasses.dataclass(frozen=True)
class SolveConfig:
  """Solver settings.

  Attributes:
    solver: ``"scip"`` (default), ``"highs"`` or ``"cpsat"`` (purely integer models only).
    time_limit: seconds (``None`` or ``inf``: no limit).
    threads: solver threads (ignored for HiGHS, whose threads are global).
    relative_gap: relative optimality gap for optimisation queries (finite, ``>= 0``).
    absolute_gap: absolute optimality gap (finite, ``>= 0``).
    tol: margin tolerance for verification (finite, ``>= 0``): VERIFIED needs a proven margin
      ``> tol`` (the feasibility form of Tjeng et al., extended in Sphynx, §5.2). A negative ``tol``
      would turn "margin > tol" into a non-proof (a network wrong everywhere with margin ``-0.5``
      was VERIFIED at ``tol=-1``), so it is refused. ``tol`` should also cover the solver's
      feasibility tolerance (SCIP/HiGHS: ``1e-6``), which an infeasibility proof is only exact to;
      ``tol=0`` is accepted but then ties within that tolerance are the solver's call.
  """

  solver: str = "scip"
  time_limit: float | None = 60.0
  threads: int = 1
  relative_gap: float = 1e-6
  absolute_gap: float = 1e-9
  tol: float = 1e-6

  def __post_init__(self):
    if self.solver not in _SOLVERS:
      raise ValueError(f"SolveConfig: solver must be one of {sorted(_SOLVERS)}, got {self.solver!r}.")
    if self.time_limit is not None and not self.time_limit > 0:
      raise ValueError(f"SolveConfig: time_limit must be > 0 seconds, got {self.time_limit}.")
    if self.threads < 1:
      raise ValueError(f"SolveConfig: threads must be >= 1, got {self.threads}.")
    for name in ("relative_gap", "absolute_gap", "tol"):
      check_nonneg_finite(getattr(self, name), f"SolveConfig: {name}")


def check_nonneg_finite(value: Any, what: str) -> float:
  """``float(value)`` if it is finite and ``>= 0``, else `ValueError` naming ``what``.

  Used for tolerances: a negative (or NaN) margin tolerance would let a solver's answer to
  "margin <= tol" be read as a proof of a margin it never established.
  """
  try:
    v = float(value)
  except (TypeError, ValueError):
    raise ValueError(f"{what} must be a finite number >= 0, got {value!r}.") from None
  if not (math.isfinite(v) and v >= 0):
    raise ValueError(f"{what} must be a finite number >= 0, got {value!r}.")
  return v


@dataclasses.dataclass
class SolveOutcome:
  """One solve.

  Attributes:
    reason: MathOpt termination reason name (``OPTIMAL``, ``INFEASIBLE``, ``FEASIBLE``,
      ``NO_SOLUTION_FOUND``, ``NUMERICAL_ERROR``, ...).
    limit: the limit hit, if any (``TIME``, ``SOLUTION``, ...).
    dual_bound: proven bound on the objective (``+inf``/``-inf`` conventions of MathOpt; for an
      infeasible minimisation ``+inf``).
    primal_value: the incumbent's objective, or ``None``.
    result: the raw MathOpt result (for reading variable values).
    seconds: wall-clock solve time (model export included).
    duals: the first solution's dual values ``(constraint ids, values)`` when the solver gave
      them (an LP), else None: `milp.safe_dual.LinearProgram.bound` turns them into a bound
      that holds whatever the solver's tolerances.
  """

  reason: str
  limit: str | None
  dual_bound: float
  primal_value: float | None
  result: Any
  seconds: float
  duals: tuple[np.ndarray, np.ndarray] | None = None

  @property
  def has_solution(self) -> bool:
    return self.primal_value is not None

  @property
  def proven(self) -> bool:
    return self.reason in ("OPTIMAL", "INFEASIBLE")


def _params(cfg: SolveConfig, solution_limit: int | None) -> mathopt.SolveParameters:
  kw: dict[str, Any] = dict(relative_gap_tolerance=cfg.relative_gap,
                            absolute_gap_tolerance=cfg.absolute_gap)
  if cfg.time_limit is not None and math.isfinite(cfg.time_limit):  # inf: no limit
    kw["time_limit"] = datetime.timedelta(seconds=float(cfg.time_limit))
  if cfg.solver != "highs":
    kw["threads"] = int(cfg.threads)
  if solution_limit is not None and cfg.solver == "scip":
    kw["solution_limit"] = int(solution_limit)
  return mathopt.SolveParameters(**kw)


def solve(enc: Encoding, cfg: SolveConfig = SolveConfig(),
          solution_limit: int | None = None) -> SolveOutcome:
  """Solves ``enc.model`` and returns the termination, dual bound and incumbent.

  Raises:
    ValueError: CP-SAT asked for a model with continuous variables.
    RuntimeError: the solver rejected the model or the parameters (message from OR-Tools).
  """
  if cfg.solver == "cpsat" and enc.has_continuous:
    raise ValueError("solve: CP-SAT needs a purely integer model; this one has continuous "
                     "variables (use 'scip' or 'highs').")
  params = _params(cfg, solution_limit)
  t0 = time.perf_counter()
  proto = enc.model.export_model()

  def run(p: mathopt.SolveParameters):
    return _solver.solve(proto, _SOLVERS[cfg.solver].value,
                         init_arguments.StreamableSolverInitArguments().to_proto(),
                         p.to_proto(), model_parameters.ModelSolveParameters().to_proto(),
                         None, callback.CallbackRegistration().to_proto(), None, None)

  try:
    try:
      raw = run(params)
    except StatusNotOk:
      if cfg.solver != "highs":
        raise
      # HiGHS's MIP presolve fails (HighsStatus kError) on some small valid models that it
      # solves without presolve (seen with HiGHS in OR-Tools 9.15 on a 134-variable big-M
      # encoding); one retry without it.
      params.presolve = mathopt.Emphasis.OFF
      raw = run(params)
  except StatusNotOk as e:  # MathOpt's own wrapper of this error is broken in 9.15
    raise RuntimeError(f"solve ({cfg.solver}): {getattr(e, 'message', e)}") from None
  res = result_lib.parse_solve_result(raw, enc.model, validate=False)
  seconds = time.perf_counter() - t0
  term = res.termination
  reason = term.reason.name
  limit = term.limit.name if term.limit is not None else None
  dual = float(res.termination.objective_bounds.dual_bound)
  primal = float(res.objective_value()) if res.has_primal_feasible_solution() else None
  maximize = bool(proto.objective.maximize)
  if reason == "INFEASIBLE":
    dual = -math.inf if maximize else math.inf
  duals = None
  if len(raw.solutions) and raw.solutions[0].HasField("dual_solution"):
    dv = raw.solutions[0].dual_solution.dual_values
    duals = (np.asarray(list(dv.ids), np.int64), np.asarray(list(dv.values), np.float64))
  return SolveOutcome(reason, limit, dual, primal, res, seconds, duals)


@dataclasses.dataclass
class OptimumBound:
  """Result of an optimisation query: ``bound`` is sound (the dual bound), ``incumbent`` is not."""

  bound: float
  incumbent: float | None
  proven_optimal: bool
  reason: str
  seconds: float
  values: np.ndarray | None = None


def optimise(enc: Encoding, ids: Any, coeffs: Any, maximize: bool,
             cfg: SolveConfig = SolveConfig(), offset: float = 0.0,
             read: np.ndarray | None = None) -> OptimumBound:
  """Optimises ``offset + coeffs . x[ids]`` and returns the dual bound as the sound value.

  When maximising, every feasible point has objective ``<= bound``; when minimising, ``>=``.
  ``read``: variable ids whose incumbent values to return (e.g. the inputs).
  """
  enc.set_objective(ids, coeffs, offset=offset, maximize=maximize)
  out = solve(enc, cfg)
  vals = None
  if read is not None and out.has_solution:
    vals = enc.values(out.result, read)
  return OptimumBound(out.dual_bound, out.primal_value, out.reason == "OPTIMAL", out.reason,
                      out.seconds, vals)

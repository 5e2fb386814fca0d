"""Pre-activation bounds tightened by one LP or MILP per neuron (Tjeng et al. 2019, §4.1:
"progressive bounds tightening"; LUCID, §6.2; α,β-CROWN's MIP refinement of intermediate layers).

Layer ``m``'s pre-activation ``z_m[j]`` is maximised and minimised over the network's first
``m + 1`` affine layers on the input box, with the bounds already known for layers ``< m`` as
big-M constants: the MILP (an unstable ReLU exact with a binary) or its LP relaxation (the
triangle). The solver's dual bound is a bound of the optimum whatever the solve's ending (an
optimum, a time-out with an incumbent, or none), so it is kept in every case it is finite,
moved outward by a margin for the solver's tolerances (below) and intersected with the old
interval: the result is never looser than the bounds given.

* `prefix(net, m)` — the network's first ``m + 1`` affine layers.
* `relax_integers(enc, ids)` — a MILP's binaries made continuous (its LP relaxation).
* `tighten_vars(enc, z, L, U, jobs, cfg, ...)` — the solves on one encoding.
* `tighten_layer(net, lo, hi, bounds, m, ...)` — one layer's neurons, in a given order, on
  several threads (HiGHS releases the GIL while it solves; each thread builds its own model:
  an OR-Tools model is not shared between threads), until a deadline.

Soundness. An LP solve (``mode="lp"``, or any encoding without integer variables) is made
rigorous by its duals: the bound kept is the safe dual bound of `milp.safe_dual` (weak duality
evaluated with a-priori rounding error bounds; Neumaier and Shcherbina 2004), which holds
whatever HiGHS's tolerances (primal and dual feasibility 1e-7); an LP solve that returns no
dual vector tightens nothing. A MILP's dual bound comes from a branch-and-bound tree that no
cheap certificate covers; it is moved outward by ``rel * (|v| + (U - L)) + abs`` before it is
met with ``[L, U]``. That margin is an allowance for HiGHS's MIP feasibility tolerance of 1e-6,
not an a-priori error bound (HiGHS gives none); callers that decide a verdict from it use the
larger `VERIFY_MARGIN`.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from milp.encode import Encoding
from milp.network import Network
from milp.safe_dual import LinearProgram
from milp.solve import SolveConfig, solve

MARGIN = (4e-7, 1e-9)
"""``(rel, abs)``: the outward margin of a bound from a MILP solve (LUCID's screening); LP solves
need none (their bounds are safe dual bounds)."""

VERIFY_MARGIN = (1e-5, 1e-6)
"""``(rel, abs)``: the margin used by the complete verifier, 25x the above in relative terms
(a few orders of magnitude above HiGHS's tolerances; it costs nothing measurable in tightness:
on ERAN's 9x200 network the refined widths agree to 1e-8 with either margin)."""


def prefix(net: Network, m: int) -> Network:
  """The first ``m + 1`` affine layers of ``net`` (layer ``m``'s pre-activations as outputs)."""
  return Network(tuple(net.layers[:m + 1]), net.input_shape)


def relax_integers(enc: Encoding, ids: np.ndarray) -> None:
  """Makes the variables ``ids`` continuous: a Tjeng ReLU with ``a in [0, 1]`` projects onto
  the triangle relaxation of ``(z, y)``."""
  from ortools.math_opt.elemental.python import enums
  ids = np.asarray(ids, np.int64)
  if ids.size:
    enc._el.set_attrs(enums.BoolAttr1.VARIABLE_INTEGER, ids[:, None], np.zeros(ids.size, bool))


def _next(jobs: Any) -> tuple[int, bool] | None:
  """The next ``(neuron, maximize)`` of a queue or an iterator; None when there is none."""
  if isinstance(jobs, queue.Queue):
    try:
      return jobs.get_nowait()
    except queue.Empty:
      return None
  return next(jobs, None)


def tighten_vars(enc: Encoding, z: np.ndarray, L: np.ndarray, U: np.ndarray, jobs: Any,
                 cfg: SolveConfig, *, accept: Sequence[str] = ("OPTIMAL",),
                 margin: tuple[float, float] = MARGIN,
                 remaining: Callable[[], float] | None = None, lock: Any = None) -> int:
  """Solves ``max z[j]`` / ``min z[j]`` over ``enc`` for each ``(j, maximize)`` taken from
  ``jobs`` (an iterator, or a `queue.Queue` shared with other threads), updating ``L`` and
  ``U`` in place (under ``lock`` if given).

  A bound is accepted when the solve ends in one of ``accept`` (termination reasons of
  `milp.solve.solve`) with a finite dual bound ``v``; it becomes
  ``min(U[j], v + pad)`` (maximising) or ``max(L[j], v - pad)`` with
  ``pad = margin[0] * (|v| + U[j] - L[j]) + margin[1]``, never crossing the other end. When
  ``enc`` has no integer variable (an LP), ``v`` is instead the safe dual bound of the solve's
  duals (`milp.safe_dual`; no margin), and a solve without duals is skipped. A neuron
  with ``L[j] >= U[j]`` is skipped. ``remaining``: seconds left (None: no deadline); a solve
  gets ``min(cfg.time_limit, remaining())`` and none starts with less than 0.05 s left.
  Returns the number of solves.
  """
  n = 0
  lp: LinearProgram | None = None
  is_lp: bool | None = None
  while True:
    left = math.inf if remaining is None else remaining()
    if left < 0.05:
      return n
    job = _next(jobs)
    if job is None:
      return n
    j, maximize = int(job[0]), bool(job[1])
    if not L[j] < U[j]:
      continue
    limit = cfg.time_limit if cfg.time_limit is not None else math.inf
    run_cfg = cfg if limit <= left else SolveConfig(
        solver=cfg.solver, time_limit=left, threads=cfg.threads, relative_gap=cfg.relative_gap,
        absolute_gap=cfg.absolute_gap)
    enc.set_objective([z[j]], [1.0], maximize=maximize)
    if is_lp is None:
      proto = enc.model.export_model()
      is_lp = not any(proto.variables.integers)
      lp = LinearProgram.from_proto(proto) if is_lp else None
    out = solve(enc, run_cfg)
    n += 1
    v = out.dual_bound
    if out.reason not in accept or not math.isfinite(v):
      continue
    if lp is not None:
      if out.duals is None:
        continue
      v = lp.bound([z[j]], [1.0], 0.0, *out.duals, maximize=maximize)
      if not math.isfinite(v):
        continue
    with (lock if lock is not None else _NoLock()):
      pad = 0.0 if lp is not None else margin[0] * (abs(v) + (U[j] - L[j])) + margin[1]
      if maximize:
        U[j] = max(min(U[j], v + pad), L[j])
      else:
        L[j] = min(max(L[j], v - pad), U[j])


class _NoLock:
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False


def tighten_layer(net: Network, lo: Any, hi: Any, bounds: Sequence[tuple[Any, Any]], m: int, *,
                  order: Iterable[int] | None = None, mode: str = "milp",
                  time_limit: float = 2.0, relative_gap: float = 1e-2,
                  margin: tuple[float, float] = VERIFY_MARGIN, threads: int = 2,
                  deadline: float | None = None) -> tuple[np.ndarray, np.ndarray, int]:
  """Layer ``m``'s pre-activation bounds tightened, one MILP (``mode="milp"``) or LP
  (``"lp"``) per neuron and direction, over ``prefix(net, m)`` on the box ``[lo, hi]``.

  ``bounds``: sound ``(L, U)`` pre-activation bounds per layer, at least ``0..m`` (the big-M
  constants of layers ``< m``; layer ``m``'s are the start). ``order``: the neurons to tighten,
  most important first (default: layer ``m``'s unstable ones, ``L < 0 < U``); each is
  maximised, then minimised. ``threads``: solver threads working through the order, each on
  its own model. ``deadline``: a `time.monotonic` time after which no solve starts and every
  solve is cut short (None: none). ``time_limit``, ``relative_gap``: per solve (the dual bound
  is kept on a time-out, so a short limit loses tightness, never soundness). Returns
  ``(L, U, solves)``, ``L >= bounds[m][0]`` and ``U <= bounds[m][1]`` entrywise.
  """
  if mode not in ("milp", "lp"):
    raise ValueError(f"tighten_layer: mode must be 'milp' or 'lp', got {mode!r}.")
  if not 0 <= m < len(net.layers):
    raise ValueError(f"tighten_layer: layer {m} of a network with {len(net.layers)} layers.")
  lo = np.asarray(lo, np.float64).reshape(-1)
  hi = np.asarray(hi, np.float64).reshape(-1)
  known = [(np.asarray(a, np.float64).reshape(-1), np.asarray(b, np.float64).reshape(-1))
           for a, b in list(bounds)[:m + 1]]
  L, U = known[m][0].copy(), known[m][1].copy()
  if order is None:
    order = np.flatnonzero((L < 0) & (U > 0))
  jobs: queue.Queue = queue.Queue()
  for j in order:
    jobs.put((int(j), True))
    jobs.put((int(j), False))
  remaining = None if deadline is None else (lambda: deadline - time.monotonic())
  cfg = SolveConfig(solver="highs", time_limit=time_limit, relative_gap=relative_gap)
  accept = ("OPTIMAL",) if mode == "lp" else ("OPTIMAL", "FEASIBLE", "NO_SOLUTION_FOUND")
  lock = threading.Lock()
  counts = [0] * max(int(threads), 1)
  errors: list = []

  def work(i: int) -> None:
    try:
      enc = Encoding(f"tighten-{m}")
      x = enc.add_variables(lo, hi)
      nv = enc.add_network(prefix(net, m), x, lo, hi, bounds=known)
      if mode == "lp":
        relax_integers(enc, nv.binaries)
      counts[i] = tighten_vars(enc, nv.pre[m], L, U, jobs, cfg, accept=accept, margin=margin,
                               remaining=remaining, lock=lock)
    except Exception as e:  # noqa: BLE001  (re-raised in the caller's thread)
      errors.append(e)

  workers = [threading.Thread(target=work, args=(i,), name="boundjax-worker")
             for i in range(len(counts))]
  for w in workers:
    w.start()
  for w in workers:
    w.join()
  if errors:
    raise errors[0]
  return L, U, sum(counts)

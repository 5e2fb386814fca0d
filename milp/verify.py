"""Local robustness of a network or hyper-network over a neighbourhood: VERIFIED or not, soundly.

`verify(net, nbhd, label)` decides ``forall x' in I(x): class(N(x')) = label`` for a concrete
network, or for every network in a hyper-network's box (Sphynx, §5.2). Steps:

1. **Bounds.** IBP (or CROWN) output bounds; if the margin's lower bound is ``> tol`` the answer is
   VERIFIED without a MILP.
2. **Sampling** (real networks only). The centre, uniform points and box corners are run through
   the concrete network and the ``replay`` networks; a misclassified point is FALSIFIED.
3. **MILP**, one per competing class ``c``: minimise the margin ``z_label - z_c`` subject to the
   encoding and ``margin <= tol`` (the feasibility form of Tjeng et al., which Sphynx, §5.2,
   extends). An infeasible model proves ``margin > tol`` for that class. A feasible point is a
   *candidate*: it is projected into the neighbourhood (clipped to the box, discrete groups snapped)
   and replayed through real networks in float64 (and any ``replay`` callables, e.g. the Flax
   model).

Statuses:

* ``VERIFIED``     — every class margin is proven ``> tol`` over the whole neighbourhood (and, for
  a hyper-network, over every network in its box).
* ``FALSIFIED``    — a real network (the concrete ``net``, or one of ``replay``) classifies a
  point of the neighbourhood as another class; the point is in ``counterexample``.
* ``NOT_VERIFIED`` — hyper-network only: the abstraction admits a violating network (the
  reconstructed member is in ``witness``, from the proof of Sphynx, Thm 2, App. B), but no real
  network was shown to violate. Sphynx reads this as "not LDCP" (conservative).
* ``UNKNOWN``      — time-out, numerical trouble, or a candidate that did not replay. Never
  counted as verified.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from typing import Any, Callable, Sequence

import numpy as np

from boundjax.core import options
from milp import bounds as bounds_lib
from milp.encode import Encoding, reconstruct_member
from milp.network import Network, classify, forward_batch, margins
from milp.neighbourhoods import Neighbourhood
from milp.solve import SolveConfig, check_nonneg_finite, solve

ReplayFn = Callable[[np.ndarray], np.ndarray]  # (n, d) inputs -> (n, outputs)


class Status(str, enum.Enum):
  VERIFIED = "VERIFIED"
  FALSIFIED = "FALSIFIED"
  NOT_VERIFIED = "NOT_VERIFIED"
  UNKNOWN = "UNKNOWN"


@dataclasses.dataclass
class VerifyResult:
  """Outcome of `verify`.

  Attributes:
    status: see the module docstring.
    method: ``"bounds"``, ``"sampling"`` or ``"milp"`` (what settled the answer).
    margin_bound: a sound lower bound on the margin over the neighbourhood (``tol`` when the MILP
      proved infeasibility of ``margin <= tol``; ``-inf`` when nothing is proven).
    counterexample: a flat input inside the neighbourhood (FALSIFIED / NOT_VERIFIED candidate).
    counterexample_margin: the margin there (replayed real network; MILP value for a hyper
      candidate).
    witness: for NOT_VERIFIED, a concrete network inside the hyper-network's box that reproduces
      the MILP trace.
    note: free text (e.g. which replay network disagreed, solver reason).
  """

  status: Status
  method: str
  margin_bound: float
  counterexample: np.ndarray | None = None
  counterexample_margin: float | None = None
  witness: Network | None = None
  seconds: float = 0.0
  build_seconds: float = 0.0
  solve_seconds: float = 0.0
  n_binaries: int = 0
  n_unstable: int = 0
  reason: str = ""
  note: str = ""

  @property
  def verified(self) -> bool:
    return self.status == Status.VERIFIED


def _output_margin_bound(net: Network, L: np.ndarray, U: np.ndarray, label: int) -> float:
  if net.output == "sign":
    return float(L[0] if label == 1 else -U[0])
  others = [c for c in range(net.num_outputs) if c != label]
  return float(min(L[label] - U[c] for c in others))


def project(nbhd: Neighbourhood, x: np.ndarray) -> np.ndarray:
  """Clips ``x`` into the box and snaps every discrete group to its nearest admissible row."""
  x = np.clip(np.asarray(x, np.float64).reshape(-1), nbhd.lower.reshape(-1),
              nbhd.upper.reshape(-1))
  for g in nbhd.groups:
    idx = list(g.index)
    k = int(np.argmin(np.sum((g.values - x[idx]) ** 2, axis=1)))
    x[idx] = g.values[k]
  return x


def _misclassified(net: Network, outs: np.ndarray, label: int) -> np.ndarray:
  return classify(net, outs) != label


def _replay(net: Network, xs: np.ndarray, label: int, replay: Sequence[Any]
            ) -> tuple[int, int, float] | None:
  """First ``(point index, replay index, margin)`` where a real network misclassifies, else None.

  Replay index ``-1`` is ``net`` itself (only when concrete).
  """
  sources: list[tuple[int, Any]] = []
  if net.is_point:
    sources.append((-1, net))
  sources += list(enumerate(replay))
  for j, src in sources:
    outs = forward_batch(src, xs) if isinstance(src, Network) else np.asarray(
        src(xs), np.float64).reshape(len(xs), -1)
    bad = _misclassified(net, outs, label)
    if bad.any():
      i = int(np.argmax(bad))
      return i, j, float(margins(net, outs[i:i + 1], label)[0])
  return None


def verify(net: Network, nbhd: Neighbourhood, label: int, cfg: SolveConfig = SolveConfig(),
           bounds: str = "ibp", replay: Sequence[Network | ReplayFn] = (),
           samples: int = 64, seed: int = 0, use_bounds_shortcut: bool = True,
           point_rows_as_equalities: bool = True) -> VerifyResult:
  """Is every point of ``nbhd`` classified ``label`` by ``net`` (every member, if an interval net)?

  Args:
    net: a concrete network or a hyper-network (`milp.network.Network`).
    nbhd: the neighbourhood (`milp.neighbourhoods`).
    label: the class index that must hold, an integer in ``0 .. num_classes - 1`` (0/1 for a
      ``"sign"`` network); a float such as ``1.5`` is refused, not truncated to class 1.
    cfg: solver settings (``cfg.tol`` is the margin tolerance, finite and ``>= 0``; re-checked
      here, `ValueError` otherwise). Only a bound ``> tol`` or an ``INFEASIBLE`` answer to
      ``margin <= tol`` for every class counts as VERIFIED; any other solver status
      (time/solution limits, numerical errors, imprecise) gives UNKNOWN or a replayed
      counterexample.
    bounds: big-M constants from ``"ibp"`` or ``"crown"``.
    replay: real networks (concrete `Network`s or callables ``X -> outputs``) that counterexamples
      are replayed through; for a hyper-network these are its known members.
    samples: random points (and as many corners) tried before the MILP (0 disables).
    seed: the seed of those points (an integer).
    use_bounds_shortcut: allow step 1 to answer VERIFIED without a MILP.
    point_rows_as_equalities: see `Encoding.add_network`.

  Raises `boundjax.core.options.OptionError` (naming the option and value) for a label that is
  not a class of ``net``, ``samples < 0``, a non-integer ``seed`` or an unknown ``bounds``.
  """
  t0 = time.perf_counter()
  # re-checked here: VERIFIED below reads "margin > tol" as a proof, so a config whose
  # validation was bypassed (object.__setattr__, a duck-typed cfg) must not get through
  check_nonneg_finite(cfg.tol, "verify: cfg.tol")
  if nbhd.size != net.input_size:
    raise ValueError(f"verify: neighbourhood has {nbhd.size} inputs, network takes {net.input_size}.")
  label = options.integer("label", label, minimum=0, maximum=net.num_classes - 1)
  samples = options.integer("samples", samples, minimum=0)
  seed = options.integer("seed", seed)
  options.one_of("bounds", bounds, ("ibp", "crown"))
  lo, hi = nbhd.lower.reshape(-1), nbhd.upper.reshape(-1)
  bnds = bounds_lib.compute(net, lo, hi, bounds)
  n_unst = bounds_lib.count_unstable(bnds)
  mb = _output_margin_bound(net, *bnds[-1], label)
  if use_bounds_shortcut and mb > cfg.tol:
    return VerifyResult(Status.VERIFIED, "bounds", mb, seconds=time.perf_counter() - t0,
                        n_unstable=n_unst)

  if samples and (net.is_point or replay):
    rng = np.random.default_rng(seed)
    xs = np.concatenate([project(nbhd, nbhd.center)[None], nbhd.sample(samples, rng),
                         nbhd.sample(samples, rng, corners=True)])
    hit = _replay(net, xs, label, replay)
    if hit is not None:
      i, j, m = hit
      return VerifyResult(Status.FALSIFIED, "sampling", -np.inf, xs[i], m,
                          seconds=time.perf_counter() - t0, n_unstable=n_unst,
                          note=f"replay network {j} misclassifies a sampled point")

  tb = time.perf_counter()
  enc = Encoding()
  x = enc.add_input(nbhd)
  nv = enc.add_network(net, x, lo, hi, bounds=bnds,
                       point_rows_as_equalities=point_rows_as_equalities)
  others = [None] if net.output == "sign" else [c for c in range(net.num_outputs) if c != label]
  build = time.perf_counter() - tb
  solve_s = 0.0
  margin_rows = None
  status, reason, note = Status.VERIFIED, "INFEASIBLE", ""
  for c in others:
    ids, coeffs = enc.margin_terms(net, nv, label, c)
    tb = time.perf_counter()
    if margin_rows is not None:  # relax the previous class's margin row
      enc.model.delete_linear_constraint(enc.model.get_linear_constraint(int(margin_rows[0])))
    margin_rows = enc.add_rows(np.zeros(len(ids)), ids, coeffs, [-np.inf], [cfg.tol])
    enc.set_objective(ids, coeffs)
    build += time.perf_counter() - tb
    out = solve(enc, cfg, solution_limit=1)
    solve_s += out.seconds
    if out.reason == "INFEASIBLE":
      continue
    if out.has_solution:
      xc = project(nbhd, enc.values(out.result, x))
      hit = _replay(net, xc[None], label, replay)
      if hit is not None:
        _, j, m = hit
        return VerifyResult(Status.FALSIFIED, "milp", -np.inf, xc, m,
                            seconds=time.perf_counter() - t0, build_seconds=build,
                            solve_seconds=solve_s, n_binaries=enc.num_binaries,
                            n_unstable=n_unst, reason=out.reason,
                            note=f"MILP counterexample replayed through network {j}")
      if net.is_point:
        status, reason = Status.UNKNOWN, out.reason
        note = ("MILP candidate did not replay (margin within solver tolerance "
                f"{cfg.tol:g}); class {c}")
        break
      # the MILP trace: layer inputs (solver's x, then post-ReLU values) and pre-activations
      pre = [enc.values(out.result, p) for p in nv.pre]
      hs = [enc.values(out.result, x)] + [np.maximum(enc.values(out.result, p), 0.0)
                                          for p in nv.post]
      wit = reconstruct_member(net, hs[0], pre, hs)
      return VerifyResult(Status.NOT_VERIFIED, "milp", -np.inf, xc,
                          float(out.primal_value), wit, seconds=time.perf_counter() - t0,
                          build_seconds=build, solve_seconds=solve_s,
                          n_binaries=enc.num_binaries, n_unstable=n_unst, reason=out.reason,
                          note="hyper-network counterexample; no real network shown to disagree")
    status, reason = Status.UNKNOWN, out.reason + (f"/{out.limit}" if out.limit else "")
    note = f"solver stopped without proof for class {c}"
    break
  return VerifyResult(status, "milp", cfg.tol if status == Status.VERIFIED else -np.inf,
                      seconds=time.perf_counter() - t0, build_seconds=build,
                      solve_seconds=solve_s, n_binaries=enc.num_binaries, n_unstable=n_unst,
                      reason=reason, note=note)


def max_output(net: Network, nbhd: Neighbourhood, coeffs: Any, cfg: SolveConfig = SolveConfig(),
               bounds: str = "ibp"):
  """Sound upper bound on ``max_{x in nbhd, N in net} coeffs . N(x)`` (the dual bound)."""
  from milp.solve import optimise
  enc = Encoding()
  x = enc.add_input(nbhd)
  nv = enc.add_network(net, x, nbhd.lower, nbhd.upper, bounds=bounds)
  return optimise(enc, nv.outputs, np.asarray(coeffs, np.float64), True, cfg, read=x)

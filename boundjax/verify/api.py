"""The complete verifier: `verify`, `verify_instance`, `run_instances`.

Pipeline for a property (regions × disjuncts, see `boundjax.verify.spec`):

1. **CROWN first** (`engine.prove_with_engine`): the engine's own bound (`bj.crown`, sound
   mode) of every region's whole box with the specification composed into the function (all
   disjuncts' rows in one backward pass; CROWN-IBP only where CROWN does not fit
   ``memory_bytes``), alone on the CPU until ``CROWN_SHARE`` of the time limit, after a quick
   attack (``QUICK_ATTACK`` of the time). A disjunct with a row whose certified lower bound
   is > 0 is done; all done is ``unsat`` (stage ``"crown"``), before any extraction or branch
   and bound. This runs for every
   network with more than ``input_split_dims`` inputs (MLP, CNN, residual); with fewer
   inputs, input splitting's first bound *is* CROWN on the whole box (the same engine on the
   dense chain), so it is not paid twice (``engine_bounds=True`` runs it anyway).
2. **attack** (`boundjax.verify.attack`): sampling and PGD, at most ``attack_share`` of the time
   (the quick attack's included); a float64-replayed hit is ``sat``.
3. **dense plan** (`engine.dense_plan`, `memory.split_chunk` when only input splitting runs):
   the memory of the dense path estimated from the traced program's widths before anything is
   built; over ``dense_memory_bytes`` (half of ``memory``, `boundjax.verify.memory`) it is
   skipped. Within the budget, the function is extracted to an affine/ReLU chain
   (`milp.network`), checked against the float64 replay on random points, and densified in
   float64 (`chain`, whose bounds all come from the engine). When every input is small enough
   for input splitting this comes first, before the attack, and input splitting's bound
   compiles in a background thread while the attack runs (`chain.warm_up`).
4. **α-CROWN** on the open disjuncts of the whole property (α-CROWN, Xu et al., ICLR 2021): by
   the engine when there is no dense chain or it has a hidden layer wider than `WIDE` (a
   densified convolution, whose dense root is slow), within ``ALPHA_SHARE`` of the time left
   (0.8 without a chain); else by ReLU splitting's root (α-CROWN on the dense chain, every
   hidden layer's bounds optimised, stage ``"root"``).
5. without a dense chain: (high-dimensional inputs) the attack again on the open disjuncts for
   half the time left, then the generic path (`boundjax.verify.generic`: the engine on
   sub-boxes within ``memory_bytes``).
6. with one: **bab** on the open disjuncts: input splitting when the input has at most
   ``input_split_dims`` entries (`input_bab`; a third of the time with the smear branching,
   then the rest with look-ahead branching, see `_input_split_portfolio`), ReLU splitting with
   β-CROWN otherwise (`relu_bab`, with the MILP fallback).

**Time limit.** ``timeout`` covers everything, compilation included: the whole pipeline runs in
a worker thread joined until the deadline, so the answer (``timeout`` at the latest) comes
within a thread join's wake-up of the limit even when a step cannot be interrupted (an XLA
compilation, a jitted α-CROWN loop, a MILP solve past its time limit); such a step is left
behind (`engine.call_with_budget`; `boundjax verify` exits without waiting for it,
`run_instances` waits before the next instance, `settle`). Inside, every step gets at most the
time left and checks it between batches, so that little work is left behind.

**Progress** (`outcome.Progress`): each stage records its name, the branch-and-bound nodes and
the best certified lower bound of every disjunct's margin; the outcome's ``stats`` carry
``stage`` (what decided, or what was running at the deadline), ``nodes`` and ``margin`` (the
property's certified margin: the smallest disjunct's best lower bound, None before any bound),
which `outcome.summary` puts in words.

**Memory**: one budget, ``memory`` (default 4 GiB), bounds the estimated JAX/XLA buffers of
every bound call (`boundjax.verify.memory`: what is covered and what is not); sub-problems are
bounded in chunks that fit it, and a sub-problem that does not fit alone raises
`MemoryBudgetError` with the size it needs (`run_instances` reports it as an ``error`` row).

``unsat`` is returned only when every disjunct of every region is proven; with ``sound=True``
(default) every bound holds in exact arithmetic (see `engine` and `chain`).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.core.errors import MemoryBudgetError
from boundjax.core.options import OptionError
from boundjax.verify import attack, chain, engine
from boundjax.verify import memory as _memory
from boundjax.verify.outcome import Deadline, Outcome, Progress
from boundjax.verify.spec import Disjunct, Region, as_regions


CROWN_SHARE = 0.5
"""The CROWN stage (the engine on the whole property) ends at this share of the time limit."""

QUICK_ATTACK = 0.1
"""Before CROWN, the attack runs for this share of the time limit, at most `QUICK_ATTACK_CAP`
seconds (the rest of ``attack_share`` after CROWN, with other random starts)."""

QUICK_ATTACK_CAP = 15.0
"""The quick attack's most seconds: at a 300 s limit a tenth is 30 s, which every unsat
instance pays before CROWN (CIFAR10-ResNet 4b prop 12: CROWN proves it in 52 s after a 29 s
attack); the counterexamples it is for are found in 3-5 s."""

ENGINE_SPLIT_BATCH = 64
"""Sub-problems per bound call of ReLU splitting on the network itself (`relu_bab.engine_problem`;
the engine chunks a call further to fit ``memory_bytes``)."""

ENGINE_SPLIT_STEPS = 10
"""α-β steps per sub-problem there (warm-started from the parent's slopes and multipliers)."""

ENGINE_SPLIT_ROOT_STEPS = 20
"""α-CROWN steps of its root (on CROWN's intermediate bounds)."""

ENGINE_MILP_UNSTABLE = 200
"""Unstable neurons at that root up to which the MILP decides the disjunct at once (OVAL21's
``cifar_base_kw`` at img 4549: 72 unstable, each of the nine disjuncts decided in 1-8 s by the
MILP, where ReLU splitting left a margin of -0.007 after 5,800 sub-problems)."""

ALPHA_SHARE = 0.5
"""The engine's α-CROWN stage gets this share of the time left when branch and bound follows."""

WIDE = 1024
"""A dense chain with a hidden layer wider than this (a convolution densified) gets the engine's
α-CROWN on the whole property: ReLU splitting's own root (α-CROWN on the dense float64 chain,
every hidden layer's bounds optimised) is far slower there (a 784-2704-784-64-10 MNIST CNN:
no root bound within 60 s)."""


def alpha_fits(budget: float, crown_seconds: float) -> bool:
  """Whether α-CROWN may start with ``budget`` seconds after CROWN took ``crown_seconds``
  (compilation included). α-CROWN's program is CROWN's with its gradient, iterated: it costs
  more than CROWN, so a budget under CROWN's time would only leave a compilation running past
  it (it cannot be interrupted), taking the CPU from the stages after it."""
  return budget > crown_seconds


def _extract(apply_fn: Callable, params: Any, input_shape: Sequence[int]):
  """A point `milp.network.Network` for the function, or None if it is not an affine/ReLU
  chain (or no extractor applies)."""
  from milp import network as mnet
  try:
    if hasattr(mnet, "from_function"):
      return mnet.from_function(apply_fn, params, tuple(input_shape))
    return mnet.from_params(params)
  except Exception:  # not a chain the extractor understands: the generic path handles it
    return None


def _check_sizes(apply_fn: Callable, params: Any, input_shape: Sequence[int],
                 regions: Sequence[Region]) -> None:
  """Every region's box has ``prod(input_shape)`` inputs and every disjunct's ``C`` one column
  per output of ``apply_fn`` (else `OptionError` naming both counts, before any work: a raw
  reshape or matmul error would come out of the attack otherwise)."""
  n_in = math.prod(input_shape)
  for i, r in enumerate(regions):
    if r.dim != n_in:
      raise OptionError(f"prop: region {i} bounds {r.dim} inputs, the network takes {n_in} "
                        f"(input_shape {tuple(input_shape)})")
  try:
    out = jax.eval_shape(apply_fn, params,
                         jax.ShapeDtypeStruct(tuple(input_shape), jnp.float32))
  except Exception:  # pylint: disable=broad-except  (the attack reports a failing function)
    return
  out = out[0] if isinstance(out, (tuple, list)) else out
  n_out = math.prod(out.shape)
  for i, r in enumerate(regions):
    for j, c in enumerate(r.disjuncts):
      if c.C.shape[1] != n_out:
        raise OptionError(f"prop: disjunct {j} of region {i} constrains {c.C.shape[1]} "
                          f"outputs, the network gives {n_out}")


def _agrees(forward: Callable[[np.ndarray], np.ndarray], replay: attack.Replayer,
            regions: Sequence[Region], rng: np.random.Generator) -> bool:
  """An extracted network's float64 ``forward`` (a batch of flat inputs to outputs) agrees with
  the float64 replay on random points and the centre of every box (1e-9 relative and absolute):
  the answers of a search on the extracted network are then about the given one."""
  for r in regions:
    xs = np.concatenate([rng.uniform(r.lower, r.upper, size=(16, r.dim)),
                         ((r.lower + r.upper) / 2)[None]])
    y_ref = replay(xs)
    y = forward(xs)
    if y.shape != y_ref.shape or not np.allclose(y, y_ref, rtol=1e-9, atol=1e-9):
      return False
  return True


def _chain_forward(lay: chain.Layers) -> Callable[[np.ndarray], np.ndarray]:
  def forward(xs):
    with jax.enable_x64(True):
      return np.asarray(chain.forward(lay, jnp.asarray(xs)))
  return forward


def _point_network(apply_fn: Callable, params: Any, input_shape: Sequence[int],
                   replay: attack.Replayer, regions: Sequence[Region], key: int):
  """The extracted `milp.network.Network` (sparse layers: convolutions are not densified)
  when the function is an affine/ReLU chain and the network agrees with the float64 replay
  (`_agrees`); else None."""
  from milp import network as mnet
  net = _extract(apply_fn, params, input_shape)
  if net is None or not _agrees(lambda xs: mnet.forward_batch(net, xs), replay, regions,
                                np.random.default_rng(key)):
    return None
  return net


def _dense_chain(apply_fn: Callable, params: Any, input_shape: Sequence[int], plan: int,
                 replay: attack.Replayer, regions: Sequence[Region], key: int):
  """``(network, chain)``: the extracted `milp.network.Network` and its dense float64
  `chain.Layers` when the dense path is planned (``plan``), the function is an affine/ReLU
  chain and the chain agrees with the replay (`_agrees`); else ``chain`` is None."""
  net = _extract(apply_fn, params, input_shape) if plan else None
  lay = None
  if net is not None:
    with jax.enable_x64(True):
      lay = chain.from_network(net)
    if not _agrees(_chain_forward(lay), replay, regions, np.random.default_rng(key)):
      lay = None
  return net, lay


def _dense_plan(apply_fn: Callable, params: Any, input_shape: Sequence[int], budget: int,
                batch: int, split_rows: int | None = None, alpha: bool = False) -> int:
  """The ReLU-splitting batch the dense path may use within ``budget`` bytes, 0 to skip it
  (`engine.dense_plan`; a function whose widths cannot be read is left to the extractor).
  ``split_rows``: only input splitting will run, on this many specification rows: the dense
  path fits when one box of it does (`memory.split_chunk`; no ReLU-splitting frontier), and
  ``batch`` is returned then."""
  try:
    widths = engine.layer_widths(apply_fn, params, input_shape)
  except Exception:  # pylint: disable=broad-except  (the attack already ran the function)
    return batch
  if split_rows is None:
    return engine.dense_plan(widths, budget, batch=batch)
  try:
    _memory.split_chunk(widths, split_rows, budget, alpha=alpha)
  except MemoryError:
    return 0
  return batch


def _attack(apply_fn: Callable, params: Any, input_shape: Sequence[int],
            regions: Sequence[Region], replay: attack.Replayer, phase: Deadline,
            deadline: Deadline, restarts: int, steps: int, key: int):
  """`attack.falsify` until ``phase`` ends, in a worker thread joined until ``deadline`` at
  most (one PGD call, compilation included, cannot be interrupted; a call still running at
  the deadline is left behind): ``(x, y)`` or None."""
  finished, hit = engine.call_with_budget(
      lambda: attack.falsify(apply_fn, params, input_shape, regions, replay, phase,
                             restarts=restarts, steps=steps, key=key), deadline.remaining())
  return hit if finished else None


def _after(jobs: Sequence[tuple[str, engine.Job, Any]], deadline: Deadline,
           report: Progress) -> bool:
  """Waits until the bounds left running past their budget (``(stage, job, where)``: ``where``
  the region or regions it bounds) have ended, at most until ``deadline`` (``report.stage``
  names the one waited for); True when they have. The memory budget's shares hold only if the
  stages using them do not overlap (`boundjax.verify.memory`): branch and bound must not
  allocate its share beside the buffers of a bound still running."""
  for stage, job, _ in jobs:
    if not job.done():
      report.stage = stage
      job.wait(deadline.remaining())
  return all(job.done() for _, job, _ in jobs)


def _late(jobs: Sequence[tuple[str, engine.Job, Any]]) -> tuple[dict[int, float], str | None]:
  """What the bounds left behind and since finished certify (`engine.late_proofs`: the
  largest lower bound of each disjunct's margin, keyed by ``id``) and the stage of the last of
  them that proved something. A bound that raised certifies nothing."""
  best: dict[int, float] = {}
  stage = None
  for name, job, where in jobs:
    if not job.done():
      continue
    try:
      _, value = job.wait(0.0)
    except Exception:  # pylint: disable=broad-except  (a failed late bound proves nothing)
      continue
    for k, v in engine.late_proofs(value, where).items():
      if v > best.get(k, -np.inf):
        best[k] = v
        if v > 0:
          stage = name
  return best, stage


def _open_part(regions: Sequence[Region], proven: Sequence[np.ndarray]) -> tuple[Region, ...]:
  """The regions with their disjuncts not yet proven (regions with none left dropped)."""
  out = []
  for r, p in zip(regions, proven):
    left = tuple(dj for dj, ok in zip(r.disjuncts, p) if not ok)
    if left:
      out.append(Region(r.lower, r.upper, left))
  return tuple(out)


def verify(apply_fn: Callable, params: Any, input_shape: Sequence[int], prop: Any, *,
           timeout: float = 60.0, sound: bool = True, key: int = 0,
           input_split_dims: int = 10, batch: int = 1024, progress: bool = False,
           intermediate: str = "crown", alpha_steps: int = 0,
           attack_restarts: int = 64, attack_steps: int = 50,
           milp: bool = True, engine_bounds: bool | str = "auto",
           memory: int = _memory.DEFAULT, memory_bytes: int | None = None,
           dense_memory_bytes: int | None = None, engine_share: float | None = None,
           attack_share: float = 0.25) -> Outcome:
  """Decides a property of ``apply_fn(params, x)`` (x of shape ``input_shape``).

  Args:
    prop: regions with disjuncts (`boundjax.verify.spec.as_regions` accepts the VNNLIB reader's
      output and ``[((lower, upper), [(C, d), ...]), ...]``).
    timeout: wall-clock seconds for everything (compilation included).
    sound: bounds valid in exact real arithmetic (the engine's ``sound=True``, `chain`);
      ``unsat`` relies on them.
    key: seed of the attack's random starts.
    input_split_dims: input splitting up to this many inputs, ReLU splitting above.
    intermediate: input splitting's intermediate bounds, the engine's ``"crown"`` (a backward
      pass per layer, tighter) or ``"ibp"`` (interval propagation, CROWN-IBP: cheaper per box,
      looser on big boxes).
    alpha_steps: α-CROWN steps on the output rows of each input-split box (0: CROWN).
    batch: sub-problems per round of branch and bound (ReLU splitting: per jitted bound call,
      at most 256 and halved until its estimate fits the dense share of ``memory``; input
      splitting: bound ``stats["chunk"]`` at a time).
    milp: allow the MILP fallback (`milp.property.check_property`) in ReLU splitting.
    engine_bounds: when the engine (`engine.prove_with_engine`) bounds the whole property:
      ``"auto"`` (default), first (CROWN, before the attack; α-CROWN after the extraction,
      where the dense chain's own root does not do it, see the module docstring) when some
      region has more than ``input_split_dims`` inputs; with fewer, input splitting's root is
      that bound (the engine's sound bounds compile far slower than the dense chain's: ACAS
      Xu 1_2 prop_2 went from solved to a timeout at 60 s with True, measured with a load of 8
      on 2 cores). True: first for every property, α-CROWN included; False: never.
    memory: the memory budget in bytes (default 4 GiB) of the bound calls' JAX/XLA buffers,
      estimated from the network's widths before anything is allocated (`boundjax.verify.memory`:
      what it covers and the formulas; not the Python process's baseline, the compiler, the
      attack or the search's frontier). A quarter goes to the engine (``memory_bytes``), half
      to the dense path (``dense_memory_bytes``); sub-problems are bounded in chunks that fit,
      and when one sub-problem alone does not, `MemoryBudgetError` (a `MemoryError`) names the
      size it needs and the budget.
    memory_bytes: overrides the engine's share of ``memory``: the budget of one chunk's
      backward state in ``bj.crown`` (whole boxes, the generic path).
    dense_memory_bytes: overrides the dense path's share of ``memory``: the dense path runs
      only if its estimate fits (`engine.dense_plan` with ReLU splitting,
      `memory.split_chunk` with input splitting), and input splitting's chunk
      (``stats["chunk"]``) is the largest power of two up to 64 boxes that fits it.
    engine_share: overrides both engine shares: CROWN ends at this share of ``timeout``
      (default ``CROWN_SHARE``), α-CROWN gets this share of the time left (default
      ``ALPHA_SHARE`` when branch and bound on a dense chain follows, 0.8 when it does not).
    attack_share: the first attack stops after this share of ``timeout`` (PGD on a CIFAR CNN
      took all of 120 s on a loaded CPU, leaving nothing to the bounds); before the generic
      path the attack runs again on the open disjuncts (other starts) for half the time left.

  Returns:
    an `Outcome`, at the latest when ``timeout`` has passed (module docstring); ``sat`` carries
    ``(x, y)`` replayed in float64. ``stats``: ``stage`` (a key of `outcome.STAGES`: what
    decided, or what ran at the deadline), ``nodes``, ``margin`` (the certified margin, None
    before any bound), ``phase`` (``"attack"``, ``"bounds"``, ``"bab"``, ``"milp"``),
    ``memory`` (the budget and its shares in bytes), ``chunk`` (input splitting's boxes per
    call), ``engine`` (what each engine mode did) and ``seconds`` per stage.

  Raises:
    boundjax.core.options.OptionError: the property's input or output count is not the
      network's (both counts named).
    boundjax.core.errors.MemoryBudgetError: one sub-problem's bound does not fit the budget
      (the size it needs and the budget named).
  """
  deadline = Deadline(timeout)
  regions = as_regions(prop)
  _check_sizes(apply_fn, params, input_shape, regions)
  shared = (memory_bytes is None, dense_memory_bytes is None)  # shares of ``memory``, not set
  memory_bytes, dense_memory_bytes = _memory.shares(memory, memory_bytes, dense_memory_bytes)
  frontier_bytes = _memory.frontier_bytes(memory)
  stats: dict[str, Any] = {"nodes": 0, "phase": None, "memory": {
      "total": memory, "engine": memory_bytes, "dense": dense_memory_bytes,
      "frontier": frontier_bytes}}
  report = Progress([dj for r in regions for dj in r.disjuncts])

  def done(status, cex=None, phase=None):
    stats["phase"] = phase
    stats["stage"] = report.stage
    stats["margin"] = report.margin()
    stats["nodes"] = max(stats["nodes"], report.nodes)
    return Outcome(status, cex, deadline.elapsed(), dict(stats))

  def engine_bounds_on(regs: Sequence[Region], budget: float, modes: Sequence[str],
                       fitted: Sequence[str] = ()) -> engine.EngineResult:
    """The engine's bounds of the regions ``regs``, recorded in ``report``."""
    eng = engine.prove_with_engine(apply_fn, params, input_shape, regs, deadline, budget,
                                   sound=sound, memory_bytes=memory_bytes, modes=modes,
                                   fitted=fitted)
    for r, low in zip(regs, eng.lower):
      for dj, v in zip(r.disjuncts, low):
        report.bound(dj, v)
    return eng

  def run() -> Outcome:
    nonlocal regions
    replay = attack.Replayer(apply_fn, params, input_shape)
    high_dim = any(r.dim > input_split_dims for r in regions)
    split_rows = None
    if not high_dim:
      from boundjax.verify import input_bab
      split_rows = max(input_bab.spec_rows(r.disjuncts) for r in regions)
    # 1. CROWN first, on the whole property, alone on the CPU (an attack beside it halved its
    # share on a loaded machine: a CNN's CROWN proof went from 20 s to over 60 s), after a
    # quick attack (`QUICK_ATTACK` of the time: a CIFAR CNN's counterexample that PGD finds in
    # seconds was lost behind CROWN's compilation at a 60 s limit). With few inputs, input
    # splitting's first bound is the same CROWN bound of the whole box (on the dense chain),
    # so it is not computed twice (unless ``engine_bounds=True``).
    first = None
    stats["seconds"] = {}
    crown_end = Deadline(timeout * (engine_share if engine_share is not None else CROWN_SHARE),
                         deadline.start)
    crown_first = (high_dim and engine_bounds is not False) or engine_bounds is True
    quick = min(min(QUICK_ATTACK, attack_share) * timeout, QUICK_ATTACK_CAP) \
        if crown_first else 0.0
    if quick > 0:
      report.stage = "attack"
      hit = _attack(apply_fn, params, input_shape, regions, replay,
                    Deadline(min(deadline.remaining(), quick)), deadline, attack_restarts,
                    attack_steps, key)
      stats["seconds"]["quick attack"] = deadline.elapsed()
      if hit is not None:
        return done("sat", hit, "attack")
    if crown_first:
      report.stage = "crown"
      first = engine.start(lambda: engine_bounds_on(
          regions, crown_end.remaining(), ("crown", "ibp")))
      first.wait(min(crown_end.remaining(), deadline.remaining()))
      stats["seconds"]["crown"] = deadline.elapsed() - sum(stats["seconds"].values())
      if first.done():
        eng = first.wait(0.0)[1]
        if eng.all_proven:
          stats["engine"] = dict(eng.modes)
          report.stage = "crown-ibp" if eng.decided_by == "ibp" else "crown"
          return done("unsat", phase="bounds")
    early, warm = None, []
    if not high_dim and engine_bounds is not True:
      # input splitting ahead: the chain is extracted first and its bound compiles in the
      # background while the attack runs (`chain.warm_up`; the two overlap on two cores)
      plan = _dense_plan(apply_fn, params, input_shape, dense_memory_bytes, min(batch, 256),
                         split_rows, bool(alpha_steps))
      early = (plan, *_dense_chain(apply_fn, params, input_shape, plan, replay, regions, key))
      if early[2] is not None and not alpha_steps:
        for rows in sorted({input_bab.spec_rows(r.disjuncts) for r in regions}):
          try:
            chunk = input_bab.chunk_for(early[2], rows, dense_memory_bytes)
          except MemoryError:  # the chain's widths are not the estimate's: the search says so
            continue
          warm.append(chain.warm_up(early[2], rows, sound, intermediate, chunk))
    report.stage = "attack"
    hit = _attack(apply_fn, params, input_shape, regions, replay,
                  Deadline(min(deadline.remaining(), attack_share * timeout - quick)), deadline,
                  attack_restarts, attack_steps, key + 2 if quick > 0 else key)
    stats["seconds"]["attack"] = deadline.elapsed() - sum(stats["seconds"].values())
    if hit is not None:
      return done("sat", hit, "attack")
    if deadline.expired():
      return done("timeout", phase="attack")
    if early is None:
      plan = _dense_plan(apply_fn, params, input_shape, dense_memory_bytes, min(batch, 256),
                         split_rows, bool(alpha_steps))
    else:
      plan = early[0]
    stats["dense_batch"] = plan
    fitted: tuple[str, ...] = ()
    behind: list[tuple[str, engine.Job, Any]] = []  # bounds left running past their budget
    if first is not None:
      finished, eng = first.wait(0.0)  # still running: a compilation past its share
      if not finished:
        behind.append(("crown", first, regions))
      elif eng.pending is not None:
        behind.append(("crown", eng.pending, eng.pending_region))
      if finished:
        stats["engine"] = dict(eng.modes)
        if eng.all_proven:
          report.stage = "crown-ibp" if eng.decided_by == "ibp" else "crown"
          return done("unsat", phase="bounds")
        regions = _open_part(regions, eng.proven)
        fitted = tuple(m for m in ("crown", "ibp") if eng.modes.get(m) in ("open", "proved"))
      else:
        stats["engine"] = {"crown": "budget"}
    if deadline.expired():
      return done("timeout", phase="bounds")
    if early is None:
      report.stage = "extract"
      net, lay = _dense_chain(apply_fn, params, input_shape, plan, replay, regions, key)
    else:
      net, lay = early[1:]
    # 2. α-CROWN on the whole property: by the engine where ReLU splitting's own root (α-CROWN
    # on the dense chain) is missing or slow (wide layers: convolutions densified)
    wide = lay is None or max(lay.widths[1:-1], default=0) > WIDE
    share = engine_share if engine_share is not None else (ALPHA_SHARE if lay is not None
                                                          else 0.8)
    if (fitted and (wide or engine_bounds is True) and (high_dim or engine_bounds is True)
        and not alpha_fits(share * deadline.remaining(), stats["seconds"].get("crown", 0.0))):
      stats["engine"]["alpha"] = "skipped: too little time"
    elif fitted and (wide or engine_bounds is True) and (high_dim or engine_bounds is True):
      report.stage = "alpha-crown"
      eng = engine_bounds_on(regions, share * deadline.remaining(), ("alpha",), fitted)
      stats["engine"].update(eng.modes)
      if eng.pending is not None:
        behind.append(("alpha-crown", eng.pending, eng.pending_region))
      stats["seconds"]["alpha"] = deadline.elapsed() - sum(stats["seconds"].values())
      if eng.all_proven:
        return done("unsat", phase="bounds")
      regions = _open_part(regions, eng.proven)
      if deadline.expired():
        return done("timeout", phase="bounds")
    # ReLU splitting on the network itself follows (convolutions as they are, not densified)
    split_here = (high_dim and wide and "crown" in fitted and engine_bounds is not False
                  and engine.has_primitive(apply_fn, params, input_shape, ("max",)))
    if lay is None and high_dim:  # the attack again on the open disjuncts, other starts
      report.stage = "attack"
      hit = _attack(apply_fn, params, input_shape, regions, replay,
                    Deadline(deadline.remaining() / (4 if split_here else 2)), deadline,
                    attack_restarts, attack_steps, key + 1)
      if hit is not None:
        return done("sat", hit, "attack")
    if not _after(behind, deadline, report):
      return done("timeout")
    # a bound left behind at its budget may have proven disjuncts since (an α-CROWN
    # compilation past its share on a loaded machine): its answer is not thrown away
    late, late_stage = _late(behind)
    for r in regions:
      for dj in r.disjuncts:
        if id(dj) in late:
          report.bound(dj, late[id(dj)])
    regions = _open_part(regions, [np.array([late.get(id(dj), -np.inf) > 0
                                             for dj in r.disjuncts]) for r in regions])
    if not regions:
      report.stage = late_stage
      stats.setdefault("engine", {})[late_stage.replace("-crown", "")] = "proved late"
      return done("unsat", phase="bounds")
    if split_here:
      if milp and net is None:
        report.stage = "extract"
        net = _point_network(apply_fn, params, input_shape, replay, regions, key)
      out = engine_split(regions, replay, net if milp else None)
      if out is not None:
        return out
    if lay is None:
      from boundjax.verify import generic
      report.stage = "generic"
      try:
        status, cex, nodes = generic.input_split_generic(
            apply_fn, params, input_shape, regions, replay, deadline, sound=sound,
            progress=progress, memory_bytes=memory_bytes, frontier_bytes=frontier_bytes)
      except MemoryBudgetError as e:
        if not shared[0]:  # a budget set by the caller: its own message
          raise
        raise _memory.against_total(e, memory) from e
      stats["nodes"] += nodes
      stats["method"] = "generic"
      return done(status, cex, "bab" if status in ("sat", "unsat") else None)
    try:
      return dense(lay, net, plan, replay, warm)
    except MemoryBudgetError as e:
      if not shared[1]:  # a budget set by the caller: its own message
        raise
      raise _memory.against_total(e, memory) from e

  def engine_split(regs: Sequence[Region], replay, net) -> Outcome | None:
    """ReLU splitting with β-CROWN on the network itself (`relu_bab.engine_problem`: the
    engine's bounds through convolutions as they are), one open disjunct after another, each
    with an equal share of the time left (one out of its share gets a second turn with what
    the others left); None when it does not apply (no ReLU, or a specification or parameters
    not exact in float32): the caller's path goes on. With the extracted point network ``net``, the MILP
    (Tjeng et al. 2019) decides a disjunct whose root has at most `ENGINE_MILP_UNSTABLE`
    unstable neurons, and the rest after half of the time (its own big-M bounds: the engine's
    node order need not be the network's layer order)."""
    from boundjax.verify import relu_bab
    fp = engine.fingerprint(apply_fn, params, input_shape)
    pending = [(r, dj) for r in regs for dj in r.disjuncts]
    decided = set()  # how the disjuncts were decided: "bounds", "bab", "milp"
    for _ in range(2):  # a disjunct out of its share of the time gets a second turn
      left = []
      for i, (region, disjunct) in enumerate(pending):
        if deadline.expired():
          return done("timeout")
        problem = relu_bab.engine_problem(
            apply_fn, params, input_shape, fp, disjunct.C, disjunct.d, sound=sound,
            root_steps=ENGINE_SPLIT_ROOT_STEPS, steps=ENGINE_SPLIT_STEPS, lr=0.1,
            memory_bytes=memory_bytes)
        if problem is None:
          return None
        stats["method"] = "relu-split-engine"
        fallback = (relu_bab.milp_fallback(net, region, disjunct, replay) if net is not None
                    else None)
        share = Deadline(deadline.remaining() / (len(pending) - i))  # the time left, shared
        status, cex, nodes, how = relu_bab.split_search(
            problem, region, disjunct, replay, share, batch=ENGINE_SPLIT_BATCH,
            progress=progress, report=report, milp=fallback,
            milp_unstable=ENGINE_MILP_UNSTABLE, frontier_bytes=frontier_bytes)
        stats["nodes"] += nodes
        if how == relu_bab.NO_RELU:
          return None
        if status == "sat":
          return done("sat", cex, how)
        if status == "timeout":
          left.append((region, disjunct))
        elif status != "unsat":
          return done(status)
        else:
          decided.add(how)
      if not left:
        phase = next(h for h in ("bab", "milp", "bounds") if h in decided or h == "bounds")
        return done("unsat", phase=phase)
      pending = left
    return done("timeout")

  def dense(lay, net, plan, replay, warm) -> Outcome:
    """Bounds and branch and bound on the dense chain."""
    phase = "bounds"
    if warm:
      report.stage = "input-split"  # its bound compiling
    for ready in warm:  # the search's time shares start once its bound is compiled
      ready.wait(max(deadline.remaining(), 0.0))
    with jax.enable_x64(True):  # thread-local: set in the worker
      for region in regions:
        # input splitting bounds all of a region's disjuncts together (shared intermediate bounds)
        split_inputs = region.dim <= input_split_dims
        refiner = None  # ReLU splitting: the region's MILP-refined bounds, shared by its disjuncts
        if not split_inputs and milp and net is not None:
          from boundjax.verify import relu_bab
          refiner = relu_bab.MilpRefiner(net, region)
        for disjunct in ((region.disjuncts,) if split_inputs else region.disjuncts):
          if deadline.expired():
            return done("timeout")
          if split_inputs:
            from boundjax.verify import input_bab
            stats["method"] = "input-split"
            report.stage = "input-split"
            stats["chunk"] = input_bab.chunk_for(lay, input_bab.spec_rows(disjunct),
                                                 dense_memory_bytes, alpha_steps)
            bar = _bar(progress, "input split")
            status, cex, nodes = _input_split_portfolio(
                input_bab, lay, region, disjunct, replay, deadline, sound=sound, batch=batch,
                progress=bar, intermediate=intermediate, alpha_steps=alpha_steps,
                memory_bytes=dense_memory_bytes, frontier_bytes=frontier_bytes)
            if bar is not None:
              bar.close()
            stats["nodes"] += nodes
            if nodes > 1:
              phase = "bab"
            if status == "sat":
              return done("sat", cex, "bab")
          else:
            from boundjax.verify import relu_bab
            stats["method"] = "relu-split"
            status, cex, nodes, how = relu_bab.relu_split(
                lay, net, region, disjunct, replay, deadline, sound=sound,
                batch=plan, progress=progress, use_milp=milp, report=report,
                frontier_bytes=frontier_bytes, refine=refiner)
            stats["nodes"] += nodes
            if how != "bounds":
              phase = how
            if status == "sat":
              return done("sat", cex, how)
          if status != "unsat":
            return done(status)
    return done("unsat", phase=phase)

  # 3. the deadline, compilation included: every step runs in a worker joined until the
  # deadline (a compilation, a jitted α-CROWN loop or a MILP solve cannot be interrupted; the
  # steps check the deadline between batches, this join is what keeps the time limit)
  finished, out = engine.call_with_budget(run, deadline.remaining())
  return out if finished else done("timeout")


def _input_split_portfolio(input_bab, lay, region, disjunct, replay, deadline: Deadline,
                           sample_seconds: float = 10.0, **kwargs: Any):
  """Input splitting with the parent's bounds met layer by layer and the smear branching for
  the first third of the time left, then, if that timed out, in the "post" mode
  (`chain.crown_batch`) with look-ahead branching (`input_bab`) for the rest.

  The two runs branch differently and neither dominates on ACAS Xu: the cheap smear run
  finishes most instances within seconds and is the faster on those needing many small boxes
  (1_1 prop_5: 8.7k boxes, 17 s; the look-ahead run times out at 60 s); the look-ahead run
  finishes the instances where smear's trees explode (2_7 prop_1: 559 boxes vs > 150k, both
  measured at 90-120 s). Between the two, a falsifier for thin violations
  (`attack.sample_search`: 10^6 float64 samples and LP local search, at most
  ``sample_seconds`` or a fifth of the time left; it finds ACAS Xu 1_9 prop_7's
  counterexample, which PGD and the boxes' centres and corners miss). Returns
  ``(status, counterexample, nodes of both runs)``."""
  first = Deadline(deadline.remaining() / 3)
  status, cex, nodes = input_bab.input_split(lay, region, disjunct, replay, first,
                                             reuse_bounds="layer", **kwargs)
  if status != "timeout" or deadline.expired():
    return status, cex, nodes
  hit = attack.sample_search([np.asarray(w) for w in lay.Ws], [np.asarray(b) for b in lay.bs],
                             Region(region.lower, region.upper, _as_tuple(disjunct)), replay,
                             Deadline(min(deadline.remaining() / 5, sample_seconds)))
  if hit is not None:
    return "sat", hit, nodes
  status, cex, more = input_bab.input_split(lay, region, disjunct, replay, deadline,
                                            reuse_bounds="post", branching="lookahead",
                                            **kwargs)
  return status, cex, nodes + more


def _as_tuple(disjunct) -> tuple:
  return (disjunct,) if isinstance(disjunct, Disjunct) else tuple(disjunct)


def _bar(progress: bool, desc: str):
  if not progress:
    return None
  from tqdm.auto import tqdm
  return tqdm(desc=desc, unit="box", leave=False)


def read_property(model: Any, onnx_path: str | Path, vnnlib_path: str | Path) -> Any:
  """The VNNLIB property of ``vnnlib_path`` read for the network ``model`` loaded from
  ``onnx_path``: `boundjax.io.vnnlib.read_vnnlib` with the network's ``n_inputs`` and
  ``n_outputs``, so that a property declaring other counts fails with a `VnnlibError` naming
  both files and both counts (not a reshape error inside the verifier)."""
  from boundjax.io.vnnlib import VnnlibError, read_vnnlib
  try:
    return read_vnnlib(str(vnnlib_path), n_inputs=model.n_inputs, n_outputs=model.n_outputs)
  except VnnlibError as e:
    raise VnnlibError(f"{e} (paired with {onnx_path}, whose input has {model.n_inputs} entries, "
                      f"shape {tuple(model.input_shape)}, and whose output has "
                      f"{model.n_outputs})") from None


def verify_instance(onnx_path: str | Path, vnnlib_path: str | Path, *, timeout: float = 60.0,
                    **kwargs: Any) -> Outcome:
  """Loads the ONNX network and the VNNLIB property (`boundjax.io`; the property's counts
  checked against the network's, `read_property`) and runs `verify`; loading counts against
  ``timeout``."""
  start = time.monotonic()
  from boundjax.io.onnx import load_onnx
  model = load_onnx(str(onnx_path))
  prop = read_property(model, onnx_path, vnnlib_path)
  left = timeout - (time.monotonic() - start)
  if left <= 0:
    return Outcome("timeout", None, time.monotonic() - start,
                   {"nodes": 0, "phase": "load", "stage": "load", "margin": None})
  out = verify(model.apply_fn, model.params, model.input_shape, prop, timeout=left, **kwargs)
  return Outcome(out.status, out.counterexample, time.monotonic() - start, out.stats)


def settle(seconds: float | None = None) -> float:
  """Waits for the bound computations an earlier instance left behind at its deadline
  (`engine.call_with_budget` and `chain.warm_up` workers and the pipeline itself, named
  ``boundjax-worker``: a compilation or a jitted α-CROWN loop cannot be interrupted), at most
  ``seconds`` (None: until they end), and returns the seconds waited. Without it they run on
  while the next instance's clock runs, taking its cores and adding their buffers to its
  memory: the memory budget holds per instance only if instances do not overlap (OVAL21 with
  a 120 s limit and the wait capped at the limit: two instances started beside work the one
  before left running after 120 s of waiting, and the batch's peak resident memory was
  5.12 GB against the 4 GiB budget)."""
  import threading
  start = time.monotonic()
  end = None if seconds is None else start + max(float(seconds), 0.0)
  for t in threading.enumerate():
    if t.name == "boundjax-worker" and t.is_alive() and t is not threading.current_thread():
      t.join(None if end is None else max(end - time.monotonic(), 0.0))
  return time.monotonic() - start


def run_instances(rows: Iterable[Any], timeout: float, progress: bool = True,
                  root: str | Path | None = None, settle_seconds: float | None = None,
                  on_row: Callable[[dict[str, Any]], None] | None = None,
                  **kwargs: Any) -> list[dict[str, Any]]:
  """Runs `verify_instance` on rows ``(onnx, vnnlib[, ...])`` or dicts with ``onnx`` and
  ``vnnlib`` keys (paths relative to ``root`` if given) and returns one dict per row:
  ``onnx, vnnlib, status, seconds, phase, nodes, settled, peak_rss`` (plus ``outcome``;
  ``peak_rss``: the process's peak resident bytes during the row, None where the platform does
  not tell, `memory.peak_rss`). ``on_row`` is called with each row's dict as soon as it is
  done (e.g. to save partial results). Never reads verdicts.

  Before each row, the work an earlier row left running at its deadline is waited for
  (`settle`, at most ``settle_seconds``, default: until it ends; not counted in any row's
  ``seconds``, reported as ``settled``), so that each instance runs alone, as it would in a
  process of its own, within its time and its memory budget.

  A row that raises (an unreadable file, a property of another size, an unsupported operator,
  any failure inside the verifier) gets ``status="error"`` with the exception in ``error`` and
  the batch goes on: one instance never costs the rows after it their answers."""
  rows = list(rows)
  results = []
  bar = None
  if progress:
    from tqdm.auto import tqdm
    bar = tqdm(total=len(rows), desc="instances", unit="inst")
  for row in rows:
    onnx_p, vnn_p = (row["onnx"], row["vnnlib"]) if isinstance(row, dict) else (row[0], row[1])
    if root is not None:
      onnx_p, vnn_p = Path(root) / onnx_p, Path(root) / vnn_p
    settled = settle(settle_seconds)
    measured = _memory.reset_peak_rss()
    start = time.monotonic()
    try:
      out = verify_instance(onnx_p, vnn_p, timeout=timeout, **kwargs)
    except Exception as e:  # noqa: BLE001  (reported per row; never a verdict)
      row_out = {"onnx": str(onnx_p), "vnnlib": str(vnn_p), "status": "error",
                 "seconds": time.monotonic() - start, "phase": None, "nodes": None,
                 "error": f"{type(e).__name__}: {e}", "outcome": None, "settled": settled}
    else:
      row_out = {"onnx": str(onnx_p), "vnnlib": str(vnn_p), "status": out.status,
                 "seconds": out.seconds, "phase": out.stats.get("phase"),
                 "nodes": out.stats.get("nodes"), "outcome": out, "settled": settled}
    row_out["peak_rss"] = _memory.peak_rss() if measured else None
    results.append(row_out)
    if on_row is not None:
      on_row(row_out)
    if bar is not None:
      bar.update(1)
      bar.set_postfix_str(f"{Path(str(vnn_p)).name}: {row_out['status']} "
                          f"{row_out['seconds']:.1f}s")
  if bar is not None:
    bar.close()
  return results

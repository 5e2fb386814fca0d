"""The complete verifier: `verify`, `verify_instance`, `run_instances`.

Pipeline for a property (regions × disjuncts, see `boundjax.verify.spec`):

1. **attack** (`boundjax.verify.attack`): sampling and PGD; a float64-replayed hit is ``sat``.
2. **network**: the function is extracted to an affine/ReLU chain (`milp.network`); the
   extraction is checked against the float64 replay on random points. Functions that are not
   such chains go to the generic path (`boundjax.verify.generic`: `bj.crown` on sub-boxes).
3. **bounds** per (region, disjunct): CROWN / α-CROWN on the whole box (`layered`); a disjunct
   with a row whose certified lower bound is > 0 is done.
4. **bab**: input splitting when the input has at most ``input_split_dims`` entries
   (`input_bab`; a third of the time with the smear branching, then the rest with look-ahead
   branching, see `_input_split_portfolio`), ReLU splitting with β-CROWN otherwise
   (`relu_bab`, with the MILP fallback).

``unsat`` is returned only when every disjunct of every region is proven; with ``sound=True``
(default) every bound holds in exact arithmetic (see `layered`). Time is wall-clock and checked
between batches; compilation counts.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.core.options import OptionError
from boundjax.verify import attack, layered
from boundjax.verify.outcome import Deadline, Outcome
from boundjax.verify.spec import Disjunct, Region, as_regions


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


def _matches(lay: layered.Layers, replay: attack.Replayer, regions: Sequence[Region],
             rng: np.random.Generator) -> bool:
  """The extracted chain agrees with the float64 replay on random points of every box."""
  for r in regions:
    xs = rng.uniform(r.lower, r.upper, size=(16, r.dim))
    xs = np.concatenate([xs, ((r.lower + r.upper) / 2)[None]])
    y_ref = replay(xs)
    with jax.enable_x64(True):
      y = np.asarray(layered.forward(lay, jnp.asarray(xs)))
    if y.shape != y_ref.shape or not np.allclose(y, y_ref, rtol=1e-9, atol=1e-9):
      return False
  return True


def verify(apply_fn: Callable, params: Any, input_shape: Sequence[int], prop: Any, *,
           timeout: float = 60.0, sound: bool = True, key: int = 0,
           input_split_dims: int = 10, batch: int = 1024, progress: bool = False,
           intermediate: str = "crown", alpha_steps: int = 0,
           attack_restarts: int = 64, attack_steps: int = 50,
           milp: bool = True) -> Outcome:
  """Decides a property of ``apply_fn(params, x)`` (x of shape ``input_shape``).

  Args:
    prop: regions with disjuncts (`boundjax.verify.spec.as_regions` accepts the VNNLIB reader's
      output and ``[((lower, upper), [(C, d), ...]), ...]``).
    timeout: wall-clock seconds for everything (compilation included).
    sound: bounds valid in exact real arithmetic (`layered`); ``unsat`` relies on them.
    key: seed of the attack's random starts.
    input_split_dims: input splitting up to this many inputs, ReLU splitting above.
    intermediate: input splitting's intermediate bounds, ``"crown"`` (backward, tighter) or
      ``"forward"`` (forward linear bounds, ~15x cheaper per box, looser on big boxes).
    alpha_steps: α-CROWN steps on the output rows of each input-split box (0: CROWN).
    batch: sub-problems per jitted bound call.
    milp: allow the MILP fallback (`milp.property.check_property`) in ReLU splitting.

  Returns:
    an `Outcome`; ``sat`` carries ``(x, y)`` replayed in float64.

  Raises:
    boundjax.core.options.OptionError: the property's input or output count is not the
      network's (both counts named).
  """
  deadline = Deadline(timeout)
  regions = as_regions(prop)
  _check_sizes(apply_fn, params, input_shape, regions)
  stats: dict[str, Any] = {"nodes": 0, "phase": None}

  def done(status, cex=None, phase=None):
    stats["phase"] = phase
    return Outcome(status, cex, deadline.elapsed(), dict(stats))

  replay = attack.Replayer(apply_fn, params, input_shape)
  hit = attack.falsify(apply_fn, params, input_shape, regions, replay, deadline,
                       restarts=attack_restarts, steps=attack_steps, key=key)
  if hit is not None:
    return done("sat", hit, "attack")
  if deadline.expired():
    return done("timeout", phase="attack")
  net = _extract(apply_fn, params, input_shape)
  lay = None
  if net is not None:
    with jax.enable_x64(True):
      lay = layered.from_network(net)
    if not _matches(lay, replay, regions, np.random.default_rng(key)):
      lay = None
  if lay is None:
    from boundjax.verify import generic
    status, cex, nodes = generic.input_split_generic(
        apply_fn, params, input_shape, regions, replay, deadline, sound=sound,
        progress=progress)
    stats["nodes"] += nodes
    stats["method"] = "generic"
    return done(status, cex, "bab" if status in ("sat", "unsat") else None)

  phase = "bounds"
  with jax.enable_x64(True):
    for region in regions:
      # input splitting bounds all of a region's disjuncts together (shared intermediate bounds)
      split_inputs = region.dim <= input_split_dims
      for disjunct in ((region.disjuncts,) if split_inputs else region.disjuncts):
        if deadline.expired():
          return done("timeout")
        if split_inputs:
          from boundjax.verify import input_bab
          stats["method"] = "input-split"
          bar = _bar(progress, "input split")
          status, cex, nodes = _input_split_portfolio(
              input_bab, lay, region, disjunct, replay, deadline, sound=sound, batch=batch,
              progress=bar, intermediate=intermediate, alpha_steps=alpha_steps)
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
              batch=min(batch, 256), progress=progress, use_milp=milp)
          stats["nodes"] += nodes
          if how != "bounds":
            phase = how
          if status == "sat":
            return done("sat", cex, how)
        if status != "unsat":
          return done(status)
  return done("unsat", phase=phase)


def _input_split_portfolio(input_bab, lay, region, disjunct, replay, deadline: Deadline,
                           sample_seconds: float = 10.0, **kwargs: Any):
  """Input splitting with the parent's bounds met layer by layer and the smear branching for
  the first third of the time left, then, if that timed out, in the "post" mode
  (`layered.crown_batch`) with look-ahead branching (`input_bab`) for the rest.

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
    return Outcome("timeout", None, time.monotonic() - start, {"nodes": 0, "phase": "load"})
  out = verify(model.apply_fn, model.params, model.input_shape, prop, timeout=left, **kwargs)
  return Outcome(out.status, out.counterexample, time.monotonic() - start, out.stats)


def run_instances(rows: Iterable[Any], timeout: float, progress: bool = True,
                  root: str | Path | None = None, **kwargs: Any) -> list[dict[str, Any]]:
  """Runs `verify_instance` on rows ``(onnx, vnnlib[, ...])`` or dicts with ``onnx`` and
  ``vnnlib`` keys (paths relative to ``root`` if given) and returns one dict per row:
  ``onnx, vnnlib, status, seconds, phase, nodes`` (plus ``outcome``). Never reads verdicts.

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
    start = time.monotonic()
    try:
      out = verify_instance(onnx_p, vnn_p, timeout=timeout, **kwargs)
    except Exception as e:  # noqa: BLE001  (reported per row; never a verdict)
      row_out = {"onnx": str(onnx_p), "vnnlib": str(vnn_p), "status": "error",
                 "seconds": time.monotonic() - start, "phase": None, "nodes": None,
                 "error": f"{type(e).__name__}: {e}", "outcome": None}
    else:
      row_out = {"onnx": str(onnx_p), "vnnlib": str(vnn_p), "status": out.status,
                 "seconds": out.seconds, "phase": out.stats.get("phase"),
                 "nodes": out.stats.get("nodes"), "outcome": out}
    results.append(row_out)
    if bar is not None:
      bar.update(1)
      bar.set_postfix_str(f"{Path(str(vnn_p)).name}: {row_out['status']} "
                          f"{row_out['seconds']:.1f}s")
  if bar is not None:
    bar.close()
  return results

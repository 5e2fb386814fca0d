"""A complete verifier for VNNLIB properties of networks (VNN-COMP's contract).

``verify(apply_fn, params, input_shape, prop, timeout=, sound=, key=) -> Outcome`` answers
``sat`` (with a counterexample replayed in float64), ``unsat`` (a proof by sound bounds),
``timeout`` or ``unknown``; ``verify_instance(onnx, vnnlib, timeout=)`` reads the files;
``format_result`` gives the result file's text; ``run_instances`` runs a list.

Modules: `spec` (regions and disjuncts), `outcome` (Outcome, Deadline, result text), `attack`
(PGD falsifier, float64 replay), `bab` (the branch-and-bound skeleton of every search),
`chain` (the dense affine/ReLU chain and its bounds, all from the engine: CROWN, α-β-CROWN
with split constraints, sound floating point), `engine` (whole-property engine bounds),
`input_bab` (input splitting), `relu_bab` (ReLU splitting, MILP fallback), `generic`
(`bj.crown` with input splitting for non-ReLU graphs), `memory` (the memory budget,
``verify(memory=)``: estimates, chunks, `MemoryBudgetError`), `api`.
"""

from boundjax.core.errors import MemoryBudgetError
from boundjax.verify.api import run_instances, verify, verify_instance
from boundjax.verify.outcome import Deadline, Outcome, format_result, parse_result, summary
from boundjax.verify.spec import Disjunct, Region, as_regions

__all__ = ["verify", "verify_instance", "run_instances", "Outcome", "Deadline", "format_result",
           "parse_result", "summary", "Region", "Disjunct", "as_regions", "MemoryBudgetError"]

"""The complete verifier's memory budget (`verify(memory=)`, `boundjax verify --memory`).

**What the budget bounds.** The JAX/XLA buffers of the verifier's bound calls, estimated from
the network's widths before anything is allocated or compiled: arguments, results and the
backward states of one call. It does not cover the Python process's baseline (the interpreter,
JAX and XLA's runtime, compiled programs: a few hundred MB), XLA's compiler, the attack's PGD
batches, or the search's frontier of open sub-problems held in NumPy between calls (capped on its own:
`frontier_bytes`). The frontier
is capped apart (`frontier_bytes`). It is an estimate, not an allocator limit: XLA's fusion temporaries are covered only by the factor 3 the
engine allows per backward state.

**Split** (`shares`): of a total ``memory`` (default 4 GiB), a quarter goes to the engine's
bounds of whole boxes and of the generic path (``memory_bytes``: `bj.crown` chunks its batch so
that three copies of one chunk's backward state fit, and raises `MemoryBudgetError` when one
example alone does not), half to the dense float64 chain (``dense_memory_bytes``: the dense path
runs only if its estimate fits, ReLU splitting's batch and input splitting's chunk are chosen
to fit it). The rest is headroom for what the estimates miss.

**No overlap.** The shares add up only if the stages that use them do not run at once. A bound
that outlives its time budget cannot be interrupted (a compilation, a jitted α-CROWN loop) and
keeps its buffers while it finishes in the background: `engine.prove_with_engine` returns it
(``pending``) and starts no other mode beside it, the verifier waits for it before branch and
bound allocates its share (`api._after`), and `api.run_instances` waits for what an instance
left running before starting the next (`api.settle`, until it ends by default; a wait capped
at the time limit let OVAL21 instances start beside the previous one's work, and the batch's
peak resident memory reached 5.12 GB against the 4 GiB budget).

**Input splitting's chunk** (`split_chunk`): a call of the dense chain's bound on ``c`` boxes
(``R`` specification rows, widths ``n_0, ..., n_L``, ``H = Σ_{0<k<L} n_k``) is estimated at

    8 · [2 (Σ_k n_k n_{k-1} + Σ_{k>0} n_k + R (n_L + 1))            weights, biases, C, d (and |W|)
         + c (6 S + 2 n_0 + 4 H + R (n_0 + 1) + 1 + α (6 S + 4 R H))]  per box

bytes, ``S = max(max_{0<k<L} n_k max_{j<k} n_j, R max_{j<=L} n_j)`` the largest backward state
of one box (coefficients of one target layer on one earlier layer), counted for both bounds and
three times like the engine's own allowance (``6 S``); the per-box arrays are the box, the known
intermediate bounds in and out, the bounds and the input coefficients. α-CROWN (``α = 1``) adds
a second copy of the state for the gradient and α with Adam's moments. The chunk is the largest
power of two up to `chain.CHUNK` (64) whose estimate fits: a few compiled shapes at most.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

from boundjax.core.errors import MemoryBudgetError

DEFAULT = 4 << 30
"""The default budget, 4 GiB."""

ENGINE_SHARE = 0.25
DENSE_SHARE = 0.5
FRONTIER_SHARE = 0.125

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(?:i?b)?\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
  """Bytes of a size such as ``"4G"``, ``"512M"``, ``"2.5GB"``, ``"1GiB"`` or ``"1048576"``
  (units K, M, G, T are powers of 1024, an optional ``B``/``iB`` after them; case ignored).
  Raises `ValueError` naming the text when it is not a positive size."""
  m = _SIZE.fullmatch(str(text))
  if m is None:
    raise ValueError(f"invalid size {text!r}: expected a number of bytes with an optional unit "
                     "K, M, G or T (e.g. 4G, 512M, 2.5GB)")
  size = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
  if size <= 0:
    raise ValueError(f"invalid size {text!r}: must be at least one byte")
  return size


def format_size(n: int) -> str:
  """``n`` bytes for a message: ``"1.50 GiB (1610612736 bytes)"``."""
  for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
    if n >= scale:
      return f"{n / scale:.2f} {unit} ({n} bytes)"
  return f"{n} bytes"


def shares(memory: int, memory_bytes: int | None = None,
           dense_memory_bytes: int | None = None) -> tuple[int, int]:
  """``(engine bytes, dense bytes)`` of a total ``memory`` (module docstring); an explicit
  ``memory_bytes`` or ``dense_memory_bytes`` overrides its share."""
  if not isinstance(memory, int) or isinstance(memory, bool) or memory <= 0:
    raise ValueError(f"verify: memory must be a positive number of bytes, got {memory!r}")
  engine = int(memory * ENGINE_SHARE) if memory_bytes is None else memory_bytes
  dense = int(memory * DENSE_SHARE) if dense_memory_bytes is None else dense_memory_bytes
  return max(engine, 1), dense


def frontier_bytes(memory: int) -> int:
  """The bytes a branch-and-bound frontier may hold between bound calls (NumPy arrays of its
  open sub-problems: boxes, split signs, α and β), an eighth of ``memory``, out of the headroom
  the two shares leave. A search whose frontier grows past it stops with the verdict
  ``"unknown"`` (`boundjax.verify.bab.FRONTIER_LIMIT`) instead of growing without bound: a
  ReLU-split node of a CIFAR CNN holds α of every unstable neuron for every row (hundreds of kB),
  and 10⁵ open boxes of an MNIST input hold 1.25 GB in float64."""
  return max(int(memory * FRONTIER_SHARE), 1)


def against_total(error: MemoryBudgetError, total: int) -> MemoryBudgetError:
  """``error``, raised against one share of the verifier's budget, restated against the whole
  budget ``total``: ``needed`` becomes the total whose share would fit (``needed · total /
  share``, rounded up), named in the message with the budget."""
  if error.budget <= 0:
    return error
  need = -(-error.needed * total // error.budget)
  return MemoryBudgetError(
      f"{error} [the memory budget is {format_size(total)}, this bound's share "
      f"{format_size(error.budget)}: a budget of at least {format_size(need)} "
      f"(--memory / memory=) fits it]", need, total)


def _state(widths: Sequence[int], rows: int) -> int:
  """``S``: the largest backward state of one box, in numbers (module docstring)."""
  hidden = [n * max(widths[:k]) for k, n in enumerate(widths[1:-1], start=1)]
  return max(hidden + [rows * max(widths)])


def chain_fixed_bytes(widths: Sequence[int], rows: int) -> int:
  """The per-call part of the dense chain bound's estimate: weights, biases, ``C``, ``d`` and
  a copy of each (``|W|``), float64."""
  pairs = sum(a * b for a, b in zip(widths[:-1], widths[1:]))
  return 8 * 2 * (pairs + sum(widths[1:]) + rows * (widths[-1] + 1))


def chain_box_bytes(widths: Sequence[int], rows: int, alpha: bool = False) -> int:
  """The per-box part of the dense chain bound's estimate (module docstring), float64."""
  n0, hidden = widths[0], sum(widths[1:-1])
  state = _state(widths, rows)
  per = 6 * state + 2 * n0 + 4 * hidden + rows * (n0 + 1) + 1
  if alpha:
    per += 6 * state + 4 * rows * hidden
  return 8 * per


def fit_chunk(fixed: int, per_item: int, budget: int, cap: int, what: str = "sub-problem"
              ) -> int:
  """The largest power of two ``c <= cap`` with ``fixed + c * per_item <= budget``; raises
  `MemoryBudgetError` naming the size one item needs when even ``c = 1`` does not fit."""
  if fixed + per_item > budget:
    need = fixed + per_item
    raise MemoryBudgetError(f"one {what} needs about {format_size(need)}, more than its memory "
                            f"budget of {format_size(budget)}", need, budget)
  c = 1 << int(math.log2(max(cap, 1)))
  while c > 1 and fixed + c * per_item > budget:
    c //= 2
  return c


def split_chunk(widths: Sequence[int], rows: int, budget: int, cap: int = 64,
                alpha: bool = False) -> int:
  """Input splitting's boxes per call of the dense chain's bound within ``budget`` bytes
  (`fit_chunk` on `chain_fixed_bytes` and `chain_box_bytes`)."""
  return fit_chunk(chain_fixed_bytes(widths, rows), chain_box_bytes(widths, rows, alpha),
                   budget, cap, what="box of input splitting")


def reset_peak_rss() -> bool:
  """Resets the process's peak resident memory (Linux: ``5`` into ``/proc/self/clear_refs``),
  so that `peak_rss` measures from now; False where that is not possible."""
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
    return True
  except OSError:
    return False


def peak_rss() -> int | None:
  """The process's peak resident memory in bytes since the start or the last `reset_peak_rss`
  (Linux ``VmHWM``); None where it cannot be read."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None

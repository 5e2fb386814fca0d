"""The one branch-and-bound skeleton under every search of the project.

Input splitting (`boundjax.verify.input_bab`, `boundjax.verify.generic`) and LUCID's iDP-DB
(LUCID, §4 and §5.3)
search over hyper-networks (`milp.idpdb.search`) are the same loop (Land & Doig 1960; the
"generic BaB" of Bunel et al. 2020, "Branch and bound for piecewise linear neural network
verification", §3, Alg. 1):

    bound the root; push it unless it is closed
    while the frontier is not empty:
      pop the ``pop`` nodes that come first (the worst bound, or the newest: depth first)
      branch them into children                       (None: a leaf, stop)
      bound the children, ``batch`` at a time         (deadline checked before each batch)
      a closed child is dropped, a counterexample stops the search, the rest is pushed
      stop when the frontier is over ``max_frontier`` nodes or ``max_bytes`` bytes
    the frontier ran empty: every sub-problem was closed (proved)

What each search supplies:

- a **node** type and its **batch**: a Python ``list`` of nodes (one item per node), or a
  *column batch*, a numpy array or a ``dict``/``tuple`` nesting of numpy arrays that share the
  leading axis (one row per node; input boxes are bounded thousands at a time and a row costs
  no Python object);
- ``bound(children) -> Bounded``: bounds a batch (at most ``batch`` nodes) and returns the
  bounded nodes with what branching needs, their priorities, which are closed (proven), and a
  counterexample if one was found. A ``bound`` that runs out of time inside (a compilation
  that outlives the deadline) raises `OutOfTime`;
- ``branch(nodes) -> children``: the children of a popped batch, or a `Bounded` when their
  bounds are already known (e.g. inherited from the parent: no bounding call), or `Parts` of
  both (pushed or bounded in order), or ``None`` when the nodes cannot be split (a
  *leaf*: in best-first order its bound is the optimum of an optimisation);
- a **frontier**: `Heap` (the smallest priority first, first-in first-out among equals: "worst
  bound first" with ``priority = lower bound``) or `Stack` (the newest first: depth first, the
  frontier stays small).

The skeleton knows nothing of networks, boxes or solvers; it counts, checks the deadline and the
memory budget, and reports why it stopped (`SearchOutcome.reason`, one of `REASONS`).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import time
from typing import Any, Callable, Generic, Protocol, Sequence, TypeVar, Union

import numpy as np

B = TypeVar("B")  # a batch of nodes: a list, or a column batch (arrays with a leading node axis)

PROVED = "proved"                  # the frontier ran empty: every sub-problem was closed
COUNTEREXAMPLE = "counterexample"  # `bound` reported a counterexample
DEADLINE = "deadline"              # the deadline came before a bounding call (or inside one)
FRONTIER_LIMIT = "frontier_limit"  # the frontier grew past ``max_frontier`` or ``max_bytes``
LEAF = "leaf"                      # `branch` could not split the popped nodes
REASONS = (PROVED, COUNTEREXAMPLE, DEADLINE, FRONTIER_LIMIT, LEAF)
# a verification's answer (`boundjax.verify.outcome.STATUSES`) for each reason; "unknown" else
VERDICTS = {PROVED: "unsat", COUNTEREXAMPLE: "sat", DEADLINE: "timeout"}


class OutOfTime(Exception):
  """Raised by ``bound`` or ``branch`` when the time ran out inside it: the search stops with
  reason `DEADLINE` (the batch being bounded counts as pending)."""


class TimeLeft(Protocol):
  """Anything with ``remaining() -> seconds`` (`boundjax.verify.outcome.Deadline`)."""

  def remaining(self) -> float:
    ...


# ------------------------------------------------------------------------------------------------
# Batches: a list of nodes, or a column batch (arrays sharing the leading axis)
# ------------------------------------------------------------------------------------------------

def _leaves(batch: Any) -> list[np.ndarray]:
  if isinstance(batch, dict):
    return [leaf for v in batch.values() for leaf in _leaves(v)]
  if isinstance(batch, tuple):
    return [leaf for v in batch for leaf in _leaves(v)]
  return [batch]


def _map(fn: Callable[[np.ndarray], np.ndarray], batch: Any) -> Any:
  if isinstance(batch, dict):
    return {k: _map(fn, v) for k, v in batch.items()}
  if isinstance(batch, tuple):
    return tuple(_map(fn, v) for v in batch)
  return fn(batch)


def size(batch: Any) -> int:
  """The number of nodes of a batch."""
  if isinstance(batch, list):
    return len(batch)
  return int(_leaves(batch)[0].shape[0])


def take(batch: B, index: Any) -> B:
  """The nodes ``index`` (integers or a boolean mask) of a batch, in that order."""
  if isinstance(batch, list):
    if isinstance(index, slice):
      return batch[index]
    return [batch[int(i)] for i in np.arange(len(batch))[np.asarray(index)]]
  return _map(lambda a: a[index], batch)


def concat(batches: Sequence[B]) -> B:
  """One batch of the nodes of ``batches`` (not empty), in order."""
  if isinstance(batches[0], list):
    return [node for b in batches for node in b]
  if len(batches) == 1:
    return batches[0]
  first = batches[0]
  leaves = [_leaves(b) for b in batches]
  joined = iter([np.concatenate([lv[k] for lv in leaves]) for k in range(len(leaves[0]))])
  return _map(lambda _: next(joined), first)


def nbytes(batch: Any) -> int:
  """Bytes of the numpy arrays of a batch (nested in lists, tuples and dicts); other Python
  objects count 0 (a frontier of them is capped by ``max_frontier`` only)."""
  if isinstance(batch, np.ndarray):
    return int(batch.nbytes)
  if isinstance(batch, dict):
    return sum(nbytes(v) for v in batch.values())
  if isinstance(batch, (list, tuple)):
    return sum(nbytes(v) for v in batch)
  return 0


# ------------------------------------------------------------------------------------------------
# Frontiers
# ------------------------------------------------------------------------------------------------

class Stack:
  """Last in, first out (depth first): ``pop(k)`` returns the ``k`` newest nodes in the order
  they were pushed. Priorities are ignored. Blocks are kept as pushed, and a pop cuts only the
  blocks it takes from (no copy of the whole frontier)."""

  def __init__(self):
    self._blocks: list[Any] = []
    self._size = 0
    self._bytes = 0

  def __len__(self) -> int:
    return self._size

  def nbytes(self) -> int:
    return self._bytes

  def push(self, nodes: Any, priority: np.ndarray | None = None) -> None:
    n = size(nodes)
    if n:
      self._blocks.append(nodes)
      self._size += n
      self._bytes += nbytes(nodes)

  def pop(self, k: int) -> Any:
    parts = []
    while k > 0 and self._blocks:
      block = self._blocks.pop()
      n = size(block)
      self._bytes -= nbytes(block)
      if n > k:  # cut the block: its head stays
        head, block = take(block, slice(0, n - k)), take(block, slice(n - k, n))
        self._blocks.append(head)
        self._bytes += nbytes(head)
        n = k
      parts.append(block)
      self._size -= n
      k -= n
    return concat(parts[::-1])

  def items(self) -> list[tuple[float, Any]]:
    """``(nan, block)`` for every block (newest last): what is left after a stop."""
    return [(float("nan"), b) for b in self._blocks]


class Heap:
  """The smallest priority first; nodes of equal priority in the order they were pushed
  (a binary heap, `heapq`). ``priority = lower bound`` pops the worst bound first (the
  best-first search of verification, Bunel et al. 2020, §3), ``priority = -upper bound`` the
  largest upper bound first (LUCID's max-priority queue, Alg. 1)."""

  def __init__(self):
    self._heap: list[tuple[float, int, Any]] = []
    self._tie = itertools.count()
    self._bytes = 0

  def __len__(self) -> int:
    return len(self._heap)

  def nbytes(self) -> int:
    return self._bytes

  def push(self, nodes: Any, priority: np.ndarray | None = None) -> None:
    n = size(nodes)
    if n and priority is None:
      raise ValueError("Heap.push: a priority per node is needed.")
    for i in range(n):
      node = take(nodes, [i])  # a batch of one node
      self._bytes += nbytes(node)
      heapq.heappush(self._heap, (float(priority[i]), next(self._tie), node))

  def pop(self, k: int) -> Any:
    parts = []
    for _ in range(min(k, len(self._heap))):
      _, _, node = heapq.heappop(self._heap)
      self._bytes -= nbytes(node)
      parts.append(node)
    return concat(parts) if parts else []

  def peek(self) -> float:
    """The smallest priority (``inf`` when empty)."""
    return self._heap[0][0] if self._heap else float("inf")

  def items(self) -> list[tuple[float, Any]]:
    """``(priority, one-node batch)`` of every node left, in no particular order."""
    return [(p, node) for p, _, node in self._heap]


Frontier = Union[Stack, Heap]


# ------------------------------------------------------------------------------------------------
# The search
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Bounded(Generic[B]):
  """What ``bound`` returns for a batch of ``n`` nodes.

  Attributes:
    nodes: the bounded nodes (``n`` of them), carrying what ``branch`` needs (their bounds,
      branching scores, ...); ``bound`` may leave the closed ones out itself (then
      ``closed=None``).
    priority: ``(n,)`` floats, smaller pops first from a `Heap` (None for a `Stack`).
    closed: ``(n,)`` bools, True where the node is settled (proven) and is not pushed; None:
      none is.
    counterexample: anything but None stops the search with reason `COUNTEREXAMPLE`.
  """

  nodes: Any
  priority: np.ndarray | None = None
  closed: np.ndarray | None = None
  counterexample: Any = None


@dataclasses.dataclass(frozen=True)
class SearchOutcome:
  """Why and where a search stopped.

  Attributes:
    reason: one of `REASONS`.
    counterexample: what ``bound`` reported (reason `COUNTEREXAMPLE`), else None.
    frontier: the frontier at the stop (`Stack` or `Heap`; ``.items()`` lists what is left).
    pending: the children not handled when the deadline came (batches, or `Bounded` parts
      that were still to be pushed), in order.
    popped: the last batch popped (the leaf for reason `LEAF`), None before the first pop.
    bounded: nodes bounded (given to ``bound``); batches: calls of ``bound``; pops: calls of
      ``branch``; largest: the largest frontier seen (nodes); seconds: wall-clock time.
  """

  reason: str
  counterexample: Any
  frontier: Any
  pending: list[Any]
  popped: Any
  bounded: int
  batches: int
  pops: int
  largest: int
  seconds: float


@dataclasses.dataclass(frozen=True)
class Parts:
  """Children in several parts, handled in order: each a batch to bound or a `Bounded` to push
  as it is (e.g. a child whose bound is inherited, next to children that need a bound)."""

  items: tuple[Any, ...]

  def __init__(self, *items: Any):
    object.__setattr__(self, "items", items)


def search(root: Any, bound: Callable[[Any], Bounded], branch: Callable[[Any], Any], *,
           frontier: Frontier | None = None, batch: int = 1, pop: int = 1,
           deadline: TimeLeft | None = None, max_frontier: int | None = None,
           max_bytes: int | None = None) -> SearchOutcome:
  """Branch and bound from ``root`` (a batch, or a `Bounded` whose bounds are known).

  Args:
    root: the root node(s), as a batch to bound, or as a `Bounded` (pushed as is).
    bound: ``bound(batch) -> Bounded`` on at most ``batch`` nodes at a time.
    branch: ``branch(popped) -> children`` (a batch, a `Bounded`, or `Parts` of both, handled
      in order) or ``None`` for a leaf (stop with reason `LEAF`).
    frontier: `Heap()` (default) or `Stack()`.
    batch: the most nodes per ``bound`` call (children are cut into batches of this size).
    pop: nodes popped (and branched) together.
    deadline: ``remaining()`` is checked before every ``bound`` call; at ``<= 0`` the search
      stops with reason `DEADLINE` (``pending`` holds the children not bounded).
    max_frontier, max_bytes: after each round of pushes, a frontier holding more nodes (or
      more bytes of arrays, `nbytes`) stops the search with reason `FRONTIER_LIMIT`.

  Returns:
    `SearchOutcome`.
  """
  if batch < 1 or pop < 1:
    raise ValueError(f"search: batch and pop must be >= 1, got {batch} and {pop}.")
  t0 = time.monotonic()
  front = Heap() if frontier is None else frontier
  counts = {"bounded": 0, "batches": 0, "pops": 0, "largest": 0}
  popped = None

  def stop(reason: str, cex: Any = None, pending: Sequence[Any] = ()) -> SearchOutcome:
    return SearchOutcome(reason, cex, front, list(pending), popped, counts["bounded"],
                         counts["batches"], counts["pops"], counts["largest"],
                         time.monotonic() - t0)

  todo = _parts(root)
  while True:
    # bound the children, `batch` at a time; known bounds are pushed as they are
    for j, part in enumerate(todo):
      if isinstance(part, Bounded):
        if part.counterexample is not None:
          return stop(COUNTEREXAMPLE, part.counterexample)
        _push(front, part)
        continue
      n = size(part)
      for s in range(0, n, batch):
        chunk = part if n <= batch else take(part, slice(s, min(s + batch, n)))
        if deadline is not None and deadline.remaining() <= 0:
          return stop(DEADLINE, pending=_rest(todo, j, s))
        try:
          res = bound(chunk)
        except OutOfTime:
          return stop(DEADLINE, pending=_rest(todo, j, s))
        counts["bounded"] += size(chunk)
        counts["batches"] += 1
        if res.counterexample is not None:
          return stop(COUNTEREXAMPLE, res.counterexample)
        _push(front, res)
    counts["largest"] = max(counts["largest"], len(front))
    if not len(front):
      return stop(PROVED)
    if ((max_frontier is not None and len(front) > max_frontier)
        or (max_bytes is not None and front.nbytes() > max_bytes)):
      return stop(FRONTIER_LIMIT)
    popped = front.pop(pop)
    counts["pops"] += 1
    try:
      children = branch(popped)
    except OutOfTime:
      return stop(DEADLINE)
    if children is None:
      return stop(LEAF)
    todo = _parts(children)


def _rest(todo: list[Any], j: int, s: int) -> list[Any]:
  """The parts not handled: part ``j`` from its node ``s`` on, and every later part."""
  part = todo[j]
  return [take(part, slice(s, size(part))) if s else part] + list(todo[j + 1:])


def _parts(children: Any) -> list[Any]:
  """``branch``'s (or the root's) children as a list of parts."""
  return list(children.items) if isinstance(children, Parts) else [children]


def _push(front: Frontier, res: Bounded) -> None:
  """Pushes the nodes of ``res`` that are not closed."""
  nodes, priority = res.nodes, res.priority
  if res.closed is not None:
    keep = ~np.asarray(res.closed, bool)
    if not np.all(keep):
      nodes = take(nodes, keep)
      priority = None if priority is None else np.asarray(priority)[keep]
  front.push(nodes, priority)

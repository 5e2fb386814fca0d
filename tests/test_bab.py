"""The branch-and-bound skeleton (`boundjax.verify.bab`) on toy problems with known answers.

The toy: ``f(x) = x^2 - x`` on ``[-2, 3]``, whose minimum is ``-1/4`` at ``x = 1/2``. A node is an
interval ``[a, b]``; its bound is the natural interval extension ``min(x^2) - b`` (sound, and
exact in the limit of small intervals), and it is split at its midpoint.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from boundjax.verify import bab

LO, HI, F_MIN, X_MIN = -2.0, 3.0, -0.25, 0.5


def f(x):
  return x * x - x


def lower(a, b):
  """A sound lower bound of ``f`` on ``[a, b]`` (arrays): ``min x^2 - max x``."""
  sq = np.where((a <= 0) & (b >= 0), 0.0, np.minimum(a * a, b * b))
  return sq - b


def halves(a, b):
  mid = (a + b) / 2
  return np.concatenate([a, mid]), np.concatenate([mid, b])


def prove_above(threshold, *, frontier, batch=8, pop=4, falsify=True, **kw):
  """Is ``f > threshold`` on ``[LO, HI]``? Column batches ``{"a", "b"}``; a box closes when its
  bound is above the threshold, and its midpoint at or below is a counterexample (if
  ``falsify``)."""
  calls = []

  def bound(nodes):
    a, b = nodes["a"], nodes["b"]
    calls.append(len(a))
    low = lower(a, b)
    mid = (a + b) / 2
    bad = np.flatnonzero(f(mid) <= threshold) if falsify else np.array([], int)
    return bab.Bounded(nodes, low, low > threshold, float(mid[bad[0]]) if bad.size else None)

  def branch(nodes):
    a, b = halves(nodes["a"], nodes["b"])
    return {"a": a, "b": b}

  root = {"a": np.array([LO]), "b": np.array([HI])}
  out = bab.search(root, bound, branch, frontier=frontier, batch=batch, pop=pop, **kw)
  return out, calls


@pytest.mark.parametrize("make", [bab.Stack, bab.Heap])
def test_proves_a_true_bound_and_finds_a_counterexample(make):
  out, calls = prove_above(F_MIN - 1e-3, frontier=make())
  assert out.reason == bab.PROVED and out.counterexample is None
  assert out.bounded == sum(calls) > 1 and max(calls) <= 8
  assert len(out.frontier) == 0
  out, calls = prove_above(F_MIN + 1e-3, frontier=make())
  assert out.reason == bab.COUNTEREXAMPLE
  assert f(out.counterexample) <= F_MIN + 1e-3
  assert out.bounded == sum(calls)  # nothing was bounded after the counterexample


def test_best_first_minimum_is_the_analytic_one():
  """Best-first optimisation: the popped node has the smallest lower bound; a node narrower
  than ``tol`` is a leaf, so the search stops with reason LEAF and the leaf's bound is within
  the bound's error (``O(width)``) below the exact minimum, never above it."""
  tol = 1e-6

  def bound(nodes):
    return bab.Bounded(nodes, np.array([lower(a, b) for a, b in nodes]))

  def branch(nodes):
    (a, b), = nodes
    if b - a < tol:
      return None
    m = (a + b) / 2
    return [(a, m), (m, b)]

  out = bab.search([(LO, HI)], bound, branch, frontier=bab.Heap(), batch=2)
  assert out.reason == bab.LEAF
  (a, b), = out.popped
  assert a <= X_MIN <= b
  best = lower(np.array(a), np.array(b))
  assert F_MIN - 4 * tol <= best <= F_MIN
  # every node left has a bound at least the leaf's: it was popped first
  assert all(p >= best for p, _ in out.frontier.items())


def test_deadline_is_kept_within_one_bound_call():
  """A problem that never closes (the minimum itself as threshold), 20 ms per bound call and a
  0.3 s deadline: the search stops on the deadline, one call late at most, and says what it
  did not bound."""

  class After:
    def __init__(self, seconds):
      self.end = time.monotonic() + seconds

    def remaining(self):
      return self.end - time.monotonic()

  calls = []

  def bound(nodes):
    calls.append(1)
    time.sleep(0.02)
    a, b = nodes["a"], nodes["b"]
    low = lower(a, b)
    return bab.Bounded(nodes, low, low > F_MIN)

  def branch(nodes):
    a, b = halves(nodes["a"], nodes["b"])
    return {"a": a, "b": b}

  t0 = time.monotonic()
  out = bab.search({"a": np.array([LO]), "b": np.array([HI])}, bound, branch,
                   frontier=bab.Heap(), batch=2, pop=1, deadline=After(0.3))
  took = time.monotonic() - t0
  assert out.reason == bab.DEADLINE
  assert 0.3 <= took <= 0.3 + 0.1, took
  assert out.pending and sum(bab.size(p) for p in out.pending) >= 1
  assert out.batches == len(calls) >= 5


def test_out_of_time_inside_bound_is_a_deadline():
  def bound(nodes):
    raise bab.OutOfTime

  out = bab.search([1], bound, lambda n: n)
  assert out.reason == bab.DEADLINE and out.pending == [[1]] and out.bounded == 0


@pytest.mark.parametrize("make", [bab.Stack, bab.Heap])
def test_frontier_limits_stop_with_their_reason(make):
  # never closes: threshold = the minimum, no counterexample search; a max_frontier of 10 nodes
  out, _ = prove_above(F_MIN, frontier=make(), falsify=False, max_frontier=10)
  assert out.reason == bab.FRONTIER_LIMIT and 10 < len(out.frontier) <= 10 + 8
  # the byte budget: two float64 columns, 16 bytes a node
  out, _ = prove_above(F_MIN, frontier=make(), falsify=False, max_bytes=16 * 40)
  assert out.reason == bab.FRONTIER_LIMIT and 16 * 40 < out.frontier.nbytes() <= 16 * 48
  assert out.frontier.nbytes() == 16 * len(out.frontier)


def test_stack_is_last_in_first_out_and_heap_first_in_first_out_among_ties():
  st = bab.Stack()
  st.push({"x": np.arange(5)})
  st.push({"x": np.arange(5, 8)})
  assert list(st.pop(4)["x"]) == [4, 5, 6, 7]  # the newest 4, in pushed order
  assert len(st) == 4 and st.nbytes() == 4 * 8
  assert list(st.pop(10)["x"]) == [0, 1, 2, 3] and len(st) == 0
  hp = bab.Heap()
  hp.push(["a", "b", "c"], np.array([1.0, 0.0, 1.0]))
  hp.push(["d"], np.array([0.0]))
  assert hp.pop(3) == ["b", "d", "a"] and hp.pop(5) == ["c"]
  with pytest.raises(ValueError, match="priority"):
    hp.push(["e"])


def test_known_bounds_skip_the_bounding_function():
  """`Parts`: a child with a known bound is pushed as is (no bound call) before the others are
  bounded, in order."""
  seen = []

  def bound(nodes):
    seen.extend(nodes)
    return bab.Bounded(nodes, np.zeros(len(nodes)), np.ones(len(nodes), bool))

  def branch(nodes):
    if nodes == ["root"]:
      return bab.Parts(bab.Bounded(["inherited"], np.array([5.0])), ["x", "y", "z"])
    return None

  out = bab.search(bab.Bounded(["root"], np.array([0.0])), bound, branch, batch=2)
  assert seen == ["x", "y", "z"] and out.batches == 2  # batches of at most 2
  assert out.reason == bab.LEAF and out.popped == ["inherited"]


def test_bad_arguments_are_refused():
  with pytest.raises(ValueError, match="batch"):
    bab.search([0], lambda n: bab.Bounded(n), lambda n: None, batch=0)


def test_verdicts_of_the_reasons():
  assert [bab.VERDICTS.get(r, "unknown") for r in bab.REASONS] == [
      "unsat", "sat", "timeout", "unknown", "unknown"]

"""The verifier's answer (`Outcome`), its deadline (`Deadline`) and the competition's result text.

VNN-COMP result files: the first line is ``sat``, ``unsat``, ``timeout`` or ``unknown``; after
``sat`` comes the counterexample, one ``(X_i value)`` / ``(Y_j value)`` per line inside one pair
of parentheses, values printed with full float64 precision (``repr``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

STATUSES = ("sat", "unsat", "timeout", "unknown")


@dataclasses.dataclass(frozen=True)
class Outcome:
  """A verification answer.

  Attributes:
    status: ``"sat"`` (a replayed counterexample), ``"unsat"`` (a proof by sound bounds),
      ``"timeout"`` or ``"unknown"``.
    counterexample: ``(x, y)`` float64 (flattened input, outputs of the float64 replay) for
      ``sat``, else None.
    seconds: wall-clock time used.
    stats: ``nodes`` (bounded sub-problems), ``phase`` (what decided: ``"attack"``,
      ``"bounds"``, ``"bab"``, ``"milp"``), and method details.
  """

  status: str
  counterexample: tuple[np.ndarray, np.ndarray] | None = None
  seconds: float = 0.0
  stats: dict[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if self.status not in STATUSES:
      raise ValueError(f"Outcome: status must be one of {STATUSES}, got {self.status!r}.")
    if (self.status == "sat") != (self.counterexample is not None):
      raise ValueError("Outcome: a counterexample goes with status 'sat' and only with it.")


class Deadline:
  """A wall-clock deadline ``start + seconds`` (``time.monotonic``)."""

  def __init__(self, seconds: float, start: float | None = None):
    self.start = time.monotonic() if start is None else start
    self.end = self.start + float(seconds)

  def remaining(self) -> float:
    return self.end - time.monotonic()

  def expired(self) -> bool:
    return self.remaining() <= 0.0

  def elapsed(self) -> float:
    return time.monotonic() - self.start


def format_result(outcome: Outcome) -> str:
  """The result file text: ``sat`` and ``((X_0 v)\\n (X_1 v) ... (Y_0 v) ...)``, or one word."""
  if outcome.status != "sat":
    return outcome.status + "\n"
  x, y = outcome.counterexample
  lines = [f"(X_{i} {float(v)!r})" for i, v in enumerate(np.asarray(x).reshape(-1))]
  lines += [f"(Y_{j} {float(v)!r})" for j, v in enumerate(np.asarray(y).reshape(-1))]
  return "sat\n(" + "\n ".join(lines) + ")\n"


def parse_result(text: str) -> tuple[str, np.ndarray | None, np.ndarray | None]:
  """Inverse of `format_result`: ``(status, x, y)`` (x, y None unless sat)."""
  import re
  lines = text.strip().splitlines()
  status = lines[0].strip() if lines else ""
  if status != "sat":
    return status, None, None
  pairs = re.findall(r"\(\s*([XY])_(\d+)\s+([^\s()]+)\s*\)", text)
  xs = {int(i): float(v) for k, i, v in pairs if k == "X"}
  ys = {int(i): float(v) for k, i, v in pairs if k == "Y"}
  x = np.array([xs[i] for i in range(len(xs))])
  y = np.array([ys[i] for i in range(len(ys))])
  return status, x, y

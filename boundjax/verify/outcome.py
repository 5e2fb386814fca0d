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


# what each stage of `boundjax.verify.verify` is, for a reader (`summary`)
STAGES = {
    "start": "checking the property",
    "load": "loading the network and the property",
    "attack": "attack (sampling and PGD)",
    "crown": "CROWN on the whole property",
    "crown-ibp": "CROWN-IBP on the whole property",
    "alpha-crown": "α-CROWN on the whole property",
    "extract": "extracting the affine/ReLU chain",
    "root": "α-CROWN at the root of ReLU splitting",
    "relu-split": "branch and bound (ReLU splitting, β-CROWN)",
    "refine": "refining intermediate bounds by MILP",
    "input-split": "branch and bound (input splitting)",
    "generic": "branch and bound (input splitting on the engine)",
    "milp": "MILP",
}


class Progress:
  """What a verification has reached, kept up to date by its stages (worker threads): the
  current ``stage`` (a key of `STAGES`), the branch-and-bound ``nodes`` bounded so far, and the
  best certified lower bound of every disjunct's margin (the largest row lower bound of
  ``C y - d``, proven when > 0). Read by `boundjax.verify.verify` when its deadline comes."""

  def __init__(self, disjuncts: Any = ()):
    self.stage = "start"
    self.nodes = 0
    self._lows: dict[int, float] = {id(dj): -np.inf for dj in disjuncts}

  def bound(self, disjunct: Any, low: float) -> None:
    """Records a certified lower bound ``low`` of ``disjunct``'s margin (the best is kept)."""
    key = id(disjunct)
    self._lows[key] = max(self._lows.get(key, -np.inf), float(low))

  def margin(self) -> float | None:
    """The property's certified margin so far: the smallest disjunct's best lower bound; None
    when some disjunct has no bound yet."""
    if not self._lows:
      return None
    low = min(self._lows.values())
    return None if not np.isfinite(low) and low < 0 else low


def _values(v: np.ndarray, limit: int) -> str:
  """``[v_0, v_1, ...]`` with at most ``limit`` values (the first ``limit - 2`` and the last
  two, ``...`` between) in 6 significant digits."""
  v = np.asarray(v, np.float64).reshape(-1)
  fmt = lambda a: ", ".join(f"{float(x):.6g}" for x in a)
  if v.size <= limit:
    return f"[{fmt(v)}]"
  return f"[{fmt(v[:limit - 2])}, ..., {fmt(v[-2:])}]"


def _how_proved(stats: dict[str, Any]) -> str:
  """The method that proved an ``unsat`` outcome, from its ``stats``."""
  stage, nodes = stats.get("stage"), int(stats.get("nodes") or 0)
  if stage in ("crown", "crown-ibp", "alpha-crown"):
    return {"crown": "CROWN", "crown-ibp": "CROWN-IBP", "alpha-crown": "α-CROWN"}[stage] + \
        " on the whole property (0 branch-and-bound nodes)"
  if stage == "root":
    return "α-CROWN at the root of ReLU splitting (0 branch-and-bound nodes)"
  if stage == "milp":
    return f"MILP (after {_plural(nodes, 'branch-and-bound node')})"
  if stage == "input-split" and nodes <= 1:
    return "CROWN on the whole input box (input splitting's root, 1 box)"
  what = {"relu-split": "ReLU splitting, β-CROWN", "input-split": "input splitting",
          "generic": "input splitting on the engine"}.get(stage, str(stage))
  return f"branch and bound ({what}) with {_plural(nodes, 'node')}"


def _plural(n: int, word: str) -> str:
  return f"{n:,} {word}" + ("" if n == 1 else "s")


def summary(outcome: Outcome, limit: float | None = None, values: int = 10,
            out_path: str | None = None) -> str:
  """A readable account of ``outcome`` for the ``boundjax verify`` command: the answer, the
  time and the limit, and

  - ``unsat``: the method that proved it (CROWN, α-CROWN, branch and bound with its node
    count, MILP) and the certified margin when known;
  - ``sat``: how the counterexample was found, that it was replayed on the network (float64),
    and its input and output values (at most ``values`` of each, with ``out_path`` named as
    holding them all);
  - ``timeout``/``unknown``: the branch-and-bound nodes, the best certified lower bound on the
    property's margin (``C y - d``; the property holds where it is > 0) and the stage reached.

  Returns the text (several lines for ``sat``)."""
  st = outcome.stats or {}
  head = f"{outcome.status} after {outcome.seconds:.1f} s"
  if limit is not None:
    head += f" (limit {limit:g} s)"
  margin = st.get("margin")
  if outcome.status == "unsat":
    text = f"{head}: proved by {_how_proved(st)}"
    if margin is not None and np.isfinite(margin):
      text += f", certified margin {margin:.4g}"
    return text
  if outcome.status == "sat":
    x, y = outcome.counterexample
    x, y = np.asarray(x).reshape(-1), np.asarray(y).reshape(-1)
    found = {"attack": "the attack (sampling and PGD)", "milp": "the MILP"}.get(
        st.get("phase"), "branch and bound")
    lines = [f"{head}: counterexample found by {found}, replayed on the network in float64 "
             "(its outputs satisfy the unsafe condition)",
             f"  input x ({x.size} values): {_values(x, values)}",
             f"  output y ({y.size} values): {_values(y, values)}"]
    if x.size > values or y.size > values:
      lines.append(f"  all values: {out_path}" if out_path else
                   "  (all values: give --out FILE)")
    return "\n".join(lines)
  stage = STAGES.get(st.get("stage"), st.get("stage") or "start")
  nodes = int(st.get("nodes") or 0)
  bound = ("no certified bound on the margin yet" if margin is None or not np.isfinite(margin)
           else f"best lower bound on the margin {margin:.4g}")
  return f"{head}: {_plural(nodes, 'branch-and-bound node')}, {bound} (stage: {stage})"


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

"""Every JSON under benchmarks/results/ says how it was made, and holds only what its script writes.

Each file must carry the record of `benchmarks/common.record()`: under a ``provenance`` key
(every script now), or the same fields at the top level (the layout `benchmarks/vnncomp.py`
writes). The record needs the exact command naming an existing script of `benchmarks/`, the git
commit (40 hex digits, optionally ``+dirty``), the machine (cpu_count, device) and an ISO date.
A top-level key the script's source never mentions was added by hand and fails the test.
Results that predate provenance live in `benchmarks/results/legacy/` and are not checked.
"""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FILES = sorted(RESULTS.glob("*.json"))
RECORD_FIELDS = ("command", "commit", "date", "machine")
COMMIT = re.compile(r"^[0-9a-f]{40}(\+dirty)?$")


def record_of(doc: dict) -> tuple[dict | None, set[str]]:
  """The provenance record and the top-level keys it occupies."""
  if isinstance(doc.get("provenance"), dict):
    return doc["provenance"], {"provenance"}
  if all(k in doc for k in RECORD_FIELDS):
    return {k: doc[k] for k in RECORD_FIELDS}, set(RECORD_FIELDS)
  return None, set()


def script_of(command: str) -> Path | None:
  """The benchmark script a recorded command runs (``python benchmarks/x.py ...``)."""
  for token in command.split():
    if token.endswith(".py"):
      path = Path(token)
      path = path if path.is_absolute() else ROOT / path
      cand = path if path.is_file() else ROOT / "benchmarks" / path.name
      return cand if cand.is_file() else None
  return None


def written_by(key: str, source: str) -> bool:
  """Whether ``source`` writes ``key``: the whole name as a word, or an f-string that builds it
  from a literal part of at least 3 characters and a placeholder (``f"logit_width_{method}"``,
  ``f"{name}_seconds"``)."""
  if re.search(rf"\b{re.escape(key)}\b", source):
    return True
  return any(f"{key[:i]}{{" in source for i in range(3, len(key))) or any(
      f"}}{key[i:]}" in source for i in range(1, len(key) - 2))


def problems(doc, source_of=lambda p: p.read_text()) -> list[str]:
  """Everything wrong with one result document (empty when it passes)."""
  if not isinstance(doc, dict):
    return [f"top level is a {type(doc).__name__}, not an object"]
  rec, used = record_of(doc)
  if rec is None:
    return ["no provenance (command, commit, date, machine)"]
  out = []
  command = rec.get("command")
  script = script_of(command) if isinstance(command, str) else None
  if not isinstance(command, str) or not command.startswith("python "):
    out.append(f"command {command!r} is not a python command line")
  elif script is None or script.parent != ROOT / "benchmarks":
    out.append(f"command {command!r} names no script of benchmarks/")
  if not isinstance(rec.get("commit"), str) or not COMMIT.match(rec["commit"]):
    out.append(f"commit {rec.get('commit')!r} is not 40 hex digits (+dirty)")
  try:
    datetime.datetime.fromisoformat(str(rec.get("date")))
  except ValueError:
    out.append(f"date {rec.get('date')!r} is not ISO 8601")
  machine = rec.get("machine")
  if not isinstance(machine, dict):
    out.append(f"machine {machine!r} is not an object")
  else:
    if not isinstance(machine.get("cpu_count"), int) or machine["cpu_count"] < 1:
      out.append(f"machine.cpu_count {machine.get('cpu_count')!r} is not a positive integer")
    if not isinstance(machine.get("device"), str) or not machine["device"]:
      out.append(f"machine.device {machine.get('device')!r} is missing")
  if script is not None:
    source = source_of(script)
    for key in doc:
      if key not in used and not written_by(key, source):
        out.append(f"key {key!r} is not written by {script.name} (hand-edited?)")
  return out


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_result_records_its_provenance_and_only_script_keys(path):
  assert not problems(json.loads(path.read_text())), "\n".join(problems(
      json.loads(path.read_text())))


def test_there_are_results_to_check():
  assert len(FILES) >= 5


# The checker itself, on documents made here: it must catch what it is meant to catch.

GOOD = {"provenance": {"command": "python benchmarks/barron.py --n 10", "commit": "a" * 40,
                       "date": "2026-11-24T05:00:00+00:00",
                       "machine": {"cpu_count": 2, "device": "cpu"}},
        "setting": {}, "rows": []}


def _with(**changes) -> dict:
  doc = json.loads(json.dumps(GOOD))
  for k, v in changes.items():
    if k in doc["provenance"]:
      doc["provenance"][k] = v
    else:
      doc[k] = v
  return doc


def test_checker_accepts_a_good_document_in_both_layouts():
  assert problems(GOOD) == []
  flat = {**GOOD["provenance"], "setting": {}, "rows": []}
  assert problems(flat) == []
  assert problems(_with(commit="b" * 40 + "+dirty")) == []


@pytest.mark.parametrize("change, message", [
    (dict(summary="typed in later"), "key 'summary' is not written"),
    (dict(commit="abc123"), "commit"),
    (dict(commit="g" * 40), "commit"),
    (dict(date="yesterday"), "date"),
    (dict(machine={"cpu_count": 2}), "machine.device"),
    (dict(machine={"device": "cpu", "cpu_count": 0}), "machine.cpu_count"),
    (dict(machine="x86_64"), "machine"),
    (dict(command="python benchmarks/no_such_script.py"), "names no script"),
    (dict(command="benchmarks/barron.py"), "not a python command"),
])
def test_checker_rejects(change, message):
  found = problems(_with(**change))
  assert any(message in p for p in found), found


def test_checker_rejects_missing_provenance_and_non_objects():
  assert problems({"setting": {}}) == ["no provenance (command, commit, date, machine)"]
  assert problems([1, 2]) and "not an object" in problems([1, 2])[0]
  partial = {k: GOOD["provenance"][k] for k in ("command", "commit", "date")}
  assert problems(partial) == ["no provenance (command, commit, date, machine)"]


def test_keys_built_by_an_f_string_are_written_by_the_script():
  src = 'out = {"setting": 0, "rows": 0}; out[f"logit_width_{method}"] = out[f"{name}_seconds"] = 1'
  assert problems(_with(logit_width_interval=1.0, fit_seconds=2.0), source_of=lambda p: src) == []
  found = problems(_with(logit_height_x=1.0), source_of=lambda p: src)
  assert found == ["key 'logit_height_x' is not written by barron.py (hand-edited?)"]


def test_keys_are_matched_as_whole_words():
  # "row" appears in the source only inside "rows": a key "row" is not written by the script.
  found = problems(_with(row=1), source_of=lambda p: 'out = {"rows": []}  # setting')
  assert found == ["key 'row' is not written by barron.py (hand-edited?)"]

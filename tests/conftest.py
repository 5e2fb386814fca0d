"""Test-session hooks.

* **Slow tests by measurement.** Every test listed in ``tests/slow.txt`` (the fast suite's tests
  that took longer than a threshold in a measured full run; `scripts/slow_tests.py` writes it)
  gets the `slow` marker, so CI (`bash scripts/test.sh`) skips it and
  `bash scripts/test.sh --slow` runs it with the tests marked `slow` in the code.
* **A crashed worker.** A test whose xdist worker process dies (a segmentation fault inside
  native code: the C++ unwinder under XLA's CPU runtime, seen about once per full run on the
  2-core CI machine, in a different test each time and never on a rerun) is run once more on a
  fresh worker. A test that crashes its worker twice fails. Every rerun is listed at the end of
  the session, so a crash is never hidden: only a one-off one does not fail the run.
"""
from __future__ import annotations

import pytest

_CRASHED: list[str] = []


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched) -> bool | None:
  """xdist's hook for a test that crashed its worker: reschedule it once."""
  if crashitem in _CRASHED:
    return None  # second crash: the default report, a failure
  _CRASHED.append(crashitem)
  sched.mark_test_pending(crashitem)
  report.outcome = "rerun"  # type: ignore[assignment]
  return True


def pytest_terminal_summary(terminalreporter) -> None:
  for nodeid in _CRASHED:
    terminalreporter.write_line(
        f"CRASH: {nodeid} crashed its worker process and was run again on a fresh one "
        "(it fails if it crashes twice)", yellow=True, bold=True)


_SLOW_LIST = __import__("pathlib").Path(__file__).with_name("slow.txt")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
  """Marks `slow` every test listed in tests/slow.txt (measured, see scripts/slow_tests.py),
  before ``-m "not slow"`` deselects by marker."""
  if not _SLOW_LIST.exists():
    return
  listed = {line.split("#")[0].strip() for line in _SLOW_LIST.read_text().splitlines()} - {""}
  for item in items:
    if item.nodeid in listed:
      item.add_marker(pytest.mark.slow)

"""Writes tests/slow.txt: the fast suite's tests that take longer than a threshold.

    bash scripts/test.sh --junitxml=/tmp/times.xml        # one full run of the fast suite
    .venv/bin/python scripts/slow_tests.py /tmp/times.xml --over 8

Every test listed in tests/slow.txt gets the `slow` marker at collection (tests/conftest.py), so
CI (`bash scripts/test.sh`) skips it and `bash scripts/test.sh --slow` runs it. Tests already
listed stay listed unless ``--replace`` is given. A module whose fixture is the slow part (its
first test carries the cost) is better marked whole in its file (``pytestmark``).
"""
from __future__ import annotations

import argparse
import collections
import datetime
import pathlib
import xml.etree.ElementTree as ET

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "slow.txt"


def times_from_junit(path: str) -> dict[str, float]:
  """Seconds per test node id from a pytest JUnit XML report (setup + call + teardown)."""
  out: dict[str, float] = collections.defaultdict(float)
  for case in ET.parse(path).getroot().iter("testcase"):
    cls, name = case.get("classname", ""), case.get("name", "")
    parts = cls.split(".")
    # classname "tests.test_x" or "tests.test_x.TestClass" -> tests/test_x.py[::TestClass]
    i = next((k for k in range(len(parts), 0, -1)
              if (OUT.parent.parent / pathlib.Path(*parts[:k])).with_suffix(".py").exists()),
             len(parts))
    nodeid = "/".join(parts[:i]) + ".py" + "".join("::" + p for p in parts[i:]) + "::" + name
    out[nodeid] += float(case.get("time", 0.0))
  return dict(out)


def times_from_log(path: str) -> dict[str, float]:
  """Seconds of the call phase per node id from lines ``nodeid<TAB>phase<TAB>seconds[...]``
  (a duplicate line once; setup is left out: a module fixture's cost would only move to the
  next test if its first test were listed)."""
  seen, out = set(), collections.defaultdict(float)
  for line in pathlib.Path(path).read_text().splitlines():
    node, phase, sec = line.split("\t")[:3]
    if phase == "call" and (node, phase) not in seen:
      seen.add((node, phase))
      out[node] += float(sec)
  return dict(out)



def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("report", help="JUnit XML (pytest --junitxml) or a tab-separated log")
  ap.add_argument("--over", type=float, default=8.0, help="seconds (default 8)")
  ap.add_argument("--replace", action="store_true", help="drop the tests listed before")
  args = ap.parse_args()
  times = (times_from_junit if args.report.endswith(".xml") else times_from_log)(args.report)
  old = set()
  if OUT.exists() and not args.replace:
    old = {l.split("#")[0].strip() for l in OUT.read_text().splitlines()} - {""}
  slow = sorted(old | {n for n, t in times.items() if t > args.over})
  total = sum(times.values())
  cut = sum(times.get(n, 0.0) for n in slow)
  head = [f"# Tests of the fast suite that took more than {args.over:g} s in a full run "
          f"(`bash scripts/test.sh`, -n 2) on {datetime.date.today()}:",
          f"# {len(slow)} of {len(times)} tests, {cut:.0f} of {total:.0f} s. They are marked `slow` at "
          "collection (tests/conftest.py): CI skips them,",
          "# `bash scripts/test.sh --slow` runs them. Regenerate: scripts/slow_tests.py."]
  OUT.write_text("\n".join(head + slow) + "\n")
  print(f"{OUT}: {len(slow)} tests, {cut:.0f} of {total:.0f} s of the measured run")


if __name__ == "__main__":
  main()

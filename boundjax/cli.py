"""The `boundjax` command.

    boundjax demo                       every section on embedded data (scikit-learn sets, blobs)
    boundjax demo --only bounds crown   some sections: data, bounds, crown, ensembles, agt, ldcp,
                                        barron, idp
    boundjax demo --json out.json       also write each section's numbers (and report) as JSON
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from boundjax.demos import SECTIONS, section


def _jsonable(value):
  """JSON for the values demo sections report: dataclasses, numpy scalars and arrays."""
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return dataclasses.asdict(value)
  if hasattr(value, "tolist"):
    return value.tolist()
  return str(value)


def demo(only: list[str] | None = None, json_path: str | None = None) -> int:
  """Runs the demo sections ``only`` (default: all), prints their reports, writes JSON if asked."""
  names = list(only or SECTIONS)
  unknown = [n for n in names if n not in SECTIONS]
  if unknown:
    raise SystemExit(f"unknown demo section(s) {unknown}; choose from {list(SECTIONS)}")
  record = {}
  for name in names:
    print(f"\n=== {name} ===", flush=True)
    t0 = time.perf_counter()
    result = section(name)()
    seconds = time.perf_counter() - t0
    print(result.text)
    print(f"[{name}: {seconds:.1f} s]", flush=True)
    record[name] = {"numbers": result.numbers, "text": result.text, "seconds": seconds}
  if json_path:
    with open(json_path, "w") as f:
      json.dump(record, f, indent=2, default=_jsonable)
  return 0


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="boundjax", description="Sound bounds for neural networks.")
  sub = parser.add_subparsers(dest="command", required=True)
  d = sub.add_parser("demo", help="run the demonstration on embedded datasets")
  d.add_argument("--only", nargs="*", help=f"sections to run (default: all of {list(SECTIONS)})")
  d.add_argument("--json", help="also write each section's numbers and report as JSON to this path")
  args = parser.parse_args(argv)
  if args.command == "demo":
    return demo(args.only, args.json)
  return 1


if __name__ == "__main__":
  sys.exit(main())

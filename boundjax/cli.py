"""The `boundjax` command.

    boundjax demo                 every section on embedded data (scikit-learn datasets, blobs)
    boundjax demo --only bounds   one section: data, bounds, crown, ensembles, agt, ldcp, barron, idp
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable


def _sections() -> dict[str, Callable[[], str]]:
  def data():
    from boundjax.data import demo_section
    return demo_section(["breast_cancer", "digits", "blobs"])

  def bounds():
    from boundjax.transforms import demo_section
    return demo_section()

  def crown():
    from boundjax.domains.linear import demo_section
    return demo_section()

  def ensembles():
    from boundjax.ensembles import demo_section
    return demo_section()

  def agt():
    from boundjax.agt.demo import demo_section
    return demo_section()

  def ldcp():
    from milp.ldcp import demo_section
    return demo_section()

  def barron():
    from boundjax.auditing import demo_section
    return demo_section()

  def idp():
    from boundjax.privacy.label_only import demo_section
    return demo_section()

  return {"data": data, "bounds": bounds, "crown": crown, "ensembles": ensembles, "agt": agt,
          "ldcp": ldcp, "barron": barron, "idp": idp}


def demo(only: list[str] | None = None, json_path: str | None = None) -> int:
  sections = _sections()
  names = only or list(sections)
  unknown = [n for n in names if n not in sections]
  if unknown:
    raise SystemExit(f"unknown demo section(s) {unknown}; choose from {list(sections)}")
  record = {}
  for name in names:
    print(f"\n=== {name} ===", flush=True)
    t0 = time.perf_counter()
    text = sections[name]()
    seconds = time.perf_counter() - t0
    print(text)
    print(f"[{name}: {seconds:.1f} s]", flush=True)
    record[name] = {"text": text, "seconds": seconds}
  if json_path:
    with open(json_path, "w") as f:
      json.dump(record, f, indent=2)
  return 0


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="boundjax", description="Sound bounds for neural networks.")
  sub = parser.add_subparsers(dest="command", required=True)
  d = sub.add_parser("demo", help="run the demonstration on embedded datasets")
  d.add_argument("--only", nargs="*", help="sections to run (default: all)")
  d.add_argument("--json", help="also write the results as JSON to this path")
  args = parser.parse_args(argv)
  if args.command == "demo":
    return demo(args.only, args.json)
  return 1


if __name__ == "__main__":
  sys.exit(main())

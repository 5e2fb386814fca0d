"""The `boundjax` command.

```text
    boundjax demo                       every section on embedded data (scikit-learn sets, blobs)
    boundjax demo --only bounds crown   some sections: data, bounds, crown, ensembles, agt, ldcp,
                                        barron, idp
    boundjax demo --json out.json       also write each section's numbers (and report) as JSON
    boundjax demo --quick               smaller sizes and fewer steps (about half a minute); every
                                        section prints its expected time before it runs
    boundjax --version                  the installed version

    boundjax verify NET.onnx PROP.vnnlib --timeout 60 --out RESULT
                                        VNN-COMP's contract: RESULT holds sat (and the
                                        counterexample), unsat, timeout or unknown; compiled
                                        bounds are cached in ~/.cache/boundjax/jax for later
                                        runs (--compile-cache DIR, --no-compile-cache);
                                        --memory 4G bounds the bound calls' memory;
                                        prints a summary (`boundjax.verify.summary`):
                                        what proved it, the counterexample (replayed), or
                                        the nodes, margin and stage reached at the limit
    boundjax verify --batch INSTANCES.csv --timeout 60 [--root DIR] [--json results.json]
                                        a list of instances (columns onnx, vnnlib), with a
                                        progress bar and a results table
    boundjax reproduce [--quick | --full | --render-only] [--only PAPER ...] [--readme]
                                        run the benchmark suite of a clone and write
                                        report/index.html and report/README.md (--readme:
                                        and README.md's measured numbers from the results)
```
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
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


def demo(only: list[str] | None = None, json_path: str | None = None,
         quick: bool = False) -> int:
  """Runs the demo sections ``only`` (default: all), prints their reports, writes JSON if asked.

  Before each section it prints what the section shows and its expected time (the section's
  ``SECONDS``, measured on a quiet 2-core CPU), after it the measured time. ``quick``: each
  section's ``QUICK`` settings (smaller sizes and fewer steps; the numbers are not the full
  demo's)."""
  from boundjax.demos import expected_seconds, title
  names = list(only or SECTIONS)
  unknown = [n for n in names if n not in SECTIONS]
  if unknown:
    raise SystemExit(f"unknown demo section(s) {unknown}; choose from {list(SECTIONS)}")
  if quick and "XLA_FLAGS" not in os.environ:
    # A short run's time is mostly XLA compiling small programs; without LLVM's optimisation
    # passes (as the fast test suite compiles) that takes about a third less. JAX reads this
    # when its CPU backend starts, so it changes nothing once this process has computed.
    os.environ["XLA_FLAGS"] = "--xla_backend_optimization_level=0"
  expected = {n: expected_seconds(n, quick) for n in names}
  setting = "quick settings" if quick else "full settings; --quick for a short run"
  print(f"boundjax demo: {len(names)} section(s), {setting}; expected "
        f"{_duration(sum(expected.values()))} on a quiet 2-core CPU (longer on a loaded machine)",
        flush=True)
  record = {}
  start = time.perf_counter()
  for i, name in enumerate(names, 1):
    print(f"\n=== {name} === [{i}/{len(names)}] {title(name)} "
          f"(expected {_duration(expected[name])})", flush=True)
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = section(name, quick)()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    print(result.text)
    print(f"[{name}: {seconds:.1f} s, expected {_duration(expected[name])}; "
          f"{time.perf_counter() - start:.0f} s since the start]", flush=True)
    record[name] = {"numbers": result.numbers, "text": result.text, "seconds": seconds,
                    "cpu_seconds": cpu, "expected_seconds": expected[name], "quick": quick}
  if json_path:
    with open(json_path, "w") as f:
      json.dump(record, f, indent=2, default=_jsonable)
  return 0


def _duration(seconds: float) -> str:
  """``~12 s`` or ``~3 min``: an expected time, rounded as a person would say it."""
  if seconds < 90:
    return f"~{max(1, round(seconds))} s"
  return f"~{round(seconds / 60)} min"


def version() -> str:
  """The installed distribution's version (package metadata), else ``boundjax.__version__``
  (a clone on the path without an install)."""
  from importlib import metadata
  try:
    return metadata.version("boundjax")
  except metadata.PackageNotFoundError:
    import boundjax
    return boundjax.__version__


def compile_cache(path: str | None) -> str | None:
  """Turns on JAX's persistent compilation cache in ``path`` (default:
  ``$XDG_CACHE_HOME/boundjax/jax``, else ``~/.cache/boundjax/jax``) for programs whose
  compilation takes over a second. Only a later process gains: it loads the compiled bounds
  (tens of seconds of XLA compilation on a loaded CPU, the same program for every network and
  property of a shape) instead of compiling them; the first run on a machine pays in full. The
  cached executables are the ones XLA would compile (keyed by the program, the options and the
  JAX version), so soundness is untouched. Returns the folder, or None if it cannot be made."""
  import os
  from pathlib import Path

  import jax
  if path is None:
    path = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "boundjax" / "jax"
  try:
    Path(path).mkdir(parents=True, exist_ok=True)
  except OSError:
    return None
  jax.config.update("jax_compilation_cache_dir", str(path))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return str(path)


def memory_size(text: str) -> int:
  """``--memory``'s type: bytes of ``4G``, ``512M``, ``2.5GB`` or plain bytes
  (`boundjax.verify.memory.parse_size`); an argparse error naming the value otherwise."""
  from boundjax.verify.memory import parse_size
  try:
    return parse_size(text)
  except ValueError as e:
    raise argparse.ArgumentTypeError(str(e)) from None


def verify(net: str | None, prop: str | None, timeout: float, out: str | None,
           batch: str | None, root: str | None, json_path: str | None, sound: bool,
           cache: str | None | bool = None, memory: int | None = None,
           milp: bool = True) -> int:
  """`boundjax verify`: one instance (``net``, ``prop``) or a CSV list (``batch``).
  ``cache``: the persistent compilation cache's folder (`compile_cache`; None: the default
  one; False: none). ``memory``: the verifier's memory budget in bytes (None: its default,
  4 GiB; `boundjax.verify.memory`). ``milp``: the MILP fallback and the MILP refinement of
  intermediate bounds (off: every ``unsat`` rests on the engine's bounds alone)."""
  import csv
  from pathlib import Path

  if cache is not False:
    compile_cache(cache)

  from boundjax.verify import format_result, run_instances, verify_instance
  from boundjax.verify.outcome import summary
  options = {"sound": sound, "milp": milp}
  if memory is not None:
    options["memory"] = memory
  if batch is None:
    if net is None or prop is None:
      raise SystemExit("boundjax verify: give NET.onnx and PROP.vnnlib, or --batch INSTANCES.csv")
    from boundjax.io import OnnxImportError, VnnlibError
    try:
      outcome = verify_instance(net, prop, timeout=timeout, **options)
    except (OnnxImportError, VnnlibError, OSError, MemoryError) as e:
      raise SystemExit(f"boundjax verify: {e}") from None
    if out:
      Path(out).write_text(format_result(outcome))
    first, *rest = summary(outcome, timeout, out_path=out).split("\n")
    print("\n".join([f"{first} [{Path(net).name} {Path(prop).name}]", *rest]))
    return 0
  with open(batch) as f:
    rows = [{"onnx": r["onnx"], "vnnlib": r["vnnlib"]} for r in csv.DictReader(f)]
  base = Path(root) if root else Path(batch).resolve().parent
  results = run_instances(rows, timeout, progress=True, root=base, **options)
  print(f"{'onnx':<40} {'vnnlib':<28} {'result':<8} {'seconds':>8}")
  for r in results:
    print(f"{Path(r['onnx']).name:<40} {Path(r['vnnlib']).name:<28} {r['status']:<8} "
          f"{r['seconds']:>8.2f}")
  for r in results:  # a row that failed is reported, and the batch went on
    if r["status"] == "error":
      print(f"boundjax verify: {Path(r['vnnlib']).name}: {r['error']}")
  counts = {s: sum(r["status"] == s for r in results) for s in ("sat", "unsat", "timeout",
                                                                "unknown", "error")}
  print(", ".join(f"{v} {k}" for k, v in counts.items()))
  if json_path:
    rows_out = [{k: v for k, v in r.items() if k != "outcome"} for r in results]
    Path(json_path).write_text(json.dumps(rows_out, indent=2, default=_jsonable))
  return 0


def _benchmark_report():
  """The module ``benchmarks/report.py`` of the clone this runs in: the first folder, from the
  current one upwards and then beside the package, holding it. The benchmarks are not part of the
  installed package, so an installed wheel without a clone gets a clear SystemExit."""
  import importlib.util
  from pathlib import Path

  cwd = Path.cwd().resolve()
  package_parent = Path(__file__).resolve().parents[1]
  for folder in [cwd, *cwd.parents, package_parent]:
    path = folder / "benchmarks" / "report.py"
    if path.is_file():
      spec = importlib.util.spec_from_file_location("boundjax_benchmarks_report", path)
      module = importlib.util.module_from_spec(spec)
      sys.modules[spec.name] = module     # dataclasses look their module up by name
      spec.loader.exec_module(module)
      return module
  raise SystemExit("boundjax reproduce: runs the benchmark scripts of a clone of the repository "
                   "(benchmarks/report.py), found neither from the current folder upwards nor "
                   f"beside the installed package ({package_parent}); run it from inside a clone "
                   "(git clone, then `pip install -e .`)")


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="boundjax", description="Sound bounds for neural networks.")
  parser.add_argument("--version", action="version", version=f"boundjax {version()}")
  sub = parser.add_subparsers(dest="command", required=True)
  d = sub.add_parser("demo", help="run the demonstration on embedded datasets")
  d.add_argument("--only", nargs="*", help=f"sections to run (default: all of {list(SECTIONS)})")
  d.add_argument("--json", help="also write each section's numbers and report as JSON to this path")
  d.add_argument("--quick", action="store_true",
                 help="smaller sizes and fewer steps in every section (the whole demo in about "
                      "half a minute on a quiet 2-core CPU; the full one takes about 1.5 min)")
  v = sub.add_parser("verify", help="verify an ONNX network against a VNNLIB property")
  v.add_argument("net", nargs="?", help="the network (.onnx)")
  v.add_argument("prop", nargs="?", help="the property (.vnnlib)")
  v.add_argument("--timeout", type=float, default=60.0, help="seconds per instance (default 60)")
  v.add_argument("--out", help="result file (VNN-COMP format)")
  v.add_argument("--batch", help="a CSV with columns onnx, vnnlib: run every row")
  v.add_argument("--root", help="folder the CSV's paths are relative to (default: the CSV's)")
  v.add_argument("--json", help="with --batch: also write the results as JSON")
  v.add_argument("--unsound-fp", action="store_true",
                 help="skip the outward rounding of the bounds (faster; unsat then holds up to "
                      "floating-point error)")
  v.add_argument("--no-milp", action="store_true",
                 help="no MILP solver: neither the exact fallback nor the MILP tightening of "
                      "intermediate bounds (every unsat then rests on the engine's sound bounds "
                      "alone, not on the solver's tolerances)")
  v.add_argument("--memory", type=memory_size, metavar="SIZE",
                 help="memory budget of the bound computations (JAX/XLA buffers, estimated "
                      "before allocating; not the process's baseline), e.g. 4G, 512M, 2.5GB or "
                      "bytes (default 4G): sub-problems are bounded in chunks that fit, and an "
                      "instance whose single sub-problem needs more is an error naming the size")
  v.add_argument("--compile-cache", metavar="DIR",
                 help="JAX's persistent compilation cache (default ~/.cache/boundjax/jax): a "
                      "later run loads the compiled bounds instead of compiling them")
  v.add_argument("--no-compile-cache", action="store_true",
                 help="no persistent compilation cache (every run compiles)")
  r = sub.add_parser("reproduce", help="run the benchmarks (from a clone) and write report/")
  mode = r.add_mutually_exclusive_group()
  mode.add_argument("--quick", action="store_const", dest="mode", const="quick",
                    help="small settings, < 20 min on a 2-core CPU (the default)")
  mode.add_argument("--full", action="store_const", dest="mode", const="full",
                    help="the documented long runs (resumable)")
  mode.add_argument("--render-only", action="store_const", dest="mode", const="render",
                    help="no runs: the report from the results already there")
  r.add_argument("--only", nargs="*", help="papers: lucid, agt, ptr, sphynx, barron, engine")
  r.add_argument("--readme", action="store_true",
                 help="also rewrite README.md's measured numbers (its <!-- report:NAME --> "
                      "blocks) from the committed results")
  args = parser.parse_args(argv)
  if args.command == "reproduce":
    report = _benchmark_report()
    try:
      path = report.reproduce(args.mode or "quick", args.only, readme=args.readme)
    except (report.NotAClone, ValueError) as e:
      raise SystemExit(f"boundjax reproduce: {e}") from None
    print(f"wrote {path} and {path.with_name('README.md')}"
          + (" and updated the clone's README.md" if args.readme else ""))
    return 0
  if args.command == "demo":
    return demo(args.only, args.json, args.quick)
  if args.command == "verify":
    code = verify(args.net, args.prop, args.timeout, args.out, args.batch, args.root, args.json,
                  not args.unsound_fp,
                  False if args.no_compile_cache else args.compile_cache, args.memory,
                  not args.no_milp)
    _leave_if_compiling(code)
    return code
  return 1


def _leave_if_compiling(code: int) -> None:
  """Run as the ``boundjax`` command: if a bound is still compiling in a worker thread
  (`boundjax.verify.engine.call_with_budget` leaves it behind at the deadline), exit at once with
  ``code`` after flushing the output; the interpreter's normal shutdown would abort in the
  middle of XLA's compilation (SIGABRT). In-process callers (tests) are left alone."""
  import os
  import threading
  from pathlib import Path
  if Path(sys.argv[0]).name not in ("boundjax", "cli.py"):
    return
  if any(t.name == "boundjax-worker" and t.is_alive() for t in threading.enumerate()):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
  sys.exit(main())

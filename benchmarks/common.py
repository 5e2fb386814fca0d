"""What every benchmark script shares: the repository's paths and the record each JSON keeps of
its own run (the command, the commit, the machine and the date, written by the script itself,
never by hand).

    from common import RESULTS, record       # a script in benchmarks/ (its folder is on sys.path)
    (RESULTS / "x.json").write_text(json.dumps({"provenance": record(), ...}))

and how they time a call (`timed`, `median_times`): wall seconds and this process's CPU seconds
(all its threads). CPU seconds are the robust figure on a shared machine: other processes
stretch wall time but not the work done here.

`benchmarks/report.py` (``boundjax reproduce``) runs the scripts and renders their JSONs.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"   # the committed results (figures and tables)


def timed(fn, *args) -> tuple[Any, float, float]:
  """``(fn(*args), wall seconds, process CPU seconds)``, the result blocked until ready (JAX
  dispatches asynchronously)."""
  import jax
  w, c = time.perf_counter(), time.process_time()
  out = jax.block_until_ready(fn(*args))
  return out, time.perf_counter() - w, time.process_time() - c


def median_times(fn, reps: int) -> tuple[float, float]:
  """Median wall and median process CPU seconds of ``fn()`` over ``reps`` calls (`timed`)."""
  runs = [timed(fn)[1:] for _ in range(reps)]
  return (float(statistics.median(r[0] for r in runs)),
          float(statistics.median(r[1] for r in runs)))


def git_commit() -> str:
  """The checked-out commit, with ``+dirty`` when tracked code differs from it (the package,
  ``milp`` and ``benchmarks``, not the result files under ``benchmarks/results``: an earlier
  run's output in the same checkout does not change the code that runs)."""
  try:
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "boundjax", "milp",
                            "benchmarks", ":(exclude)benchmarks/results"],
                           cwd=ROOT).returncode != 0
    return sha + ("+dirty" if dirty else "")
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def script_path(arg0: str) -> str:
  """The script as the repository names it (``benchmarks/x.py``) when it lies in the repository,
  so the same run from another folder records the same command."""
  try:
    return Path(arg0).resolve().relative_to(ROOT).as_posix()
  except ValueError:
    return arg0


DIRTY_WARNING = ("uncommitted changes in boundjax/, milp/ or benchmarks/: this result records "
                 "commit {commit}, from which it cannot be reproduced. Commit first, then run "
                 "the benchmark again for a result to keep.")


def warn_dirty(commit: str) -> None:
  """Say loudly, on stderr, that a result is being made from uncommitted code."""
  bar = "!" * 78
  print(f"\n{bar}\nWARNING: {DIRTY_WARNING.format(commit=commit)}\n{bar}\n", file=sys.stderr,
        flush=True)


def record(argv: list[str] | None = None) -> dict[str, Any]:
  """``command``, ``commit``, ``date`` (UTC), ``machine`` (cores, processor, device, load).

  ``argv`` is the script and its arguments (default ``sys.argv``)."""
  import jax
  argv = list(sys.argv if argv is None else argv)
  if argv:
    argv[0] = script_path(argv[0])
  commit = git_commit()
  if commit.endswith("+dirty"):
    warn_dirty(commit)
  return {
      "command": " ".join(["python", *argv]),
      "commit": commit,
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "machine": {"cpu_count": os.cpu_count(), "processor": platform.processor()
                  or platform.machine(), "platform": platform.platform(),
                  "device": jax.devices()[0].device_kind, "backend": jax.default_backend(),
                  "jax_version": jax.__version__, "load_average_1_5_15": os.getloadavg()},
  }

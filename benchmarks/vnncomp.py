"""VNN-COMP 2021 instances (ACAS Xu, MNIST 256x2, and with --category the CNN categories:
verivital, oval21, cifar10_resnet, marabou-cifar10, eran) through `boundjax verify`'s verifier.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/vnncomp.py                 # every instance
    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/vnncomp.py --category acasxu --limit 10
    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/vnncomp.py --match "1_9_batch_2000.onnx acasxu/prop_7."
    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/vnncomp.py --category verivital oval21 --limit 2 \
        --timeout 120          # one limit for every category (or --csv-timeouts: the competition's)
    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/vnncomp.py --category eran --csv-timeouts \
        --isolate              # each instance in a fresh process: its own compilation and peak memory

Runs `boundjax.verify.run_instances` on ``instances.csv`` of the shared folder (per-category time
limits: ACAS Xu 60 s, MNIST 120 s, the targets of the issue, 120 s for the other categories;
``--timeout`` sets one limit for all, ``--csv-timeouts`` the competition's per instance), then — only after every instance has
run — reads the competition's verdicts to score: solved, wrong answers (must be 0), time per
instance, and α,β-CROWN's 2021 answers on the same instances beside ours. Writes
``benchmarks/results/vnncomp_<category>.json`` (one category; ``vnncomp_all.json`` for several;
command, commit, machine, date under ``provenance``, one row per instance) and a cactus plot
``..._cactus.png`` (instances solved vs time, ours solid, α,β-CROWN 2021's dashed: its times
are from its GPU machine in 2021). Times include JIT compilation, paid once per process (see
``TIMING``).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, record  # noqa: E402

SHARED = ROOT.parent / "shared" / "benchmarks" / "vnncomp2021"
TIMEOUTS = {"acasxu": 60.0, "mnistfc": 120.0}
TIMING = ("wall-clock seconds per instance from loading the ONNX/VNNLIB files to the verdict, "
          "JIT compilation included; all instances run one after another in one process without "
          "a persistent compilation cache, so a compiled bound (one per batch size and number "
          "of property rows) is paid by the first instance that needs it and reused after; the "
          "machine is shared (load averages before and after are under provenance.machine)")

TIMING_ISOLATED = ("wall-clock seconds per instance from loading the ONNX/VNNLIB files to the "
                   "verdict, JIT compilation included; every instance in a fresh process "
                   "(--isolate), so each pays its own compilation, and its peak resident memory "
                   "is its own; the process start and imports (a few seconds) are not counted")


def parse(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--root", default=str(SHARED), help="folder holding instances.csv")
  p.add_argument("--category", nargs="*", default=None,
                 help="categories of instances.csv (acasxu mnistfc eran verivital "
                      "marabou-cifar10 oval21 cifar10_resnet; default: all)")
  p.add_argument("--limit", type=int, default=None, help="first N instances of each category")
  p.add_argument("--match", nargs="*", default=None,
                 help="only instances whose 'onnx vnnlib' contains one of these substrings, "
                      "e.g. '2_7_batch_2000.onnx acasxu/prop_1.'")
  p.add_argument("--timeout-acasxu", type=float, default=TIMEOUTS["acasxu"])
  p.add_argument("--timeout-mnistfc", type=float, default=TIMEOUTS["mnistfc"])
  p.add_argument("--timeout", type=float, default=None,
                 help="one time limit (s) for every category, overriding the two above")
  p.add_argument("--csv-timeouts", action="store_true",
                 help="each instance's limit from instances.csv's timeout column")
  p.add_argument("--isolate", action="store_true",
                 help="each instance in a fresh process (as VNN-COMP runs them): compilation\n"
                      "paid by every instance, and the peak memory measured is that instance's\n"
                      "alone (a process killed by the kernel is an error row with its exit code)")
  p.add_argument("--out", default=None,
                 help="result file (default benchmarks/results/vnncomp_<category>.json, "
                      "vnncomp_all.json for several categories)")
  return p.parse_args(argv)


def instances(root: Path, categories, limit, match=None) -> list[dict]:
  """Rows of instances.csv without their verdicts (those are read back only to score)."""
  with open(root / "instances.csv") as f:
    rows = [{"category": r["category"], "onnx": r["onnx"], "vnnlib": r["vnnlib"],
             "csv_timeout": float(r["timeout"]) if r.get("timeout") else None}
            for r in csv.DictReader(f)]
  if categories:
    rows = [r for r in rows if r["category"] in categories]
  if match:
    rows = [r for r in rows if any(m in f"{r['onnx']} {r['vnnlib']}" for m in match)]
  if limit:
    rows = [r for c in dict.fromkeys(r["category"] for r in rows)
            for r in [q for q in rows if q["category"] == c][:limit]]
  return rows


def verdicts(root: Path) -> dict[tuple[str, str], str]:
  with open(root / "instances.csv") as f:
    return {(r["onnx"], r["vnnlib"]): r["verdict"] for r in csv.DictReader(f)}


def abcrown_2021(root: Path) -> dict[tuple[str, str], tuple[str, float | None]]:
  """α,β-CROWN's 2021 answer and seconds per instance (instances.csv), where recorded."""
  with open(root / "instances.csv") as f:
    return {(r["onnx"], r["vnnlib"]): (r.get("abcrown_2021") or "",
                                       float(r["abcrown_2021_s"]) if r.get("abcrown_2021_s")
                                       else None)
            for r in csv.DictReader(f)}


def score(rows: list[dict], truth: dict, ab: dict | None = None) -> dict:
  out = {}
  ab = ab or {}
  for cat in dict.fromkeys(r["category"] for r in rows):
    rs = [r for r in rows if r["category"] == cat]
    solved = [r for r in rs if r["status"] in ("sat", "unsat")]
    wrong = [r for r in solved if r["status"] != truth[(r["onnx_rel"], r["vnnlib_rel"])]]
    times = [r["seconds"] for r in solved if r not in wrong]
    out[cat] = {"instances": len(rs), "solved": len(solved) - len(wrong), "wrong": len(wrong),
                "timeout": sum(r["status"] == "timeout" for r in rs),
                "unknown": sum(r["status"] == "unknown" for r in rs),
                "median_seconds_solved": float(np.median(times)) if times else None,
                "max_seconds_solved": float(np.max(times)) if times else None,
                "wrong_instances": [f"{r['onnx_rel']} {r['vnnlib_rel']}" for r in wrong],
                "max_peak_rss_bytes": max((r["peak_rss_bytes"] for r in rs
                                           if r.get("peak_rss_bytes") is not None), default=None),
                "abcrown_2021_solved": sum(
                    ab.get((r["onnx_rel"], r["vnnlib_rel"]), ("", None))[0]
                    == truth[(r["onnx_rel"], r["vnnlib_rel"])] for r in rs)}
  return out


def cactus(rows: list[dict], path: Path, ab: dict | None = None) -> None:
  """Instances solved (correctly) within each time, per category: ours solid, α,β-CROWN's
  2021 answers on the same instances dashed (``ab``: `abcrown_2021`)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4))
  for cat in dict.fromkeys(r["category"] for r in rows):
    t = sorted(r["seconds"] for r in rows if r["category"] == cat and r["correct"])
    line, = ax.step(t, np.arange(1, len(t) + 1), where="post", label=f"{cat} ({len(t)} solved)")
    theirs = sorted(s for r in rows if r["category"] == cat
                    for a, s in [(ab or {}).get((r["onnx_rel"], r["vnnlib_rel"]), ("", None))]
                    if s is not None and a == r["verdict"])
    if theirs:
      ax.step(theirs, np.arange(1, len(theirs) + 1), where="post", linestyle="--",
              color=line.get_color(), label=f"{cat}, α,β-CROWN 2021 ({len(theirs)})")
  ax.set_xlabel("time per instance (s)")
  ax.set_ylabel("instances solved")
  ax.set_xscale("log")
  ax.grid(alpha=0.3)
  ax.legend()
  ax.set_title("boundjax verify on VNN-COMP 2021 instances")
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def _child(row: dict, timeout: float, root: str, queue) -> None:
  """One instance in a process of its own (`run_isolated`): its row, without the outcome object,
  put on ``queue``."""
  from boundjax.verify import run_instances
  res = run_instances([row], timeout, progress=False, root=root)[0]
  out = res.pop("outcome", None)
  res["engine"] = out.stats.get("engine") if out is not None else None
  queue.put(res)


def run_isolated(group: list[dict], timeout: float, root: Path, on_row, target=_child) -> None:
  """`run_instances` with each row in a fresh ``spawn`` process, one at a time (``target``: the
  child's function, `_child`). A process that dies without a row (the kernel's OOM killer, a
  crash) gives an ``error`` row naming its exit code; one that hangs is killed after three
  time limits plus two minutes."""
  import multiprocessing
  import queue as queue_mod
  import time
  ctx = multiprocessing.get_context("spawn")
  for row in group:
    q = ctx.Queue()
    proc = ctx.Process(target=target, args=(row, timeout, str(root), q))
    start = time.monotonic()
    proc.start()
    res, end = None, start + 3 * timeout + 120
    while res is None and time.monotonic() < end:
      try:
        res = q.get(timeout=1.0)
      except queue_mod.Empty:
        if not proc.is_alive():       # died without a row
          break
    if res is None:
      proc.kill()
    proc.join()
    if res is None:
      res = {"status": "error", "seconds": time.monotonic() - start, "phase": None,
             "nodes": None, "settled": 0.0, "peak_rss": None, "engine": None,
             "error": f"the instance's process ended without a result (exit code "
                      f"{proc.exitcode}; -9: killed, e.g. by the kernel's OOM killer)"}
    on_row(res)


def main(argv=None) -> dict:
  a = parse(argv)
  from boundjax.verify import run_instances
  root = Path(a.root)
  meta = record()
  rows = instances(root, a.category, a.limit, a.match)
  results = []
  cats = list(dict.fromkeys(r["category"] for r in rows))
  out = Path(a.out) if a.out else (ROOT / "benchmarks" / "results" / (
      f"vnncomp_{cats[0]}.json" if len(cats) == 1 else "vnncomp_all.json"))
  out.parent.mkdir(parents=True, exist_ok=True)
  partial = out.with_name(out.stem + ".partial.json")
  for cat in cats:
    batch = [r for r in rows if r["category"] == cat]
    timeout = a.timeout or getattr(a, f"timeout_{cat}", 120.0)
    groups = ([[r] for r in batch] if a.csv_timeouts else [batch])
    for group in groups:
      t = group[0]["csv_timeout"] if a.csv_timeouts and group[0]["csv_timeout"] else timeout
      done = iter(group)

      def keep(res, cat=cat, t=t, done=done):
        """One finished instance: its row, and the partial file rewritten (a run killed
        half-way, e.g. by the kernel's OOM killer, keeps what it measured; no verdicts)."""
        r = next(done)
        results.append({"category": cat, "onnx_rel": r["onnx"], "vnnlib_rel": r["vnnlib"],
                        "status": res["status"], "seconds": res["seconds"],
                        "phase": res["phase"], "nodes": res["nodes"], "timeout": t,
                        "error": res.get("error"), "settled": res.get("settled"),
                        "peak_rss_bytes": res.get("peak_rss"),
                        "engine": (res["outcome"].stats.get("engine")
                                   if res.get("outcome") is not None else res.get("engine"))})
        partial.write_text(json.dumps({"provenance": meta, "complete": False,
                                       "instances": results}, indent=2))

      if a.isolate:
        run_isolated(group, t, root, keep)
      else:
        run_instances(group, t, progress=True, root=root, on_row=keep)
  truth = verdicts(root)                       # read only now, to score
  for r in results:
    r["verdict"] = truth[(r["onnx_rel"], r["vnnlib_rel"])]
    r["correct"] = r["status"] == r["verdict"]
  ab = abcrown_2021(root)
  summary = score(results, truth, ab)
  print(f"\n{'category':<16}{'inst':>6}{'solved':>8}{'wrong':>7}{'timeout':>9}{'unknown':>9}"
        f"{'median s':>10}{'max s':>8}{'peak GB':>9}{'abcrown 2021':>14}")
  for cat, s in summary.items():
    med = "-" if s["median_seconds_solved"] is None else f"{s['median_seconds_solved']:.2f}"
    mx = "-" if s["max_seconds_solved"] is None else f"{s['max_seconds_solved']:.1f}"
    peak = "-" if s["max_peak_rss_bytes"] is None else f"{s['max_peak_rss_bytes'] / 1e9:.2f}"
    print(f"{cat:<16}{s['instances']:>6}{s['solved']:>8}{s['wrong']:>7}{s['timeout']:>9}"
          f"{s['unknown']:>9}{med:>10}{mx:>8}{peak:>9}{s['abcrown_2021_solved']:>14}")
  meta["machine"]["load_average_after"] = __import__("os").getloadavg()
  doc = {"provenance": meta,
         "timeouts": {"acasxu": a.timeout_acasxu, "mnistfc": a.timeout_mnistfc,
                      "all": a.timeout, "csv": a.csv_timeouts},
         "subset": {"category": a.category, "limit": a.limit, "match": a.match},
         "isolated": a.isolate, "summary": summary,
         "timing": TIMING_ISOLATED if a.isolate else TIMING, "instances": results}
  out.write_text(json.dumps(doc, indent=2))
  partial.unlink(missing_ok=True)
  cactus(results, out.with_name(out.stem + "_cactus.png"), ab)
  print(f"wrote {out} and {out.with_name(out.stem + '_cactus.png')}")
  return doc


if __name__ == "__main__":
  main()

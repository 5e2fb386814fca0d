"""The Lipschitz oracles of post-hoc PTR side by side (PTR, App. C and Algorithm 1), on the paper's
obfuscator shape: a ReLU MLP 8→10→8 (PTR authors' code, final commit: ``ReLUNet([8, 10, 8])``).

Network: **trained here on a synthetic 8-d task, not ARL**: embeddings ``z ~ N(0, I_8)`` (what a
β-VAE's prior makes of them), 10 classes from a fixed random linear teacher, obfuscator 8→10→8
and predictor 8→50→10 (LeakyReLU, the paper's MNIST predictor) trained jointly with Adam (lr 1e-3)
on cross-entropy; the obfuscator alone is what the oracles bound (the spec's ARL training and the
β-VAE are `boundjax.ptr.pipeline` / `benchmarks/ptr.py`).

Part 1, per box ``N(z, r)`` (``--centres`` held-out centres × radii ``--radii``), each oracle's
upper bound ``U`` (∞→1 norm, what the ℓ1 Laplace release needs), its time, and whether it is
exact; ratios are ``U / L`` with ``L`` the exact constant (the MILP's, or the enumeration's when
both are exact they must agree; a disagreement is counted):

* ``milp`` — `milp.lipschitz.lipschitz_milp` (LipMIP formulation, HiGHS through OR-Tools MathOpt,
  solved to optimality; the sound value is the dual bound);
* ``enumerate`` — `boundjax.ptr.lipschitz.enumerate_patterns` (one hidden layer: every pattern of the
  IBP-unstable units, LP realisability, exact when the best pattern is realisable on an open set);
* ``ibp`` — FastLip per sign vector (`boundjax.ptr.lipschitz.ibp_upper`, jitted, outward rounding);
* ``ibp_cheap`` — one interval Jacobian (``method="ibp_cheap"``).
* with ``--compare-commit SHA``: the MILP of ``milp/lipschitz.py`` at that commit (the formulation
  before this benchmark's speed work), on the same boxes.

Times are per box, wall-clock and process CPU (the machine is shared: the CPU time is the fairer
number when the load average in the provenance is high); the jitted oracles are compiled first.

Part 2, the radius search per query (PTR, Algorithm 1's loop, corrected: fixed
``ceil(log2((R_max - R)/ζ))`` halvings): ``R = 0.5`` (MNIST), ``R_max = 1.4``, ``ζ = 0.01``,
``Δp`` = mean + 3·std of each oracle's ``U(N(z, R))`` on ``--public`` training points (the authors'
rule, on training data rather than their test points; most queries then pass even ``N(z, R_max)``
and the search stops after 2 calls) and, so that the bisection runs, the median of the same values;
``--queries`` held-out queries (``--slow-queries`` for the MILP and enumeration): oracle calls
and ms per query (eager search with early exits for every oracle; plus, for the IBP oracles, the
whole jitted query ``ptr_query`` — search, test and release in one compiled function with a
``lax.fori_loop`` bisection — and the vmapped batch ``ptr_release_batch`` per query). The MILP
also runs as the Δp-aware oracle ``milp Δp-aware`` (`milp.lipschitz.lipschitz_decide`: the
interval bound or sampled Jacobian norms decide ``U <= Δp`` when they can, the MILP otherwise),
with the exact MILP's proposal; its statistics must equal the exact MILP's (``min(IBP, MILP)``
decides the same way as the MILP unless the IBP bound is below the MILP's padded value).

The paper gives no oracle timings (its main text is not available; the supplement only says the
LipMIP test "can be heavy"); its code gives each radius search a 20 s wall-clock budget.

Run:  JAX_PLATFORMS=cpu python benchmarks/ptr_oracles.py
      JAX_PLATFORMS=cpu python benchmarks/ptr_oracles.py --compare-commit 22ce11f
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

jax.config.update("jax_enable_x64", True)

from boundjax.ptr import lipschitz as lip  # noqa: E402
from boundjax.ptr import release as ptr  # noqa: E402
from milp import lipschitz as mlip  # noqa: E402
from common import RESULTS, record, timed  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SIZES = (8, 10, 8)


# ------------------------------------------------------------------------------------------------
# The obfuscator
# ------------------------------------------------------------------------------------------------

def obf_apply(params, z):
  """``W2 relu(W1 z + b1) + b2`` for ``params = [{"kernel", "bias"}] * 2``."""
  h = jax.nn.relu(z @ params[0]["kernel"] + params[0]["bias"])
  return h @ params[1]["kernel"] + params[1]["bias"]


def _dense(key, a, b):
  bound = 1.0 / math.sqrt(a)      # PyTorch's Linear default, as the authors' ReLUNet
  k1, k2 = jax.random.split(key)
  return {"kernel": jax.random.uniform(k1, (a, b), minval=-bound, maxval=bound),
          "bias": jax.random.uniform(k2, (b,), minval=-bound, maxval=bound)}


def train_obfuscator(seed: int, n: int, steps: int) -> tuple[list, dict]:
  """The obfuscator and its accuracy on the synthetic task (module docstring)."""
  key = jax.random.PRNGKey(seed)
  kz, kt, kv, k0, k1, k2, k3 = jax.random.split(key, 7)
  teacher = jax.random.normal(kt, (8, 10))
  z = jax.random.normal(kz, (n, 8))
  zv = jax.random.normal(kv, (n // 4, 8))
  y, yv = jnp.argmax(z @ teacher, -1), jnp.argmax(zv @ teacher, -1)
  params = {"obf": [_dense(k0, 8, 10), _dense(k1, 10, 8)],
            "pred": [_dense(k2, 8, 50), _dense(k3, 50, 10)]}

  def logits(p, x):
    h = jax.nn.leaky_relu(obf_apply(p["obf"], x) @ p["pred"][0]["kernel"] + p["pred"][0]["bias"])
    return h @ p["pred"][1]["kernel"] + p["pred"][1]["bias"]

  def loss(p):
    return optax.softmax_cross_entropy_with_integer_labels(logits(p, z), y).mean()

  tx = optax.adam(1e-3)

  @jax.jit
  def run(p):
    def step(carry, _):
      p, s = carry
      g = jax.grad(loss)(p)
      u, s = tx.update(g, s, p)
      return (optax.apply_updates(p, u), s), None
    return jax.lax.scan(step, (p, tx.init(p)), None, length=steps)[0][0]

  params = run(params)
  acc = float(jnp.mean(jnp.argmax(logits(params, zv), -1) == yv))
  return params["obf"], {"train_points": n, "steps": steps, "optimizer": "adam(1e-3)",
                         "validation_accuracy": acc}


# ------------------------------------------------------------------------------------------------
# Oracles
# ------------------------------------------------------------------------------------------------

_OLD_WORKER = r"""
import pickle, sys, time
import numpy as np
out, sys.stdout = sys.stdout.buffer, sys.stderr  # results only on the pipe, prints elsewhere
from milp import lipschitz as old_lip
from milp.network import from_params
net = from_params(pickle.load(sys.stdin.buffer))
while True:
  try:
    x, r = pickle.load(sys.stdin.buffer)
  except EOFError:
    break
  w, c = time.perf_counter(), time.process_time()
  res = old_lip.lipschitz_milp(net, np.asarray(x), float(r))
  pickle.dump((float(res.upper), bool(res.exact), time.perf_counter() - w,
               time.process_time() - c), out)
  out.flush()
"""


class _OldMilp:
  """`milp.lipschitz.lipschitz_milp` as of an earlier ``commit``, in a worker process that
  imports that commit's own ``boundjax`` and ``milp`` packages (``git archive``), so the old
  formulation meets the code it was written against. A call returns ``(upper, exact, wall,
  cpu)``, timed inside the worker (`_timed` takes the worker's times)."""

  CALL_SECONDS = 600.0
  """The longest one call may take (the current oracle's own time limit is far below it): a
  worker that has not answered by then is killed and the call raises `TimeoutError`, so a hung
  old formulation cannot stall the benchmark."""

  def __init__(self, commit: str, params):
    tmp = Path(tempfile.mkdtemp())
    tar = subprocess.run(["git", "archive", commit, "boundjax", "milp"], cwd=ROOT, check=True,
                         capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=tar, check=True)
    env = dict(os.environ, PYTHONPATH=str(tmp), JAX_PLATFORMS="cpu", JAX_ENABLE_X64="1")
    self.proc = subprocess.Popen([sys.executable, "-c", _OLD_WORKER], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, env=env, cwd=tmp)
    self._send(jax.tree.map(np.asarray, params))

  def _send(self, obj) -> None:
    pickle.dump(obj, self.proc.stdin)
    self.proc.stdin.flush()

  def __call__(self, x, r):
    self._send((np.asarray(x, np.float64), float(r)))
    ready, _, _ = select.select([self.proc.stdout], [], [], self.CALL_SECONDS)
    if not ready:
      self.proc.kill()
      raise TimeoutError(f"the MILP oracle of the earlier commit did not answer within "
                         f"{self.CALL_SECONDS:.0f} s (its worker was killed)")
    return pickle.load(self.proc.stdout)

  def close(self) -> None:
    self.proc.stdin.close()
    try:
      self.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      self.proc.wait()


def _timed(fn, *args):
  """``(fn(*args), wall, cpu)`` (`common.timed`); an oracle run in another process (`_OldMilp`)
  returns its own times as the last two of four values."""
  out, w, c = timed(fn, *args)
  if isinstance(out, tuple) and len(out) == 4:
    return out[:2], out[2], out[3]
  return out, w, c


def make_oracles(params, net, old=None) -> dict:
  """``name -> (x, r) -> (upper, exact)``."""
  W1 = np.asarray(params[0]["kernel"], np.float64).T
  b1 = np.asarray(params[0]["bias"], np.float64)
  W2 = np.asarray(params[1]["kernel"], np.float64).T
  ibp = ptr.make_oracle(obf_apply, params, method="ibp")
  cheap = ptr.make_oracle(obf_apply, params, method="ibp_cheap")

  def milp(x, r):
    res = mlip.lipschitz_milp(net, np.asarray(x), float(r))
    return res.upper, res.exact

  def enum(x, r):
    up, low, _ = lip.enumerate_patterns(W1, b1, W2, np.asarray(x), float(r))
    return up, bool(low >= up * (1 - 1e-9))

  def jitted(f):
    return lambda x, r: (float(f(jnp.asarray(x), jnp.asarray(r, jnp.float64))), False)

  out = {"milp": milp, "enumerate": enum, "ibp": jitted(ibp), "ibp_cheap": jitted(cheap)}
  if old is not None:
    out["milp_before"] = old
  return out


def _stats(v) -> dict:
  v = np.asarray(v, np.float64)
  return {"median": float(np.median(v)), "p90": float(np.percentile(v, 90)),
          "max": float(v.max()), "mean": float(v.mean())}


def compare_boxes(oracles: dict, centres: np.ndarray, radii) -> dict:
  """Part 1 (module docstring)."""
  for f in oracles.values():                       # compile the jitted ones
    f(centres[0], radii[0])
  rows = {name: {r: {"upper": [], "exact": [], "wall": [], "cpu": []} for r in radii}
          for name in oracles}
  truth = {r: [] for r in radii}
  disagree = 0
  total = len(centres) * len(radii)
  with tqdm(total=total, desc="boxes") as bar:
    for r in radii:
      for z in centres:
        for name, f in oracles.items():
          (u, ex), w, c = _timed(f, z, r)
          row = rows[name][r]
          row["upper"].append(u), row["exact"].append(ex), row["wall"].append(w)
          row["cpu"].append(c)
        m_u, m_ex = rows["milp"][r]["upper"][-1], rows["milp"][r]["exact"][-1]
        e_u, e_ex = rows["enumerate"][r]["upper"][-1], rows["enumerate"][r]["exact"][-1]
        if m_ex and e_ex and abs(m_u - e_u) > 1e-5 * max(1.0, e_u):
          disagree += 1
        truth[r].append(m_u if m_ex else (e_u if e_ex else math.nan))
        bar.update()
  out = {}
  for name in oracles:
    out[name] = {}
    for r in radii:
      row, t = rows[name][r], np.asarray(truth[r])
      ok = np.isfinite(t)
      ratio = np.asarray(row["upper"])[ok] / t[ok]
      out[name][str(r)] = {
          "ratio_to_exact": _stats(ratio) if ok.any() else None,
          "exact_fraction": float(np.mean(row["exact"])),
          "below_exact": int(np.sum(ratio < 1 - 1e-9)),      # soundness: must be 0
          "seconds_wall": _stats(row["wall"]), "seconds_cpu": _stats(row["cpu"]),
      }
  return {"per_oracle": out, "boxes_with_exact_value": {str(r): int(np.isfinite(truth[r]).sum())
                                                         for r in radii},
          "milp_enumeration_disagreements": disagree}


RULES = (("mean+3std", 0.95), ("quantile", 0.5))   # the authors' rule; a median proposal


def radius_searches(oracles: dict, params, net, public: np.ndarray, queries: np.ndarray, *,
                    R: float, R_max: float, zeta: float, n_slow: int) -> dict:
  """Part 2 (module docstring), for each proposal rule of `RULES`; the MILP also as the
  Δp-aware oracle (`milp.lipschitz.lipschitz_decide`, the proposal of the exact MILP)."""
  out = {}
  for name, f in oracles.items():
    memo: dict = {}

    def U(x, r, f=f, memo=memo):
      k = (np.asarray(x, np.float64).tobytes(), float(r))
      if k not in memo:
        memo[k] = f(x, r)[0]
      return memo[k]

    fast = name.startswith("ibp")
    pub = jnp.asarray(public if fast else public[: max(2, n_slow)])
    qs = queries if fast else queries[:n_slow]
    for rule, q in RULES:
      prop = ptr.propose_bound(obf_apply, params, pub, radius=R, oracle=U, rule=rule, q=q)
      variants = [(name, lambda z, r, f=f: f(z, r)[0])]
      if name == "milp":
        variants.append(("milp Δp-aware", lambda z, r, prop=prop: mlip.lipschitz_decide(
            net, np.asarray(z), float(r), prop).upper))
      for label, oracle in variants:
        calls, ms, cpu_ms, feas, stat = [], [], [], [], []
        for x in tqdm(qs, desc=f"search {label} {rule}"):
          res, w, c = _timed(lambda: ptr.radius_search(obf_apply, params, x, radius=R,
                                                       proposal=prop, radius_max=R_max,
                                                       zeta=zeta, oracle=oracle))
          calls.append(res.evaluations), ms.append(1e3 * w), cpu_ms.append(1e3 * c)
          feas.append(res.feasible), stat.append(res.statistic)
        out[f"{label} | {rule}" + (f" {q}" if rule == "quantile" else "")] = {
            "oracle": label, "rule": rule, "proposal": prop, "public_points": int(len(pub)),
            "queries": int(len(qs)), "oracle_calls": _stats(calls),
            "ms_per_query_wall": _stats(ms), "ms_per_query_cpu": _stats(cpu_ms),
            "feasible_fraction": float(np.mean(feas)), "mean_statistic": float(np.mean(stat)),
            "statistics": [float(v) for v in stat]}
  return out


def jitted_queries(params, public, queries, *, R, R_max, zeta) -> dict:
  """The whole IBP-oracle PTR query compiled (search + test + release), per query, and batched."""
  out = {}
  for method in ("ibp", "ibp_cheap"):
    prop = ptr.propose_bound(obf_apply, params, jnp.asarray(public), radius=R, method=method)
    kw = dict(proposal=prop, epsilon=2.0, delta=0.1, radius=R, radius_max=R_max, zeta=zeta,
              method=method, calib="code")    # the authors' calibration, as benchmarks/ptr.py
    t = time.perf_counter()
    ptr.ptr_query(jax.random.PRNGKey(0), obf_apply, params, jnp.asarray(queries[0]), **kw)
    compile_s = time.perf_counter() - t
    ms, answered = [], []
    for i, x in enumerate(queries):
      t = time.perf_counter()
      a = ptr.ptr_query(jax.random.PRNGKey(i), obf_apply, params, jnp.asarray(x), **kw)
      ms.append(1e3 * (time.perf_counter() - t))
      answered.append(a.answered)
    xs = jnp.asarray(queries)
    jax.block_until_ready(ptr.ptr_release_batch(jax.random.PRNGKey(1), obf_apply, params, xs,
                                                **kw))
    t = time.perf_counter()
    jax.block_until_ready(ptr.ptr_release_batch(jax.random.PRNGKey(2), obf_apply, params, xs,
                                                **kw))
    batch_ms = 1e3 * (time.perf_counter() - t) / len(queries)
    out[method] = {"proposal": prop, "compile_seconds": compile_s,
                   "ms_per_query": _stats(ms), "batched_ms_per_query": batch_ms,
                   "oracle_calls_per_query": 2 + ptr.bisection_steps(R, R_max, zeta),
                   "answered_fraction_eps2": float(np.mean(answered)), "queries": len(queries)}
  return out


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------

def table(res: dict) -> str:
  boxes = res["boxes"]["per_oracle"]
  radii = list(next(iter(boxes.values())).keys())
  lines = ["| oracle | r | U / exact (median, p90, max) | exact | ms/box wall (median, p90) "
           "| ms/box CPU (median, p90) |", "|---|---|---|---|---|---|"]
  for name, per in boxes.items():
    for r in radii:
      e = per[r]
      q = e["ratio_to_exact"]
      rat = f"{q['median']:.3f}, {q['p90']:.3f}, {q['max']:.3f}" if q else "—"
      lines.append(f"| {name} | {r} | {rat} | {100 * e['exact_fraction']:.0f}% | "
                   f"{1e3 * e['seconds_wall']['median']:.1f}, {1e3 * e['seconds_wall']['p90']:.1f} | "
                   f"{1e3 * e['seconds_cpu']['median']:.1f}, {1e3 * e['seconds_cpu']['p90']:.1f} |")
  lines += ["", f"MILP vs enumeration disagreements (both exact): "
                f"{res['boxes']['milp_enumeration_disagreements']}", "",
            "| oracle | Δp rule | Δp | queries | oracle calls (median, max) "
            "| ms/query wall (median, p90) | ms/query CPU (median) | feasible |",
            "|---|---|---|---|---|---|---|---|"]
  for name, e in res["search"].items():
    lines.append(f"| {name} | {e['proposal']:.3f} | {e['queries']} | "
                 f"{e['oracle_calls']['median']:.0f}, {e['oracle_calls']['max']:.0f} | "
                 f"{e['ms_per_query_wall']['median']:.1f}, {e['ms_per_query_wall']['p90']:.1f} | "
                 f"{e['ms_per_query_cpu']['median']:.1f} | {100 * e['feasible_fraction']:.0f}% |")
  for rule in {e["rule"] for e in res["search"].values()}:
    a = [e for e in res["search"].values() if e["rule"] == rule and e["oracle"] == "milp"]
    b = [e for e in res["search"].values() if e["rule"] == rule and e["oracle"] == "milp Δp-aware"]
    if a and b:
      same = int(np.sum(np.asarray(a[0]["statistics"]) == np.asarray(b[0]["statistics"])))
      lines.append(f"\nΔp-aware MILP vs exact MILP ({rule}): {same}/{len(a[0]['statistics'])} "
                   "identical statistics")
  lines += ["", "| jitted PTR query | compile s | ms/query (median, p90) | batched ms/query |",
            "|---|---|---|---|"]
  for name, e in res["jitted_query"].items():
    lines.append(f"| {name} | {e['compile_seconds']:.1f} | {e['ms_per_query']['median']:.2f}, "
                 f"{e['ms_per_query']['p90']:.2f} | {e['batched_ms_per_query']:.3f} |")
  return "\n".join(lines)


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--centres", type=int, default=50)
  ap.add_argument("--radii", type=float, nargs="+", default=[0.01, 0.05, 0.1, 0.5])
  ap.add_argument("--public", type=int, default=100)
  ap.add_argument("--queries", type=int, default=50)
  ap.add_argument("--slow-queries", type=int, default=10,
                  help="queries (and public points) for the MILP and enumeration searches")
  ap.add_argument("--train-steps", type=int, default=3000)
  ap.add_argument("--compare-commit", default=None)
  ap.add_argument("--seed", type=int, default=2)
  ap.add_argument("--out", default=str(RESULTS / "ptr_oracles.json"))
  args = ap.parse_args(argv)
  params, training = train_obfuscator(args.seed, 4096, args.train_steps)
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), params)
  rng = np.random.default_rng(args.seed + 1)
  centres = rng.normal(size=(args.centres, 8))
  public = rng.normal(size=(args.public, 8))
  queries = rng.normal(size=(args.queries, 8))
  net = mlip.network_of(obf_apply, params, centres[0])
  old = _OldMilp(args.compare_commit, params) if args.compare_commit else None
  oracles = make_oracles(params, net, old)
  R, R_max, zeta = 0.5, 1.4, 0.01
  res = {
      "provenance": record(sys.argv if argv is None else ["benchmarks/ptr_oracles.py", *argv]),
      "setting": {
          "network": "obfuscator ReLU MLP 8→10→8 (the PTR authors' ReLUNet([8, 10, 8]))",
          "training": dict(training, task="synthetic: z ~ N(0, I_8), 10 classes argmax(z T), "
                           "T a fixed random 8x10 teacher; predictor 8→50→10 LeakyReLU; "
                           "joint cross-entropy, NOT ARL (the paper trains with ARL on β-VAE "
                           "embeddings)"),
          "centres": args.centres, "radii": args.radii, "norm": "inf->1 (l1 output)",
          "dtype": "float64 (jax_enable_x64)", "milp_solver": "HiGHS via OR-Tools MathOpt, "
          "1 thread, gaps 1e-9, no time limit",
          "search": {"R": R, "R_max": R_max, "zeta": zeta, "proposal": "mean + 3 std of U(N(z, R)) "
                     "over public (training-distribution) points, per oracle",
                     "public_points": args.public, "queries": args.queries,
                     "slow_oracle_queries": args.slow_queries},
          "compare_commit": args.compare_commit,
          "paper": "no oracle timings available (main text missing); the authors' code stops "
                   "each radius search after 20 s of wall clock",
      },
  }
  res["boxes"] = compare_boxes(oracles, centres, args.radii)
  res["search"] = radius_searches({k: v for k, v in oracles.items() if k != "milp_before"},
                                  params, net, public, queries, R=R, R_max=R_max, zeta=zeta,
                                  n_slow=args.slow_queries)
  if old is not None:
    old.close()
  res["jitted_query"] = jitted_queries(params, public, queries, R=R, R_max=R_max, zeta=zeta)
  res["table"] = table(res)
  Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  Path(args.out).write_text(json.dumps(res, indent=1))
  print(res["table"])
  return res


if __name__ == "__main__":
  main()

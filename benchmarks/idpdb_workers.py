"""The 1- vs 2-worker speed-up of an iDP-DB run (`boundjax.executor` under `milp.idpdb`).

One fixed family: N and ``--members`` leave-one-out networks of an MLP ``30-H-H-2`` trained on
scikit-learn's breast_cancer (all 30 features, min-max scaled; one vmapped run). Two
measurements, each with 1 and then 2 workers in this process, side by side:

1. **Fixed node count**: `milp.idpdb.naive_compute` for class 0, i.e. exactly one node MILP per
   member (the same MILPs whatever the worker count; the answers must agree), wall time and the
   ratio ``t(1) / t(2)``.
2. **Fixed time**: `milp.idpdb.lucid_compute` for class 0 with ``--seconds`` of total time
   (LUCID's branch-and-bound; the tree depends on the worker count, so what is compared is the
   number of node MILPs solved in that time).

The JSON (``benchmarks/results/idpdb_workers.json``) records the command, the git commit, the
machine and the date (``provenance``) and the load average at start and end. The machine may be shared:
the load average says how much of the second core was really free.

    python benchmarks/idpdb_workers.py                      # the stored JSON, ~3 min
    python benchmarks/idpdb_workers.py --members 8 --seconds 10 --hidden 8   # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from boundjax import ensembles as E  # noqa: E402
from boundjax.data import load_sklearn  # noqa: E402
from boundjax.models import MLP  # noqa: E402
from milp import idpdb  # noqa: E402
from milp import network as net_lib  # noqa: E402
from milp.ldcp import family_from_stacked  # noqa: E402
from common import record  # noqa: E402


def parse(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--members", type=int, default=16, help="leave-one-out networks in the family")
  p.add_argument("--hidden", type=int, default=16, help="width of the two hidden layers")
  p.add_argument("--epochs", type=int, default=20)
  p.add_argument("--node-time-limit", type=float, default=30.0, help="seconds per node MILP")
  p.add_argument("--seconds", type=float, default=40.0, help="total time of the fixed-time run")
  p.add_argument("--executor", default="process", choices=("process", "ray"))
  p.add_argument("--out", default=str(ROOT / "benchmarks/results/idpdb_workers.json"))
  return p.parse_args(argv)


def family(a: argparse.Namespace):
  """N and the first ``a.members`` leave-one-out networks of breast_cancer (seed 0)."""
  ds = load_sklearn("breast_cancer")
  x, y = ds.x_train, ds.y_train
  model = MLP(hidden=(a.hidden, a.hidden), out=2)
  init = model.init(jax.random.PRNGKey(0), x[:1])
  ens = E.train_ensemble(model, init, E.sgd(0.1, weight_decay=1e-5), x, y,
                         E.leave_k_out(np.arange(a.members)), epochs=a.epochs, batch_size=32,
                         seed=0, progress=False)
  members = ens.select(np.arange(1, a.members + 1)).params
  return net_lib.from_params(ens.full), family_from_stacked(members)


def main(argv=None) -> dict:
  a = parse(argv)
  load_start = os.getloadavg()
  t = time.perf_counter()
  net, fam = family(a)
  train_s = time.perf_counter() - t
  print(f"family: N + {fam.size} members, MLP 30-{a.hidden}-{a.hidden}-2, trained in "
        f"{train_s:.1f} s")

  fixed = {}
  for w in (1, 2):
    t = time.perf_counter()
    res = idpdb.naive_compute(net, fam, 0, idpdb.IdpDbConfig(
        node_time_limit=a.node_time_limit, executor=a.executor, workers=w))
    fixed[w] = dict(seconds=time.perf_counter() - t, n_milps=res.n_milps, beta=res.beta,
                    exact=res.exact, milp_seconds=float(sum(n.seconds for n in res.nodes)))
    print(f"naive_compute, {w} worker(s): {fixed[w]['seconds']:.1f} s for {res.n_milps} MILPs "
          f"(beta_0 = {res.beta:.6f}, exact {res.exact})")
  same = abs(fixed[1]["beta"] - fixed[2]["beta"]) <= 1e-6 * max(1.0, abs(fixed[1]["beta"]))
  speedup = fixed[1]["seconds"] / fixed[2]["seconds"]
  print(f"fixed node count: speed-up t(1)/t(2) = {speedup:.2f} (same beta: {same})")

  timed = {}
  for w in (1, 2):
    cfg = idpdb.IdpDbConfig(node_time_limit=a.node_time_limit, total_time_limit=a.seconds,
                            executor=a.executor, workers=w)
    res = idpdb.lucid_compute(net, fam, 0, cfg, progress=False)
    timed[w] = dict(seconds=res.seconds, n_milps=res.n_milps, beta=idpdb.json_float(res.beta),
                    exact=res.exact, timed_out=res.timed_out,
                    milps_per_second=res.n_milps / res.seconds)
    print(f"lucid_compute, {w} worker(s): {res.n_milps} MILPs in {res.seconds:.1f} s, "
          f"beta_0 <= {res.beta:.6f} (exact {res.exact})")
  rate = timed[2]["milps_per_second"] / timed[1]["milps_per_second"]
  print(f"fixed time: MILPs per second with 2 workers / with 1 = {rate:.2f}")

  out = dict(
      provenance=record([os.path.relpath(__file__, ROOT), *(sys.argv[1:] if argv is None
                                                            else argv)]),
      loadavg=dict(start=list(load_start), end=list(os.getloadavg())),
      family=dict(data="breast_cancer (sklearn), 30 features", arch=f"30-{a.hidden}-{a.hidden}-2",
                  members=fam.size, epochs=a.epochs, train_seconds=train_s),
      executor=a.executor, node_time_limit=a.node_time_limit,
      fixed_node_count=dict(method="milp.idpdb.naive_compute, class 0", by_workers=fixed,
                            speedup=speedup, same_beta=bool(same)),
      fixed_time=dict(method="milp.idpdb.lucid_compute, class 0", seconds=a.seconds,
                      by_workers=timed, milps_per_second_ratio=rate))
  path = pathlib.Path(a.out)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(out, indent=1))
  print(f"wrote {path}")
  return out


if __name__ == "__main__":
  main()

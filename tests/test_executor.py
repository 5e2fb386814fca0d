"""The one executor (`boundjax.executor`): serial, spawn process pool and a local Ray instance give
the same results in job order, for a plain function and for MILP jobs (`milp.parallel.solve_many`).
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from boundjax.executor import Executor, run_jobs
from milp import ldcp
from milp import neighbourhoods as NB
from milp import network as N
from milp.parallel import VerifyJob, solve_many


def _job(seed: int) -> dict:
  """A small picklable job with a result that depends on the job only: a seeded draw."""
  rng = np.random.default_rng(seed)
  a = rng.normal(size=(6, 6))
  return {"seed": seed, "trace": float(np.trace(a @ a.T)), "pid": os.getpid()}


def _strip(results: list[dict]) -> list[tuple]:
  return [(r["seed"], r["trace"]) for r in results]


JOBS = [3, 1, 4, 1, 5, 9, 2, 6]


def _milp_jobs(seed: int = 3, n: int = 4) -> list[VerifyJob]:
  """Tiny 2-8-2 networks and L-inf balls: VERIFIED or FALSIFIED by a MILP each."""
  rng = np.random.default_rng(seed)
  jobs = []
  for _ in range(n):
    lo = [(rng.normal(size=(8, 2)), rng.normal(size=8) * .1),
          (rng.normal(size=(2, 8)) / 3, np.zeros(2))]
    net = N.interval_network(lo, lo)
    xc = rng.random(2)
    jobs.append(VerifyJob(net, NB.linf_ball(xc, 0.3), ldcp.predicted_label(net, xc), samples=0))
  return jobs


def _milp_summary(results) -> list[tuple]:
  out = []
  for r in results:
    cex = None if r.counterexample is None else np.round(r.counterexample, 6).tolist()
    out.append((r.status, r.method, round(float(r.margin_bound), 6), cex))
  return out


def test_serial_and_process_pool_agree_in_job_order():
  serial = run_jobs(_job, JOBS, executor="serial")
  pooled = run_jobs(_job, JOBS, executor="process", workers=2)
  assert _strip(serial) == _strip(pooled)
  assert [r["seed"] for r in pooled] == JOBS
  assert {r["pid"] for r in serial} == {os.getpid()}
  assert os.getpid() not in {r["pid"] for r in pooled}     # really ran in the workers


def test_executor_keeps_its_pool_between_batches():
  with Executor("process", workers=2) as ex:
    a = ex.map(_job, JOBS[:4])
    pool = ex._pool
    b = ex.map(_job, JOBS[4:])
    assert ex._pool is pool                                # one pool for both batches
  assert ex._pool is None
  assert _strip(a + b) == _strip(run_jobs(_job, JOBS, executor="serial"))


def test_bad_options_raise():
  with pytest.raises(ValueError, match="executor must be one of"):
    run_jobs(_job, JOBS, executor="threads")
  with pytest.raises(ValueError, match="workers"):
    run_jobs(_job, JOBS, workers=0)
  assert run_jobs(_job, [], executor="process") == []


def test_solve_many_process_pool_matches_serial():
  jobs = _milp_jobs()
  serial = solve_many(jobs, executor="serial")
  pooled = solve_many(jobs, executor="process", workers=2)
  assert _milp_summary(serial) == _milp_summary(pooled)
  assert {r.status.value for r in serial} <= {"VERIFIED", "FALSIFIED"}


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_local_ray_matches_serial():
  """``executor="ray"`` without an address starts a local instance (``num_cpus=workers``) and
  shuts it down; with an instance already running (``ray.init(num_cpus=2)``) it uses that one
  and leaves it running. Results equal the serial run, for plain jobs and MILP jobs."""
  import ray

  assert not ray.is_initialized()
  remote = run_jobs(_job, JOBS, executor="ray", workers=2)
  assert _strip(remote) == _strip(run_jobs(_job, JOBS, executor="serial"))
  assert not ray.is_initialized()                          # the instance it started is gone

  ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
  try:
    jobs = _milp_jobs(seed=4, n=3)
    assert _milp_summary(solve_many(jobs, executor="ray")) == \
        _milp_summary(solve_many(jobs, executor="serial"))
    with Executor("ray", workers=2) as ex:
      assert _strip(ex.map(_job, JOBS[:3]) + ex.map(_job, JOBS[3:])) == \
          _strip(run_jobs(_job, JOBS, executor="serial"))
    assert ray.is_initialized()                            # not started by the executor: kept
  finally:
    ray.shutdown()

"""Independent verification jobs in parallel: a local process pool, or a Ray cluster.

OR-Tools models are not picklable, so a job ships its *description* — the `Network` (numpy
arrays), the `Neighbourhood`, the label and the solver settings — and the worker builds and solves
the model (`run_job`). Results come back in job order.

* ``executor="process"`` (default): ``concurrent.futures.ProcessPoolExecutor`` with the ``spawn``
  start method (safe with JAX and OR-Tools threads in the parent).
* ``executor="serial"``: in this process (debugging, or one core).
* ``executor="ray"`` or ``ray_address="..."``: ``ray.remote`` tasks on the cluster at
  ``ray_address`` (``"auto"``, ``"ray://host:port"``), or on a local instance started with
  ``ray.init(num_cpus=max_workers)`` when no address is given. ``ray`` is the optional extra
  ``boundjax[ray]``.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import multiprocessing as mp
import os
from typing import Any, Sequence

from milp.network import Network
from milp.neighbourhoods import Neighbourhood
from milp.solve import SolveConfig
from milp.verify import VerifyResult, verify


@dataclasses.dataclass
class VerifyJob:
  """A picklable description of one `milp.verify.verify` call."""

  net: Network
  nbhd: Neighbourhood
  label: int
  cfg: SolveConfig = SolveConfig()
  bounds: str = "ibp"
  replay: tuple = ()
  samples: int = 64
  tag: Any = None


def run_job(job: VerifyJob) -> VerifyResult:
  """Builds and solves one job (runs in the worker)."""
  return verify(job.net, job.nbhd, job.label, job.cfg, bounds=job.bounds,
                replay=job.replay, samples=job.samples)


def _worker_init() -> None:
  os.environ.setdefault("JAX_PLATFORMS", "cpu")


def solve_many(jobs: Sequence[VerifyJob], executor: str = "process",
               max_workers: int | None = None, ray_address: str | None = None,
               progress: bool = False) -> list[VerifyResult]:
  """Runs every job and returns the results in order.

  Args:
    jobs: `VerifyJob` descriptions.
    executor: ``"process"``, ``"serial"`` or ``"ray"``.
    max_workers: pool size (default: the CPU count); for a local Ray instance, its ``num_cpus``.
    ray_address: a Ray cluster address; implies ``executor="ray"``.
    progress: show a tqdm bar.
  """
  jobs = list(jobs)
  if ray_address is not None:
    executor = "ray"
  if executor not in ("process", "serial", "ray"):
    raise ValueError(f"solve_many: executor must be 'process', 'serial' or 'ray', got {executor!r}.")
  bar = None
  if progress:
    from tqdm.auto import tqdm
    bar = tqdm(total=len(jobs), desc="MILP jobs", unit="job")
  try:
    if executor == "serial" or not jobs:
      out = []
      for j in jobs:
        out.append(run_job(j))
        if bar is not None:
          bar.update(1)
      return out
    if executor == "ray":
      return _ray_many(jobs, max_workers, ray_address, bar)
    workers = max_workers or os.cpu_count() or 1
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                initializer=_worker_init) as pool:
      futures = [pool.submit(run_job, j) for j in jobs]
      if bar is not None:
        for _ in cf.as_completed(futures):
          bar.update(1)
      return [f.result() for f in futures]
  finally:
    if bar is not None:
      bar.close()


def _ray_many(jobs, max_workers, ray_address, bar) -> list[VerifyResult]:
  try:
    import ray
  except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("solve_many(executor='ray') needs the optional extra: pip install ray") from e
  started = False
  if not ray.is_initialized():
    if ray_address is not None:
      ray.init(address=ray_address)
    else:
      ray.init(num_cpus=max_workers or os.cpu_count() or 1, include_dashboard=False,
               log_to_driver=False)
    started = True
  try:
    remote = ray.remote(run_job)
    refs = [remote.remote(j) for j in jobs]
    if bar is not None:
      pending = list(refs)
      while pending:
        done, pending = ray.wait(pending, num_returns=1)
        bar.update(len(done))
    return list(ray.get(refs))
  finally:
    if started and ray_address is None:
      ray.shutdown()

"""Independent jobs in parallel: in this process, a local process pool, or a Ray cluster.

The one executor of the package (MILP solves of LDCP and iDP-DB, chunked leave-out training).
A job is a picklable description (numpy arrays, dataclasses) and a module-level function that
turns it into a picklable result; results come back in job order.

* ``executor="process"`` (default): ``concurrent.futures.ProcessPoolExecutor`` with the ``spawn``
  start method (safe with JAX and OR-Tools threads in the parent); workers run JAX on the CPU
  unless ``JAX_PLATFORMS`` says otherwise.
* ``executor="serial"``: in this process (debugging, one core, or a single job).
* ``executor="ray"`` or ``address="..."``: ``ray.remote`` tasks on the cluster at ``address``
  (``"auto"``, ``"ray://host:port"``), or on a local instance started with
  ``ray.init(num_cpus=workers)`` when no address is given. Ray is the optional extra
  ``boundjax[ray]`` (also in ``dev``).

No home-made scheduler: this is a thin, typed front to the two standard ones.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
from typing import Any, Callable, Iterable, Sequence

EXECUTORS = ("serial", "process", "ray")


def check_executor(executor: str, address: str | None = None) -> str:
  """The executor name to use (``"ray"`` when an address is given); raises on an unknown name."""
  if address is not None:
    return "ray"
  if executor not in EXECUTORS:
    raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}.")
  return executor


def _worker_init() -> None:
  os.environ.setdefault("JAX_PLATFORMS", "cpu")


def run_jobs(fn: Callable[[Any], Any], jobs: Iterable[Any], *, executor: str = "process",
             workers: int | None = None, address: str | None = None, progress: bool = False,
             desc: str = "jobs") -> list[Any]:
  """``[fn(job) for job in jobs]``, computed by ``executor``; results in job order.

  Args:
    fn: a module-level (picklable) function of one job.
    jobs: picklable job descriptions.
    executor: ``"process"``, ``"serial"`` or ``"ray"``.
    workers: pool size (default: the CPU count); for a local Ray instance, its ``num_cpus``.
    address: a Ray cluster address; implies ``executor="ray"``.
    progress: show a tqdm bar labelled ``desc``.
  """
  jobs = list(jobs)
  executor = check_executor(executor, address)
  if workers is not None and workers < 1:
    raise ValueError(f"workers must be >= 1, got {workers}.")
  bar = None
  if progress:
    from tqdm.auto import tqdm
    bar = tqdm(total=len(jobs), desc=desc, unit="job")
  try:
    if executor == "serial" or not jobs:
      out = []
      for job in jobs:
        out.append(fn(job))
        if bar is not None:
          bar.update(1)
      return out
    if executor == "ray":
      return _ray_jobs(fn, jobs, workers, address, bar)
    n = min(workers or os.cpu_count() or 1, len(jobs))
    with cf.ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn"),
                                initializer=_worker_init) as pool:
      futures = [pool.submit(fn, job) for job in jobs]
      if bar is not None:
        for _ in cf.as_completed(futures):
          bar.update(1)
      return [f.result() for f in futures]
  finally:
    if bar is not None:
      bar.close()


def _ray_jobs(fn: Callable, jobs: Sequence[Any], workers: int | None, address: str | None,
              bar) -> list[Any]:
  try:
    import ray
  except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("executor='ray' needs the optional extra: pip install 'boundjax[ray]'") from e
  started = False
  if not ray.is_initialized():
    if address is not None:
      ray.init(address=address)
    else:
      ray.init(num_cpus=workers or os.cpu_count() or 1, include_dashboard=False,
               log_to_driver=False)
    started = True
  try:
    remote = ray.remote(fn)
    refs = [remote.remote(job) for job in jobs]
    if bar is not None:
      pending = list(refs)
      while pending:
        done, pending = ray.wait(pending, num_returns=1)
        bar.update(len(done))
    return list(ray.get(refs))
  finally:
    if started and address is None:
      ray.shutdown()

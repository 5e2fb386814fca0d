"""Independent jobs in parallel: in this process, a local process pool, or a Ray cluster.

The one executor of the package (MILP solves of LDCP, Sphynx §3, and
of LUCID's iDP-DB, LUCID §4, Def. 4.1; chunked leave-out training).
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

Two entry points: `run_jobs` for one batch of jobs, and `Executor` for many batches in a row (a
branch-and-bound solving the children of one node at a time), which keeps its pool or Ray
connection between batches instead of paying the start-up for each.

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


def check_workers(workers: int | None) -> int | None:
  """``workers`` unchanged when it is ``None`` or an integer >= 1; raises otherwise."""
  if workers is not None and (not isinstance(workers, int) or workers < 1):
    raise ValueError(f"workers must be an integer >= 1 or None, got {workers!r}.")
  return workers


def _worker_init() -> None:
  os.environ.setdefault("JAX_PLATFORMS", "cpu")


class Executor:
  """A reusable executor: ``map(fn, jobs)`` any number of times, then `close` (or ``with``).

  The process pool (``workers`` processes, default the CPU count) or the Ray connection is made
  on the first ``map`` and kept until `close`; a local Ray instance started here is shut down
  there (one started elsewhere, or a cluster, is left running).

  Args:
    executor: ``"process"``, ``"serial"`` or ``"ray"``.
    workers: pool size (default: the CPU count); for a local Ray instance, its ``num_cpus``.
    address: a Ray cluster address; implies ``executor="ray"``.
  """

  def __init__(self, executor: str = "process", *, workers: int | None = None,
               address: str | None = None):
    self.kind = check_executor(executor, address)
    self.workers = check_workers(workers)
    self.address = address
    self._pool: cf.ProcessPoolExecutor | None = None
    self._ray_started = False

  def __enter__(self) -> "Executor":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def map(self, fn: Callable[[Any], Any], jobs: Iterable[Any], *, progress: bool = False,
          desc: str = "jobs") -> list[Any]:
    """``[fn(job) for job in jobs]`` on this executor, in job order (tqdm bar if ``progress``)."""
    jobs = list(jobs)
    bar = None
    if progress:
      from tqdm.auto import tqdm
      bar = tqdm(total=len(jobs), desc=desc, unit="job")
    try:
      if self.kind == "serial" or not jobs:
        out = []
        for job in jobs:
          out.append(fn(job))
          if bar is not None:
            bar.update(1)
        return out
      if self.kind == "ray":
        return self._ray_map(fn, jobs, bar)
      if self._pool is None:
        self._pool = cf.ProcessPoolExecutor(max_workers=self.workers or os.cpu_count() or 1,
                                            mp_context=mp.get_context("spawn"),
                                            initializer=_worker_init)
      futures = [self._pool.submit(fn, job) for job in jobs]
      if bar is not None:
        for _ in cf.as_completed(futures):
          bar.update(1)
      return [f.result() for f in futures]
    finally:
      if bar is not None:
        bar.close()

  def _ray_map(self, fn: Callable, jobs: Sequence[Any], bar) -> list[Any]:
    try:
      import ray
    except ImportError as e:  # pragma: no cover - depends on the environment
      raise ImportError("executor='ray' needs the optional extra: "
                        "pip install 'boundjax[ray]'") from e
    if not ray.is_initialized():
      if self.address is not None:
        ray.init(address=self.address)
      else:
        ray.init(num_cpus=self.workers or os.cpu_count() or 1, include_dashboard=False,
                 log_to_driver=False)
        self._ray_started = True
    refs = [ray.remote(fn).remote(job) for job in jobs]
    if bar is not None:
      pending = list(refs)
      while pending:
        done, pending = ray.wait(pending, num_returns=1)
        bar.update(len(done))
    return list(ray.get(refs))

  def close(self) -> None:
    """Shuts the pool down (pending jobs cancelled) and a local Ray instance started here."""
    if self._pool is not None:
      self._pool.shutdown(cancel_futures=True)
      self._pool = None
    if self._ray_started:
      import ray
      ray.shutdown()
      self._ray_started = False


def run_jobs(fn: Callable[[Any], Any], jobs: Iterable[Any], *, executor: str = "process",
             workers: int | None = None, address: str | None = None, progress: bool = False,
             desc: str = "jobs") -> list[Any]:
  """``[fn(job) for job in jobs]``, computed by ``executor``; results in job order.

  Args:
    fn: a module-level (picklable) function of one job.
    jobs: picklable job descriptions.
    executor: ``"process"``, ``"serial"`` or ``"ray"``.
    workers: pool size (default: the CPU count, at most one process per job); for a local Ray
      instance, its ``num_cpus``.
    address: a Ray cluster address; implies ``executor="ray"``.
    progress: show a tqdm bar labelled ``desc``.
  """
  jobs = list(jobs)
  kind = check_executor(executor, address)
  workers = check_workers(workers)
  if kind == "process":
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
  with Executor(kind, workers=workers, address=address) as ex:
    return ex.map(fn, jobs, progress=progress, desc=desc)

"""Independent verification jobs in parallel, through the package's one executor.

OR-Tools models are not picklable, so a job ships its *description* — the `Network` (numpy
arrays), the `Neighbourhood`, the label and the solver settings — and the worker builds and solves
the model (`run_job`). `solve_many` hands the jobs to `boundjax.executor.run_jobs` (serial, a
spawn process pool, or Ray); results come back in job order.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from boundjax.executor import run_jobs
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


def solve_many(jobs: Sequence[VerifyJob], executor: str = "process", workers: int | None = None,
               address: str | None = None, progress: bool = False) -> list[VerifyResult]:
  """``[run_job(j) for j in jobs]`` by `boundjax.executor.run_jobs`, in order.

  Args:
    jobs: `VerifyJob` descriptions.
    executor: ``"process"``, ``"serial"`` or ``"ray"``.
    workers: pool size (default: the CPU count); for a local Ray instance, its ``num_cpus``.
    address: a Ray cluster address; implies ``executor="ray"``.
    progress: show a tqdm bar.
  """
  return run_jobs(run_job, jobs, executor=executor, workers=workers, address=address,
                  progress=progress, desc="MILP jobs")

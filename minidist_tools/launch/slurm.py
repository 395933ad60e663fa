"""Whether the launcher runs inside a Slurm allocation, and what it got: read from Slurm's variables.

Inside ``sbatch`` or ``salloc`` Slurm tells every process of the job its allocation through the
environment (sbatch(1), "OUTPUT ENVIRONMENT VARIABLES"): ``SLURM_JOB_ID``, ``SLURM_JOB_NODELIST``
(``node[0-1]``), ``SLURM_JOB_NUM_NODES``, ``SLURM_NTASKS`` (when the job asked for tasks) and
``SLURM_RESTART_COUNT`` (how often it was requeued). There ``minidist launch -- python train.py`` needs
no ``-n``: it runs one rank per task, and MPICH's mpiexec finds the nodes in the same variables and
starts its helpers on them with ``srun``, so every restart stays within the allocation. This module
imports nothing but the standard library.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Allocation:
    """A Slurm job's allocation: its id, nodes, tasks (None when the job asked for nodes only) and
    requeues."""

    job_id: str
    nodelist: str
    num_nodes: int
    ntasks: int | None
    restart_count: int

    def describe(self) -> str:
        tasks = f", {self.ntasks} tasks" if self.ntasks is not None else ""
        again = f", requeued {self.restart_count} time(s)" if self.restart_count else ""
        return f"Slurm job {self.job_id}: {self.num_nodes} node(s) {self.nodelist}{tasks}{again}"


def _int(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isdigit() else None


def allocation(environ: Mapping[str, str] = os.environ) -> Allocation | None:
    """The allocation this process runs in, or None outside Slurm (no ``SLURM_JOB_ID``)."""
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job:
        return None
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or "?"
    num_nodes = _int(environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES")) or 1
    return Allocation(
        job_id=job,
        nodelist=nodelist,
        num_nodes=num_nodes,
        ntasks=_int(environ.get("SLURM_NTASKS")),
        restart_count=_int(environ.get("SLURM_RESTART_COUNT")) or 0,
    )

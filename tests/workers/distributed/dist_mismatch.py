"""MPI worker (2 ranks) where the ranks disagree on a message length; it must fail, not hang.

Usage: ``mpiexec -n 2 python dist_mismatch.py MODE`` with MODE one of

* ``recv-long``: rank 0 sends 5 float64, rank 1 receives into 4;
* ``recv-short``: rank 0 sends 3 float64, rank 1 receives into 4 (MPI alone would accept this and
  leave the last element stale);
* ``all_reduce-lengths``: rank 0 all-reduces 4 elements, rank 1 six (a ring chunk has the wrong length).

The receiving side raises ``DistributedError``; ``run_worker`` prints it and aborts the job, so
``mpiexec`` exits non-zero. The test checks the exit code and the message.
"""

from __future__ import annotations

import sys

import numpy as np
from dist_worker_utils import run_worker

import minidist.distributed as dist


def main(mode: str) -> None:
    world = dist.init()
    assert world.size == 2, "run with 2 ranks"
    if mode == "all_reduce-lengths":
        dist.all_reduce(np.ones(4 if world.rank == 0 else 6), algorithm="ring")
    else:
        sent = {"recv-long": 5, "recv-short": 3}[mode]
        if world.rank == 0:
            dist.send(np.arange(sent, dtype=np.float64), dst=1)
        else:
            dist.recv(np.zeros(4), src=0)
    # Only reached if no error was raised: rank 0 waits here until rank 1's abort ends the job.
    world.barrier()
    print(f"rank {world.rank}: no error raised")


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])

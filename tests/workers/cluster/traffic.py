"""Where the ranks of a cluster in a box landed, and an all-reduce big enough to see on the links.

    mpiexec ... -n N python traffic.py OUT_DIR MEBIBYTES

Every rank writes OUT_DIR/rank{r}.json: its hostname, MPI's processor name, the size of its
shared-memory group (MPI.COMM_TYPE_SHARED: the ranks MPI considers on its node), whether
``dist.all_reduce`` of MEBIBYTES MiB of float64 (rank r contributes r + 1 everywhere) gave the exact
sum, and how many seconds it took.
The test compares the links' byte counters before and after with the all-reduced size.
"""

import socket
import sys
import time
from pathlib import Path

import numpy as np
from dist_worker_utils import run_worker, write_json
from mpi4py import MPI

import minidist.distributed as dist


def main(out: Path, mebibytes: float) -> None:
    dist.init()
    rank, size = dist.get_rank(), dist.get_world_size()
    a = np.full(int(mebibytes * 2**20) // 8, rank + 1, dtype=np.float64)
    dist.barrier()
    start = time.perf_counter()
    dist.all_reduce(a)
    seconds = time.perf_counter() - start
    exact = size * (size + 1) / 2  # small integers: the sum is exact in float64
    record = {
        "hostname": socket.gethostname(),
        "processor_name": MPI.Get_processor_name(),
        "shared_memory_size": MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED).Get_size(),
        "sum_is_exact": bool(np.all(a == exact)),
        "seconds": seconds,
    }
    write_json(out, f"rank{rank}.json", record)


run_worker(main, Path(sys.argv[1]), float(sys.argv[2]))

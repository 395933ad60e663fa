"""What minidist sees of the nodes it was started on (by srun, or by mpiexec inside an allocation).

    srun --mpi=pmi2 -N2 -n4 python slurm_nodes.py OUT_DIR

Every rank writes OUT_DIR/rank{r}.json: its hostname, MPI's processor name, minidist's node count and
its node layout (node index, local rank, number of nodes), the Slurm node and task ids Slurm gave it,
and whether an all-reduce across the nodes (``dist.all_reduce``, hierarchical when the world spans
nodes) gave the exact sum.
"""

import os
import socket
import sys
from pathlib import Path

import numpy as np
from dist_worker_utils import run_worker, write_json
from mpi4py import MPI

import minidist.distributed as dist
from minidist.distributed import world
from minidist.distributed.topology import node_layout


def main(out: Path) -> None:
    dist.init()
    rank, size = dist.get_rank(), dist.get_world_size()
    layout = node_layout()
    a = np.full(1000, rank + 1, dtype=np.float64)
    dist.all_reduce(a)
    record = {
        "hostname": socket.gethostname(),
        "processor_name": MPI.Get_processor_name(),
        "node_count": world.node_count(),
        "nodes": layout.nodes,
        "node": layout.node_of_rank[rank],
        "local_rank": layout.local_rank,
        "slurm_nodeid": os.environ.get("SLURM_NODEID"),
        "slurmd_nodename": os.environ.get("SLURMD_NODENAME"),
        "sum_is_exact": bool(np.all(a == size * (size + 1) / 2)),
    }
    write_json(out, f"rank{rank}.json", record)


run_worker(main, Path(sys.argv[1]))

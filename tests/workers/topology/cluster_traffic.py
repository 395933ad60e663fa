"""MPI worker: ``repeats`` all-reduces of ``nbytes`` bytes with one algorithm, for counting link bytes.

Usage (on a cluster): ``python cluster_traffic.py ALGORITHM NBYTES REPEATS``. Rank r contributes
``r + 1`` in every element, so each result must be ``n (n + 1) / 2`` everywhere; a wrong one raises
(and ``run_worker`` ends the job). ``tests/distributed/test_topology.py`` reads the nodes' link counters
around two such runs (ring, hierarchical) and compares the bytes that crossed.
"""

from __future__ import annotations

import sys

import numpy as np
from dist_worker_utils import run_worker

import minidist.distributed as dist


def main(algorithm: str, nbytes: str, repeats: str) -> None:
    world = dist.init()
    a = np.empty(int(nbytes) // 8, dtype=np.float64)
    for _ in range(int(repeats)):
        a.fill(world.rank + 1)
        dist.all_reduce(a, group=world, algorithm=algorithm)
        expected = world.size * (world.size + 1) / 2
        if not np.all(a == expected):
            raise AssertionError(f"{algorithm}: got {np.unique(a)[:5]}, expected {expected} everywhere")


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])

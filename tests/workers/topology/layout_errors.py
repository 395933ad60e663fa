"""MPI worker: with a malformed ``MINIDIST_RANKS_PER_NODE`` every entry point raises ``ValueError``.

Usage: ``MINIDIST_RANKS_PER_NODE=two mpiexec -n 2 python layout_errors.py OUT_DIR``. Each rank writes
``rank<r>.json``: the messages of the errors raised by ``node_layout``, a hierarchical ``all_reduce``
and ``ProcessMesh`` (the test checks there are three, on every rank, each naming the variable).
"""

from __future__ import annotations

import sys

import numpy as np
from dist_worker_utils import run_worker, write_json

import minidist.distributed as dist
from minidist.distributed.topology import node_layout
from minidist.parallel import ProcessMesh


def main(out_dir: str) -> None:
    world = dist.init()
    errors = []
    for attempt in (
        lambda: node_layout(world),
        lambda: dist.all_reduce(np.ones(3), group=world, algorithm="hierarchical"),
        lambda: ProcessMesh(dp=world.size),
    ):
        try:
            attempt()
        except ValueError as error:
            errors.append(str(error))
    write_json(out_dir, f"rank{world.rank}.json", errors)


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])

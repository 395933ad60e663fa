"""A script whose error only some ranks raise, ended as train_mlp.py ends: ``exit_with_error``.

Usage: error_on_some_ranks.py RANK [RANK ...]

The listed ranks raise ``ValueError("bad input on rank r")`` while the others wait in a collective
(a barrier), as healthy ranks wait in the next all-reduce when a file is missing on one node. The
failing ranks must each print their own error once, with their true rank, and end the job.
"""

from __future__ import annotations

import sys

import minidist.distributed as dist
from minidist_tools.report import exit_with_error

if __name__ == "__main__":
    failing = {int(r) for r in sys.argv[1:]}
    try:
        world = dist.init()
        if world.rank in failing:
            raise ValueError(f"bad input on rank {world.rank}")
        dist.barrier()
    except ValueError as error:
        exit_with_error(error, code=2)

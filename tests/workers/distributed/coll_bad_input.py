"""MPI worker: every documented misuse raises the documented exception, with a helpful message.

Usage: ``mpiexec -n 2 python coll_bad_input.py OUT_DIR``. All the errors checked here are found by the
argument checks before any message is sent, so each rank raises on its own and nobody hangs. Each rank
writes ``rank<r>.json``: the number of checks and a list of failures. At the end the ranks run one valid
all_reduce, to show that a caught error leaves the group usable.
"""

from __future__ import annotations

import sys

import numpy as np
from dist_worker_utils import run_worker, write_json
from mpi4py import MPI

import minidist.distributed as dist


def main(out_dir: str) -> None:
    world = dist.init()
    report = {"checks": 0, "failures": []}
    a = np.ones(6)
    read_only = np.ones(6)
    read_only.flags.writeable = False

    def expect(error: type, fragments: list[str], call, *args, **kwargs) -> None:
        """``call(*args, **kwargs)`` must raise ``error`` with every fragment in its message."""
        report["checks"] += 1
        name = f"{call.__name__}{args}{kwargs}"
        try:
            call(*args, **kwargs)
        except error as e:
            missing = [f for f in fragments if f not in str(e)]
            if missing:
                report["failures"].append(f"{name}: message {str(e)!r} lacks {missing}")
            return
        except Exception as e:
            report["failures"].append(f"{name}: raised {type(e).__name__}: {e}, expected {error.__name__}")
            return
        report["failures"].append(f"{name}: raised nothing, expected {error.__name__}")

    ops = ["'sum', 'avg', 'max', 'min'"]
    expect(ValueError, ["'prod'", *ops], dist.all_reduce, a, op="prod")
    expect(ValueError, ["'prod'", *ops], dist.reduce_scatter, a, op="prod")
    all_reduce_algorithms = "'auto', 'ring', 'recursive_doubling', 'rabenseifner', 'hierarchical', 'mpi'"
    expect(ValueError, ["'butterfly'", all_reduce_algorithms], dist.all_reduce, a, algorithm="butterfly")
    expect(ValueError, ["'tree'", "'auto', 'ring', 'mpi'"], dist.all_gather, a, algorithm="tree")
    broadcast_algorithms = "'auto', 'tree', 'scatter_allgather', 'mpi'"
    expect(ValueError, ["'ring'", broadcast_algorithms], dist.broadcast, a, algorithm="ring")
    expect(ValueError, ["'ring'", "'auto', 'tree', 'mpi'"], dist.reduce, a, algorithm="ring")
    expect(ValueError, ["'prod'", *ops], dist.reduce, a, op="prod")
    expect(ValueError, ["dst=2", "0..1"], dist.reduce, a, dst=2)
    expect(TypeError, ["dst", "int"], dist.reduce, a, dst="0")
    expect(ValueError, ["read-only"], dist.reduce, read_only)
    expect(TypeError, ["avg", "float", "int32"], dist.reduce, np.ones(3, dtype=np.int32), op="avg")
    expect(ValueError, ["C-contiguous", "ascontiguousarray"], dist.all_reduce, np.ones((4, 4)).T)
    expect(ValueError, ["C-contiguous"], dist.all_gather, np.ones(8)[::2])
    expect(ValueError, ["read-only"], dist.all_reduce, read_only)
    expect(TypeError, ["avg", "float", "int64"], dist.all_reduce, np.ones(3, dtype=np.int64), op="avg")
    expect(TypeError, ["bool"], dist.all_reduce, np.ones(3, dtype=bool))
    expect(TypeError, ["NumPy or CuPy array", "list"], dist.all_reduce, [1.0, 2.0])
    expect(ValueError, ["src=5", "0..1"], dist.broadcast, a, src=5)
    expect(TypeError, ["src", "int"], dist.broadcast, a, src=0.0)
    expect(ValueError, ["dst=7", "0..1"], dist.send, a, 7)
    expect(ValueError, ["this rank itself"], dist.send, a, world.rank)
    expect(ValueError, ["this rank itself"], dist.recv, a, world.rank)
    expect(ValueError, ["tag=40000"], dist.send, a, 1 - world.rank, tag=40000)
    expect(TypeError, ["Communicator", "Intracomm"], dist.all_reduce, a, group=MPI.COMM_WORLD)
    expect(ValueError, ["color"], world.split, -1)

    # The group still works after all those errors.
    b = np.full(3, float(world.rank))
    dist.all_reduce(b)
    report["checks"] += 1
    if not np.array_equal(b, np.full(3, 1.0)):
        report["failures"].append(f"all_reduce after the errors gave {b}")
    b = np.full(3, float(world.rank + 1))
    dist.reduce(b, dst=1)
    report["checks"] += 1
    if not np.array_equal(b, np.full(3, 3.0 if world.rank == 1 else 1.0)):
        report["failures"].append(f"reduce after the errors gave {b} on rank {world.rank}")
    write_json(out_dir, f"rank{world.rank}.json", report)


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])

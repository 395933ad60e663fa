"""MPI worker (4 ranks) for debug mode, timeouts and abort-on-error: the ranks misbehave on purpose.

Usage: ``mpiexec -n 4 python dist_checks.py MODE OUT_DIR``, with ``MINIDIST_DEBUG`` / ``MINIDIST_TIMEOUT``
set by the test. MODE is one of

* ``results``: a run with no mistakes (every collective, on the world and on two sub-groups); each rank
  saves its results to ``rank<r>.npz``, so runs with and without the checks can be compared;
* ``other-collective``: rank 2 calls ``all_gather`` while the others call ``all_reduce``;
* ``other-length``: rank 1 all-reduces 99 elements, the others 100;
* ``skip-last``: rank 3 skips the last ``all_reduce`` and ends the program;
* ``late``: rank 3 sleeps (a long computation) instead of joining collective #2;
* ``barrier-instead``: rank 3 calls ``barrier`` while the others call ``all_reduce``;
* ``crash``: rank 1 raises ``RuntimeError`` while the others wait in ``all_reduce``;
* ``abort``: rank 1 calls ``dist.abort`` (exit code 3) while the others wait in ``all_reduce``;
* ``slow-finish``: no mistake: rank 0 works longer than the timeout after the last collective, while
  the others end the program (this must not be taken for a hang).

A rank that gets a ``DistributedError`` writes ``rank<r>.json`` (error type, message, seconds spent in
the failing call) and re-raises it: uncaught, it goes to the hook ``dist.init()`` installs, which prints
it and aborts the job. This worker deliberately does not use ``run_worker``, to test that hook.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from dist_worker_utils import write_json

import minidist.distributed as dist


def results(world: dist.Communicator, out_dir: Path) -> None:
    rank = world.rank
    x = np.arange(12, dtype=np.float32) * (rank + 1)
    out = {}
    for algorithm in ("auto", "ring", "mpi"):
        out[f"all_reduce_{algorithm}"] = dist.all_reduce(x.copy(), op="sum", algorithm=algorithm)
    out["reduce_scatter"] = dist.reduce_scatter(x, op="max")
    out["all_gather"] = dist.all_gather(np.full(rank + 1, rank, dtype=np.int64))  # unequal lengths
    out["broadcast"] = dist.broadcast(x.copy(), src=2)
    out["reduce"] = dist.reduce(x.copy(), dst=1, op="min")
    dist.barrier()
    parity = world.split(rank % 2)  # two sub-groups: {0, 2} and {1, 3}
    out["parity_all_reduce"] = dist.all_reduce(x.copy(), op="avg", group=parity)
    dist.barrier(parity)
    if rank == 0:
        dist.send(x, dst=1)
    elif rank == 1:
        out["recv"] = dist.recv(np.empty_like(x), src=0)
    np.savez(out_dir / f"rank{rank}.npz", **out)


def misbehave(mode: str, world: dist.Communicator) -> None:
    rank = world.rank
    dist.all_reduce(np.ones(4))  # collective #1: everybody agrees
    if mode == "other-collective":
        if rank == 2:
            dist.all_gather(np.ones(50, dtype=np.float32))
        else:
            dist.all_reduce(np.ones(100, dtype=np.float32))
    elif mode == "other-length":
        dist.all_reduce(np.ones(99 if rank == 1 else 100, dtype=np.float32))
    elif mode == "skip-last":
        if rank != 3:
            dist.all_reduce(np.ones(4))
    elif mode == "late":
        if rank == 3:
            time.sleep(60)  # far longer than the test's timeout: the others must not wait for it
        dist.all_reduce(np.ones(100_000, dtype=np.float32), algorithm="ring")
    elif mode == "barrier-instead":
        if rank == 3:
            dist.barrier()
        else:
            dist.all_reduce(np.ones(100_000, dtype=np.float32), algorithm="ring")
    elif mode == "slow-finish":
        if rank == 0:
            time.sleep(dist.timeout_seconds() + 1)  # e.g. writing the results
    elif mode == "crash":
        if rank == 1:
            raise RuntimeError("rank 1 fails on purpose")
        dist.all_reduce(np.ones(4))
    elif mode == "abort":
        if rank == 1:
            dist.abort("rank 1 gives up on purpose", code=3)
        dist.all_reduce(np.ones(4))
    else:
        raise ValueError(f"unknown mode {mode!r}")


def main(mode: str, out_dir: str) -> None:
    world = dist.init()
    assert world.size == 4, "run with 4 ranks"
    if mode == "results":
        results(world, Path(out_dir))
        return
    start = time.monotonic()
    try:
        misbehave(mode, world)
    except dist.DistributedError as error:
        report = {"type": type(error).__name__, "message": str(error), "seconds": time.monotonic() - start}
        write_json(out_dir, f"rank{world.rank}.json", report)
        raise
    print(f"rank {world.rank}: finished")


if __name__ == "__main__":
    main(*sys.argv[1:])

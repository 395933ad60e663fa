"""MPI worker for the default liveness checks and debug-mode call sites: ranks misbehave the way users do.

Usage: ``mpiexec -n N python dist_liveness.py MODE OUT_DIR`` (no ``MINIDIST_TIMEOUT``; ``MINIDIST_DEBUG``
only where the test sets it). MODE is one of

* ``exit`` (3 ranks): rank 1 calls ``sys.exit(0)`` in the middle of a loop of ``all_reduce``;
* ``return-subgroup`` (4 ranks): on the sub-groups {0, 2} and {1, 3} (like a data-parallel group), rank 3
  returns out of its training loop one step early, while rank 1 still all-reduces;
* ``return-subgroup-gc`` (4 ranks): the same, but the loop is a function that creates the sub-group,
  and rank 3 goes on with other work after it returns (Python collects the sub-group meanwhile);
* ``ddp-short`` (4 ranks): DistributedDataParallel on the data-parallel groups {0, 2} and {1, 3};
  rank 3's data runs out one step early, so it leaves the training loop while rank 1 waits in the
  gradient all-reduce of its backward pass (run by DDP's communication thread);
* ``broadcast-src`` (2 ranks): each rank thinks it is the ``src`` of a broadcast, then all ranks
  all-reduce (its receive takes the stale broadcast message: it raises, naming it; before tags, wrong
  numbers and exit 0);
* ``op`` (2 ranks): rank 1 all-reduces with ``op="max"``, rank 0 with ``"sum"``;
* ``dtype`` (2 ranks): rank 1 all-reduces int32, rank 0 float32 (the same number of bytes);
* ``numpy-src`` (3 ranks, a correct program): the ranks pick the broadcast's ``src`` and the reduce's
  ``dst`` with ``np.argmin`` (a NumPy integer); rank 0 passes it on as it is, the others as ``int``,
  and rank 0 reads ``op`` from a NumPy string array (its messages used to carry another tag: abort);
* ``stop`` (3 ranks): rank 1 freezes (``SIGSTOP``, as a node whose link is cut looks to the others)
  in the middle of a loop of ``all_reduce``;
* ``stop-p2p`` (2 ranks): rank 1 freezes while rank 0 waits to receive a message from it
  (``recv``, as a pipeline stage waits for the previous stage's activations);
* ``slow`` (3 ranks, a correct program): rank 1 sleeps 5 s before its third ``all_reduce`` (a slow
  step, not a failure: its watchdog thread still answers the others' heartbeats);
* ``order`` (2 ranks): the ranks all-reduce two metrics of the same shape in a different order, from
  different lines (wrong numbers, exit 0, even in debug mode, before call sites were compared).

A rank that finishes writes ``rank<r>.json`` with its results; a rank that gets a ``DistributedError``
writes it with the error, then re-raises it (the abort hook ends the job).
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import time

import numpy as np
from dist_worker_utils import report_misbehaviour

import minidist.distributed as dist


def train_on_a_subgroup(world: dist.Communicator, x: np.ndarray) -> bool:
    dp = world.split(world.rank % 2)  # {0, 2} and {1, 3}, local to this function
    for step in range(4):
        if world.rank == 3 and step == 3:
            return True  # rank 3 returns one step early
        dist.all_reduce(x, op="avg", group=dp)
    return False


def misbehave(mode: str, world: dist.Communicator) -> dict:
    rank = world.rank
    x = np.full(8, rank + 1, dtype=np.float32)
    if mode == "exit":
        for step in range(4):
            if rank == 1 and step == 2:
                sys.exit(0)
            dist.all_reduce(x)
    elif mode == "stop":
        for step in range(4):
            if rank == 1 and step == 2:
                os.kill(os.getpid(), signal.SIGSTOP)
            dist.all_reduce(x)
    elif mode == "stop-p2p":
        if rank == 1:
            os.kill(os.getpid(), signal.SIGSTOP)
        world.recv(x, src=1, tag=7)
    elif mode == "slow":
        for step in range(4):
            if rank == 1 and step == 2:
                time.sleep(5)
            dist.all_reduce(x)
    elif mode == "return-subgroup":
        dp = world.split(rank % 2)  # {0, 2} and {1, 3}
        for step in range(4):
            if rank == 3 and step == 3:
                return {"left": True}  # out of the loop: the program ends
            dist.all_reduce(x, op="avg", group=dp)
    elif mode == "return-subgroup-gc":
        left = train_on_a_subgroup(world, x)  # the sub-group is garbage once this returns
        gc.collect()  # what any later allocation-heavy work (evaluation, saving) would trigger
        time.sleep(5)  # that work: the waiting rank must not need rank 3 to exit
        return {"left": left}
    elif mode == "ddp-short":
        from ddp_common import make_model

        import minidist as md
        from minidist import nn, optim
        from minidist.parallel import DistributedDataParallel

        dp = world.split(rank % 2)
        ddp = DistributedDataParallel(make_model(0, np.float64), group=dp, overlap=True)
        opt = optim.SGD(ddp.parameters(), lr=0.1)
        rng = np.random.default_rng(rank)
        for _step in range(3 if rank == 3 else 4):  # rank 3's shard of the data is one batch shorter
            x, y = md.tensor(rng.standard_normal((4, 6))), rng.integers(0, 4, 4)
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            opt.zero_grad()
        return {"steps": _step + 1}
    elif mode == "broadcast-src":
        dist.broadcast(x, src=rank)  # every rank thinks it is the source
        dist.all_reduce(x)
        time.sleep(1)  # a little more work before the end
    elif mode == "op":
        dist.all_reduce(x, op="max" if rank == 1 else "sum")
    elif mode == "dtype":
        dist.all_reduce(x.astype(np.int32) if rank == 1 else x)
    elif mode == "numpy-src":
        best = np.argmin(np.array([3.0, 1.0, 2.0]))  # rank 1, as an np.int64
        root = best if rank == 0 else int(best)  # the same rank, as another Python type
        op = np.array(["max"])[0] if rank == 0 else "max"  # an np.str_ equal to "max"
        dist.broadcast(x, src=root)
        y = np.full(4, rank + 1.0)
        dist.reduce(y, op=op, dst=root)
        z = np.full(4, rank + 1.0)
        dist.all_reduce(z, op=op)
        return {"x": x.tolist(), "y": y.tolist(), "z": z.tolist()}
    elif mode == "order":
        loss, acc = np.full(4, 1.0 + rank), np.full(4, 10.0 + rank)
        if rank == 0:
            dist.all_reduce(loss)
            dist.all_reduce(acc)
        else:
            dist.all_reduce(acc)
            dist.all_reduce(loss)
        return {"loss": loss.tolist(), "acc": acc.tolist()}
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return {"x": x.tolist()}


def main(mode: str, out_dir: str) -> None:
    report_misbehaviour(misbehave, mode, out_dir)


if __name__ == "__main__":
    main(*sys.argv[1:])

"""What one look of the liveness watchdog at a communicator costs, and the heartbeats' share of it.

Usage: ``mpiexec -n N python benchmarks/watchdog_look.py [--rounds 30] [--calls 2000]``

The watchdog thread looks at every communicator every ``liveness.TICK`` seconds
(``liveness.inspect_channel``: departure notices, stray messages, deadlines and, since issue 20, the
heartbeats' ``heartbeat.answer``: answering pings and taking in pongs). Both are timed alternately in
one run (so machine load hits them alike); rank 0 prints the minimum and the median per call over the
rounds, and the share of a core the look takes at ten looks a second.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import minidist.distributed as dist
from minidist.distributed.safety import heartbeat, liveness


def per_call(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--calls", type=int, default=2000)
    args = p.parse_args()
    world = dist.init()
    # A spare communicator, on which nothing else is sent: its look finds no message, as most ticks do.
    link = dist.Communicator(world.mpi).collective_channel
    looks, answers = [], []
    for _ in range(args.rounds):
        looks.append(per_call(lambda: liveness.inspect_channel(link, None), args.calls))
        answers.append(per_call(lambda: heartbeat.answer(link), args.calls))
    if world.rank == 0:
        look, answer = min(looks), min(answers)
        print(
            f"n={world.size}: one look {look * 1e6:.1f} us (median {np.median(looks) * 1e6:.1f}), of which "
            f"heartbeat.answer {answer * 1e6:.1f} us (median {np.median(answers) * 1e6:.1f}); "
            f"{look / liveness.TICK:.4%} of a core per communicator"
        )
    world.mpi.Barrier()


if __name__ == "__main__":
    main()

"""Lesson 02: two ranks that both send first, then receive. Small messages get through; large ones hang.

    mpiexec -n 2 python lessons/scripts/deadlock.py --nbytes 1000000 [--fix]

MPI may buffer a small message ("eager" protocol) so that ``send`` returns before the peer receives,
but a large one ("rendezvous") waits until the matching receive is posted. Both ranks then wait in
``send`` for each other forever. Run it with ``MINIDIST_TIMEOUT=3`` to get an error instead of a hang.
``--fix`` uses ``sendrecv``, which posts both halves at once and cannot deadlock.
"""

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import minidist.distributed as dist  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--nbytes", type=int, default=1_000_000)
p.add_argument("--fix", action="store_true")
args = p.parse_args()

world = dist.init()
peer = 1 - world.rank
out = np.full(args.nbytes // 8, float(world.rank))
into = np.empty_like(out)
if args.fix:
    world.sendrecv(out, peer, into, peer)
else:
    world.send(out, peer)  # both ranks are here at the same time...
    world.recv(into, peer)  # ...so for a large message neither ever gets here
print(f"rank {world.rank}: received {args.nbytes} bytes from rank {peer} (first value {into[0]})", flush=True)

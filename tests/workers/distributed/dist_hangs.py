"""MPI worker for mistakes that used to end late or never, with the default settings (2 ranks each).

Usage: ``mpiexec -n 2 python dist_hangs.py MODE OUT_DIR`` (no ``MINIDIST_TIMEOUT``, no ``MINIDIST_DEBUG``).
MODE is one of

* ``broadcast-self`` : each rank broadcasts the initial weights with ``src=rank`` (the slip for
  ``src=0``), then trains a tiny model, averaging its gradients with ``dist.all_reduce``; the
  replicas diverged, and used to train on for about a thousand steps until the watchdog's look;
* ``broadcast-self-ddp``: the same slip, then DistributedDataParallel trains (its constructor
  compares its options across the same group first);
* ``ddp-short-log``: DistributedDataParallel on the world; rank 0's data is one batch shorter, and
  after training every rank logs its loss with ``dist.all_reduce`` on the world: rank 0 waits there,
  rank 1 in DDP's gradient all-reduce (its own channel). Nobody leaves: a hang until the deadline;
* ``send-send``: both ranks ``dist.send`` 16 MiB to each other before receiving (MPICH sends a message
  this large only once the receiver posts its receive): a hang, heartbeats answered;
* ``send-slow-recv`` (a correct program): rank 0 sends 16 MiB; rank 1 computes for 7 s, then receives.

A rank that finishes writes ``rank<r>.json``; one that gets a ``DistributedError`` writes the error and
how many training steps it completed, then re-raises it (the abort hook ends the job).
"""

from __future__ import annotations

import sys
import time

import numpy as np
from ddp_common import make_model
from dist_worker_utils import report_misbehaviour

import minidist as md
import minidist.distributed as dist
from minidist import nn, optim
from minidist.parallel import DistributedDataParallel

progress = {"steps": 0}


def train(model, params, rank: int, steps: int, average: bool) -> float:
    opt = optim.SGD(params, lr=0.1)
    rng = np.random.default_rng(rank)
    for _ in range(steps):
        x, y = md.tensor(rng.standard_normal((4, 6))), rng.integers(0, 4, 4)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        for p in params if average else ():
            dist.all_reduce(p.grad, op="avg")
        opt.step()
        opt.zero_grad()
        progress["steps"] += 1
    return float(loss.data)


def misbehave(mode: str, world: dist.Communicator) -> dict:
    rank = world.rank
    if mode in ("broadcast-self", "broadcast-self-ddp"):
        model = make_model(rank, np.float64)  # a different start on every rank, as before a broadcast
        flat = np.concatenate([p.data.ravel() for p in model.parameters()])
        dist.broadcast(flat, src=rank)  # the slip: every rank names itself
        if mode == "broadcast-self":
            train(model, list(model.parameters()), rank, 5, average=True)
        else:
            ddp = DistributedDataParallel(model)
            train(ddp, list(ddp.parameters()), rank, 5, average=False)
    elif mode == "ddp-short-log":
        ddp = DistributedDataParallel(make_model(0, np.float64))
        loss = train(ddp, list(ddp.parameters()), rank, 3 if rank == 0 else 4, average=False)
        dist.all_reduce(np.array([loss]), op="avg")  # logging, on the world
    elif mode in ("send-send", "send-slow-recv"):
        out, into = np.full(4 << 20, rank, np.float32), np.empty(4 << 20, np.float32)  # 16 MiB each
        if mode == "send-send":
            dist.send(out, dst=1 - rank)
            dist.recv(into, src=1 - rank)
        elif rank == 0:
            dist.send(out, dst=1)
        else:
            time.sleep(7)
            dist.recv(into, src=0)
            return {"received": float(into[0])}
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return {"steps": progress["steps"]}


def main(mode: str, out_dir: str) -> None:
    report_misbehaviour(misbehave, mode, out_dir, extra=lambda: {"steps": progress["steps"]})


if __name__ == "__main__":
    main(*sys.argv[1:])

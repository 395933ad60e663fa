"""MPI worker: the ordinary PyTorch-style training loop, checkpointed at every kind of epoch position.

Usage: ``mpiexec -n R python ckpt_loop.py OUT``. The loop is written as a user writes it (no
bookkeeping of the sampler's position by hand)::

    for epoch in range(sampler.epoch, EPOCHS):
        sampler.set_epoch(epoch)
        for x, y in loader:
            ...step...
            checkpoint.save(..., sampler=sampler)

An uninterrupted run saves checkpoints after the first batch, a middle batch and the last batch of
epoch 0 (inside the loop body), at the boundary after epoch 0 (after the inner loop), and in the middle
of epoch 1 passing the loader itself (``sampler=loader``). Then, for each, a fresh model, optimizer,
sampler and loader load it and run the same loop to the end. Rank 0 writes ``OUT/<case>.npz`` with
the final parameters (``full`` for the uninterrupted run) and ``OUT/steps.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from dist_worker_utils import run_worker

import minidist as md
import minidist.distributed as dist
from minidist import checkpoint, nn, optim
from minidist.data import DataLoader, DistributedSampler
from minidist.parallel import DistributedDataParallel

N_SAMPLES, GLOBAL_BATCH, EPOCHS = 40, 8, 3  # 5 steps per epoch
SAVES = {1: "first", 3: "middle", 5: "last", 8: "loader"}  # step -> case (inside the loop body)


def build(world):
    md.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16, dtype=np.float64), nn.Tanh(), nn.Linear(16, 4, dtype=np.float64))
    ddp = DistributedDataParallel(model)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((N_SAMPLES, 6)), rng.integers(0, 4, N_SAMPLES)
    sampler = DistributedSampler(N_SAMPLES, batch_size=GLOBAL_BATCH, seed=3, drop_last=True)
    loader = DataLoader((x, y), batch_size=sampler.local_batch_size, sampler=sampler)
    return model, ddp, opt, sampler, loader


def run(ddp, opt, sampler, loader, step: int, out: Path | None) -> int:
    """The user's loop; with ``out`` it saves a checkpoint per case in ``out/<case>``."""
    for epoch in range(sampler.epoch, EPOCHS):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(ddp(md.tensor(xb)), yb, reduction="sum") * (
                dist.get_world_size() / GLOBAL_BATCH
            )
            loss.backward()
            opt.step()
            step += 1
            if out is not None and step in SAVES:
                case = SAVES[step]
                state = loader if case == "loader" else sampler
                checkpoint.save(out / case, ddp, opt, step=step, sampler=state)
        if out is not None and epoch == 0:  # the epoch boundary: saved after the inner loop
            checkpoint.save(out / "boundary", ddp, opt, step=step, sampler=sampler)
    return step


def main(out_dir: str) -> None:
    world = dist.init()
    out = Path(out_dir)
    model, ddp, opt, sampler, loader = build(world)
    steps = {"full": run(ddp, opt, sampler, loader, 0, out)}
    if world.rank == 0:
        np.savez(out / "full.npz", **{n: p.numpy() for n, p in model.named_parameters()})
    for case in [*SAVES.values(), "boundary"]:
        model, ddp, opt, sampler, loader = build(world)
        md.manual_seed(99)  # the checkpoint must restore everything that matters, not this seed
        info = checkpoint.load(out / case, ddp, opt, sampler=loader if case == "loader" else sampler)
        steps[case] = [
            info["step"],
            sampler.epoch,
            sampler.position,
            run(ddp, opt, sampler, loader, info["step"], None),
        ]
        if world.rank == 0:
            np.savez(out / f"{case}.npz", **{n: p.numpy() for n, p in model.named_parameters()})
    if world.rank == 0:
        (out / "steps.json").write_text(json.dumps(steps))


if __name__ == "__main__":
    run_worker(main, sys.argv[1])

"""MPI worker: a RandomWindows stream saved by checkpoint.save(..., sampler=) resumes bit-exactly.

Usage: ``mpiexec -n 2 python ckpt_text_windows.py OUT``. Each rank draws microbatches (2 accumulation
steps per global batch), saves a checkpoint in the middle of a global batch (``OUT/mid``) and one at a
step boundary (``OUT/boundary``), and keeps drawing: the uninterrupted stream. A fresh stream then loads
``OUT/mid`` and draws the same number of microbatches. Rank r writes ``OUT/rank<r>.npz``: ``straight``
and ``resumed`` (the microbatches after ``mid``, stacked) and ``after_boundary`` (the rows of the global
batch after ``boundary``, this rank's microbatches concatenated), which the test compares with a
one-process stream that loads ``OUT/boundary``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from dist_worker_utils import run_worker

import minidist as md
import minidist.distributed as dist
from minidist import checkpoint, nn
from minidist.data import RandomWindows

IDS = np.random.default_rng(3).integers(0, 50, size=300)  # the test builds the same stream
BLOCK, BATCH, SEED, ACCUM = 6, 8, 11, 2


def stream(world) -> RandomWindows:
    return RandomWindows(IDS, BLOCK, BATCH, seed=SEED, rank=world.rank, world_size=world.size,
                         accumulation_steps=ACCUM)  # fmt: skip


def main(out_dir: str) -> None:
    world = dist.init()
    out = Path(out_dir)
    md.manual_seed(0)
    model = nn.Linear(2, 2)  # a checkpoint holds a model; the stream is what this test is about
    windows = stream(world)
    for _ in range(2 * ACCUM + 1):  # two global batches and one microbatch of the third
        windows.next()
    checkpoint.save(out / "mid", model, step=1, sampler=windows)
    straight = [windows.next() for _ in range(5)]  # to the end of the 5th global batch
    assert (windows.step, windows.micro) == (5, 0)
    checkpoint.save(out / "boundary", model, step=2, sampler=windows)
    after = [windows.next() for _ in range(ACCUM)]
    resumed_stream = stream(world)
    checkpoint.load(out / "mid", model, sampler=resumed_stream)
    resumed = [resumed_stream.next() for _ in range(5)]
    np.savez(
        out / f"rank{world.rank}.npz",
        straight=np.stack([np.stack(b) for b in straight]),
        resumed=np.stack([np.stack(b) for b in resumed]),
        after_x=np.concatenate([x for x, _ in after]),
        after_y=np.concatenate([y for _, y in after]),
    )


if __name__ == "__main__":
    run_worker(main, sys.argv[1])

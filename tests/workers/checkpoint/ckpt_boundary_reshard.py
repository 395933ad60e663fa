"""MPI worker: the ordinary loop saves between two epochs, and resumes on another number of ranks.

Usage: ``mpiexec -n R python ckpt_boundary_reshard.py MODE DIR OUT [MODE DIR OUT ...]``, MODE ``strided``
or ``global``; several triples run one after another in one launch (starting the ranks costs more).
Each rank holds the whole model (no layout to reshard) and reads the data set through a
``DistributedSampler``: strided (PyTorch's layout), or global batches of 8 (``global``).

The first launch (``DIR`` empty) trains epoch 0 as a user writes it and saves after the inner loop,
with ``sampler=sampler``. A launch that finds the checkpoint loads it and runs the same loop to the
end of epoch 1, with a global batch of 6 in ``global`` mode (the saved 8 fixes no position once the
epoch is finished). Every rank writes ``OUT/rank<r>.json``: ``{"error": ..., "seen": {epoch: sample
indices this rank read}}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from dist_worker_utils import run_worker

import minidist as md
import minidist.distributed as dist
from minidist import checkpoint, nn
from minidist.data import DataLoader, DistributedSampler

N_SAMPLES, EPOCHS = 20, 2


def main() -> None:
    rank = dist.init().rank
    args = sys.argv[1:]
    for i in range(0, len(args), 3):
        run(args[i], Path(args[i + 1]), Path(args[i + 2]), rank)


def run(mode: str, root: Path, out: Path, rank: int) -> None:
    resuming = (root / "latest").exists()
    md.manual_seed(0)
    model = nn.Linear(2, 2)
    index = np.arange(N_SAMPLES)  # the data is the sample index: what a rank reads is what it sees
    global_batch = None if mode == "strided" else (6 if resuming else 8)
    sampler = DistributedSampler(N_SAMPLES, batch_size=global_batch, seed=5)
    local = 3 if global_batch is None else sampler.local_batch_size
    loader = DataLoader((index,), batch_size=local, sampler=sampler)
    result: dict = {"error": None, "seen": {}}
    try:
        if resuming:
            checkpoint.load_latest(root, model, sampler=sampler)
        for epoch in range(sampler.epoch, EPOCHS if resuming else 1):
            sampler.set_epoch(epoch)
            for (batch,) in loader:
                result["seen"].setdefault(str(epoch), []).extend(batch.tolist())
            if not resuming:
                checkpoint.save(root, model, step=1, sampler=sampler)
    except checkpoint.CheckpointError as err:
        result["error"] = str(err)
    (out / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    run_worker(main)

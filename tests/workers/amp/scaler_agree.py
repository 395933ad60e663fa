"""MPI worker: GradScaler agrees on skipping when only one rank's gradients overflow (ZeRO shards).

Usage: ``mpiexec -n 2 python scaler_agree.py OUT_DIR``. A tiny model under ZeroRedundancyOptimizer
(AdamW, stage 2): step 1 is clean on both ranks; in step 2 only rank 1 puts an inf into its local
gradient. With ``group=world`` both ranks must skip step 2 (parameters and AdamW state as after step 1,
the same scale halved, one skipped step); step 3 is clean again and steps on both. Each rank writes
``rank<r>.json``: per step the scale, skipped count and a parameter fingerprint.
"""

from __future__ import annotations

import sys

import numpy as np
from dist_worker_utils import run_worker, write_json

import minidist as md
import minidist.distributed as dist
from minidist import nn, optim
from minidist.amp import GradScaler
from minidist.parallel import ZeroRedundancyOptimizer


def main(out_dir: str) -> None:
    world = dist.init()
    md.manual_seed(0)
    model = nn.Linear(3, 2)
    zero = ZeroRedundancyOptimizer(model.parameters(), optim.AdamW, stage=2, lr=0.1)
    scaler = GradScaler(init_scale=2.0**10, group=world)
    x = md.tensor(np.arange(12, dtype=np.float32).reshape(4, 3) / 10 + world.rank)
    report = {"scale": [], "skipped": [], "params": [], "state_steps": []}
    for step in range(3):
        loss = (model(x) ** 2).mean()
        scaler.scale(loss).backward()
        if step == 1 and world.rank == 1:
            model.weight.grad[0, 0] = np.inf  # an overflow on this rank only
        scaler.step(zero)
        scaler.update()
        zero.zero_grad()
        report["scale"].append(scaler.get_scale())
        report["skipped"].append(scaler.skipped_steps)
        report["params"].append([p.numpy().tolist() for p in model.parameters()])
        report["state_steps"].append(zero.optimizer.step_count)
    write_json(out_dir, f"rank{world.rank}.json", report)


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])

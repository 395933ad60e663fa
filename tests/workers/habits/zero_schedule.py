"""MPI worker: ZeroRedundancyOptimizer driven by an lr scheduler, against one process doing the same.

Usage: ``mpiexec -n N python zero_schedule.py OUT_DIR STAGE OPTIMIZER``. Every rank trains the same
float64 MLP for 8 steps on its numpy.array_split share of one global batch, with ZeRO (stage STAGE,
SGD with momentum or AdamW) and ``cosine_with_warmup`` stepping ``zero.param_groups``; then, alone, a
plain optimizer on the whole batch with the same schedule. It writes ``rank<r>.json``: the largest
difference between the two models and the learning rates both ended with.
"""

from __future__ import annotations

import sys

import numpy as np
from dist_worker_utils import run_worker, write_json

import minidist as md
import minidist.distributed as dist
from minidist import nn, optim
from minidist.optim.lr_scheduler import cosine_with_warmup
from minidist.parallel import ZeroRedundancyOptimizer

KWARGS = {"SGD": dict(lr=0.2, momentum=0.9), "AdamW": dict(lr=0.05)}


def build() -> nn.Module:
    md.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7, dtype=np.float64), nn.GELU(), nn.Linear(7, 3, dtype=np.float64))


def train(model, opt, x, y, share, scale) -> list[float]:
    scheduler = cosine_with_warmup(opt, warmup_steps=2, total_steps=8, start_factor=0.1)
    for _ in range(8):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(
            model(md.tensor(x[share], dtype=np.float64)), y[share], reduction="sum"
        )
        (loss * scale).backward()
        opt.step()
        scheduler.step()
    return [g["lr"] for g in opt.param_groups]


def main(out_dir: str, stage: str, name: str) -> None:
    world = dist.init()
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((12, 5)), rng.integers(0, 3, size=12)
    share = np.array_split(np.arange(12), world.size)[world.rank]

    model = build()
    zero = ZeroRedundancyOptimizer(model.parameters(), getattr(optim, name), stage=int(stage), **KWARGS[name])
    # ZeRO averages the gradients over ranks: scale each rank's sum so that the average is the batch mean.
    zero_lrs = train(model, zero, x, y, share, world.size / 12)

    reference = build()
    ref_lrs = train(
        reference, getattr(optim, name)(reference.parameters(), **KWARGS[name]), x, y, slice(None), 1 / 12
    )
    diff = max(
        float(np.abs(a - b).max())
        for a, b in zip(model.state_dict().values(), reference.state_dict().values())
    )
    write_json(
        out_dir, f"rank{world.rank}.json", {"max_diff": diff, "zero_lrs": zero_lrs, "ref_lrs": ref_lrs}
    )


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])

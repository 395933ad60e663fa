"""Cost of the failure agreement in ``PipelineParallel.predict`` (issue 14, item 8).

    mpiexec -n 2 python benchmarks/predict_failure_check.py

A stage whose layers raise in ``predict`` now sends zeros on, and the ranks then all-gather one int64
(the virtual stage of their first failure) so that every rank raises the same error
(``pipeline/inference.py``). This times, in one run, ``predict`` of a small MLP cut into 2 stages
(the whole call, agreement included) and that one-integer all-gather alone; it prints both medians
and the share of the call the agreement takes.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

import minidist as md
import minidist.distributed as dist
from minidist import nn
from minidist.parallel.pipeline import PipelineParallel


def median_us(work, repeats: int = 200) -> float:
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    world = dist.init()
    md.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    pipe = PipelineParallel(model, world, microbatches=1, cuts=[2])
    x = md.tensor(np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32))
    flag = np.zeros(1, np.int64)
    call = median_us(lambda: pipe.predict(x))
    agree = median_us(lambda: dist.all_gather(flag, group=world))
    if world.rank == 0:
        print(f"predict (batch 32, 2 stages): {call:.1f} us; one-int all-gather: {agree:.1f} us "
              f"({100 * agree / call:.1f} % of the call)")  # fmt: skip


if __name__ == "__main__":
    main()

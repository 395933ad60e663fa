"""The straggler monitor's cost per step: ``mpirun -n 2 python benchmarks/straggler.py``.

A small data-parallel MLP step (DDP, 64 -> 128 -> 128 -> 10, 64 samples per rank) runs in rotating blocks
of ``--block`` steps: off (no tracing, no monitor object: train_mlp.py without --straggler-report),
spans (``trace.enable(collectives=True)`` only: the cost of recording) and monitor
(``StragglerMonitor(every=--block)``: recording, the per-step bookkeeping and one all-gather per block).
Rotating blocks see the same machine load; rank 0 prints the median per-step time of each kind and its
difference to "off". Options: --rounds, --block. Load-proof, one process: count instructions with
``valgrind --tool=callgrind --callgrind-out-file=/dev/null python benchmarks/straggler.py --only KIND
--steps N`` for N = 200 and 0; (difference) / 200 is a step's instructions of that KIND.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import nn, optim, trace  # noqa: E402
from minidist.models import MLP  # noqa: E402
from minidist.parallel import DistributedDataParallel  # noqa: E402
from minidist_tools.straggler import StragglerMonitor  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15, help="off/on block pairs")
    p.add_argument("--block", type=int, default=20, help="steps per block (= the monitor's window)")
    p.add_argument(
        "--only", choices=["off", "spans", "monitor"], help="run --steps steps of one kind, untimed"
    )
    p.add_argument("--steps", type=int, default=200, help="with --only: how many (0: start-up only)")
    args = p.parse_args()
    world = dist.init()
    md.manual_seed(0)
    model = DistributedDataParallel(MLP(64, [128, 128], 10))
    opt = optim.SGD(model.parameters(), lr=0.01)
    rng = np.random.default_rng(world.rank)
    x, y = rng.standard_normal((64, 64)).astype(np.float32), rng.integers(0, 10, 64)

    def train_step() -> None:
        opt.zero_grad()
        with trace.span("forward", "forward"):
            loss = nn.functional.cross_entropy(model(md.tensor(x)), y)
        with trace.span("backward", trace.BACKWARD):
            loss.backward()
        with trace.span("optimizer step", "optimizer"):
            opt.step()

    for _ in range(args.block):  # warm-up
        train_step()
    if args.only:  # for valgrind --tool=callgrind: instructions, not time (load-proof)
        if args.only == "spans":
            trace.enable(collectives=True)
        monitor = StragglerMonitor(every=args.block) if args.only == "monitor" else None
        for _ in range(args.steps):
            with monitor.step() if monitor else contextlib.nullcontext():
                train_step()
        return
    times: dict[str, list[float]] = {"off": [], "spans": [], "monitor": []}
    for _ in range(args.rounds):
        for kind in times:
            world.barrier()
            if kind == "spans":
                trace.enable(collectives=True)
            monitor = StragglerMonitor(every=args.block) if kind == "monitor" else None  # enables tracing
            start = time.perf_counter()
            for _ in range(args.block):
                with monitor.step() if monitor else contextlib.nullcontext():
                    train_step()
            times[kind].append((time.perf_counter() - start) / args.block)  # with the window's all-gather
            trace.disable()
    if world.rank == 0:
        off = statistics.median(times["off"])
        print(f"{world.size} ranks, {args.rounds} rounds of {args.block} steps of each kind (median us/step)")
        for kind, label in [("off", "no tracing, no monitor"), ("spans", "tracing (collectives=True)"),
                            ("monitor", "StragglerMonitor")]:  # fmt: skip
            t = statistics.median(times[kind])
            print(f"{label:>28}: {1e6 * t:8.1f}  {1e6 * (t - off):+8.1f}  ({t / off - 1:+.1%})")


if __name__ == "__main__":
    main()

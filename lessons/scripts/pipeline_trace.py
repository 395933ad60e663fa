"""Lesson 07: time one pipeline step on real ranks; rank 0 writes every stage's spans as JSON.

    MINIDIST_TIMEOUT=60 mpiexec -n 4 python lessons/scripts/pipeline_trace.py OUT.json --schedule 1f1b -m 8
    MINIDIST_TIMEOUT=60 mpiexec -n 2 python lessons/scripts/pipeline_trace.py OUT.json -m 4 --stage-ms 20
    MINIDIST_TIMEOUT=60 mpiexec -n 2 python lessons/scripts/pipeline_trace.py OUT.json --runs gpipe:4 1f1b:8

One rank per stage (p = the number of ranks). The model is ``2p`` blocks of Linear(width, width) + Tanh,
so every stage does the same work. After one untraced warm-up step, one step is traced
(``minidist.trace``: the executor records a ``"forward i"`` / ``"backward i"`` span per microbatch).
OUT.json holds ``{"schedule", "p", "m", "stage_ms", "events": [per rank], "stats": [per rank]}`` where
``stats`` is the executor's ``StepStats`` (busy, step, measured bubble fraction, peak activations held);
with ``--runs``, OUT.json holds a list of those, one per ``SCHEDULE:M``.

``--stage-ms T`` adds synthetic work: every stage's forward of a microbatch takes T ms more and its
backward 2T ms more (a sleep, as a rank waits while its GPU computes). With T of some tens of ms the
stage time dwarfs what a loaded laptop adds (scheduling delays, message latency, Python overhead per
microbatch, all a millisecond or so), so the measured bubble shows the theory, ``(p-1)/(m+p-1)``; and a
sleeping rank needs no core, so even more ranks than cores measure it. Without it, one microbatch's
real compute on a CPU is as short as that noise, which then decides the bubble.

``MINIDIST_TIMEOUT`` makes a waiting rank poll and sleep instead of spinning in MPI, so that idle
stages leave the cores to busy ones when there are more ranks than cores.
"""

import argparse
import json
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import nn, trace  # noqa: E402
from minidist.autograd import Function  # noqa: E402
from minidist.parallel.pipeline import PipelineParallel  # noqa: E402


class SyntheticWork(Function):
    """y = x, taking ``seconds`` in forward and twice that in backward (a backward costs about two
    forwards: the gradients of the input and of the weights)."""

    def forward(self, x, seconds=0.0):
        self.seconds = seconds
        time.sleep(seconds)
        return x.copy()

    def backward(self, grad):
        time.sleep(2 * self.seconds)
        return (grad,)


class SlowLinear(nn.Linear):
    """A Linear layer followed by synthetic work; parameters as nn.Linear, so the stages stay balanced."""

    def __init__(self, width: int, seconds: float) -> None:
        super().__init__(width, width)
        self.seconds = seconds

    def forward(self, x):
        return SyntheticWork.apply(super().forward(x), seconds=self.seconds)


p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b"])
p.add_argument("-m", "--microbatches", type=int, default=8)
p.add_argument("--runs", nargs="+", metavar="SCHEDULE:M", help="several steps in one launch (OUT: a list)")
p.add_argument("--width", type=int, default=256)
p.add_argument("--batch", type=int, default=512, help="global batch, cut into the microbatches")
p.add_argument("--stage-ms", type=float, default=0.0, help="synthetic forward ms per microbatch and stage")
args = p.parse_args()
world = dist.init()


def trace_step(schedule: str, m: int) -> dict | None:
    """Build the pipeline, warm it up, trace one step; rank 0 returns the result (others None)."""
    md.manual_seed(0)
    layers = []
    for _ in range(2 * world.size):  # two blocks per stage: each adds half of the stage's synthetic time
        seconds = args.stage_ms / 2e3
        linear = SlowLinear(args.width, seconds) if seconds else nn.Linear(args.width, args.width)
        layers += [linear, nn.Tanh()]
    pipe = PipelineParallel(nn.Sequential(*layers), world, microbatches=m, schedule=schedule)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, args.width), dtype=np.float32)  # the layers' dtype: no cast is made
    y = rng.integers(0, args.width, args.batch)
    pipe.train_step(x, y, nn.functional.cross_entropy)  # warm-up: first-touch allocations, message headers
    world.barrier()
    trace.enable()  # right after a barrier: the ranks' clocks start together
    pipe.train_step(x, y, nn.functional.cross_entropy)
    trace.disable()
    s = pipe.stats
    stats = {"busy_s": s.busy_s, "step_s": s.step_s, "bubble": s.bubble_fraction}
    stats["peak_activations"] = s.peak_activations
    everyone = world.mpi.gather({"events": trace.events(), "stats": stats}, root=0)
    if world.rank != 0:
        return None
    print(f"{schedule}, p={world.size}, m={m}: step {s.step_s * 1e3:.0f} ms")
    result = {"schedule": schedule, "p": world.size, "m": m, "stage_ms": args.stage_ms}
    return result | {"events": [r["events"] for r in everyone], "stats": [r["stats"] for r in everyone]}


# One launch for many runs: starting 2 ranks costs a second or two, more than a traced step.
runs = [(r.split(":")[0], int(r.split(":")[1])) for r in args.runs] if args.runs else None
results = [trace_step(schedule, m) for schedule, m in (runs or [(args.schedule, args.microbatches)])]
if world.rank == 0:
    with open(args.out, "w") as f:
        json.dump(results if runs else results[0], f)

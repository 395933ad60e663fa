"""Lesson 07: the naive GPipe step next to PipelineParallel's GPipe and 1F1B, on real ranks.

    mpiexec -n 2 python lessons/scripts/naive_gpipe.py [--steps 3] [-m 4]

One rank per stage. Every rank builds the same float64 MLP from one seed, and each of three ways
trains it for a few SGD steps on the same batches: ``naive_gpipe_step``
(``minidist/parallel/pipeline/naive.py``) on the stage's layers, cut as PipelineParallel cuts them, and
``PipelineParallel`` with ``schedule="gpipe"`` and ``"1f1b"``. Rank 0 prints every step's mean loss
per way, and whether every stage's parameters came out equal, bit for bit.
"""

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import nn, optim  # noqa: E402
from minidist.parallel.pipeline import PipelineParallel, naive_gpipe_step  # noqa: E402
from minidist.parallel.pipeline.partition import build_stage, partition  # noqa: E402

F64, WAYS = np.float64, ("naive", "gpipe", "1f1b")


def build() -> nn.Sequential:
    md.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 32, dtype=F64), nn.Tanh(), nn.Linear(32, 32, dtype=F64), nn.Tanh(),
        nn.Linear(32, 32, dtype=F64), nn.Tanh(), nn.Linear(32, 4, dtype=F64),
    )  # fmt: skip


def train(way: str, world, batches, m: int) -> tuple[list[float], list[np.ndarray]]:
    """The mean loss of every step, and this stage's parameters after the last one."""
    s, p, model = world.rank, world.size, build()
    pipe = None if way == "naive" else PipelineParallel(model, world, microbatches=m, schedule=way)
    stage = build_stage(model, partition(model, p)[s]) if pipe is None else pipe.stage_module
    opt, losses = optim.SGD(stage.parameters(), lr=0.1), []
    for x, y in batches:
        inputs, targets = (md.tensor(x, dtype=F64) if s == 0 else None), (y if s == p - 1 else None)
        opt.zero_grad()
        if pipe is None:
            losses.append(naive_gpipe_step(stage, world, inputs, targets, nn.functional.cross_entropy, m))
        else:
            losses.append(pipe.train_step(inputs, targets, nn.functional.cross_entropy))
        opt.step()
    return losses, [param.data.copy() for param in stage.parameters()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("-m", type=int, default=4, help="microbatches (default 4)")
    args = parser.parse_args()
    world = dist.init()
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((16, 8)), rng.integers(0, 4, 16)) for _ in range(args.steps)]
    runs = {way: train(way, world, batches, args.m) for way in WAYS}
    naive = runs["naive"][1]
    same = all(np.array_equal(a, b) for way in WAYS[1:] for a, b in zip(naive, runs[way][1]))
    same = dist.all_reduce(np.array([float(same)]), op="min", group=world)[0] == 1.0  # on every stage
    if world.rank == 0:
        print(f"p = {world.size} stages, m = {args.m} microbatches; the mean loss of every step:")
        print("step  " + "".join(f"{way:>22}" for way in WAYS))
        for t in range(args.steps):
            print(f"{t + 1:4}  " + "".join(f"{runs[way][0][t]:22.17f}" for way in WAYS))
        print(f"every stage's parameters equal, bit for bit, after {args.steps} steps: {same}")


if __name__ == "__main__":
    main()

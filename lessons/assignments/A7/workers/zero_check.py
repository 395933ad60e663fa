"""MPI worker for A7: ZeRO stage 1 against one process training on the whole batch.

Config: ``{"seed", "steps", "batch", "check": "shard" | "train"}``. ``"shard"`` checks the averaged
gradient shard that ``_reduce_scatter_gradients`` returns after one backward; ``"train"`` trains
``steps`` SGD-with-momentum steps and compares every parameter. float64 throughout: the runs differ
only in the order of additions (~1e-16 relative), so rtol 1e-9 is generous yet catches any real error.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import gradelib  # noqa: E402
import rules  # noqa: E402

import minidist as md  # noqa: E402
from minidist import nn, optim  # noqa: E402
from minidist.parallel import ZeroRedundancyOptimizer  # noqa: E402

# The handout's "Not allowed": all-reducing full gradients (ZeRO reduce-scatters them), and MPI's own
# collectives, inside the two communication steps the student writes.
RULE = rules.Rule(
    files=("minidist.parallel.zero.optimizer",),
    why="ZeRO reduce-scatters the gradients (each rank gets the average of its shard only) and all-gathers "
    "the parameters, with minidist.distributed; all-reducing full gradients keeps ZeRO's memory saving "
    "from mattering",
    functions=("minidist.distributed.collectives:all_reduce",),
    callers=("_reduce_scatter_gradients", "_all_gather_parameters"),
    tasks={"_reduce_scatter_gradients": "A7.1", "_all_gather_parameters": "A7.2"},
)


def make_model(seed: int) -> nn.Sequential:
    md.manual_seed(seed)
    f64 = np.float64
    return nn.Sequential(nn.Linear(5, 7, dtype=f64), nn.Tanh(), nn.Linear(7, 3, dtype=f64))


def batches(seed: int, steps: int, batch: int):
    rng = np.random.default_rng(seed + 1000)
    return [(rng.standard_normal((batch, 5)), rng.integers(0, 3, batch)) for _ in range(steps)]


def loss_of(model, x, y, rank: int, world: int):
    mine = np.array_split(np.arange(len(x)), world)[rank]
    return nn.functional.cross_entropy(model(md.tensor(x[mine], dtype=np.float64)), y[mine])


def body(world, config: dict) -> list[str]:
    n, r = world.size, world.rank
    data = batches(config["seed"], config["steps"], config["batch"])
    reference = make_model(config["seed"])
    ref_opt = optim.SGD(reference.parameters(), lr=0.2, momentum=0.9)
    model = make_model(config["seed"] + r)  # different seeds: ZeRO must broadcast rank 0's weights
    zero = ZeroRedundancyOptimizer(model.parameters(), optim.SGD, group=world, stage=1, lr=0.2, momentum=0.9)
    setup = f"ZeRO-1 on {n} ranks, {sum(p.size for p in model.parameters())} parameters"

    if config["check"] == "shard":
        x, y = data[0]
        loss_of(reference, x, y, 0, 1).backward()
        loss_of(model, x, y, r, n).backward()
        full = np.concatenate([p.grad.reshape(-1) for p in reference.parameters()])
        want = full[zero.layout.start : zero.layout.stop]
        got = np.asarray(zero._reduce_scatter_gradients())
        if got.shape == want.shape and np.allclose(got, want, rtol=1e-9, atol=1e-12):
            return []
        diagnosis = ""
        if got.shape == want.shape and np.allclose(got, n * want, rtol=1e-9, atol=1e-12):
            diagnosis = f" It is world_size = {n} times too large: the gradients were summed, not averaged."
        return [
            f"{setup}: rank {r} owns flat elements {zero.layout.start}:{zero.layout.stop}; its averaged "
            f"gradient shard should be {gradelib.show(want)}, got {gradelib.show(got)} "
            f"(shape {got.shape}).{diagnosis}"
        ]

    for x, y in data:
        ref_opt.zero_grad()
        loss_of(reference, x, y, 0, 1).backward()
        ref_opt.step()
        zero.zero_grad()
        loss_of(model, x, y, r, n).backward()
        zero.step()
    ref = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        if not np.allclose(p.data, ref[name].data, rtol=1e-9, atol=1e-12):
            return [
                f"{setup}: after {len(data)} steps parameter {name!r} on rank {r} differs from single-device "
                f"training: {gradelib.show(p.data)} vs {gradelib.show(ref[name].data)} (every rank must hold "
                "all updated parameters after step())"
            ]
    return []


if __name__ == "__main__":
    gradelib.worker_main(body, RULE)

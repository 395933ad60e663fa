"""MPI worker for A3: train with DistributedDataParallel and compare with one process on the whole batch.

Config (OUT_DIR/config.json): ``{"seed", "steps", "batch", "bucket_cap_mb", "overlap", "check_overlap"}``.
Every rank also trains the single-device reference itself (same seed, whole global batch): it is small,
so computing it locally avoids any extra communication. The model is float64, so the only difference
between the two runs is the order of floating-point additions (ring sum of per-rank gradients vs one
batch gradient), ~1e-16 relative per step; rtol 1e-9 over 3 SGD steps leaves a wide margin, while a
missing 1/world_size or a stale gradient is off by far more.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import gradelib  # noqa: E402
import rules  # noqa: E402

import minidist as md  # noqa: E402
from minidist import nn, optim, trace  # noqa: E402
from minidist.parallel import DistributedDataParallel  # noqa: E402

# The handout's "Not allowed": MPI's own collectives (also as minidist's mpi_builtin) from DDP's code.
RULE = rules.Rule(
    files=("minidist.parallel.data_parallel.buckets", "minidist.parallel.data_parallel.ddp"),
    why="the handout asks for buckets averaged with minidist's dist.all_reduce, not MPI's own collectives",
)

seen_at_first_layer: list[int] = []  # per backward: how many buckets had started when backward got there


class Mark(md.Function):
    """Identity; its backward notes how many buckets have started when backward reaches the first layer."""

    def forward(self, x):
        return x

    def backward(self, grad):
        seen_at_first_layer.append(sum(e["name"].startswith("start bucket") for e in trace.events()))
        return (grad,)


class MarkLayer(nn.Module):
    def forward(self, x):
        return Mark.apply(x)


def make_model(seed: int) -> nn.Sequential:
    md.manual_seed(seed)
    f64 = np.float64
    return nn.Sequential(
        nn.Linear(6, 16, dtype=f64), nn.Tanh(), MarkLayer(), nn.Linear(16, 8, dtype=f64), nn.Tanh(),
        nn.Linear(8, 4, dtype=f64),
    )  # fmt: skip


def batches(seed: int, steps: int, batch: int):
    rng = np.random.default_rng(seed + 1000)
    return [(rng.standard_normal((batch, 6)), rng.integers(0, 4, batch)) for _ in range(steps)]


def train(model, data, rank: int, world: int, on_first_backward=None):
    opt = optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    for step, (x, y) in enumerate(data):
        mine = np.array_split(np.arange(len(x)), world)[rank]
        opt.zero_grad()
        nn.functional.cross_entropy(model(md.tensor(x[mine], dtype=np.float64)), y[mine]).backward()
        if step == 0 and on_first_backward is not None:
            on_first_backward(model)
        opt.step()


def body(world, config: dict) -> list[str]:
    n, r = world.size, world.rank
    data = batches(config["seed"], config["steps"], config["batch"])
    reference = make_model(config["seed"])
    first_grads = {}
    train(
        reference,
        data,
        0,
        1,
        lambda m: first_grads.update({k: p.grad.copy() for k, p in m.named_parameters()}),
    )

    failures: list[str] = []
    setup = f"DDP on {n} ranks, bucket_cap_mb={config['bucket_cap_mb']:.3g}, overlap={config['overlap']}"

    def check_first_gradients(ddp) -> None:
        for name, p in ddp.module.named_parameters():
            want, got = first_grads[name], p.grad
            if got is None:
                failures.append(f"{setup}: after loss.backward() parameter {name!r} has no gradient")
                return
            if np.allclose(got, want, rtol=1e-9, atol=1e-12):
                continue
            ratio = float(np.sum(got * want) / max(np.sum(want * want), 1e-300))
            diagnosis = ""
            if abs(ratio - n) < 1e-6 * n:
                diagnosis = (
                    f" They are world_size = {n} times too large: the gradients were summed, not averaged."
                )
            failures.append(
                f"{setup}: after the first loss.backward() the gradient of {name!r} on rank {r} is "
                f"{gradelib.show(got)}, but single-device training gives {gradelib.show(want)}.{diagnosis}"
            )
            return

    seen_at_first_layer.clear()  # the reference run above passed the mark too, without DDP
    trace.enable()
    ddp = DistributedDataParallel(
        make_model(config["seed"] + r),
        group=world,
        bucket_cap_mb=config["bucket_cap_mb"],
        overlap=config["overlap"],
        small_bucket_bytes=0,  # these buckets are tiny: without this they would all skip the comm thread
    )  # different seeds per rank: DDP's broadcast must make the replicas start from rank 0's weights
    train(ddp, data, r, n, check_first_gradients)
    trace.disable()
    if not failures:
        ref = dict(reference.named_parameters())
        for name, p in ddp.module.named_parameters():
            if not np.allclose(p.data, ref[name].data, rtol=1e-9, atol=1e-12):
                failures.append(
                    f"{setup}: after {config['steps']} steps parameter {name!r} on rank {r} differs from "
                    f"single-device training: {gradelib.show(p.data)} vs {gradelib.show(ref[name].data)}"
                )
                break
    if config.get("check_overlap") and not (seen_at_first_layer and min(seen_at_first_layer) >= 1):
        failures.append(
            f"{setup}: no bucket's all-reduce had started when backward reached the first layer, so "
            "communication did not overlap with backward: start a bucket as soon as its last gradient is "
            "ready (and every earlier bucket has started), from the gradient hook, not at the end of backward"
        )
    return failures


if __name__ == "__main__":
    gradelib.worker_main(body, RULE)

"""FSDP's prefetch: how much of the all-gather time the main thread still waits for, on or off.

    mpiexec -n 2 python benchmarks/fsdp_prefetch.py [--layers 4] [--width 128] [--rounds 3] [--steps 4]

Run from the repository root with ``PYTHONPATH=.``. A float32 GPT (``--layers`` blocks of width
``--width``, block size 64, 8 windows per rank) is wrapped per Block in ``FullyShardedDataParallel``
with prefetch on and off, and for scale in DDP; the three take turns in ``--rounds`` rounds of
``--steps`` AdamW steps, so they see the same load. From the trace spans of the FSDP steps (rank 0):

* ``all-gather``: time the communication thread spent in all-gathers (interval union), per step;
* ``waited``: time the main thread was blocked waiting for an all-gather, per step: the part of the
  communication that prefetching did not hide;

Without prefetch the wait can exceed the all-gather's own time: it also holds the hand-over to the
communication thread and back, which on a loaded machine means waiting for a core.

Also printed, independent of the load: the all-gathers and the bytes each rank receives per step
(2 per Block, forward and backward recomputation, + 1 for the root) and the gathered bytes' peak.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import minidist as md
import minidist.distributed as dist
from minidist import nn, optim, trace
from minidist.memory import counters
from minidist.models import GPT, GPTConfig
from minidist.models.gpt.transformer import Block
from minidist.parallel import DistributedDataParallel, FullyShardedDataParallel
from minidist_tools import timeline


def build(kind: str, args: argparse.Namespace):
    md.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=65, block_size=64, n_layer=args.layers, n_head=4, n_embd=args.width))
    if kind == "ddp":
        model = DistributedDataParallel(gpt)
        return model, optim.AdamW(model.parameters(), lr=1e-3)
    model = FullyShardedDataParallel(gpt, wrap=(Block,), prefetch=kind == "prefetch on")
    return model, optim.AdamW(model.parameters(), lr=1e-3)


def step(model, optimizer, x, y) -> None:
    logits = model(x)
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    world = dist.init()
    rng = np.random.default_rng(world.rank)
    ids = rng.integers(0, 65, size=(8, 65))
    x, y = ids[:, :-1], ids[:, 1:]
    kinds = ["prefetch on", "prefetch off", "ddp"]
    models = {k: build(k, args) for k in kinds}
    for k in kinds:
        step(*models[k], x, y)  # warm up: first-touch allocations, thread start
    times = {k: [] for k in kinds}
    spans = {k: {"comm": 0.0, "wait": 0.0} for k in kinds[:2]}
    for _ in range(args.rounds):
        for k in kinds:
            dist.barrier()
            trace.enable()
            start = time.perf_counter()
            for _ in range(args.steps):
                step(*models[k], x, y)
            elapsed = np.array([time.perf_counter() - start])
            events = trace.events()
            trace.disable()
            dist.all_reduce(elapsed, op="max")  # a step is as slow as its slowest rank
            times[k].append(float(elapsed[0]) / args.steps)
            if k in spans:
                gathers = [e for e in events if e["name"].startswith("all_gather")]
                waits = [e for e in events if e["name"].startswith("wait all_gather")]
                spans[k]["comm"] += union(gathers) / args.steps / args.rounds
                spans[k]["wait"] += union(waits) / args.steps / args.rounds
    fsdp = models["prefetch on"][0]
    counters._active = True  # count one step's gathered bytes (the memory tracker's switch)
    step(*models["prefetch on"], x, y)
    counters._active = False
    if world.rank == 0:
        units = fsdp.units
        per_step = sum(2 * u.full_nbytes for u in units if u.name) + sum(
            u.full_nbytes for u in units if not u.name
        )
        load = open("/proc/loadavg").read().split()[0]
        print(f"GPT {args.layers} x {args.width}, {world.size} ranks, load {load}")
        peak = counters._peak["gathered_parameters"] / 2**20
        print(f"all-gathers per step: {2 * (len(units) - 1) + 1}, {per_step / 2**20:.2f} MiB gathered per "
              f"step, peak gathered {peak:.2f} MiB")  # fmt: skip
        for k in kinds:
            line = f"{k:13s} {1e3 * np.median(times[k]):7.1f} ms/step"
            if k in spans:
                comm, wait = spans[k]["comm"], spans[k]["wait"]
                line += f"  all-gather {1e3 * comm:6.1f} ms, main thread waited {1e3 * wait:6.1f} ms"
            print(line)


def union(events: list[dict]) -> float:
    return sum(end - start for start, end in timeline.merge_intervals((e["start"], e["end"]) for e in events))


if __name__ == "__main__":
    main()

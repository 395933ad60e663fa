"""Lesson 14: train the GPT that does not fit one rank's memory budget on N ranks with FSDP.

    mpiexec -n 4 python scripts/fsdp_memory.py BUDGET [--steps 3]

Every rank builds the same GPT (same seed: 3 blocks of width 96, 343 k parameters, float32 AdamW) and
wraps it in ``FullyShardedDataParallel`` with one unit per ``Block``; each step every rank takes its
rows of the same global batch of 8 random windows. A ``MemoryTracker`` with the per-rank budget
``BUDGET`` (e.g. 4MiB) runs around the training; rank 0 prints every rank's memory table and the
losses. Over the budget, the job ends with the out-of-memory message on every rank.
"""
# ruff: noqa: E402  (NumPy, imported below, must start after OMP_NUM_THREADS is set)

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one BLAS thread per rank: the ranks share the cores

import argparse

import numpy as np

import minidist as md
import minidist.distributed as dist
from minidist import memory, optim
from minidist.models import GPT, GPTConfig
from minidist.models.gpt.transformer import Block
from minidist.nn import functional as F
from minidist.parallel.fsdp import FullyShardedDataParallel
from minidist_tools.report import exit_with_error

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("budget", help="the per-rank memory budget, e.g. 4MiB")
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()
world = dist.init()
md.manual_seed(3)
config = GPTConfig(vocab_size=65, block_size=16, n_layer=3, n_head=2, n_embd=96)
fsdp = FullyShardedDataParallel(GPT(config), wrap=(Block,))  # a unit per Block; the rest is the root unit
opt = optim.AdamW(fsdp.parameters(), lr=1e-2, weight_decay=0.0)  # the parameters: this rank's shards
rng = np.random.default_rng(3)
batch, mine = 8, slice(world.rank * 8 // world.size, (world.rank + 1) * 8 // world.size)
losses = []
try:
    with memory.MemoryTracker(fsdp, opt, budget=args.budget, rank=world.rank) as tracker:
        for _ in range(args.steps):
            idx, targets = rng.integers(0, 65, (2, batch, config.block_size))
            loss = F.cross_entropy(fsdp(idx[mine]).reshape(-1, 65), targets[mine].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
except memory.OutOfMemoryError as error:
    exit_with_error(error, code=2)
tables = world.mpi.gather(tracker.table(), root=0)
if world.rank == 0:
    print("\n\n".join(tables))
    print(f"losses of rank 0's rows: {np.round(losses, 4).tolist()}")

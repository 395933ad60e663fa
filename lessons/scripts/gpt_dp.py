"""Lesson 10: train a tiny GPT data-parallel for a few steps and save the loss of every step.

    mpiexec -n 2 python scripts/gpt_dp.py OUT.npz [--steps 6] [--batch 8]

Every rank builds the same model (same seed), draws the same global batch of random windows each step
and keeps its slice (``RandomWindows``); ``DistributedDataParallel`` averages the gradients during
backward, and every rank takes the same AdamW step. In float64, so that 1 and 2 ranks can be compared
down to rounding: the lesson runs this on 1 and on 2 ranks and compares the files. Rank 0 writes
``losses`` (the mean loss over the global batch, per step) and ``params`` (all weights, flattened).
"""
# ruff: noqa: E402  (NumPy, imported below, must start after OMP_NUM_THREADS is set)

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one BLAS thread per rank: two ranks share two cores

import argparse

import numpy as np

import minidist as md
import minidist.distributed as dist
from minidist import optim
from minidist.data import CharTokenizer, RandomWindows, load_shakespeare, train_val_split
from minidist.models import GPT, GPTConfig
from minidist.nn import functional as F
from minidist.parallel import DistributedDataParallel

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("out", help="where rank 0 writes the losses and the final weights (.npz)")
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--batch", type=int, default=8, help="GLOBAL windows per step, split over the ranks")
args = parser.parse_args()

world = dist.init()
text = load_shakespeare()
tokenizer = CharTokenizer(text)
train_ids, _ = train_val_split(tokenizer.encode(text))
windows = RandomWindows(train_ids, 16, args.batch, seed=0, rank=world.rank, world_size=world.size)

md.manual_seed(0)  # the same initial weights on every rank
config = GPTConfig(
    vocab_size=tokenizer.vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=16, dtype=np.float64
)
gpt = GPT(config)
model = DistributedDataParallel(gpt)
optimizer = optim.AdamW(model.parameters(), lr=1e-2)

losses = []
for _ in range(args.steps):
    x, y = windows.next()  # this rank's batch / world.size windows of this step's global batch
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, config.vocab_size), y.reshape(-1))
    optimizer.zero_grad()
    loss.backward()  # DDP: the gradients come back averaged over the ranks
    optimizer.step()
    total = np.array([loss.item()])
    dist.all_reduce(total, op="avg")  # equal slices: the mean of the ranks' means is the global mean
    losses.append(total[0])

if world.rank == 0:
    params = np.concatenate([p.data.ravel() for p in gpt.parameters()])
    np.savez(args.out, losses=np.array(losses), params=params)
    print(f"{world.size} rank(s): {args.steps} steps, last loss {losses[-1]:.6f}")

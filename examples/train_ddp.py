"""Data-parallel training on one page: ``mpirun -n 8 python examples/train_ddp.py``.

Every rank runs this same file (SPMD: single program, multiple data). Each rank holds a full copy of
the model and reads its own slice of every global batch; DistributedDataParallel (DDP) averages the
gradients over the ranks during backward, so every copy takes the same optimizer step. The result is
the model that one process (``python examples/train_ddp.py``) trains with the same global batch.

Read it top to bottom: setup -> data -> model -> training loop -> evaluation. ``examples/train_mlp.py``
is the same loop with every option: tensor and pipeline parallelism, ZeRO, checkpoints, tracing.
(Its defaults train a bigger model for longer, so it ends at 0.9697 where this one ends at 0.9663.)
"""

# ruff: noqa: E402  (NumPy, imported below, must start after OMP_NUM_THREADS is set)
import os

# One BLAS thread per rank, set before NumPy loads its BLAS: 8 ranks on a 2-core laptop would
# otherwise each start a thread per core, and the threads would fight over the cores.
for threads in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(threads, "1")

import argparse
import contextlib
import io

import numpy as np

import minidist as md
import minidist.distributed as dist
from minidist import nn, optim
from minidist.data import DataLoader, DistributedSampler, load_dataset
from minidist.parallel import DistributedDataParallel

parser = argparse.ArgumentParser(
    description="Train an MLP data-parallel on the bundled digits.",
    formatter_class=argparse.ArgumentDefaultsHelpFormatter,  # --help shows each default
)
parser.add_argument("--epochs", type=int, default=15, help="passes over the training set")
parser.add_argument("--batch-size", type=int, default=128, help="GLOBAL batch, split across the ranks")
parser.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (momentum 0.9)")
parser.add_argument("--seed", type=int, default=0, help="seed for the weights and the data order")
parser.add_argument("--out", default=None, help="also save the final weights and losses to this .npz")

# --- setup: start MPI. Every rank learns its number (rank) and how many ranks there are.
dist.init()
rank, world_size = dist.get_rank(), dist.get_world_size()
# Every rank parses the same command line, so a bad flag fails on all of them alike: only rank 0 shows
# argparse's message (and --help), not world_size copies. All ranks then exit with argparse's code 2.
with contextlib.redirect_stdout(io.StringIO()) if rank else contextlib.nullcontext():
    with contextlib.redirect_stderr(io.StringIO()) if rank else contextlib.nullcontext():
        args = parser.parse_args()

# --- data: every rank loads the whole (small) data set; the sampler decides who reads which samples.
x_train, y_train = load_dataset("digits", "train")  # 1,500 8x8 images as 64 floats, labels 0-9
x_test, y_test = load_dataset("digits", "test")  # 297 more, for the accuracy
# The sampler shuffles with the same seed on every rank, so all ranks agree on one order without
# exchanging any data. It cuts that order into global batches of --batch-size samples and gives
# this rank its slice of each (128 on 8 ranks: 16 each). So step k uses the same 128 samples on any
# number of ranks: that is what lets 8 ranks train the same model as 1. drop_last: every step is a
# full global batch (the last 1500 % 128 samples of the epoch's order are left out).
sampler = DistributedSampler(
    len(x_train), num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed,
    drop_last=True, batch_size=args.batch_size,
)  # fmt: skip
loader = DataLoader((x_train, y_train), batch_size=sampler.local_batch_size, sampler=sampler)

# --- model: the same seed gives every rank the same initial weights (and DDP broadcasts rank 0's
# weights anyway when it wraps the model, so the copies start identical).
md.manual_seed(args.seed)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
model = DistributedDataParallel(model)  # registers the hooks that average gradients in backward
optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

# --- training loop
losses = []
for epoch in range(args.epochs):
    # A new order every epoch, the same on every rank: without set_epoch each epoch repeats epoch 0's.
    sampler.set_epoch(epoch)
    loss_sum = np.zeros(2)  # [sum of per-sample losses, number of samples] on this rank
    for xb, yb in loader:
        logits = model(md.tensor(xb))  # forward on this rank's slice of the global batch
        # DDP AVERAGES the ranks' gradients (sums them, divides by world_size). So each rank's loss
        # is the sum over its slice times world_size / batch_size: the average is then the gradient
        # of the mean loss over the global batch. With equal slices (128 on 8 ranks) that is just
        # each slice's mean; with unequal ones (128 on 3 ranks: 43 + 43 + 42) only this is exact.
        local_sum = nn.functional.cross_entropy(logits, yb, reduction="sum")
        loss = local_sum * (world_size / args.batch_size)
        optimizer.zero_grad()
        # Backward computes the gradients layer by layer, last layer first. As soon as a bucket of
        # them is ready, DDP's hook starts its all-reduce on a communication thread, overlapping with
        # the rest of backward (a model this small fills one bucket, all-reduced when backward ends).
        # When backward returns, every rank holds the same averaged gradients.
        loss.backward()
        # Same weights + same gradients = the same step on every rank: the copies stay identical.
        optimizer.step()
        loss_sum += (local_sum.item(), len(xb))
    # This rank saw only its slices: add up every rank's [loss sum, samples] for the epoch's loss.
    dist.all_reduce(loss_sum, op="sum")
    losses.append(loss_sum[0] / loss_sum[1])
    if rank == 0:  # every rank now holds the same numbers; one prints them, not world_size copies
        print(f"epoch {epoch + 1:2d}  train loss {losses[-1]:.4f}")

# --- evaluation: each rank scores its share of the test set (every world_size-th sample, no
# shuffling), then an all-reduce adds up the counts: the accuracy over all 297 test samples.
mine = DistributedSampler(len(x_test), num_replicas=world_size, rank=rank, shuffle=False).indices()
with md.no_grad():  # no graph: we only need the outputs
    predicted = model(md.tensor(x_test[mine])).numpy().argmax(axis=1)
counts = np.array([(predicted == y_test[mine]).sum(), len(mine)], dtype=np.float64)  # [correct, seen]
dist.all_reduce(counts, op="sum")
accuracy = counts[0] / counts[1]
if rank == 0:
    print(f"final test accuracy: {accuracy:.4f}")
    if args.out:  # for tests: the weights and losses of N ranks should equal those of 1
        weights = {name: p.numpy() for name, p in model.module.named_parameters()}  # host copies
        np.savez(args.out, losses=np.array(losses), accuracy=accuracy, **weights)

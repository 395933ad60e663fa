"""Train an MLP data-parallel on handwritten digits: ``mpirun -n 8 python examples/train_mlp.py``.

Read it top to bottom: arguments -> data -> model -> training loop -> evaluation.
Every rank runs this same file (SPMD). Each global batch of ``--batch-size`` samples is split
across the ranks; DistributedDataParallel averages the gradients, so any number of ranks trains
the same model as one process, from the same seed.
"""

from __future__ import annotations

import argparse
import os
import sys

# One BLAS thread per rank, set before NumPy loads its BLAS: with 8 ranks on a 2-core machine, each
# rank's own BLAS threads would spin and fight the other ranks for cores (measured here: a 64x256
# matmul went from well under 1 ms to 17 ms). Set OMP_NUM_THREADS yourself to override.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

import minidist as md  # noqa: E402
from minidist import dist, nn, optim  # noqa: E402
from minidist.data import DataLoader, DistributedSampler, load_dataset  # noqa: E402
from minidist.parallel import DistributedDataParallel  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=30, help="passes over the training set")
    p.add_argument("--batch-size", type=int, default=128, help="GLOBAL batch size, split across all ranks")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 256], help="hidden layer widths")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and shuffling")
    p.add_argument("--dataset", choices=["digits", "mnist"], default="digits")
    p.add_argument("--data-dir", default=None, help="folder with the MNIST IDX files (for --dataset mnist)")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0 or min(args.hidden) < 1:
        p.error("--epochs, --batch-size, --hidden must be >= 1 and --lr > 0")
    return args


def build_mlp(n_in: int, hidden: list[int], n_out: int) -> nn.Sequential:
    """Linear -> ReLU -> ... -> Linear, e.g. 64-256-256-10."""
    sizes = [n_in, *hidden]
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(sizes[-1], n_out))


def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray, world: dist.Communicator) -> float:
    """Accuracy on (x, y): each rank scores its share of the samples, then one all-reduce adds the counts."""
    mine = np.array(list(DistributedSampler(len(x), shuffle=False)), dtype=np.int64)
    counts = np.zeros(2)  # [correct, seen]
    model.eval()
    with md.no_grad():
        if len(mine):
            logits = model(md.tensor(x[mine])).numpy()
            counts[:] = [(logits.argmax(axis=1) == y[mine]).sum(), len(mine)]
    model.train()
    dist.all_reduce(counts, op="sum", group=world)
    return float(counts[0] / counts[1])


def main(argv: list[str] | None = None) -> float:
    args = parse_args(argv)
    world = dist.init()
    rank, world_size = world.rank, world.size

    # --- data: every rank reads the (small) data set; the sampler decides who uses which samples.
    x_train, y_train = load_dataset(args.dataset, "train", args.data_dir)
    x_test, y_test = load_dataset(args.dataset, "test", args.data_dir)
    # Global-batch mode: rank r gets its numpy.array_split piece of each global batch, so the
    # global batches are the same for any number of ranks (and the last partial one is dropped).
    sampler = DistributedSampler(
        len(x_train), shuffle=True, seed=args.seed, drop_last=True, batch_size=args.batch_size
    )
    loader = DataLoader((x_train, y_train), batch_size=sampler.local_batch_size, sampler=sampler)

    # --- model: same seed on every rank; DDP broadcasts rank 0's weights anyway.
    md.manual_seed(args.seed)
    n_classes = int(y_train.max()) + 1
    model = DistributedDataParallel(build_mlp(x_train.shape[1], args.hidden, n_classes), group=world)
    optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    # --- training loop
    bar = tqdm(total=args.epochs * len(loader), disable=rank != 0, desc="train", unit="step")
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        loss_sum = np.zeros(2)  # [sum of per-sample losses, samples], summed over ranks at the end
        for xb, yb in loader:
            logits = model(md.tensor(xb))
            # Sum over my samples / global batch * world size: after DDP averages over the ranks this
            # is the gradient of the mean loss over the global batch, even when ranks hold unequal
            # shares (e.g. 128 samples on 3 ranks: 43 + 43 + 42).
            local_sum = nn.functional.cross_entropy(logits, yb, reduction="sum")
            loss = local_sum * (world_size / args.batch_size)
            optimizer.zero_grad()
            loss.backward()  # returns with gradients already averaged over all ranks
            optimizer.step()
            loss_sum += [local_sum.item(), len(yb)]
            bar.update()
        dist.all_reduce(loss_sum, op="sum", group=world)
        accuracy = evaluate(model, x_test, y_test, world)
        if rank == 0:
            bar.write(
                f"epoch {epoch + 1:3d}  train loss {loss_sum[0] / loss_sum[1]:.4f}  "
                f"test accuracy {accuracy:.4f}"
            )
    bar.close()
    if rank == 0:
        print(f"final test accuracy: {accuracy:.4f}")
    return accuracy


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError) as error:
        # Bad input is detected identically on every rank (it depends only on the arguments), so each
        # rank prints the message and exits non-zero; no rank is left waiting in a collective.
        print(f"[rank {dist.get_rank()}] error: {error}", file=sys.stderr)
        sys.exit(2)

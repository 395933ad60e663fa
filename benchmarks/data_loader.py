"""What tracking the loader's progress costs: one epoch of DataLoader batches, three ways, in one run.

    python benchmarks/data_loader.py                 # MNIST-sized: 60000 x 784 float32, batch 128
    python benchmarks/data_loader.py --n 1500 --features 64 --batch 32   # the bundled digits

``DataLoader`` takes its sampler's indices one batch at a time, so that ``DistributedSampler.position``
is the real progress when a checkpoint is saved inside the loop. Three ways are timed here over the
same data, alternating, and the ratios of their medians are printed; the gather ``x[idx]`` of each
batch is included, as a training loop pays it:

* up front: the whole epoch's indices with one ``np.fromiter``, then the batches (the sampler's
  position is then lost to a checkpoint inside the loop);
* index by index (an earlier DataLoader): ``np.fromiter(islice(iter(sampler), B))`` per batch, the
  sampler's generator advancing ``position`` at every index;
* the DataLoader as it is now: ``sampler.batches(B)`` hands out each batch as a slice.
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from minidist.data import DataLoader, DistributedSampler


def whole_epoch_up_front(loader: DataLoader) -> int:
    """The old way: every index of the epoch first, then the batches (the sampler's position is lost)."""
    order = np.fromiter(loader.sampler, dtype=np.int64)
    count = 0
    for start in range(0, len(order), loader.batch_size):
        idx = order[start : start + loader.batch_size]
        count += len(tuple(a[idx] for a in loader.dataset)[0])
    return count


def index_by_index(loader: DataLoader) -> int:
    """An earlier DataLoader's way: each batch's indices pulled one by one from the sampler's generator."""
    indices, count = iter(loader.sampler), 0
    while len(idx := np.fromiter(itertools.islice(indices, loader.batch_size), dtype=np.int64)):
        count += len(tuple(a[idx] for a in loader.dataset)[0])
    return count


def batch_by_batch(loader: DataLoader) -> int:
    """The DataLoader as it is now (``DistributedSampler.batches``: one slice per batch)."""
    return sum(len(xb) for xb, _ in loader)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=60000)
    ap.add_argument("--features", type=int, default=784)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    data = (rng.standard_normal((args.n, args.features), dtype=np.float32), rng.integers(0, 10, args.n))
    sampler = DistributedSampler(args.n, num_replicas=1, rank=0, batch_size=args.batch, seed=0)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    ways = {
        "up front": whole_epoch_up_front,
        "index by index": index_by_index,
        "batch by batch": batch_by_batch,
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):  # alternate, so that all see the same machine load
        for name, run in ways.items():
            t0 = time.perf_counter()
            assert run(loader) == args.n
            times[name].append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    print(f"{args.n} x {args.features} float32, batch {args.batch}: one epoch, median of {args.rounds}")
    for name, ms in med.items():
        print(f"  {name:15s} {ms:8.2f} ms")
    print(f"  ratio batch-by-batch / up-front: {med['batch by batch'] / med['up front']:.3f}")
    print(f"  ratio batch-by-batch / index-by-index: {med['batch by batch'] / med['index by index']:.3f}")


if __name__ == "__main__":
    main()

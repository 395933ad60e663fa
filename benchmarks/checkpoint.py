"""Benchmark checkpointing: save/load throughput against plain file I/O, and activation recomputation.

    mpirun -n 2 python benchmarks/checkpoint.py                    # benchmarks/README.md, "Checkpoint"
    mpirun -n 2 python benchmarks/checkpoint.py --mb 64 --rounds 2 --dir /tmp/ckbench
    mpirun -n 2 python benchmarks/checkpoint.py --stall-only --stall-mb 8 32 128   # part 3 only

Part 1 (all ranks). A float32 MLP of ``--mb`` MB of parameters, trained one step with AdamW so the
optimizer state (exp_avg, exp_avg_sq) is twice that again, data-parallel over the world. Measured:

* ``checkpoint.save`` (the whole collective: serialise, sha256, write + fsync, manifest, rename,
  ``latest``), throughput = checkpoint bytes / wall time of the slowest rank;
* ``checkpoint.load`` of it (read, verify every checksum, deserialise, copy into the model and the
  optimizer), throughput = checkpoint bytes / wall time;
* the yardstick, on the same disk: rank 0 alone writes the same number of bytes as one file with one
  sequential ``write`` + ``fsync``, and reads it back with one ``read``.

Rounds alternate between the two so both see the same machine; the best round of each is reported
(on a shared machine other work only ever adds time). Before each read the files are evicted from the
page cache (``posix_fadvise(DONTNEED)`` after the fsync), so both reads come from the disk.

Part 3 (all ranks). The training-loop stall of a save, synchronous vs ``async_save=True``,
for the same model at ``--stall-mb`` sizes (AdamW: the checkpoint is 3x that). A DDP training step
(batch 8) runs before, during and after each save. Measured on the slowest rank:

* ``call``: from ``save()`` being called to its return (sync: the whole save; async: the copy to
  host memory and the bookkeeping, the background write still running);
* ``delay``: what the save cost the loop in all: the wall time of the save call plus the steps
  that ran until the background write committed, less as many plain steps (median step time without a
  save, measured in the same run): sync ``delay`` is ``call``; async adds the slowdown of the steps
  that share the cores with the background write (serialise, sha256, fsync);
* ``write``: how long after ``save()`` the checkpoint was committed (async; ``wait()`` returns).

Part 2 (rank 0). Activation recomputation (Chen et al. 2016): a 16-layer MLP (1024 wide, dropout,
batch 512) with and without ``minidist.nn.recompute`` around each layer; peak traced memory of one
forward + backward (``tracemalloc``, which sees NumPy's allocations) and the step time.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import time
import tracemalloc
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import checkpoint, nn, optim  # noqa: E402
from minidist.checkpoint import atomic  # noqa: E402
from minidist.nn.recompute import recompute  # noqa: E402
from minidist.parallel import DistributedDataParallel  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=128, help="parameter megabytes (x3 with AdamW state)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", default="benchmarks/results/ckpt_tmp", help="scratch folder (deleted after)")
    p.add_argument("--skip-recompute", action="store_true")
    p.add_argument("--stall-mb", type=float, nargs="+", default=[8, 32, 128], help="part 3's model sizes")
    p.add_argument("--stall-only", action="store_true", help="run part 3 only")
    return p.parse_args()


def timed(world, fn) -> float:
    """Wall time of a collective ``fn`` on the slowest rank."""
    world.barrier()
    start = time.perf_counter()
    fn()
    elapsed = np.array([time.perf_counter() - start])
    return float(dist.all_reduce(elapsed, op="max", group=world)[0])


def evict(paths) -> None:
    """Drop files from the page cache (they are fsynced), so the next read comes from the disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def plain_write_read(path: Path, nbytes: int) -> tuple[float, float]:
    data = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8).tobytes()
    start = time.perf_counter()
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    write_s = time.perf_counter() - start
    evict([path])
    start = time.perf_counter()
    with open(path, "rb") as f:
        back = f.read()
    read_s = time.perf_counter() - start
    assert len(back) == nbytes
    path.unlink()
    return write_s, read_s


def io_benchmark(args: argparse.Namespace) -> None:
    world = dist.init()
    width = 1024
    layers = max(1, round(args.mb * 2**20 / 4 / (width * width)))
    md.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    ddp = DistributedDataParallel(model)
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    x = md.tensor(np.ones((8, width), dtype=np.float32))
    ddp(x).sum().backward()
    opt.step()
    root = Path(args.dir)
    if world.rank == 0:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
    world.barrier()
    best = {"save": np.inf, "load": np.inf, "write": np.inf, "read": np.inf}
    nbytes = 0
    for r in range(args.rounds):
        folder = root / f"step_{r:09d}"
        best["save"] = min(
            best["save"], timed(world, lambda r=r: checkpoint.save(root, ddp, opt, step=r, keep_last=1))
        )
        nbytes = sum(p.stat().st_size for p in folder.iterdir())
        evict(folder.iterdir())
        best["load"] = min(best["load"], timed(world, lambda f=folder: checkpoint.load(f, ddp, opt)))
        if world.rank == 0:
            w, rd = plain_write_read(root / "plain.bin", nbytes)
            best["write"], best["read"] = min(best["write"], w), min(best["read"], rd)
        world.barrier()
    if world.rank == 0:
        mb = nbytes / 1e6
        rate = {k: mb / v for k, v in best.items()}
        print(f"checkpoint of {mb:.1f} MB ({layers} x Linear({width}, {width}) + AdamW state), "
              f"{world.size} ranks, best of {args.rounds} rounds")  # fmt: skip
        print(f"  save  {rate['save']:8.1f} MB/s   plain write+fsync {rate['write']:8.1f} MB/s   "
              f"ratio {rate['save'] / rate['write']:.2f}")  # fmt: skip
        print(f"  load  {rate['load']:8.1f} MB/s   plain read        {rate['read']:8.1f} MB/s   "
              f"ratio {rate['load'] / rate['read']:.2f}")  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


def training_step(ddp: DistributedDataParallel, opt: optim.Optimizer, x: md.Tensor) -> float:
    """One DDP + AdamW step (an all-reduce of every gradient); its wall time in seconds."""
    start = time.perf_counter()
    opt.zero_grad()
    (ddp(x) ** 2).mean().backward()  # (a sum's gradients grew until AdamW's v overflowed float32)
    opt.step()
    return time.perf_counter() - start


def all_done(handle: checkpoint.SaveHandle, world: dist.Communicator) -> bool:
    """Whether every rank's background write has finished. ``done()`` alone is this rank's: ranks that
    branched on it would run different numbers of training steps (DDP collectives) and hang."""
    flag = np.array([1.0 if handle.done() else 0.0])
    return bool(dist.all_reduce(flag, op="min", group=world)[0])


def stall_benchmark(args: argparse.Namespace) -> None:
    """Part 3: the loop's stall of a synchronous and an asynchronous save (see the module docstring)."""
    world, width = dist.init(), 1024
    root = Path(args.dir)
    if world.rank == 0:
        print(f"save stall in a DDP + AdamW loop, {world.size} ranks (ms; slowest rank; median of 3 rounds)")
        print(f"{'params MB':>9} {'ckpt MB':>8} {'step':>7} | {'sync call':>9} | {'async call':>10} "
              f"{'delay':>7} {'write':>7} {'steps':>5}")  # fmt: skip
    for mb in args.stall_mb:
        md.manual_seed(0)
        layers = max(1, round(mb * 2**20 / 4 / (width * width)))
        model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
        ddp = DistributedDataParallel(model)
        opt = optim.AdamW(model.parameters(), lr=1e-3)
        x = md.tensor(np.ones((8, width), dtype=np.float32))
        step = functools.partial(training_step, ddp, opt, x)
        if world.rank == 0:
            shutil.rmtree(root, ignore_errors=True)
        world.barrier()
        plain = float(np.median([step() for _ in range(5)][1:]))  # the first step allocates state
        rows, n = [], 0
        for _ in range(3):  # rounds: sync then async, so both see the same machine
            for mode in ("sync", "async"):
                n += 1
                world.barrier()
                start = time.perf_counter()
                saved = checkpoint.save(root, ddp, opt, step=n, keep_last=1, async_save=mode == "async")
                call, steps = time.perf_counter() - start, 0
                while mode == "async" and not all_done(saved, world):  # train on while it writes
                    step()
                    steps += 1
                write = time.perf_counter() - start
                if mode == "async":
                    saved.wait()
                delay = write - steps * plain
                worst = np.array([call, delay, write, steps])
                dist.all_reduce(worst, op="max", group=world)
                rows.append((mode, *worst))
        nbytes = sum(f.stat().st_size for f in (root / atomic.step_dirname(n)).iterdir())
        if world.rank == 0:
            med = {m: np.median([r[1:] for r in rows if r[0] == m], axis=0) for m in ("sync", "async")}
            print(f"{mb:9.0f} {nbytes / 1e6:8.0f} {plain * 1e3:7.1f} | {med['sync'][0] * 1e3:9.1f} | "
                  f"{med['async'][0] * 1e3:10.1f} {med['async'][1] * 1e3:7.1f} {med['async'][2] * 1e3:7.1f} "
                  f"{med['async'][3]:5.0f}")  # fmt: skip
    if world.rank == 0:
        shutil.rmtree(root, ignore_errors=True)


def recompute_benchmark() -> None:
    width, depth, batch = 1024, 16, 512
    md.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Dropout(0.1)) for _ in range(depth)]
    x = md.tensor(np.random.default_rng(0).standard_normal((batch, width)).astype(np.float32))

    def step(use: bool) -> None:
        h = x
        for b in blocks:
            h = recompute(b, h) if use else b(h)
        (h * h).mean().backward()
        for b in blocks:
            b.zero_grad()

    print(f"activation recomputation: {depth} x (Linear({width}, {width}), GELU, Dropout), batch {batch}")
    for use in (False, True):
        step(use)  # warm-up
        tracemalloc.start()
        step(use)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        times = []
        for _ in range(3):
            start = time.perf_counter()
            step(use)
            times.append(time.perf_counter() - start)
        label = "recompute" if use else "plain    "
        print(f"  {label}  peak traced memory {peak / 2**20:8.1f} MiB   step {min(times) * 1e3:7.1f} ms")


def main() -> None:
    args = parse_args()
    if not args.stall_only:
        io_benchmark(args)
        if dist.get_rank() == 0 and not args.skip_recompute:
            recompute_benchmark()
    stall_benchmark(args)


if __name__ == "__main__":
    main()

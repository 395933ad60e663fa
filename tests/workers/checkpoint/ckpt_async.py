"""MPI worker (2 ranks): asynchronous saves beside a training loop that keeps running collectives.

Usage: ``mpiexec -n 2 python ckpt_async.py OUT``. A DDP + AdamW float64 MLP trains ``STEPS`` steps
three times from the same seed, saving every ``EVERY`` steps:

* ``sync``: ``checkpoint.save`` (the reference files);
* ``async``: ``save(..., async_save=True)``; each background write is held back (its
  ``atomic.write_shard`` waits on an event) until the training thread has run the *next* step, i.e.
  changed every parameter in place and run a DDP all-reduce on the world while the save's own
  collectives wait on the private communicator. The files must still equal ``sync``'s;
* ``resumed``: a fresh model loads ``async``'s checkpoint of step ``EVERY`` and trains on.

Then the errors: the ranks pass different ``async_save`` (ValueError on every rank); a background
write fails on rank 1 only (a file-size limit) and nobody waits: the next ``save`` raises it on both
ranks, and the one after works. Rank r writes ``OUT/rank<r>.json`` and rank 0 the final parameters
of each run as ``OUT/<run>.npz``.
"""

from __future__ import annotations

import resource
import signal
import sys
import threading
from pathlib import Path

import numpy as np
from dist_worker_utils import run_worker, write_json

import minidist as md
import minidist.distributed as dist
from minidist import checkpoint, nn, optim
from minidist.checkpoint import CheckpointError, atomic
from minidist.data import DataLoader, DistributedSampler
from minidist.parallel import DistributedDataParallel

STEPS, EVERY = 7, 3


def build():
    md.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16, dtype=np.float64), nn.Tanh(), nn.Linear(16, 3, dtype=np.float64))
    ddp = DistributedDataParallel(model)
    opt = optim.AdamW(model.parameters(), lr=0.01)
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((40, 5)), rng.integers(0, 3, 40)
    sampler = DistributedSampler(40, batch_size=8, seed=2)
    loader = DataLoader((x, y), batch_size=sampler.local_batch_size, sampler=sampler)
    return model, ddp, opt, sampler, loader


def batches(sampler, loader):
    while True:
        yield from loader
        sampler.set_epoch(sampler.epoch + 1)


def train(run: str, root: Path, world, start_from: Path | None = None) -> dict[str, np.ndarray]:
    model, ddp, opt, sampler, loader = build()
    step = checkpoint.load(start_from, ddp, opt, sampler=sampler)["step"] if start_from else 0
    held: list[threading.Event] = []  # async: the write of the save made at the previous step
    real_write = atomic.write_shard

    def write_when_released(path, arrays):
        event = threading.Event()
        held.append(event)
        event.wait(timeout=60)  # released by the training thread one step later
        return real_write(path, arrays)

    if run == "async":
        atomic.write_shard = write_when_released
    handle = None
    try:
        for xb, yb in batches(sampler, loader):
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(md.tensor(xb)), yb).backward()  # DDP all-reduce
            opt.step()  # changes every parameter in place
            step += 1
            if handle is not None:
                while not held:  # the thread has reached its write: release it now
                    threading.Event().wait(0.001)
                held.pop().set()
                handle = None
            if step % EVERY == 0:
                saved = checkpoint.save(root, ddp, opt, step=step, sampler=sampler, async_save=run == "async")
                if run == "async":
                    assert isinstance(saved, checkpoint.SaveHandle) and not saved.done(), saved
                    handle = saved
            if step == STEPS:
                break
        if handle is not None:
            while not held:
                threading.Event().wait(0.001)
            held.pop().set()
        checkpoint.wait_pending()
    finally:
        atomic.write_shard = real_write
    return {n: p.data.copy() for n, p in model.named_parameters()}


def errors(out: Path, world) -> dict[str, list[str]]:
    model, ddp, opt, sampler, _ = build()
    root, seen = out / "errors", {}
    try:
        checkpoint.save(root, ddp, opt, step=1, async_save=world.rank == 0)
    except ValueError as err:
        seen["async_save differs"] = [type(err).__name__, str(err)]
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if world.rank == 1:  # rank 1's background write fails (EFBIG); nobody waits for it
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, hard))
    handle = checkpoint.save(root, ddp, opt, step=2, async_save=True)
    while not handle.done():
        threading.Event().wait(0.01)
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    try:
        checkpoint.save(root, ddp, opt, step=3)  # raises the failure of step 2; saves nothing
    except CheckpointError as err:
        seen["next save"] = [type(err).__name__, str(err)]
    seen["after"] = sorted(p.name for p in root.iterdir())
    checkpoint.save(root, ddp, opt, step=4, async_save=True).wait()
    seen["then"] = sorted(p.name for p in root.iterdir())
    return seen


def main(out_dir: str) -> None:
    world = dist.init()
    out = Path(out_dir)
    final = {
        "sync": train("sync", out / "sync", world),
        "async": train("async", out / "async", world),
        "resumed": train("resumed", out / "resumed", world, start_from=out / "async" / f"step_{EVERY:09d}"),
    }
    if world.rank == 0:
        for run, values in final.items():
            np.savez(out / f"{run}.npz", **values)
    write_json(out, f"rank{world.rank}.json", errors(out, world))


if __name__ == "__main__":
    run_worker(main, sys.argv[1])

"""MPI worker (2 ranks): a training loop that catches ``CheckpointError`` from ``save`` and carries on.

Usage: ``mpiexec -n 2 python ckpt_save_failures.py OUT [async]``. Every step trains (DDP: a collective)
and saves (with ``async``: ``save(..., async_save=True).wait()``, so the failures below happen on the
background thread, and its errors come from ``wait()``); at some steps one rank's save fails
somewhere along the save path:

* step 2: a file-size limit (``RLIMIT_FSIZE``, ``SIGXFSZ`` ignored) on rank 1: its shard;
* step 3: a file-size limit on rank 0 that its shard fits under but ``manifest.json`` does not;
* step 4: a full disk (``ENOSPC``) on rank 0 halfway through writing ``latest.tmp``;
* step 5: an ``EIO`` from fsync on rank 0 right after the folder was renamed into place;
* step 6: rank 1's sampler returns a NumPy integer in its state (not JSON);
* step 7: rank 0 cannot delete an old checkpoint for ``keep_last`` (``PermissionError``);
* step 9: rank 1 passes an optimizer built over another model's parameters (state gathering fails).

Rank r writes ``OUT/rank<r>.json``: ``{step: [exception type or "ok", message, rank 0's listing of the
checkpoint root afterwards, what 'latest' names]}``, plus the step ``load_latest`` resumes at.
"""

from __future__ import annotations

import errno
import resource
import signal
import sys
from pathlib import Path

import numpy as np
from dist_worker_utils import run_worker, write_json

import minidist as md
import minidist.distributed as dist
from minidist import checkpoint, nn, optim
from minidist.checkpoint import atomic
from minidist.checkpoint.errors import CheckpointError
from minidist.data import DataLoader, DistributedSampler
from minidist.parallel import DistributedDataParallel


class NumpySampler(DistributedSampler):
    """A user's sampler that keeps its epoch as a NumPy integer (json.dumps cannot write it)."""

    def state_dict(self):
        return {**super().state_dict(), "epoch": np.int64(self.epoch)}


def file_size_limit(nbytes: int):
    """Limit the size of files this process writes; return a function that lifts the limit again."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def epoch_of(sampler, loader, epoch):
    sampler.set_epoch(epoch)
    yield from loader


def main(out_dir: str, mode: str = "sync") -> None:
    world = dist.init()
    r = world.rank
    out = Path(out_dir)
    root = out / "ckpt"
    md.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8, dtype=np.float64), nn.Tanh(), nn.Linear(8, 3, dtype=np.float64))
    ddp = DistributedDataParallel(model)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((40, 4)), rng.integers(0, 3, 40)
    sampler = DistributedSampler(40, batch_size=8, seed=1)
    numpy_sampler = NumpySampler(40, batch_size=8, seed=1)
    loader = DataLoader((x, y), batch_size=sampler.local_batch_size, sampler=sampler)

    # Sizes from a probe save: rank 0's shard must fit under the step-3 limit, the manifest must not.
    probe = checkpoint.save(out / "probe", ddp, opt, step=0)
    shard, manifest = (
        (probe / "rank00000.safetensors").stat().st_size,
        (probe / "manifest.json").stat().st_size,
    )
    assert shard < manifest, (shard, manifest)

    real_write_durable, real_fsync_dir, real_prune = atomic.write_durable, atomic.fsync_dir, atomic.prune

    def half_then_full(path, data):
        if path.name == "latest.tmp":
            path.write_bytes(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_write_durable(path, data)

    def fsync_fails_after_rename(path):
        if path == root:
            raise OSError(errno.EIO, "Input/output error", str(path))
        real_fsync_dir(path)

    def cannot_delete(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(root / "step_000000001"))

    seen: dict[str, object] = {}
    step = 0
    for xb, yb in (batch for epoch in range(2) for batch in epoch_of(sampler, loader, epoch)):
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(md.tensor(xb)), yb).backward()  # DDP: an all-reduce every step
        opt.step()
        step += 1
        lift, state, optimizer = None, sampler, opt
        if step == 2 and r == 1:
            lift = file_size_limit(64)
        if step == 3 and r == 0:
            lift = file_size_limit((shard + manifest) // 2)
        if step == 4 and r == 0:
            atomic.write_durable = half_then_full
        if step == 5 and r == 0:
            atomic.fsync_dir = fsync_fails_after_rename
        if step == 6 and r == 1:
            numpy_sampler.load_state_dict(sampler.state_dict())
            state = numpy_sampler
        if step == 7 and r == 0:
            atomic.prune = cannot_delete
        if step == 9 and r == 1:
            optimizer = optim.SGD(nn.Linear(4, 8, dtype=np.float64).parameters(), lr=0.1)
        try:
            saved = checkpoint.save(
                root, ddp, optimizer, step=step, sampler=state, keep_last=2 if step >= 7 else None,
                async_save=mode == "async",
            )  # fmt: skip
            if mode == "async":
                saved.wait()  # the background write's error, on every rank
            outcome = ["ok", ""]
        except CheckpointError as err:  # the loop carries on: the next step's all-reduce must not hang
            outcome = [type(err).__name__, str(err)]
        finally:
            if lift is not None:
                lift()
            atomic.write_durable, atomic.fsync_dir, atomic.prune = (
                real_write_durable,
                real_fsync_dir,
                real_prune,
            )
        listing = sorted(p.name for p in root.iterdir()) if r == 0 else []
        seen[str(step)] = [*outcome, listing, atomic.read_latest(root)]
        if step == 9:
            break
    fresh = nn.Sequential(nn.Linear(4, 8, dtype=np.float64), nn.Tanh(), nn.Linear(8, 3, dtype=np.float64))
    seen["resumed step"] = checkpoint.load_latest(root, fresh)["step"]
    write_json(out, f"rank{r}.json", seen)


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])

"""MPI worker: a script that returns while its asynchronous save is still being written.

Usage: ``ckpt_async_exit.py ROOT finish|fail``. ``finish``: every rank's shard write is slowed by 1 s and
the script ends right after ``save(..., async_save=True)`` returns, without waiting: the save must
still commit (Python joins the non-daemon thread before ``atexit`` runs MPI_Finalize). ``fail``: the
write fails (``OSError``) and nobody waits: the error must be printed at exit, nothing committed.
"""

from __future__ import annotations

import errno
import sys
import time

import numpy as np

import minidist as md
import minidist.distributed as dist
from minidist import checkpoint, nn, optim
from minidist.checkpoint import atomic


def main(root: str, mode: str) -> None:
    dist.init()
    md.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8, dtype=np.float64), nn.Tanh(), nn.Linear(8, 3, dtype=np.float64))
    opt = optim.SGD(model.parameters(), lr=0.1)
    real = atomic.write_shard

    def slow_or_failing(path, arrays):
        # Both modes are slow, so the save is surely still pending when save() returns: a failing
        # write that raised at once could finish before the `handle.done()` check below (a CI run
        # saw exactly that race).
        time.sleep(1.0)  # still writing when the script ends
        if mode == "fail":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, arrays)

    atomic.write_shard = slow_or_failing
    handle = checkpoint.save(root, model, opt, step=5, async_save=True)
    assert not handle.done()
    print("returned before the save finished", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])

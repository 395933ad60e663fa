"""All-reduce a 4 MiB array ITERS times; rank 0 creates ``OUT/looping`` once 2 calls have finished.

Usage: ``mpiexec -n N python all_reduce_loop.py OUT ITERS [PAUSE]``: with PAUSE, rank 0 sleeps PAUSE
seconds before the last call, so the others wait in it long enough to ping it (heartbeats). Every
result is checked (the sum of the ranks' values); at the end every rank writes ``OUT/rank<r>.json``.
A test cuts a node's link while the ranks loop (``OUT/looping`` says they do), or lets the loop end
to check a clean exit.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from dist_worker_utils import write_json

import minidist.distributed as dist


def main(out: str, iters: str, pause: str = "0") -> None:
    world = dist.init()
    x = np.full(1 << 20, world.rank + 1, dtype=np.float32)
    expected = world.size * (world.size + 1) / 2
    for i in range(int(iters)):
        if i == int(iters) - 1 and world.rank == 0:
            time.sleep(float(pause))
        y = dist.all_reduce(x.copy())
        assert np.all(y == expected), (i, y[:4])
        if i == 1 and world.rank == 0:
            (Path(out) / "looping").touch()
    write_json(out, f"rank{world.rank}.json", {"iters": int(iters)})


if __name__ == "__main__":
    main(*sys.argv[1:])

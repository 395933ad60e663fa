"""MPI worker: every collective algorithm stages GPU (CuPy) arrays through the host exactly once each way.

Usage: ``mpiexec -n N python coll_staging.py OUT_DIR``. Importing ``dist_fake_cupy`` puts its stand-in
for ``cupy`` (arrays MPI cannot read, which count their device-to-host ``get`` and host-to-device ``set``
copies) into ``sys.modules`` before minidist is imported. Each rank writes ``rank<r>.json`` with the
number of checks and a list of failures.
"""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np
from dist_fake_cupy import FakeCupyArray, copies  # first: installs the fake cupy
from dist_worker_utils import run_worker, write_json

import minidist.distributed as dist


def main(out_dir: str) -> None:
    world = dist.init()
    r, n = world.rank, world.size
    report = {"checks": 0, "failures": []}

    def check(ok: bool, what: str) -> None:
        report["checks"] += 1
        if not ok:
            report["failures"].append(f"{what}; copies {dict(copies)}")

    def counted(call, *args, **kwargs):
        copies.clear()
        return call(*args, **kwargs)

    values = np.arange(2 * n + 1.0) + r  # longer than the group, not a multiple of its size
    total = sum(np.arange(2 * n + 1.0) + k for k in range(n))
    root = n - 1
    once_each_way, read_only, write_only = Counter(get=1, set=1), Counter(get=1), Counter(set=1)

    for algorithm in dist.ALGORITHMS["all_reduce"]:
        a = FakeCupyArray(values)
        out = counted(dist.all_reduce, a, algorithm=algorithm)
        check(out is a and np.array_equal(a._data, total), f"all_reduce ({algorithm}) result")
        check(copies == once_each_way, f"all_reduce ({algorithm}) copies in once and out once")

    for algorithm in dist.ALGORITHMS["reduce_scatter"]:
        a = FakeCupyArray(values)
        chunk = counted(dist.reduce_scatter, a, algorithm=algorithm)
        ok = isinstance(chunk, FakeCupyArray) and np.array_equal(chunk._data, np.array_split(total, n)[r])
        check(ok and np.array_equal(a._data, values), f"reduce_scatter ({algorithm}) chunk on the device")
        check(copies == read_only, f"reduce_scatter ({algorithm}) copies in once")

    for algorithm in dist.ALGORITHMS["reduce"]:
        a = FakeCupyArray(values)
        out = counted(dist.reduce, a, dst=root, algorithm=algorithm)
        want = total if r == root else values
        check(out is a and np.array_equal(a._data, want), f"reduce ({algorithm}) result")
        check(copies == (once_each_way if r == root else read_only), f"reduce ({algorithm}) copies")

    for algorithm in dist.ALGORITHMS["broadcast"]:
        a = FakeCupyArray(values)
        counted(dist.broadcast, a, src=root, algorithm=algorithm)
        check(np.array_equal(a._data, np.arange(2 * n + 1.0) + root), f"broadcast ({algorithm}) result")
        # The root only reads its array; the others only write theirs.
        check(copies == (read_only if r == root else write_only), f"broadcast ({algorithm}) copies")

    write_json(out_dir, f"rank{r}.json", report)


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])

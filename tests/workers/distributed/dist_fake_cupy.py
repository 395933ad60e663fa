"""MPI worker: GPU (CuPy) arrays are staged through host memory, checked without a GPU.

Usage: ``mpiexec -n 3 python dist_fake_cupy.py OUT_DIR``. A stand-in for ``cupy`` is put into
``sys.modules`` before minidist is imported. Its arrays keep their data private (MPI cannot read them:
they have no buffer interface, just as MPI cannot read GPU memory) and count the device-to-host copies
(``get``) and host-to-device copies (``set``) that ``minidist.distributed.staging`` makes. Each rank writes
``rank<r>.json`` with a list of failures.
"""

from __future__ import annotations

import sys
import types
from collections import Counter

import numpy as np
from dist_worker_utils import run_worker, write_json

copies: Counter = Counter()


class FakeCupyArray:
    """Holds a NumPy array out of MPI's reach; ``get``/``set`` copy it out/in like CuPy's methods."""

    def __init__(self, data) -> None:
        self._data = np.array(data)  # a private copy, like memory on a device

    shape = property(lambda self: self._data.shape)
    dtype = property(lambda self: self._data.dtype)
    size = property(lambda self: self._data.size)
    nbytes = property(lambda self: self._data.nbytes)
    flags = property(lambda self: self._data.flags)

    def get(self) -> np.ndarray:
        copies["get"] += 1
        return self._data.copy()

    def set(self, host: np.ndarray) -> None:
        copies["set"] += 1
        self._data[...] = host

    def reshape(self, *shape) -> FakeCupyArray:
        return FakeCupyArray(self._data.reshape(*shape))

    def copy(self) -> FakeCupyArray:
        return FakeCupyArray(self._data)


FakeCupyArray.__module__ = "cupy"  # what minidist.backend.is_gpu_array looks at
fake_cupy = types.ModuleType("cupy")
fake_cupy.asarray = FakeCupyArray
sys.modules["cupy"] = fake_cupy

import minidist.distributed as dist  # noqa: E402  (after the fake cupy is in place)


def main(out_dir: str) -> None:
    world = dist.init()
    r, n = world.rank, world.size
    failures = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            failures.append(f"{what}; copies so far {dict(copies)}")

    def counted(call, *args, **kwargs):
        copies.clear()
        return call(*args, **kwargs)

    values = np.arange(7.0) + r  # rank r holds [r, r+1, ..., r+6]
    total = sum(np.arange(7.0) + k for k in range(n))

    a = FakeCupyArray(values)
    out = counted(dist.all_reduce, a)
    check(out is a and np.array_equal(a._data, total), "all_reduce result")
    check(copies == Counter(get=1, set=1), "all_reduce copies in once and out once")

    a = FakeCupyArray(values)
    chunk = counted(dist.reduce_scatter, a)
    check(isinstance(chunk, FakeCupyArray), "reduce_scatter returns a device array")
    check(np.array_equal(chunk._data, np.array_split(total, n)[r]), "reduce_scatter chunk")
    check(np.array_equal(a._data, values), "reduce_scatter leaves its input alone")

    gathered = counted(dist.all_gather, FakeCupyArray(np.full(r + 1, float(r))))
    check(isinstance(gathered, FakeCupyArray), "all_gather returns a device array")
    want = np.concatenate([np.full(k + 1, float(k)) for k in range(n)])
    check(np.array_equal(gathered._data, want), "all_gather concatenation")

    for algorithm in ("tree", "mpi"):
        a = FakeCupyArray(values)
        counted(dist.broadcast, a, src=1, algorithm=algorithm)
        check(np.array_equal(a._data, np.arange(7.0) + 1), f"broadcast ({algorithm})")
        # The root only reads its array; the others only write theirs.
        check(copies == (Counter(get=1) if r == 1 else Counter(set=1)), f"broadcast ({algorithm}) copies")

    if r == 0:
        dist.send(FakeCupyArray(values), dst=1)
        dist.send(np.zeros(3), dst=1)  # too short for rank 1's buffer
    elif r == 1:
        into = FakeCupyArray(np.zeros(7))
        counted(dist.recv, into, src=0)
        check(np.array_equal(into._data, np.arange(7.0)), "recv into a device array")
        check(copies == Counter(set=1), "recv copies out only (nothing to copy in)")
        into = FakeCupyArray(np.full(4, -1.0))
        try:
            counted(dist.recv, into, src=0)
            check(False, "recv of a too-short message raised nothing")
        except dist.DistributedError:
            check(np.array_equal(into._data, np.full(4, -1.0)) and copies["set"] == 0, "failed recv wrote")

    check(isinstance(dist.mpi_is_cuda_aware(), bool), "mpi_is_cuda_aware returns a bool")
    write_json(out_dir, f"rank{r}.json", {"failures": failures})


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])

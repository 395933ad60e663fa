"""Where a DP step's time goes beyond the local step: DDP vs the same all-reduce written by hand (issue 16).

    mpiexec -n 2 python benchmarks/ddp_breakdown.py

The small MLP (64-256-256-10, 64 rows per rank, SGD) six ways, taking turns (15 rounds x 30 steps, the
slowest rank's wall time per step): ``ddp`` (DistributedDataParallel), ``ours`` (the local model, then
its gradients packed into one flat array, ``dist.all_reduce``, divided and unpacked by hand), ``mpi``
(the same with mpi4py's ``Allreduce``), ``none`` (the local step without communication), and the NumPy
reference of ``peer.py`` with (``ref``) and without (``ref none``) its one ``Allreduce``.
``ddp - ours`` is DDP's own bookkeeping, ``ours - mpi`` the hand-written all-reduce against MPI's,
``mpi - none`` the all-reduce including the ranks' wait for each other, to be compared with
``ref - ref none``; ``none - ref none`` is the local step's gap, with both ranks computing at once.
Figures: benchmarks/README.md, "After" and "The DP-2 gap, split in time".
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import nn, optim  # noqa: E402
from minidist.models import MLP  # noqa: E402
from minidist.parallel import DistributedDataParallel  # noqa: E402
from minidist.parallel.buckets import flatten, unflatten_into  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from numpy_reference import ReferenceStage, dp_step  # noqa: E402

KINDS = ("ddp", "ours", "mpi", "none", "ref", "ref none")


def make_step(kind: str, world: dist.Communicator, x: md.Tensor, y: np.ndarray) -> Callable[[], None]:
    """One training step of the ``kind`` above, on a fresh model from seed 0."""
    md.manual_seed(0)
    model = MLP(64, [256, 256], 10)
    if kind.startswith("ref"):  # the hand-written NumPy step, from the same initial weights
        stage = ReferenceStage([np.array(p.data) for p in model.parameters()], head=True)
        dp_comm = world.mpi.Dup() if kind == "ref" else None  # None: no all-reduce
        x_host = np.asarray(x.data)
        return lambda: dp_step(stage, x_host, y, 0.05, dp_comm)
    if kind == "ddp":
        ddp = DistributedDataParallel(model, group=world)
        opt = optim.SGD(ddp.parameters(), lr=0.05)

        def ddp_step() -> None:
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()

        return ddp_step
    params = list(model.parameters())
    comm = world.mpi.Dup()  # MPI's own messages on a communicator of their own
    opt = optim.SGD(params, lr=0.05)

    def by_hand() -> None:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        grads = [p.grad for p in params]
        flat = flatten(grads)  # pack, as DDP's buckets do
        if kind == "mpi":
            comm.Allreduce(MPI.IN_PLACE, flat)
        elif kind == "ours":
            dist.all_reduce(flat, group=world)
        flat /= world.size
        unflatten_into(flat, grads)
        opt.step()

    return by_hand


def main() -> None:
    world = dist.init()
    rng = np.random.default_rng(world.rank)
    x = md.tensor(rng.standard_normal((64, 64), dtype=np.float32))
    y = rng.integers(0, 10, 64)
    steps = {kind: make_step(kind, world, x, y) for kind in KINDS}
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for step in steps.values():
        for _ in range(20):
            step()
    for _ in range(15):
        for kind, step in steps.items():
            world.mpi.Barrier()
            start = time.perf_counter()
            for _ in range(30):
                step()
            times[kind].append(world.mpi.allreduce((time.perf_counter() - start) / 30, op=MPI.MAX))
    if world.rank == 0:
        print(f"small MLP, 64 rows per rank, {world.size} ranks; load {os.getloadavg()[0]:.2f}")
        for kind, t in times.items():
            print(f"{kind:8s} median {np.median(t) * 1e6:7.0f} us  min {min(t) * 1e6:7.0f} us")


if __name__ == "__main__":
    main()

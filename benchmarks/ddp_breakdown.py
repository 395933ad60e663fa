"""Where a DP step's time goes beyond the NumPy reference's: local step, packing, all-reduce, DDP (issue 16).

    mpiexec -n 2 python benchmarks/ddp_breakdown.py

The small MLP (64-256-256-10, 64 rows per rank, SGD) seven ways, taking turns (``--rounds`` rounds x 30
steps, the slowest rank's wall time per step):

* ``ddp``: ``DistributedDataParallel``, as ``peer.py`` times it;
* ``ours``: the local model, then what DDP does with its one bucket, called directly (``Bucket``):
  each ``.grad`` copied into the flat buffer (``pack``), ``dist.all_reduce(op="avg")`` on it, and each
  ``.grad`` made a view of its piece (``unpack``, no copy back);
* ``mpi``: the same with mpi4py's ``Allreduce`` and a division;
* ``pack``: the same without any communication (the copy into the buffer only);
* ``local``: the local step alone;
* ``ref`` / ``ref none``: the NumPy reference of ``peer.py`` with and without its one ``Allreduce``
  (its gradients are views of one flat buffer from the start: it has nothing to pack).

First a check that the contenders compute the same step (``check``). Printed, besides the times,
the gap ``ddp - ref`` split into five differences that add up to it:

* ``local - ref none``: minidist's local step (``feature_cost.py`` splits it by feature);
* ``pack - local``: copying the gradients into the buffer;
* ``(mpi - pack) - (ref - ref none)``: the same ``Allreduce`` and division with the ranks' wait (~0);
* ``ours - mpi``: our all-reduce against MPI's;
* ``ddp - ours``: DDP's bookkeeping (hooks, bucket plan, the unused-parameter flags, statistics).

Until the sixth session the by-hand contenders copied the averaged gradients back into fresh arrays
(``unflatten_into``, ~100 µs here), which DDP does not do; that copy was counted as "local step" and
overstated its share (benchmarks/README.md, "The DP-2 gap, split again").
"""

from __future__ import annotations

import argparse
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
from minidist.parallel.data_parallel.buckets import Bucket  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from numpy_reference import ReferenceStage, compare, dp_step  # noqa: E402

KINDS = ("ddp", "ours", "mpi", "pack", "local", "ref", "ref none")
CHECK_STEPS = 5
SPLIT = (  # (label, the difference as (plus, minus) pairs of kinds)
    ("local step: local - ref none", (("local", "ref none"),)),
    ("packing: pack - local", (("pack", "local"),)),
    ("Allreduce + wait: (mpi - pack) - (ref - ref none)", (("mpi", "pack"), ("ref none", "ref"))),
    ("our all-reduce: ours - mpi", (("ours", "mpi"),)),
    ("DDP's bookkeeping: ddp - ours", (("ddp", "ours"),)),
)


Built = tuple[Callable[[], None], list]  # (one step, the parameters it trains)


def make_step(kind: str, world: dist.Communicator, x: md.Tensor, y: np.ndarray) -> Built:
    """(one training step of the ``kind`` above, on a fresh model from seed 0; its parameters)."""
    md.manual_seed(0)
    model = MLP(64, [256, 256], 10)
    if kind.startswith("ref"):  # the hand-written NumPy step, from the same initial weights
        stage = ReferenceStage([np.array(p.data) for p in model.parameters()], head=True)
        dp_comm = world.mpi.Dup() if kind == "ref" else None  # None: no all-reduce
        x_host = np.asarray(x.data)
        return (lambda: dp_step(stage, x_host, y, 0.05, dp_comm)), stage.params
    net = DistributedDataParallel(model, group=world) if kind == "ddp" else model
    params = list(net.parameters())
    opt = optim.SGD(params, lr=0.05)
    bucket = Bucket(0, params)  # one bucket of every gradient, as DDP's plan makes here
    comm = world.mpi.Dup()  # MPI's own messages on a communicator of their own

    def step() -> None:
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        if kind in ("ours", "mpi", "pack"):
            bucket.pack()  # DDP's own copy into the buffer
            if kind == "mpi":
                comm.Allreduce(MPI.IN_PLACE, bucket.flat)
                np.divide(bucket.flat, world.size, out=bucket.flat)
            elif kind == "ours":
                dist.all_reduce(bucket.flat, op="avg", group=world)
            bucket.unpack()  # views of the buffer, no copy back
        opt.step()

    return step, params


def check(built: dict[str, Built], world: dist.Communicator) -> list[str]:
    """Lines saying whether, after CHECK_STEPS steps of each, the contenders that average gradients
    (ddp, ours, mpi, ref) hold the same parameters on every rank, and those that do not (pack, local,
    ref none) the same as each other: allclose, rtol 1e-4, atol 1e-5 (float32 sums in other orders drift
    by a few ulps per step; a missing average moves a parameter by lr x |g|, far more)."""
    for step, _ in built.values():
        for _ in range(CHECK_STEPS):
            step()
    lines = []
    for group in (("ddp", "ours", "mpi", "ref"), ("pack", "local", "ref none")):
        for kind in group[1:]:
            _, ok = compare(built[group[0]][1], built[kind][1], rtol=1e-4, atol=1e-5)
            ok = world.mpi.allreduce(ok, op=MPI.LAND)
            lines.append(f"check: {kind} vs {group[0]} after {CHECK_STEPS} steps, every rank: allclose {ok}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=25)
    args = parser.parse_args()
    world = dist.init()
    rng = np.random.default_rng(world.rank)
    x = md.tensor(rng.standard_normal((64, 64), dtype=np.float32))
    y = rng.integers(0, 10, 64)
    built = {kind: make_step(kind, world, x, y) for kind in KINDS}
    steps = {kind: step for kind, (step, _) in built.items()}
    lines = check(built, world)
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for step in steps.values():
        for _ in range(20):
            step()
    for _ in range(args.rounds):
        for kind, step in steps.items():
            world.mpi.Barrier()
            start = time.perf_counter()
            for _ in range(30):
                step()
            times[kind].append(world.mpi.allreduce((time.perf_counter() - start) / 30, op=MPI.MAX))
    if world.rank != 0:
        return
    med = {kind: float(np.median(t)) * 1e6 for kind, t in times.items()}
    print(f"small MLP, 64 rows per rank, {world.size} ranks; load {os.getloadavg()[0]:.2f}")
    print("\n".join(lines))
    for kind in KINDS:
        print(f"{kind:8s} median {med[kind]:7.0f} us  min {min(times[kind]) * 1e6:7.0f} us")
    print(f"the gap ddp - ref: {med['ddp'] - med['ref']:+.0f} us, of which")
    for label, pairs in SPLIT:
        print(f"  {label:52s} {sum(med[a] - med[b] for a, b in pairs):+6.0f} us")


if __name__ == "__main__":
    main()

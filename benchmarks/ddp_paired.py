"""DDP before and after a change, in one process: the fairest comparison on a shared machine.

    git archive <commit> | tar -x -C /tmp/before                       # the code before the change
    mpiexec -n 2 python benchmarks/ddp_paired.py --before /tmp/before [--cap 1e-9] [--small 0]

Run from the repository root with ``PYTHONPATH=.`` so that ``minidist`` is this checkout. The older
``DistributedDataParallel`` (its folder ``minidist/parallel/data_parallel/``: a checkout with that
layout) is loaded from ``--before`` as a separate package; the rest of minidist (autograd, collectives) is
this checkout's for both. Both wrap the small MLP of ``small_mlp.py`` and take turns with the hand-written
step (local model + mpi4py ``Allreduce``) in ``--rounds`` rounds of ``--steps`` forward + backward steps (no
optimizer); a round's time per step is the slowest rank's. Prints the medians and the median over rounds of
(after - before): with the load changing from second to second, paired rounds see the same conditions.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import numpy as np  # noqa: E402
from ddp import time_round  # noqa: E402
from overhead_parallel import averaged_by_hand, backward_step  # noqa: E402
from small_mlp import add_workload_args, make_workload  # noqa: E402

import minidist.distributed as dist  # noqa: E402
from minidist.parallel import DistributedDataParallel  # noqa: E402


def load_before(root: Path) -> type:
    """The ``DistributedDataParallel`` of the checkout at ``root`` (its ``minidist/parallel/data_parallel/``
    folder), as package ``ddp_before``."""
    package = Path(tempfile.mkdtemp()) / "ddp_before"
    atexit.register(shutil.rmtree, package.parent, ignore_errors=True)
    folder = root / "minidist" / "parallel" / "data_parallel"
    shutil.copytree(folder, package, ignore=shutil.ignore_patterns("__pycache__"))
    for path in package.glob("*.py"):
        path.write_text(path.read_text().replace("minidist.parallel.data_parallel", "ddp_before"))
    sys.path.insert(0, str(package.parent))
    from ddp_before import DistributedDataParallel as Before

    return Before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_args(parser)
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the code before")
    parser.add_argument("--cap", type=float, default=25, help="bucket_cap_mb for both")
    parser.add_argument("--small", type=int, default=None, help="small_bucket_bytes for the new DDP")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    load = os.getloadavg()
    w = make_workload(args)
    comm, group = dist.init().mpi, w.mesh.dp_group
    extra = {} if args.small is None else {"small_bucket_bytes": args.small}
    before, _ = backward_step(w, lambda m: load_before(args.before)(m, group=group, bucket_cap_mb=args.cap))
    after, _ = backward_step(
        w, lambda m: DistributedDataParallel(m, group=group, bucket_cap_mb=args.cap, **extra)
    )
    by_hand = averaged_by_hand(w, *backward_step(w, lambda m: m))

    steps = {"before": before, "after": after, "by hand": by_hand}
    for fn in steps.values():
        time_round(fn, comm, 5)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, fn in steps.items():
            times[name].append(time_round(fn, comm, args.steps))
    if comm.Get_rank() == 0:
        medians = "  ".join(f"{name} {np.median(t) * 1e6:.0f} us" for name, t in times.items())
        paired = np.median(np.subtract(times["after"], times["before"])) * 1e6
        print(f"DDP per step (cap {args.cap} MiB, {extra or 'defaults'}), load {load[0]:.2f}: {medians}")
        print(f"median over rounds of (after - before): {paired:+.0f} us per step")


if __name__ == "__main__":
    main()

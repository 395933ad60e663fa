"""minidist's step time against a hand-written NumPy reference and PyTorch eager, in one run.

    mpiexec -n 1 python benchmarks/peer.py                  # 1 rank
    mpiexec -n 2 python benchmarks/peer.py                  # DP 2   (-n 4: DP 4)
    mpiexec -n 2 python benchmarks/peer.py --pp 2           # 2 GPipe stages, 4 microbatches
    mpiexec -n 4 python benchmarks/peer.py --dp 2 --pp 2    # dp2 x pp2

The workload is ``small_mlp.py``'s (64-256-256-10, global batch 128, float32, SGD). Three contenders:

* minidist through its public API (DDP for dp > 1, ``PipelineParallel(schedule="gpipe")`` for pp > 1);
* ``numpy_reference.py``: the same arithmetic with a hand-written backward and bare mpi4py calls,
  the stand-in for ShallowSpeed (not a dependency; its workload, not its code);
* PyTorch eager on CPU, one thread (``torch.set_num_threads(1)``), gradients averaged with mpi4py
  ``Allreduce`` for dp > 1; not with pipeline stages. Prints "PyTorch not installed" if it is missing.

First a correctness check: from the same initial weights and data, 5 steps of each; the other
contenders' parameters must equal minidist's (allclose, rtol 1e-4, atol 1e-5: float32 sums in other
orders drift by a few ulps per step, while a wrong gradient moves a parameter by lr x |grad| >> 1e-5).
Then ``--rounds`` rounds, each timing ``--steps`` steps of every contender in turn (interleaved, so
load from other processes hits all alike). A round's time per step is the slowest rank's: wall time,
or with ``--clock cpu`` each rank's CPU time (``time.process_time``: a rank's own work, its
communication thread's and its MPI waits, which spin, but not the time the OS gave its core to another
process; the fairer clock on a shared, loaded machine). Printed:
median, min and the spread (max - min) / median over rounds, and the ratios of the medians (to the
reference and to PyTorch). CSV to
``benchmarks/results/peer_dp{dp}_pp{pp}.csv``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import numpy as np  # noqa: E402
from ddp import time_round  # noqa: E402  (the slowest rank's wall time per step of one round)
from mpi4py import MPI  # noqa: E402
from numpy_reference import compare  # noqa: E402
from small_mlp import (  # noqa: E402
    Workload,
    add_workload_args,
    make_workload,
    minidist_step,
    reference_step,
    torch_step,
    write_csv,
)

CHECK_STEPS, RTOL, ATOL = 5, 1e-4, 1e-5


def builders(w: Workload) -> dict:
    contenders = {"minidist": minidist_step, "numpy reference": reference_step}
    if torch_step(w) is not None:
        contenders["pytorch eager"] = torch_step
    return contenders


def check(w: Workload, comm: MPI.Comm) -> list[str]:
    """Lines saying whether each contender's parameters after CHECK_STEPS steps equal minidist's."""
    runs = {name: build(w) for name, build in builders(w).items()}
    for step, _ in runs.values():
        for _ in range(CHECK_STEPS):
            step()
    ours = runs.pop("minidist")[1]
    lines = []
    for name, (_, params) in runs.items():
        diff, ok = compare(params, ours, RTOL, ATOL)
        diff, ok = comm.allreduce(diff, op=MPI.MAX), comm.allreduce(ok, op=MPI.LAND)
        lines.append(
            f"check: {name} vs minidist after {CHECK_STEPS} steps: max |diff| {diff:.2e} over all ranks' "
            f"parameters, allclose(rtol={RTOL:g}, atol={ATOL:g}): {ok}"
        )
    return lines


def cpu_round(step, comm: MPI.Comm, steps: int) -> float:
    """CPU time of ``steps`` steps / steps, in seconds, on the rank that used the most (see --clock)."""
    comm.Barrier()
    start = time.process_time()
    for _ in range(steps):
        step()
    return comm.allreduce((time.process_time() - start) / steps, op=MPI.MAX)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_args(parser)
    parser.add_argument("--steps", type=int, default=50, help="steps per contender per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="wall or CPU time per step")
    args = parser.parse_args()
    load_before = os.getloadavg()
    w = make_workload(args)
    comm, mesh = w.mesh.world.mpi, w.mesh
    lines = check(w, comm)
    steps = {name: build(w)[0] for name, build in builders(w).items()}
    for step in steps.values():
        time_round(step, comm, args.warmup)
    times: dict[str, list[float]] = {name: [] for name in steps}
    timed = time_round if args.clock == "wall" else cpu_round
    for _ in range(args.rounds):
        for name, step in steps.items():
            times[name].append(timed(step, comm, args.steps))
    if comm.Get_rank() != 0:
        return
    print(f"small MLP 64-256-256-10, global batch {args.batch}, float32, SGD; dp={mesh.dp} pp={mesh.pp}"
          + (f" (GPipe, {args.microbatches} microbatches)" if mesh.pp > 1 else "")
          + f"; {args.rounds} rounds x {args.steps} steps, interleaved; {args.clock} clock")  # fmt: skip
    print(f"load average (1, 5, 15 min) before: {load_before[0]:.2f} {load_before[1]:.2f} "
          f"{load_before[2]:.2f}; after: {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs")  # fmt: skip
    print("\n".join(lines))
    if "pytorch eager" not in steps:
        print("PyTorch not installed" if mesh.pp == 1 else "PyTorch: no pipeline version here")
    med = {name: float(np.median(t)) for name, t in times.items()}
    ref = med["numpy reference"]
    print(f"{'':16s} {'median ms':>10s} {'min ms':>8s} {'spread':>7s} {'/ reference':>12s} "
          f"{'/ pytorch':>10s}")  # fmt: skip
    rows = ["contender,dp,pp,median_ms,min_ms,spread,ratio_vs_reference,ratio_vs_pytorch"]
    for name, t in times.items():
        spread = (max(t) - min(t)) / med[name]
        vs_torch = med[name] / med["pytorch eager"] if "pytorch eager" in med else float("nan")
        torch_text = "-" if np.isnan(vs_torch) else f"{vs_torch:.2f}x"
        print(f"{name:16s} {med[name] * 1e3:10.3f} {min(t) * 1e3:8.3f} {spread:7.1%} "
              f"{med[name] / ref:11.2f}x {torch_text:>10s}")  # fmt: skip
        rows.append(f"{name},{mesh.dp},{mesh.pp},{med[name] * 1e3:.4f},{min(t) * 1e3:.4f},{spread:.4f},"
                    f"{med[name] / ref:.4f},{vs_torch:.4f}")  # fmt: skip
    write_csv("peer", mesh, rows)


if __name__ == "__main__":
    main()

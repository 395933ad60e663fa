"""Check minidist_tools.perfmodel.step against measured DDP training steps at 1, 2 and 4 ranks.

    python benchmarks/perfmodel_check.py                 # launches mpiexec -n 1, 2, 4 itself
    python benchmarks/perfmodel_check.py --ranks 1 2 --steps 3 --json   # what lesson 09 runs

Model: an MLP of 4 x Linear(1024, 1024) (4.2 M parameters, 16.8 MB of float32 gradients), a *global*
batch of 256 split over the ranks (strong scaling), cross-entropy, SGD, DistributedDataParallel with
25 MB buckets. For each rank count, one ``mpiexec -n k`` job

1. calibrates the model on this machine, all ranks at once (so ranks sharing a core see half of it):
   FLOP/s from a timed matmul of the shape of one layer's forward, ``(256/k, 1024) @ (1024, 1024)``;
   alpha and beta from simultaneous ping-pongs between rank pairs; gamma from a timed NumPy add;
2. times ``--steps`` training steps (fastest of ``--rounds`` rounds, after a warm-up);
3. predicts the step with ``perfmodel.predict`` and reports the error (predicted / measured - 1).

What the model leaves out (the printed error includes it): elementwise work (ReLU, softmax, the
optimizer's update), Python overhead per op, and smaller matmuls running further from peak speed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one BLAS thread per rank: the ranks share the cores

import numpy as np  # noqa: E402

WIDTH, LAYERS, GLOBAL_BATCH = 1024, 4, 256


def worker(args: argparse.Namespace) -> None:
    import minidist as md
    import minidist.distributed as dist
    from minidist import nn, optim
    from minidist.parallel import DistributedDataParallel
    from minidist_tools.perfmodel import step as perfmodel

    world = dist.init()
    n = world.size
    local = len(np.array_split(np.arange(GLOBAL_BATCH), n)[world.rank])
    world.barrier()  # all ranks multiply at the same time, as they do in training
    flops = world.mpi.allreduce(perfmodel.measure_flops(local, WIDTH, WIDTH, repeats=20), op=_min())
    alpha, beta = perfmodel.measure_alpha_beta(world) if n > 1 else (0.0, 0.0)
    gamma = world.mpi.allreduce(perfmodel.measure_gamma(), op=_max())

    md.manual_seed(0)
    layers: list[nn.Module] = []
    for i in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH)] + ([nn.ReLU()] if i < LAYERS - 1 else [])
    model = DistributedDataParallel(nn.Sequential(*layers))
    opt = optim.SGD(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(world.rank)
    x = md.tensor(rng.standard_normal((local, WIDTH), dtype=np.float32))
    y = rng.integers(0, WIDTH, local)

    def step() -> None:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()  # warm-up
    rounds = []
    for _ in range(args.rounds):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        rounds.append(world.mpi.allreduce((time.perf_counter() - start) / args.steps, op=_max()))
    params = sum(p.size for p in model.parameters())
    hw = perfmodel.Hardware(flops=flops, alpha=alpha, beta=beta, gamma=gamma)
    work = perfmodel.Workload(params=params, global_batch=GLOBAL_BATCH, bytes_per_value=4)
    pred = perfmodel.predict(work, hw, dp=n)
    if world.rank == 0:
        row = {"ranks": n, "measured_s": min(rounds), "predicted_s": pred.step, "compute_s": pred.compute,
               "comm_s": pred.dp_comm, "flops": flops, "alpha": alpha, "beta": beta,
               "gamma": gamma}  # fmt: skip
        row["error"] = row["predicted_s"] / row["measured_s"] - 1
        print("RESULT " + json.dumps(row), flush=True)


def _min():
    from mpi4py import MPI

    return MPI.MIN


def _max():
    from mpi4py import MPI

    return MPI.MAX


def mpiexec() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else "mpiexec"


def launch(ranks: int, args: argparse.Namespace) -> dict:
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, __file__, "--worker",
           "--steps", str(args.steps), "--rounds", str(args.rounds)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--steps", type=int, default=5, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds; the fastest is reported")
    p.add_argument("--json", action="store_true", help="print one JSON list instead of a table")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    rows = [launch(k, args) for k in args.ranks]
    if args.json:
        print(json.dumps(rows))
        return
    print(f"load average {os.getloadavg()[0]:.1f}; MLP 4 x {WIDTH}, global batch {GLOBAL_BATCH}, float32")
    print("ranks  GFLOP/s/rank  alpha us  1/beta GB/s  measured s  predicted s  (compute  comm)  error")
    for r in rows:
        bw = 1 / r["beta"] / 1e9 if r["beta"] else float("nan")
        print(f"{r['ranks']:>5}  {r['flops'] / 1e9:>12.1f}  {r['alpha'] * 1e6:>8.1f}  {bw:>11.1f}  "
              f"{r['measured_s']:>10.4f}  {r['predicted_s']:>11.4f}  ({r['compute_s']:.4f} {r['comm_s']:.4f})"
              f"  {r['error']:+.0%}")  # fmt: skip


if __name__ == "__main__":
    main()

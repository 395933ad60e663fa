"""Benchmark DistributedDataParallel: scaling from 1 to N ranks, overlap, and PyTorch DDP as the yardstick.

    mpirun -n 2 python benchmarks/ddp.py                       # benchmarks/README.md, "DDP"
    mpirun -n 2 python benchmarks/ddp.py --steps 3 --rounds 2 --trace ddp_trace.json --no-torch

The model is compute-bound on purpose: an MLP of 4 Linear layers 2048 -> 2048 (ReLU between them,
16.8 M parameters, 67 MB of float32 gradients), a batch of 256 samples *per rank*, cross-entropy over
2048 classes, plain SGD, float32, one BLAS thread per rank. One launch measures everything:

1. minidist on 1 rank (rank 0 alone, in a group of its own, while the other ranks sleep), then on all
   N ranks. Scaling efficiency = t(1) / t(N): with a fixed batch per rank (weak scaling) perfect
   scaling keeps the step time constant, so 100% means communication cost nothing.
2. The overlap fraction from a timeline trace of one round on N ranks (``minidist.trace``): the share
   of communication time hidden behind backward, per rank.
3. If ``import torch`` works (``pip install -e ".[bench]"``): the same model, batch, dtype and thread
   count with PyTorch's DistributedDataParallel over the gloo backend (CPU, TCP on 127.0.0.1), on 1 and
   N ranks, and the ratio minidist / PyTorch (< 1 means minidist is faster).

Timing: ``--warmup`` steps, then ``--rounds`` rounds of ``--steps`` steps, alternating between rank 0
alone and all ranks so both see the same machine conditions. A round's step time is its wall time /
steps on the slowest rank; the fastest round is reported, because on a shared machine other work only
ever adds time (check ``uptime`` first; the load is printed).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one BLAS thread per rank: the ranks share the cores

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import nn, optim, trace  # noqa: E402
from minidist.parallel import DistributedDataParallel, ZeroRedundancyOptimizer  # noqa: E402
from minidist_tools import timeline  # noqa: E402

WIDTH, LAYERS, BATCH = 2048, 4, 256


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=5, help="rounds; the fastest round is reported")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--bucket-cap-mb", type=float, default=25)
    p.add_argument("--no-overlap", action="store_true", help="minidist DDP with overlap=False")
    p.add_argument("--no-torch", action="store_true", help="skip PyTorch even if it is installed")
    p.add_argument("--trace", default=None, metavar="OUT.json", help="save the traced round's timeline")
    return p.parse_args()


Step = Callable[[], None]


def time_round(step: Step, comm: MPI.Comm, steps: int) -> float:
    """Wall time of ``steps`` steps / steps, in seconds, on the slowest rank of ``comm``."""
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return comm.allreduce((time.perf_counter() - start) / steps, op=MPI.MAX)


def on_rank_0_alone(work: Callable[[], None], world: MPI.Comm) -> None:
    """Rank 0 runs ``work``; the other ranks sleep meanwhile (a blocking MPI wait would spin and steal
    a core from rank 0's single-rank measurement)."""
    if world.Get_rank() == 0:
        work()
    request = world.Ibarrier()
    while not request.Test():
        time.sleep(0.02)


def measure(
    single: Step | None, everyone: Step, world: MPI.Comm, args: argparse.Namespace
) -> dict[str, float]:
    """Step times on rank 0 alone (``single``, None on other ranks) and on all ranks (``everyone``).

    The rounds alternate (1 rank, N ranks, 1 rank, ...) so both see the same machine conditions, and
    the fastest round of each is reported: on a shared machine other work only ever adds time.
    """
    times: dict[str, list[float]] = {"t1": [], "tN": []}

    def rank_0_round(steps: int, record: bool) -> None:
        assert single is not None  # on rank 0
        seconds = time_round(single, MPI.COMM_SELF, steps)
        if record:
            times["t1"].append(seconds)

    # Warm-up (caches, the allocator, first-touch page faults), then alternating timed rounds.
    for steps, record in [(args.warmup, False)] * (args.warmup > 0) + [(args.steps, True)] * args.rounds:
        on_rank_0_alone(lambda: rank_0_round(steps, record), world)  # noqa: B023  (called at once)
        seconds = time_round(everyone, world, steps)
        if record:
            times["tN"].append(seconds)
    return {"t1": min(times["t1"]) if times["t1"] else 0.0, "tN": min(times["tN"])}


# --- minidist ---------------------------------------------------------------------------------------


def minidist_step(group: dist.Communicator, args: argparse.Namespace) -> Step:
    """A closure running one training step of the benchmark MLP under minidist DDP on ``group``."""
    md.manual_seed(0)
    layers: list[nn.Module] = []
    for i in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH)] + ([nn.ReLU()] if i < LAYERS - 1 else [])
    model = DistributedDataParallel(
        nn.Sequential(*layers), group=group, bucket_cap_mb=args.bucket_cap_mb, overlap=not args.no_overlap
    )
    opt = optim.SGD(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(group.rank)
    x = md.tensor(rng.standard_normal((BATCH, WIDTH), dtype=np.float32))
    y = rng.integers(0, WIDTH, BATCH)

    def step() -> None:
        with trace.span("forward", "forward"):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        with trace.span("backward", trace.BACKWARD):
            loss.backward()
        with trace.span("optimizer step", "optimizer"):
            opt.step()

    return step


def zero_memory(world: dist.Communicator) -> list[tuple[str, int, int, int]]:
    """Bytes per rank (the largest over ranks) of optimizer state and gradients after one step, for the
    plain optimizer (stage 0, what every data-parallel rank holds) and ZeRO stages 1 and 2.

    ZeRO paper (Rajbhandari et al. 2020, §5): with Psi parameters, K bytes of optimizer state each and
    N ranks, stage 1 holds K*Psi/N of optimizer state (+ rounding of the array_split shards), stage 2
    also 4*Psi/N of float32 gradients. Returns ``[(optimizer, stage, state_bytes, grad_bytes), ...]``.
    """
    rows = []
    choices = (
        ("SGD(momentum)", optim.SGD, {"lr": 1e-3, "momentum": 0.9}),
        ("AdamW", optim.AdamW, {"lr": 1e-3}),
    )
    for name, optimizer_class, kwargs in choices:
        for stage in (0, 1, 2):
            md.manual_seed(0)
            model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
            if stage == 0:
                opt = optimizer_class(model.parameters(), **kwargs)
            else:
                opt = ZeroRedundancyOptimizer(
                    model.parameters(), optimizer_class, group=world, stage=stage, **kwargs
                )
            x = md.tensor(np.ones((8, WIDTH), dtype=np.float32))
            model(x).sum().backward()
            opt.step()
            if stage == 0:
                state = sum(v.nbytes for s in opt.state.values() for v in s.values() if hasattr(v, "nbytes"))
                grads = sum(p.grad.nbytes for p in model.parameters())
            else:
                report = opt.memory_report()
                state, grads = report["optimizer_state"], report["gradients"]
            largest = np.array([state, grads], dtype=np.int64)
            dist.all_reduce(largest, op="max", group=world)
            rows.append((name, stage, int(largest[0]), int(largest[1])))
    return rows


def bench_minidist(world: dist.Communicator, args: argparse.Namespace) -> dict[str, float]:
    alone = world.split(0 if world.rank == 0 else None)  # rank 0 in a group of one; None elsewhere
    everyone = minidist_step(world, args)
    results = measure(minidist_step(alone, args) if alone else None, everyone, world.mpi, args)

    # One more round on all ranks, traced, for the overlap fraction (a span costs microseconds).
    world.barrier()
    trace.enable()
    for _ in range(args.steps):
        everyone()
    trace.disable()
    gathered = world.mpi.gather(trace.events(), root=0)
    if world.rank == 0:
        fractions = [timeline.overlap_fraction(events) for events in gathered]
        results["overlap_mean"], results["overlap_min"] = float(np.mean(fractions)), min(fractions)
        if args.trace:
            timeline.save_chrome_trace(args.trace, gathered)
    return results


# --- PyTorch ----------------------------------------------------------------------------------------


def bench_torch(world: MPI.Comm, args: argparse.Namespace) -> dict[str, float] | None:
    try:
        import torch  # noqa: PLC0415  (optional: the "bench" extra)
        import torch.distributed as tdist  # noqa: PLC0415
        from torch.nn.parallel import DistributedDataParallel as TorchDDP  # noqa: PLC0415
    except ImportError:
        return None
    torch.set_num_threads(1)
    rank, size = world.Get_rank(), world.Get_size()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(world.bcast(_free_port() if rank == 0 else None, root=0))
    tdist.init_process_group("gloo", rank=rank, world_size=size)
    alone = tdist.new_group([0])  # collective over all ranks, even those not in the new group

    def make_step(group) -> Step:
        torch.manual_seed(0)
        layers: list[torch.nn.Module] = []
        for i in range(LAYERS):
            layers += [torch.nn.Linear(WIDTH, WIDTH)] + ([torch.nn.ReLU()] if i < LAYERS - 1 else [])
        model = TorchDDP(torch.nn.Sequential(*layers), process_group=group)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(rank)
        x = torch.randn(BATCH, WIDTH, generator=gen)
        y = torch.randint(0, WIDTH, (BATCH,), generator=gen)

        def step() -> None:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

        return step

    everyone = make_step(None)
    results = measure(make_step(alone) if rank == 0 else None, everyone, world, args)
    tdist.destroy_process_group()
    return results


def _free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    args = parse_args()
    load_before = os.getloadavg()[0]
    world = dist.init()
    n = world.size
    mini = bench_minidist(world, args)
    torch_results = None if args.no_torch else bench_torch(world.mpi, args)
    zero_rows = zero_memory(world)
    if world.rank != 0:
        return
    params = LAYERS * (WIDTH * WIDTH + WIDTH)
    print(f"MLP {LAYERS} x Linear({WIDTH}, {WIDTH}), {params / 1e6:.1f} M parameters "
          f"({4 * params / 1e6:.0f} MB float32 gradients), batch {BATCH} per rank, "
          f"{os.environ['OMP_NUM_THREADS']} BLAS thread(s) per rank; "
          f"minidist bucket_cap_mb={args.bucket_cap_mb}, overlap={not args.no_overlap}")  # fmt: skip
    print(f"1-minute load average before / after: {load_before:.2f} / {os.getloadavg()[0]:.2f}")
    print(f"{'':12s} {'1 rank':>10s} {f'{n} ranks':>10s} {'scaling':>9s}")
    print(f"{'minidist':12s} {mini['t1']:9.3f}s {mini['tN']:9.3f}s {mini['t1'] / mini['tN']:8.1%}")
    if torch_results is not None:
        t1, tn = torch_results["t1"], torch_results["tN"]
        print(f"{'PyTorch DDP':12s} {t1:9.3f}s {tn:9.3f}s {t1 / tn:8.1%}")
        print(
            f"{'ratio':12s} {mini['t1'] / t1:9.2f}x {mini['tN'] / tn:9.2f}x   (minidist / PyTorch step time)"
        )
    else:
        print("PyTorch not importable (or --no-torch): no comparison")
    print(f"communication hidden behind backward ({n} ranks): mean {mini['overlap_mean']:.1%}, "
          f"min {mini['overlap_min']:.1%}")  # fmt: skip
    if args.trace:
        print(f"timeline: {args.trace} (open in https://ui.perfetto.dev)")
    print(f"\nZeRO memory per rank after one step (largest over the {n} ranks; paper: stage 1 keeps 1/N of")
    print("the optimizer state, stage 2 also 1/N of the gradients)")
    header = ("optimizer", "stage", "opt. state MB", "vs plain", "gradients MB", "vs plain")
    print("{:14s} {:>5s} {:>14s} {:>9s} {:>13s} {:>9s}".format(*header))
    plain = {name: (state, grads) for name, stage, state, grads in zero_rows if stage == 0}
    for name, stage, state, grads in zero_rows:
        print(f"{name:14s} {stage:5d} {state / 1e6:14.2f} {state / plain[name][0]:9.3f} "
              f"{grads / 1e6:13.2f} {grads / plain[name][1]:9.3f}")  # fmt: skip
    print(f"(1/N = {1 / n:.3f})")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

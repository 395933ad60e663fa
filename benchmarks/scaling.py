"""Scaling DDP across nodes over real TCP links, and where adding nodes stops paying off.

    python benchmarks/scaling.py            # as root: the study (~5-10 min), table on stdout,
                                            # benchmarks/scaling.json and benchmarks/scaling.png
    python benchmarks/scaling.py --quick    # 1 and 2 nodes at 100mbit, a small model (~30 s)

It brings up a cluster of network namespaces (``minidist_tools.cluster``: one bridge, a veth link per node,
shaped with tc tbf, MPI over TCP) and runs one MPI job per (nodes, ranks per node, link speed). Each
job, with all ranks at once:

1. times the training step without DDP (forward, backward, SGD on the rank's share of the batch): the
   compute the model is given, measured under the same sharing of the cores as the real steps;
2. sweeps ring all-reduces of 4 KiB and 0.5 .. 4 MiB (one rank per node: every step crosses a link), from
   which ``perfmodel_network.calibrate_link`` fits the link's alpha and beta;
3. times DDP training steps in each variant: gradients all-reduced after backward (``after``) or
   overlapped with it (``overlap``), and with the communication hooks fp16 compression
   (``fp16``), PowerSGD (``powersgd``), or with 2 ranks per node DDP as it is (``overlap``: ``auto``
   picks the hierarchical all-reduce across nodes) against a hook that forces the flat ``ring`` or
   the ``hierarchical`` all-reduce.

``scaling_report.py`` turns the measurements into predictions, the table and the plot.

**Model and why.** An MLP of 4 x Linear(1024, 1024) (4.2 M parameters, 16.8 MB of float32
gradients), a global batch of 256 split over the ranks (strong scaling), buckets of 5 MiB (one per
layer, so 3 of the 4 can overlap backward). On one core a step computes ~6.4 GFLOP (~0.1-0.3 s here);
one all-reduce of its gradients between 2 nodes moves 16.8 MB over each link: 1.3 s at 100 Mbit/s,
0.13 s at 1 Gbit/s, 13 ms at 10 Gbit/s. So the network dominates at 100 Mbit/s, matters at
1 Gbit/s and hides at 10 Gbit/s: the three regimes of the question.

**What the machine limits.** All nodes share this host's cores: past the core count, more ranks do
not add compute (the table says how many cores there were). With 2 ranks per node only 2 nodes are
run (4 processes); 4 nodes x 2 ranks (8 processes) would measure the oversubscription, not the
network.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one BLAS thread per rank: the ranks share the cores

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
SPEEDS = ["100mbit", "1gbit", "10gbit", None]  # None: unshaped (as fast as the host's TCP stack)
# Bytes of the calibration sweep. 4 KiB pins alpha (the fit weighs points by 1/t); 0.5-4 MiB, the sizes
# of the study's buckets, give beta. Nothing between: tbf's bucket (256 KiB, shaping.py) lets a short
# burst through at the host's speed, so a lone 64 KiB message would time the host, not the link (at
# 4 KiB that hides only 2 KiB / rate, 0.16 ms at 100mbit); back-to-back large messages drain it and run
# at the link's rate. Nothing larger: at 100mbit an 8 MiB all-reduce overflowed tbf's 50 ms queue and
# TCP's losses made it 30 % slower than the rate (measured), which DDP's 4 MiB buckets never see.
SWEEP = (1 << 12, 1 << 19, 1 << 20, 1 << 21, 1 << 22)
PLAIN, OVERLAP, FP16, POWERSGD, RING, HIER = "after", "overlap", "fp16", "powersgd", "ring", "hierarchical"


# --- one MPI job (every rank runs this) --------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    import minidist as md
    import minidist.distributed as dist
    from minidist import nn, optim
    from minidist.distributed.topology import node_layout
    from minidist.parallel import DistributedDataParallel
    from minidist_tools.perfmodel import step as perfmodel

    world = dist.init()
    layout = node_layout()
    local = len(np.array_split(np.arange(args.batch), world.size)[world.rank])
    rng = np.random.default_rng(world.rank)
    x = md.tensor(rng.standard_normal((local, args.width), dtype=np.float32))
    y = rng.integers(0, args.width, local)

    def build() -> nn.Module:
        md.manual_seed(0)
        layers: list[nn.Module] = []
        for i in range(args.layers):
            layers += [nn.Linear(args.width, args.width)] + ([nn.ReLU()] if i < args.layers - 1 else [])
        return nn.Sequential(*layers)

    def timed_steps(model: nn.Module, warmup: int) -> float:
        opt = optim.SGD(model.parameters(), lr=1e-3)
        times = []
        for i in range(warmup + args.steps):
            world.barrier()  # every step starts together: one sample = the slowest rank's step
            start = time.perf_counter()
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            elapsed = world.mpi.allreduce(time.perf_counter() - start, op=_max())
            if i >= warmup:
                times.append(elapsed)
        return float(np.median(times))

    result: dict = {"nodes": layout.nodes, "ranks_per_node": world.size // layout.nodes, "ranks": world.size}
    result["compute_s"] = timed_steps(build(), warmup=1)  # no DDP: what the ranks compute, sharing cores
    result["gamma"] = world.mpi.allreduce(perfmodel.measure_gamma(1 << 22), op=_max())
    if POWERSGD in args.variants:  # its matmuls are thin, (width x width) @ (width x rank): far from peak
        world.barrier()
        thin = perfmodel.measure_flops(args.width, args.width, args.powersgd_rank, repeats=20)
        result["powersgd_flops"] = world.mpi.allreduce(thin, op=_min())
    if layout.local_size > 1:  # shared memory between the ranks of a node (all nodes at once)
        result["intra_alpha"], result["intra_beta"] = perfmodel.measure_alpha_beta(layout.node_group)
    if layout.nodes > 1 and layout.local_size == 1:
        result["sweep"] = [[n, _time_all_reduce(world, n, args.repeats)] for n in SWEEP]
    hooks = _hooks(dist)
    result["steps"] = {}
    for variant in args.variants:
        if variant not in (PLAIN, OVERLAP) and hooks is None:
            continue  # the communication hooks are not in this checkout
        ddp = DistributedDataParallel(build(), bucket_cap_mb=args.bucket_mb, overlap=variant != PLAIN)
        if variant not in (PLAIN, OVERLAP):
            ddp.register_comm_hook(*hooks[variant](args))
        # PowerSGD compresses from step 2 on (its first compressed step also allocates its memory)
        result["steps"][variant] = timed_steps(ddp, warmup=3 if variant == POWERSGD else 1)
        if variant == PLAIN:  # the fp16 hook's input: real averaged gradients, many of them tiny
            grads = np.concatenate([np.asarray(p.grad).ravel() for p in ddp.parameters()])
            result["fp16_cast_s_per_byte"], result["gamma_fp16"] = _fp16_costs(world, grads / world.size)
    result["shapes"] = [list(p.shape) for p in build().parameters()]
    if world.rank == 0:
        print("RESULT " + json.dumps(result), flush=True)


def _time_all_reduce(world, nbytes: int, repeats: int) -> float:
    import minidist.distributed as dist

    a = np.ones(nbytes // 4, dtype=np.float32)
    times = []
    for _ in range(repeats + 1):  # the first call opens connections and empties tbf's bucket: not kept
        world.barrier()
        start = time.perf_counter()
        dist.all_reduce(a, algorithm="ring")
        times.append(world.mpi.allreduce(time.perf_counter() - start, op=_max()))
    return float(np.median(times[1:]))


def _fp16_costs(world, grads: np.ndarray, values: int = 1 << 18) -> tuple[float, float]:
    """Seconds per float32 byte of one cast to float16 (the mean of there and back), and per float16 byte
    to add float16 arrays, on a slice of this rank's averaged gradients (all ranks at once: they share
    the cores). NumPy converts float16 in software, and gradients below float16's smallest normal
    number (6.1e-5) become subnormals, the slow path: ~300 ns a value here against ~50 ns for values of
    order 1. That, not the bytes, decides the fp16 hook on a CPU."""
    a = np.ascontiguousarray(grads[:values], dtype=np.float32)
    half = a.astype(np.float16)
    world.barrier()
    cast = min(
        _clock(lambda: a.astype(np.float16)) + _clock(lambda: half.astype(np.float32)) for _ in range(3)
    )
    add = min(_clock(lambda: np.add(half, half)) for _ in range(3))
    return (
        world.mpi.allreduce(cast / 2 / a.nbytes, op=_max()),
        world.mpi.allreduce(add / half.nbytes, op=_max()),
    )


def _clock(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _hooks(dist):
    """Variant name -> (args -> (state, hook)), or None where the comm hooks have not landed."""
    try:
        from minidist.parallel import comm_hooks as ch
    except ImportError:
        return None

    def forced(algorithm: str):
        def hook(state, bucket):  # plain DDP, but with the all-reduce algorithm chosen by hand
            return dist.all_reduce(bucket.buffer(), op="avg", group=bucket.group, algorithm=algorithm)

        return lambda args: (None, hook)

    def powersgd(args):
        state = ch.PowerSGDState(matrix_approximation_rank=args.powersgd_rank, start_powerSGD_iter=2)
        return state, ch.powerSGD_hook

    return {FP16: lambda args: (None, ch.fp16_compress_hook), POWERSGD: powersgd,
            RING: forced("ring"), HIER: forced("hierarchical")}  # fmt: skip


def _min():
    from mpi4py import MPI

    return MPI.MIN


def _max():
    from mpi4py import MPI

    return MPI.MAX


# --- the study (the driver, as root) -------------------------------------------------------------------


def plan(quick: bool) -> list[tuple[int, int, list[str | None], list[str]]]:
    """(nodes, ranks_per_node, link speeds, variants) of every job. fp16 only where the link is slow
    enough for halving the bytes to pay for NumPy's software float16 (it costs ~3 s a step here)."""
    if quick:
        return [(1, 1, [None], [PLAIN]), (2, 1, ["100mbit"], [PLAIN, FP16])]
    slow, fast = SPEEDS[:2], SPEEDS[2:]
    one_per_node = [PLAIN, OVERLAP, POWERSGD]
    jobs = [
        (1, 1, [None], [PLAIN, OVERLAP]),
        (1, 2, [None], [PLAIN, OVERLAP]),
        (2, 2, SPEEDS, [OVERLAP, RING, HIER]),
    ]
    for nodes in (2, 4):
        jobs += [(nodes, 1, slow, [*one_per_node, FP16]), (nodes, 1, fast, one_per_node)]
    return jobs


def run_study(args: argparse.Namespace) -> dict:
    from minidist_tools.cluster import Cluster, ClusterError

    study = {"rows": [], "cores": os.cpu_count(), "load_before": args.load, "config": _config(args)}
    started = time.time()
    for per_node in sorted({p[1] for p in plan(args.quick)}):
        jobs = [job for job in plan(args.quick) if job[1] == per_node]
        cluster = Cluster.up(nodes=max(job[0] for job in jobs), ranks_per_node=per_node)
        try:
            with cluster:
                for speed in SPEEDS:
                    cluster.set_bandwidth(speed)
                    for nodes, _, speeds, variants in jobs:
                        if speed in speeds:
                            study["rows"].append(measure(cluster, nodes, speed, variants, args))
                            args.out.write_text(json.dumps(study, indent=1))  # a failure later loses nothing
        except ClusterError as error:
            # Under load the kernel can remove a veth between down()'s check and its `ip link del`; the
            # second pass finds everything gone and removes the state file.
            if "not fully removed" not in str(error):
                raise
            cluster.down()
    study.update(load_after=list(os.getloadavg()), seconds=time.time() - started)
    return study


def measure(cluster, nodes: int, speed: str | None, variants: list[str], args: argparse.Namespace) -> dict:
    """One job on the first ``nodes`` nodes, with the bytes that crossed the links meanwhile."""
    before = cluster.link_bytes()
    row = launch(cluster, nodes * cluster.ranks_per_node, variants, args)
    after = cluster.link_bytes()
    row["link"] = speed or "unshaped"
    row["link_tx_bytes"] = sum(after[k][1] - before[k][1] for k in after)
    print(f"{nodes} x {cluster.ranks_per_node} at {row['link']}: {row['steps']}", file=sys.stderr, flush=True)
    return row


def launch(cluster, ranks: int, variants: list[str], args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--variants", *variants, *_worker_flags(args)]
    proc = cluster.run(cmd, n=ranks, timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{ranks}-rank job failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
        )
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])


def _config(args: argparse.Namespace) -> dict:
    return {k: getattr(args, k) for k in ("width", "layers", "batch", "steps", "bucket_mb", "powersgd_rank")}


def _worker_flags(args: argparse.Namespace) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in _config(args).items()] + [f"--repeats={args.repeats}"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 and 2 nodes at 100mbit, a small model (the test)")
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=256, help="global batch, split over the ranks")
    p.add_argument("--steps", type=int, default=3, help="timed steps per variant (the median is kept)")
    p.add_argument("--bucket-mb", type=float, default=5.0)
    p.add_argument("--powersgd-rank", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3, help="all-reduces per size in the sweep (median)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per MPI job")
    p.add_argument("--out", type=Path, default=HERE / "scaling.json")
    p.add_argument("--plot", type=Path, default=HERE / "scaling.png")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variants", nargs="+", default=[PLAIN], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.quick:
        args.width, args.layers, args.steps, args.repeats = 512, 2, 2, 2
    from minidist_tools.cluster import cluster_available

    ok, reason = cluster_available()
    if not ok:
        sys.exit(f"benchmarks/scaling.py needs the cluster of network namespaces: {reason}")
    args.load = list(os.getloadavg())
    study = run_study(args)
    sys.path.insert(0, str(HERE))
    import scaling_report

    study["predictions"] = scaling_report.predict_all(study)
    args.out.write_text(json.dumps(study, indent=1))
    print(scaling_report.markdown(study))
    if not args.quick or args.plot != HERE / "scaling.png":
        scaling_report.plot(study, args.plot)


if __name__ == "__main__":
    main()

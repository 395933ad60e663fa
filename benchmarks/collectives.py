"""Benchmark minidist's collectives against MPI's built-ins, in the style of nccl-tests.

    mpirun -n 4 python benchmarks/collectives.py                 # 4 KiB .. 64 MiB, float32
    mpirun -n 2 python benchmarks/collectives.py --max-bytes 1M --iters 30 --collectives all_reduce

For every collective, message size and algorithm (every one in ``dist.ALGORITHMS``, "mpi" being MPI's
built-in) it prints the median time over ``--iters`` repetitions (each repetition's time is the
slowest rank's), the algorithm bandwidth algbw = bytes / time, the bus bandwidth busbw = algbw x
factor (2(n-1)/n for all_reduce, (n-1)/n for reduce_scatter and all_gather, 1 for broadcast and
reduce: the nccl-tests convention, which makes busbw comparable with the link's bandwidth), the
ratio to MPI's built-in (< 1 means minidist is faster) and the time the alpha-beta-gamma model
predicts. alpha and beta are fitted to a ping-pong between ranks 0 and 1 measured in the same run,
gamma to a timed NumPy add, and a single-core memcpy bandwidth is measured for reference.

Writes ``<out-dir>/collectives_n<N>.csv`` and, when matplotlib is installed
(``pip install -e ".[bench]"``), ``<out-dir>/collectives_n<N>.png`` (busbw against size).

**Across nodes**, as root: ``python benchmarks/collectives.py --cluster 2x2 --bandwidth
100mbit,1gbit,none`` starts a cluster of 2 network namespaces x 2 ranks (``minidist_tools.cluster``) and
runs this benchmark on it once per link speed, for ``all_reduce`` only (ring, recursive doubling,
Rabenseifner, hierarchical, MPI's built-in and auto, taking turns as always), then prints one table
of all speeds (``collectives_cluster.py``). alpha and beta are then also fitted between the nodes
(rank 0 and the first rank of node 1), and the model column uses those.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one thread per rank: ranks share few cores

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from cost_model import fit_alpha_beta, predict, predict_hierarchical  # noqa: E402

import minidist.distributed as dist  # noqa: E402
from minidist.distributed.safety import liveness  # noqa: E402
from minidist.distributed.safety.tags import identity  # noqa: E402

BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def parse_size(text: str) -> int:
    """'4K' -> 4096, '64M' -> 67108864, '100' -> 100 (bytes)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def human(nbytes: int) -> str:
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:g}{unit}"
    return f"{nbytes}B"


def timed(world: dist.Communicator, fn, iters: int, warmup: int) -> float:
    """Median over ``iters`` of the slowest rank's time for ``fn()``, in seconds."""
    return timed_together(world, {"fn": fn}, iters, warmup)["fn"]


def timed_together(world: dist.Communicator, fns: dict, iters: int, warmup: int) -> dict[str, float]:
    """For each ``fns[name]``: the median over ``iters`` of the slowest rank's time, in seconds.

    The functions take turns (one call of each per round, each call after a barrier) rather than
    running their ``iters`` calls back to back: on a shared machine the load changes from second to
    second, and taking turns exposes every algorithm to the same conditions, so the *ratios* between
    them stay meaningful even when the absolute times drift. Each round starts with the next function
    (round i runs them from number i mod len(fns) on): the first call of a round measured 2-3 us slower
    than the same algorithm later in the round on a loaded machine, a bias no algorithm should always get.
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    functions = list(fns.values())
    times = np.empty((len(fns), iters))
    for i in range(iters):
        for k in range(len(functions)):
            j = (i + k) % len(functions)
            fn = functions[j]
            world.mpi.Barrier()
            start = time.perf_counter()
            fn()
            times[j, i] = time.perf_counter() - start
    slowest = np.empty_like(times)
    world.mpi.Allreduce(times, slowest, op=MPI.MAX)
    return {name: float(np.median(row)) for name, row in zip(fns, slowest)}


def call(collective: str, algorithm: str, a: np.ndarray):
    if collective == "all_reduce":
        return lambda: dist.all_reduce(a, op="sum", algorithm=algorithm)
    if collective == "reduce_scatter":
        return lambda: dist.reduce_scatter(a, op="sum", algorithm=algorithm)
    if collective == "all_gather":
        chunk = a[: a.size // dist.get_world_size()]  # the gathered result has (about) a.size elements
        return lambda: dist.all_gather(chunk, algorithm=algorithm)
    if collective == "broadcast":
        return lambda: dist.broadcast(a, src=0, algorithm=algorithm)
    return lambda: dist.reduce(a, dst=0, op="sum", algorithm=algorithm)


def bare_all_reduce(world: dist.Communicator, a: np.ndarray):
    """The floor of any all-reduce written in Python: recursive doubling in bare mpi4py.

    ``log2 n`` steps of one ``Sendrecv`` (the whole array) and one ``np.add`` into ``a``, with a
    scratch buffer allocated once and no checks, tags or bookkeeping at all (n a power of two). What
    minidist's ``auto`` costs beyond this is its own Python; what this costs beyond MPI's built-in
    ``Allreduce`` is mpi4py's per-call work and the Python loop, which no Python algorithm avoids.
    """
    comm, rank, n = world.mpi, world.rank, world.size
    scratch = np.empty_like(a)

    def run() -> None:
        distance = 1
        while distance < n:
            partner = rank ^ distance
            comm.Sendrecv(a, dest=partner, recvbuf=scratch, source=partner)
            np.add(a, scratch, out=a)
            distance *= 2

    return run


def ping_pong_fit(world: dist.Communicator, iters: int, peer: int = 1) -> tuple[float, float]:
    """(alpha s, beta s/byte) fitted to ping-pongs between rank 0 and rank ``peer``."""
    sizes = np.array([8, 1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22])
    one_way = []
    for nbytes in sizes:
        buf = np.zeros(nbytes, dtype=np.uint8)

        def ping_pong(buf=buf):
            if world.rank == 0:
                world.send(buf, peer)
                world.recv(buf, peer)
            elif world.rank == peer:
                world.recv(buf, 0)
                world.send(buf, 0)

        one_way.append(timed(world, ping_pong, iters, 3) / 2)
    return fit_alpha_beta(sizes, np.array(one_way))


def measure_constants(world: dist.Communicator, iters: int) -> tuple[float, float, float, float]:
    """(alpha s, beta s/byte, gamma s/byte, memcpy bytes/s) measured on this machine, now."""
    alpha, beta = ping_pong_fit(world, iters)
    big = np.ones(1 << 24, dtype=np.float32)  # 64 MiB
    other = np.ones_like(big)
    t_add = min(_clock(lambda: np.add(big, other, out=big)) for _ in range(5))
    t_copy = min(_clock(lambda: np.copyto(other, big)) for _ in range(5))
    return alpha, beta, t_add / big.nbytes, big.nbytes / t_copy


def check_costs(world: dist.Communicator, repeats: int = 20_000) -> tuple[float, float]:
    """(seconds per collective, seconds per look) of the checks that are on by default (``liveness.py``).

    Per collective: the marks every call makes for the liveness watchdog and for its messages' tags
    (``tags.identity``, ``liveness.enter``/``leave``, what ``debug.collective_call`` adds to each
    call). Per look: one :func:`~minidist.distributed.safety.liveness.inspect_channel` of the world's channel
    (one ``MPI_Iprobe`` per peer), which the watchdog thread does every ``liveness.TICK`` seconds per
    communicator: the CPU it takes from the ranks is this divided by the tick.
    """
    # A spare communicator: marking calls that send nothing on the world's channel would put its
    # numbering out of step with the other ranks', which the watchdog rightly reports.
    link, dtype = dist.Communicator(world.mpi).collective_channel, np.dtype(np.float32)
    start = time.perf_counter()
    for _ in range(repeats):
        previous = liveness.enter(link, identity("all_reduce", "sum", None, dtype))
        liveness.leave(link, previous)
    per_call = (time.perf_counter() - start) / repeats
    start = time.perf_counter()
    for _ in range(repeats // 10):
        liveness.inspect_channel(link, None)
    return per_call, (time.perf_counter() - start) / (repeats // 10)


def _clock(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--min-bytes", default="4K", help="smallest message (e.g. 4K)")
    p.add_argument("--max-bytes", default="64M", help="largest message (e.g. 64M)")
    p.add_argument("--factor", type=int, default=4, help="size multiplier between rows")
    p.add_argument("--iters", type=int, default=20, help="timed repetitions per row (median reported)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--collectives", default="all_reduce,reduce_scatter,all_gather,broadcast,reduce")
    p.add_argument(
        "--algorithms", default=None, help="only these, e.g. auto (mpi is always timed: the ratios need it)"
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="also time all_reduce 'bare': recursive doubling in bare mpi4py (n a power of 2)",
    )
    p.add_argument("--out-dir", default=str(Path(__file__).parent / "results"))
    p.add_argument(
        "--cluster", default=None, help="NODESxRANKS, e.g. 2x2: run on a cluster of namespaces (root)"
    )
    p.add_argument(
        "--bandwidth", default="1gbit", help="with --cluster: link speeds, e.g. 100mbit,1gbit,none"
    )
    p.add_argument("--ranks-per-node", type=int, default=None, help=argparse.SUPPRESS)  # set by --cluster
    p.add_argument("--label", default="", help=argparse.SUPPRESS)  # set by --cluster: names the CSV
    args = p.parse_args()
    if args.cluster:
        from collectives_cluster import run_on_cluster  # imports minidist_tools.cluster: only in this mode

        run_on_cluster(args, sys.argv[1:], Path(__file__).resolve())
        return

    world = dist.init()
    n, rank = world.size, world.rank
    if n < 2:
        sys.exit("run with at least 2 ranks: mpirun -n 2 python benchmarks/collectives.py")
    dtype = np.dtype(args.dtype)
    sizes = []
    size = parse_size(args.min_bytes)
    while size <= parse_size(args.max_bytes):
        sizes.append(size)
        size *= args.factor
    collectives = [c for c in args.collectives.split(",") if c in dist.ALGORITHMS]

    alpha, beta, gamma, memcpy_bw = measure_constants(world, args.iters)
    rpn = args.ranks_per_node
    # Across nodes the link decides: fit it between rank 0 and the first rank of node 1.
    inter = ping_pong_fit(world, args.iters, peer=rpn) if rpn and rpn < n else None
    per_call, per_look = check_costs(world)
    if rank == 0:
        print(
            f"# minidist collectives benchmark: n={n} ranks, dtype={dtype}, {args.iters} iterations (median)"
        )
        print(f"# fitted: alpha = {alpha * 1e6:.2f} us, 1/beta = {1 / beta / 1e9:.2f} GB/s, "
              f"1/gamma = {1 / gamma / 1e9:.2f} GB/s; "
              f"single-core memcpy {memcpy_bw / 1e9:.2f} GB/s")  # fmt: skip
        if inter:
            print(f"# across nodes ({args.label}, {n // rpn} nodes x {rpn} ranks): alpha = "
                  f"{inter[0] * 1e6:.1f} us, 1/beta = {1 / max(inter[1], 1e-15) / 1e9:.3f} GB/s "
                  "(the model column uses these; hierarchical: two levels)")  # fmt: skip
        print(f"# default checks: {per_call * 1e6:.2f} us per collective (tags, watchdog marks); "
              f"watchdog look {per_look * 1e6:.1f} us every {liveness.TICK:g} s per communicator "
              f"({per_look / liveness.TICK:.2%} of a core)")  # fmt: skip

    rows = []
    for collective in collectives:
        algorithms = [a for a in dist.ALGORITHMS[collective] if a != "mpi"]
        if args.algorithms:
            algorithms = [a for a in algorithms if a in args.algorithms.split(",")]
        floor = args.floor and collective == "all_reduce" and n & (n - 1) == 0
        algorithms += ["mpi"] + (["bare"] if floor else [])
        if rank == 0:
            print(f"\n# {collective}")
            print(f"# {'size':>8} {'count':>10} {'algorithm':>20} {'time(us)':>11} {'algbw(GB/s)':>11} "
                  f"{'busbw(GB/s)':>11} {'model(us)':>10} {'vs mpi':>7}")  # fmt: skip
        for nbytes in sizes:
            a = np.zeros(nbytes // dtype.itemsize, dtype=dtype)  # ones would overflow to inf: warnings
            calls = {alg: call(collective, alg, a) for alg in algorithms if alg != "bare"}
            if floor:
                calls["bare"] = bare_all_reduce(world, a)
            results = timed_together(world, calls, args.iters, args.warmup)
            for alg in algorithms:
                t = results[alg]
                algbw = a.nbytes / t / 1e9
                model = model_seconds(collective, alg, n, a.nbytes, (alpha, beta), inter, gamma, rpn)
                row = dict(
                    collective=collective, n=n, dtype=str(dtype), size_bytes=a.nbytes, count=a.size,
                    algorithm=alg, time_us=t * 1e6, algbw_GBs=algbw,
                    busbw_GBs=algbw * BUS_FACTOR[collective](n),
                    model_us=None if model is None else model * 1e6, ratio_vs_mpi=t / results["mpi"],
                )  # fmt: skip
                rows.append(row)
                if rank == 0:
                    model_text = "-" if model is None else f"{model * 1e6:10.1f}"
                    print(f"  {human(a.nbytes):>8} {a.size:>10} {alg:>20} {t * 1e6:11.1f} {algbw:11.3f} "
                          f"{row['busbw_GBs']:11.3f} {model_text:>10} "
                          f"{row['ratio_vs_mpi']:7.2f}")  # fmt: skip

    if rank == 0:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        csv_path = out / f"collectives_n{n}{'_' + args.label if args.label else ''}.csv"
        with csv_path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        ring = [r for r in rows if (r["collective"], r["algorithm"]) == ("all_reduce", "ring")]
        if ring:
            top = max(ring, key=lambda r: r["size_bytes"])
            print(f"\n# ring all_reduce busbw at {human(top['size_bytes'])}: {top['busbw_GBs']:.2f} GB/s = "
                  f"{top['busbw_GBs'] * 1e9 / memcpy_bw:.0%} of single-core memcpy")  # fmt: skip
        print(f"# wrote {csv_path}")
        plot(rows, csv_path.with_suffix(".png"), n)


def model_seconds(
    collective: str, alg: str, n: int, nbytes: int, intra: tuple, inter: tuple | None, gamma: float, rpn
) -> float | None:
    """The cost model's seconds for one row (None where none is written down, e.g. "mpi")."""
    if alg == "hierarchical":
        return None if inter is None else predict_hierarchical(n // rpn, rpn, nbytes, intra, inter, gamma)
    alpha, beta = inter or intra  # a flat algorithm across nodes waits for its link steps
    return predict(collective, alg if alg != "bare" else "recursive_doubling", n, nbytes, alpha, beta, gamma)


def plot(rows: list[dict], path: Path, n: int) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print('# matplotlib not installed (pip install -e ".[bench]"): no plot')
        return
    collectives = sorted({r["collective"] for r in rows}, key=[r["collective"] for r in rows].index)
    fig, axes = plt.subplots(1, len(collectives), figsize=(4.5 * len(collectives), 3.8), squeeze=False)
    for ax, collective in zip(axes[0], collectives):
        mine = [r for r in rows if r["collective"] == collective]
        for alg in sorted({r["algorithm"] for r in mine}):
            pts = [r for r in mine if r["algorithm"] == alg]
            ax.plot([r["size_bytes"] for r in pts], [r["busbw_GBs"] for r in pts], marker="o",
                    linestyle="--" if alg == "mpi" else "-", label=alg)  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_title(f"{collective} (n={n})")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"# wrote {path}")


if __name__ == "__main__":
    main()

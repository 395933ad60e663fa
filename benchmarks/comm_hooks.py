"""Gradient compression: bytes per step and final accuracy/loss of the examples, per hook.

    python benchmarks/comm_hooks.py --ranks 4                               # train_mlp.py, defaults
    python benchmarks/comm_hooks.py --ranks 4 --example gpt --max-iters 200   # train_gpt.py, short

Runs ``mpiexec -n RANKS python examples/<example> --comm-hook H`` for each hook (``--hooks``, default
none, fp16, bf16, powersgd rank 1, 2 and 4) one after another, and prints one markdown row per run:
the bytes rank 0 sent per step for the gradients (measured: ``ddp.comm_stats``, which the examples print),
the payload against a plain all-reduce's, the final test accuracy (MLP) or validation loss (GPT), and
the wall time (all under whatever else runs on the machine: compare bytes and results, not times).

On a slow link (as root): ``--cluster 2x2 --bandwidth 100mbit`` runs each hook on a cluster in a box
(``minidist_tools.cluster``: 2 network namespaces of 2 ranks, TCP over veth links shaped by ``tc``), timing
the example's MLP's DDP steps inside the ranks (:func:`time_steps`: the median step after PowerSGD's
plain steps, so that start-up and load spikes drop out), with the bytes per step that crossed node 0's
link (the kernel's counters). ``minidist.parallel.comm_hooks.register_by_name`` registers a hook by
these names in your own benchmark.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
BYTES = re.compile(r"(\d+\.\d) KiB sent per step by rank 0")
RATIO = re.compile(r"(\d+\.\d)x (?:smaller|less payload)")
RESULT = {"mlp": re.compile(r"^final test accuracy: (\d\.\d{4})$", re.M),
          "gpt": re.compile(r"^val loss: (\d+\.\d{4})$", re.M)}  # fmt: skip


def command(example: str, hook: str, extra: list[str]) -> list[str]:
    """``python examples/<example> --comm-hook ...`` for ``hook`` (``powersgd:R``: rank R)."""
    name, _, rank = hook.partition(":")
    flags = ["--comm-hook", name] + (["--powersgd-rank", rank] if rank else [])
    script = REPO / "examples" / ("train_mlp.py" if example == "mlp" else "train_gpt.py")
    return [sys.executable, str(script), *flags, *extra]


def figures(example: str, hook: str, out: str, seconds: float) -> dict[str, str]:
    sent, ratio = BYTES.search(out), RATIO.search(out)
    return {
        "hook": hook,
        "KiB sent/step": sent.group(1),
        "payload ratio": ratio.group(1),
        "result": RESULT[example].search(out).group(1),
        "wall s": f"{seconds:.0f}",
    }


def run(example: str, ranks: int, hook: str, extra: list[str]) -> dict[str, str]:
    """One run of the example with ``hook`` on this machine; its figures as text."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    start = time.perf_counter()
    out = subprocess.run([MPIEXEC, "-n", str(ranks), *command(example, hook, extra)],
                         capture_output=True, text=True, env=env, check=True).stdout  # fmt: skip
    return figures(example, hook, out, time.perf_counter() - start)


def run_on_cluster(cluster, hook: str, steps: int) -> dict[str, str]:  # noqa: ANN001
    """:func:`time_steps` with ``hook`` on ``cluster`` (one rank per core of the MLP's DDP), plus the bytes
    per step that crossed node 0's link (the kernel's counters, both directions, start-up included)."""
    before = sum(cluster.link_bytes()[cluster.nodes[0]])
    argv = [sys.executable, str(Path(__file__).resolve()), "--time-steps", str(steps), "--hooks", hook]
    proc = cluster.run(argv, timeout=1800, cwd=str(REPO))
    if proc.returncode:
        raise RuntimeError(f"{hook}: {proc.stderr[-2000:]}")
    crossed = sum(cluster.link_bytes()[cluster.nodes[0]]) - before
    row = dict(zip(["hook", "ms/step", "KiB sent/step"], proc.stdout.split()[-3:], strict=True))
    row["link KiB/step"] = f"{crossed / (steps + WARMUP) / 1024:.1f}"
    return row


WARMUP = 12  # steps before timing: PowerSGD's 10 plain ones, and the first allocations


def time_steps(hook: str, steps: int) -> None:
    """(Under mpiexec.) Train the example's 64-256-256-10 MLP with DDP and ``hook`` on random data, 32
    samples per rank; print ``hook``, the median over ranks of each rank's median step time (ms) after
    :data:`WARMUP` steps, and the KiB rank 0 sent per step then."""
    import numpy as np

    import minidist as md
    import minidist.distributed as dist
    from minidist import nn, optim
    from minidist.models import MLP
    from minidist.parallel import DistributedDataParallel
    from minidist.parallel.comm_hooks import register_by_name

    world = dist.init()
    md.manual_seed(0)
    ddp = DistributedDataParallel(MLP(64, [256, 256], 10))
    name, _, rank = hook.partition(":")
    register_by_name(ddp, name, powersgd_rank=int(rank or 1))
    opt = optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(world.rank)
    x, y = rng.standard_normal((32, 64)).astype(np.float32), rng.integers(0, 10, 32)
    seconds = []
    for step in range(WARMUP + steps):
        if step == WARMUP:
            sent_before = ddp.comm_stats.bytes_sent
        start = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(md.tensor(x)), y).backward()
        opt.step()
        seconds.append(time.perf_counter() - start)
    median = np.array([np.median(seconds[WARMUP:])])
    everyone = dist.all_gather(median)
    if world.rank == 0:
        sent = (ddp.comm_stats.bytes_sent - sent_before) / steps / 1024
        print(hook, f"{1000 * np.median(everyone):.1f}", f"{sent:.1f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--example", choices=["mlp", "gpt"], default="mlp")
    hooks = ["none", "fp16", "bf16", "powersgd:1", "powersgd:2", "powersgd:4"]
    p.add_argument("--hooks", nargs="+", default=hooks, help="powersgd:R is --powersgd-rank R")
    p.add_argument("--max-iters", type=int, default=200, help="(gpt) optimizer steps")
    p.add_argument("--cluster", default=None, metavar="NxR", help="(mlp, as root) N nodes of R ranks")
    p.add_argument("--bandwidth", default="100mbit", help="with --cluster: each node's link (tc rate)")
    p.add_argument("--steps", type=int, default=40, help="with --cluster: timed steps per hook")
    p.add_argument("--time-steps", type=int, default=None, help=argparse.SUPPRESS)  # (the ranks' mode)
    p.add_argument("--name", default=None, help="with --cluster: its name (default: a free one)")
    p.add_argument("--subnet", type=int, default=None, help="with --cluster: K of 198.18.K.0/24")
    args = p.parse_args()
    if args.time_steps:
        time_steps(args.hooks[0], args.time_steps)
        return
    extra = [] if args.example == "mlp" else ["--max-iters", str(args.max_iters), "--eval-interval",
                                              str(args.max_iters), "--sample-tokens", "0"]  # fmt: skip
    if args.cluster:
        from minidist_tools.cluster import Cluster

        nodes, ranks_per_node = map(int, args.cluster.split("x"))
        with Cluster.up(nodes, ranks_per_node, args.bandwidth, name=args.name, subnet=args.subnet) as cluster:
            rows = [run_on_cluster(cluster, hook, args.steps) for hook in args.hooks]
    else:
        rows = [run(args.example, args.ranks, hook, extra) for hook in args.hooks]
    print("| " + " | ".join(rows[0]) + " |")
    print("|" + "---|" * len(rows[0]))
    for row in rows:
        print("| " + " | ".join(row.values()) + " |", flush=True)


if __name__ == "__main__":
    main()

"""Gradient compression (issue 19): bytes per step and final accuracy/loss of the examples, per hook.

    python benchmarks/comm_hooks.py --ranks 4                               # train_mlp.py, defaults
    python benchmarks/comm_hooks.py --ranks 4 --example gpt --max-iters 200   # train_gpt.py, short

Runs ``mpiexec -n RANKS python examples/<example> --comm-hook H`` for each hook (``--hooks``, default
none, fp16, bf16, powersgd rank 1, 2 and 4) one after another, and prints one markdown row per run:
the bytes rank 0 sent per step for the gradients (measured: ``ddp.comm_stats``, which the examples print),
the payload against a plain all-reduce's, the final test accuracy (MLP) or validation loss (GPT), and
the wall time (all under whatever else runs on the machine: compare bytes and results, not times).

On a slow link (as root): ``--cluster 2x2 --bandwidth 100mbit`` runs each hook on a cluster in a box
(``minidist.cluster``: 2 network namespaces of 2 ranks, TCP over veth links shaped by ``tc``) and adds
the seconds per step (the difference of a run of ``--epochs`` and one of 2 epochs, over the steps between
them: start-up and the first epochs cancel) and the bytes per step that crossed node 0's link (the
kernel's counters, both directions). ``minidist.parallel.comm_hooks.register_by_name`` registers a hook
by these names in your own benchmark.
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


def run_on_cluster(cluster, hook: str, epochs: int, extra: list[str]) -> dict[str, str]:  # noqa: ANN001
    """train_mlp.py with ``hook`` on ``cluster``: figures plus seconds and node-0 link bytes per step."""
    steps_per_epoch = 11  # 1500 digits / global batch 128 (the example's defaults)

    def timed(n_epochs: int) -> tuple[float, int, str]:
        before = sum(cluster.link_bytes()[cluster.nodes[0]])
        start = time.perf_counter()
        argv = command("mlp", hook, ["--epochs", str(n_epochs), *extra])
        proc = cluster.run(argv, timeout=1800, cwd=str(REPO))
        if proc.returncode:
            raise RuntimeError(f"{hook}: {proc.stderr[-2000:]}")
        return time.perf_counter() - start, sum(cluster.link_bytes()[cluster.nodes[0]]) - before, proc.stdout

    short, short_bytes, _ = timed(2)
    long, long_bytes, out = timed(epochs)
    steps = (epochs - 2) * steps_per_epoch
    row = figures("mlp", hook, out, long)
    row["ms/step"] = f"{1000 * (long - short) / steps:.0f}"
    row["link KiB/step"] = f"{(long_bytes - short_bytes) / steps / 1024:.1f}"
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--example", choices=["mlp", "gpt"], default="mlp")
    hooks = ["none", "fp16", "bf16", "powersgd:1", "powersgd:2", "powersgd:4"]
    p.add_argument("--hooks", nargs="+", default=hooks, help="powersgd:R is --powersgd-rank R")
    p.add_argument("--max-iters", type=int, default=200, help="(gpt) optimizer steps")
    p.add_argument("--cluster", default=None, metavar="NxR", help="(mlp, as root) N nodes of R ranks")
    p.add_argument("--bandwidth", default="100mbit", help="with --cluster: each node's link (tc rate)")
    p.add_argument("--epochs", type=int, default=10, help="with --cluster: epochs of the long run")
    p.add_argument("--name", default=None, help="with --cluster: its name (default: a free one)")
    p.add_argument("--subnet", type=int, default=None, help="with --cluster: K of 198.18.K.0/24")
    args = p.parse_args()
    extra = [] if args.example == "mlp" else ["--max-iters", str(args.max_iters), "--eval-interval",
                                              str(args.max_iters), "--sample-tokens", "0"]  # fmt: skip
    if args.cluster:
        from minidist.cluster import Cluster

        nodes, ranks_per_node = map(int, args.cluster.split("x"))
        with Cluster.up(nodes, ranks_per_node, args.bandwidth, name=args.name, subnet=args.subnet) as cluster:
            rows = [run_on_cluster(cluster, hook, args.epochs, extra) for hook in args.hooks]
    else:
        rows = [run(args.example, args.ranks, hook, extra) for hook in args.hooks]
    print("| " + " | ".join(rows[0]) + " |")
    print("|" + "---|" * len(rows[0]))
    for row in rows:
        print("| " + " | ".join(row.values()) + " |", flush=True)


if __name__ == "__main__":
    main()

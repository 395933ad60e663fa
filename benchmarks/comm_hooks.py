"""Gradient compression (issue 19): bytes per step and final accuracy/loss of the examples, per hook.

    python benchmarks/comm_hooks.py --ranks 4                               # train_mlp.py, defaults
    python benchmarks/comm_hooks.py --ranks 4 --example gpt --max-iters 200   # train_gpt.py, short

Runs ``mpiexec -n RANKS python examples/<example> --comm-hook H`` for each hook (``--hooks``, default
none, fp16, bf16, powersgd rank 1, 2 and 4) one after another, and prints one markdown row per run:
the bytes rank 0 sent per step for the gradients (measured: ``ddp.comm_stats``, which the examples print),
the payload against a plain all-reduce's, the final test accuracy (MLP) or validation loss (GPT), and
the wall time (all under whatever else runs on the machine: compare bytes and results, not times).

To measure the speed-up on a slow link, run the same under the cluster (``python -m minidist.cluster run
-- python examples/train_mlp.py --comm-hook ...``) or call ``minidist.parallel.comm_hooks.register_by_name``
in your own benchmark (``benchmarks/scaling.py`` does).
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


def run(example: str, ranks: int, hook: str, extra: list[str]) -> dict[str, str]:
    """One run of the example with ``hook`` (``powersgd:R`` for rank R); its figures as text."""
    name, _, rank = hook.partition(":")
    flags = ["--comm-hook", name] + (["--powersgd-rank", rank] if rank else [])
    script = REPO / "examples" / ("train_mlp.py" if example == "mlp" else "train_gpt.py")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    start = time.perf_counter()
    out = subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, str(script), *flags, *extra],
                         capture_output=True, text=True, env=env, check=True).stdout  # fmt: skip
    seconds = time.perf_counter() - start
    sent, ratio = BYTES.search(out), RATIO.search(out)
    return {
        "hook": hook,
        "KiB sent/step": sent.group(1),
        "payload ratio": ratio.group(1),
        "result": RESULT[example].search(out).group(1),
        "wall s": f"{seconds:.0f}",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--example", choices=["mlp", "gpt"], default="mlp")
    hooks = ["none", "fp16", "bf16", "powersgd:1", "powersgd:2", "powersgd:4"]
    p.add_argument("--hooks", nargs="+", default=hooks, help="powersgd:R is --powersgd-rank R")
    p.add_argument("--max-iters", type=int, default=200, help="(gpt) optimizer steps")
    args = p.parse_args()
    extra = [] if args.example == "mlp" else ["--max-iters", str(args.max_iters), "--eval-interval",
                                              str(args.max_iters), "--sample-tokens", "0"]  # fmt: skip
    rows = [run(args.example, args.ranks, hook, extra) for hook in args.hooks]
    print("| " + " | ".join(rows[0]) + " |")
    print("|" + "---|" * len(rows[0]))
    for row in rows:
        print("| " + " | ".join(row.values()) + " |", flush=True)


if __name__ == "__main__":
    main()

"""Before/after, in one run: a GPT training step with an older version of some classes against the current.

    OMP_NUM_THREADS=1 python benchmarks/gpt_ab.py REV minidist/ops/linear.py:Linear [FILE:Class ...]
    OMP_NUM_THREADS=1 python benchmarks/gpt_ab.py REV minidist/nn/utils.py:norm_contribution

For each FILE:Class, the file as it was at git revision REV is executed in a scratch module and the
methods its Class defines are swapped into the current Class for the "before" blocks (a module-level
function is swapped in its module). The step is
benchmarks/gpt.py's (nanoGPT's CPU config, AdamW, clipping); blocks of ``--block`` steps alternate
between before and after (order swapped every round, the first round left out), each timed by this
process's CPU time (one thread: the load of other processes does not inflate it) and the wall clock.
Prints the medians and the after / before ratio with its range. How the README's "profile before/after"
figures of the GPT were measured.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
import types
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from gpt import MinidistRun  # noqa: E402

import minidist as md  # noqa: E402
from minidist.data import CharTokenizer, RandomWindows, load_shakespeare, train_val_split  # noqa: E402
from minidist.models import GPTConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def old_methods(rev: str, spec: str) -> tuple[object, dict]:
    """(current class, {name: old function}) for ``FILE:Class`` at git revision ``rev``; for
    ``FILE:function``, (its module, {function: old function})."""
    path, name = spec.split(":")
    source = subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    module_name = path.removesuffix(".py").replace("/", ".")
    scratch = types.ModuleType(module_name + "_old")
    exec(compile(source, f"{rev}:{path}", "exec"), scratch.__dict__)  # noqa: S102  (our own file)
    module = __import__(module_name, fromlist=[name])
    old = getattr(scratch, name)
    if isinstance(old, types.FunctionType):  # callers in other modules that imported it keep the new one
        return module, {name: old}
    return getattr(module, name), {k: v for k, v in vars(old).items() if isinstance(v, types.FunctionType)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("rev")
    parser.add_argument("specs", nargs="+", help="FILE:Class")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--block", type=int, default=2)
    args = parser.parse_args()
    swaps = [old_methods(args.rev, spec) for spec in args.specs]
    new = [(owner, {k: vars(owner)[k] for k in methods if k in vars(owner)}) for owner, methods in swaps]

    def install(which: list) -> None:
        for owner, methods in which:
            for k, fn in methods.items():
                setattr(owner, k, fn)

    text = load_shakespeare()
    tokenizer = CharTokenizer(text)
    train_ids, _ = train_val_split(tokenizer.encode(text))
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=64, n_layer=4, n_head=4, n_embd=128)
    md.manual_seed(0)
    run = MinidistRun(config, 10_000)
    windows = RandomWindows(train_ids, 64, 12, seed=0)
    cpu = {"before": [], "after": []}
    wall = {"before": [], "after": []}
    for r in range(args.rounds + 1):
        for label in ("before", "after") if r % 2 == 0 else ("after", "before"):
            install(swaps if label == "before" else new)
            batches = [windows.next() for _ in range(args.block)]
            start, cpu_start = time.perf_counter(), time.process_time()
            for x, y in batches:
                run.step(x, y)
            if r:  # round 0: warm-up
                cpu[label].append((time.process_time() - cpu_start) / args.block * 1e3)
                wall[label].append((time.perf_counter() - start) / args.block * 1e3)
    install(new)
    for clock, data in (("CPU", cpu), ("wall", wall)):
        before, after = np.array(data["before"]), np.array(data["after"])
        ratios = after / before
        print(
            f"{clock:>4} ms per step: before {np.median(before):.1f}, after {np.median(after):.1f}; "
            f"after / before {np.median(ratios):.3f} (range {ratios.min():.3f}-{ratios.max():.3f})"
        )
    print(f"{args.rounds} rounds of {args.block} steps each; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

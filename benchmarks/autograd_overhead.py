"""The per-op cost of autograd's bookkeeping: a small-layer forward + backward, timed per step.

What it measures: with small arrays the arithmetic is cheap, so the time is Python's per-op work
(``Function.apply``, the graph walk, version counters, dtype promotion, freeing the graph). Two
workloads:

* ``tiny``: 25 elementwise ops on 8-element tensors and a sum, then backward (almost pure overhead);
* ``mlp``: Linear(64, 64) -> tanh -> Linear(64, 64) -> tanh -> Linear(64, 10), batch 32, cross-entropy.

``--baseline DIR`` also times an older checkout of minidist (e.g. ``git worktree add`` or
``git archive <commit> | tar -x -C DIR``) in alternating subprocesses of this one run, and prints
the ratio, so machine load affects both sides alike.

    python benchmarks/autograd_overhead.py [--baseline /tmp/old_checkout] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np


def _measure(steps: int) -> dict[str, float]:
    """Median seconds per step of each workload, with the minidist found on sys.path."""
    import minidist as md  # noqa: PLC0415  (imported here: the baseline run imports another copy)
    from minidist import nn  # noqa: PLC0415

    rng = np.random.default_rng(0)
    md.manual_seed(0)
    a = md.tensor(rng.standard_normal(8), dtype=np.float32, requires_grad=True)
    b = md.tensor(rng.standard_normal(8), dtype=np.float32, requires_grad=True)

    def tiny() -> None:
        y = a
        for _ in range(5):
            y = (y * b + a) / (b * b + 1.0)  # 5 ops (the constant is lifted by the op)
        y.sum().backward()

    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10))
    x = md.tensor(rng.standard_normal((32, 64)), dtype=np.float32)
    targets = rng.integers(0, 10, 32)

    def mlp() -> None:
        nn.functional.cross_entropy(model(x), targets).backward()

    out = {}
    for name, fn in (("tiny", tiny), ("mlp", mlp)):
        for _ in range(20):
            fn()  # warm up caches and allocators
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        out[name] = float(np.median(times))
    return out


def _run(pythonpath: str, steps: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}
    code = f"import sys, json; sys.path.insert(0, {pythonpath!r}); "
    code += "from autograd_overhead import _measure; "
    code += f"print(json.dumps(_measure({steps})))"
    env["PYTHONPATH"] = os.pathsep.join([pythonpath, os.path.dirname(os.path.abspath(__file__))])
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="folder holding an older minidist/ to compare with")
    parser.add_argument("--rounds", type=int, default=5, help="alternating runs of each side")
    parser.add_argument("--steps", type=int, default=300, help="timed steps per workload per run")
    args = parser.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sides = {"this": here} | ({"baseline": args.baseline} if args.baseline else {})
    results: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for _ in range(args.rounds):
        for side, path in sides.items():
            results[side].append(_run(path, args.steps))
    for workload in ("tiny", "mlp"):
        line = [f"{workload:5s}"]
        medians = {s: float(np.median([r[workload] for r in runs])) for s, runs in results.items()}
        line += [f"{s}: {1e6 * t:8.1f} us/step" for s, t in medians.items()]
        if "baseline" in medians:
            line.append(f"ratio this/baseline: {medians['this'] / medians['baseline']:.3f}")
        print("   ".join(line))


if __name__ == "__main__":
    main()

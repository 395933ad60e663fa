"""What enforcing an assignment's "Not allowed" rule costs the grader (lessons/assignments/rules.py).

    mpirun -n 3 python benchmarks/grading_rules.py

Runs the A2 worker's ring cases and the A7 worker's ZeRO training on the reference, plain and under
``rules.watch`` with the worker's rule, in turns (so both see the same load), and prints the best
time of each and the ratio. Not a library hot path:
the watch runs only inside grading workers.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

ASSIGNMENTS = Path(__file__).resolve().parents[1] / "lessons" / "assignments"
sys.path.insert(0, str(ASSIGNMENTS))
import gradelib  # noqa: E402

import minidist.distributed as dist  # noqa: E402


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def once(world, body, config: dict, rule) -> float:
    """Seconds of one run of ``body`` (under ``rule``'s watch unless None)."""
    world.mpi.Barrier()
    start = time.perf_counter()
    failures = gradelib.run_body(world, body, config, rule)
    seconds = time.perf_counter() - start
    assert failures == [], failures  # the reference breaks no rule
    return seconds


def main() -> None:
    world = dist.init()
    ring = load("ring_check", ASSIGNMENTS / "A2" / "workers" / "ring_check.py")
    zero = load("zero_check", ASSIGNMENTS / "A7" / "workers" / "zero_check.py")
    kinds = ["reduce_scatter", "all_gather", "all_reduce"]
    cases = [{"kind": k, "length": 1000, "dtype": "float64", "seed": 1} for k in kinds] * 3
    runs = [
        ("A2 ring cases", ring, {"cases": cases}, 30),
        ("A7 ZeRO training", zero, {"seed": 1, "steps": 3, "batch": 6, "check": "train"}, 15),
    ]
    for name, module, config, reps in runs:
        plain, watched = [], []
        for _ in range(reps):  # in turns, so that both see the same load
            plain.append(once(world, module.body, config, None))
            watched.append(once(world, module.body, config, module.RULE))
        if world.rank == 0:
            fast, slow = min(plain), min(watched)
            times = f"plain {fast * 1e3:.1f} ms, watched {slow * 1e3:.1f} ms (best of {reps})"
            print(f"{name}: {times}, ratio {slow / fast:.2f}")


if __name__ == "__main__":
    main()

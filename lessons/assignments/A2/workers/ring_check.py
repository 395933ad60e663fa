"""MPI worker for A2: run ring collective cases on every rank and report mismatches in plain words.

Usage (by gradelib.run_ranks): ``mpiexec -n N python ring_check.py OUT_DIR`` with OUT_DIR/config.json::

    {"cases": [{"kind": "reduce_scatter" | "all_gather" | "all_reduce", "length": 7,
                "dtype": "float64", "op": "sum", "seed": 0}, ...],
     "groups": [2, 3]}      # optional: split the world into consecutive groups of these sizes

Inputs are integer-valued floats in [-50, 50): every summation order gives the exact sum, so results
are compared for exact equality (and "avg" is that exact sum divided once by n, as NumPy does it).
Every rank rebuilds all ranks' inputs from (seed, rank), so it knows the expected result without
communicating.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import gradelib  # noqa: E402

import minidist.distributed as dist  # noqa: E402
from minidist.distributed import ring  # noqa: E402


def rank_input(seed: int, rank: int, length: int, dtype: str) -> np.ndarray:
    return np.random.default_rng([seed, rank]).integers(-50, 50, length).astype(dtype)


def reduce(inputs: list[np.ndarray], op: str) -> np.ndarray:
    stack = np.stack(inputs)
    if op == "max":
        return stack.max(axis=0)
    if op == "min":
        return stack.min(axis=0)
    total = stack.sum(axis=0)
    return total / len(inputs) if op == "avg" else total


def bounds(length: int, n: int) -> list[tuple[int, int]]:
    """numpy.array_split order: the first length % n chunks are one longer."""
    edges = np.cumsum([0] + [len(c) for c in np.array_split(np.arange(length), n)])
    return list(zip(edges[:-1].tolist(), edges[1:].tolist()))


def same(got: np.ndarray, want: np.ndarray) -> bool:
    return got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got, want)


def check_case(group, case: dict) -> list[str]:
    n, r = group.size, group.rank
    kind, length, dtype, op = case["kind"], case["length"], case["dtype"], case.get("op", "sum")
    inputs = [rank_input(case["seed"], q, length, dtype) for q in range(n)]
    chunks = bounds(length, n)
    lo, hi = chunks[r]
    where = f"{kind} (op={op!r}, {length} {dtype} elements, group of {n} ranks, rank {r})"
    failures = []

    def expect(label: str, got: np.ndarray, want: np.ndarray) -> None:
        got = np.asarray(got)
        if same(got, want):
            return
        got_text = (
            f"an array of shape {got.shape}, dtype {got.dtype}"
            if got.shape != want.shape
            else gradelib.show(got)
        )
        diagnosis = ""
        if op == "avg" and got.shape == want.shape and want.size and np.allclose(got, want * n):
            diagnosis = f" That is the sum: for op='avg' divide it by the group size ({n}), once, at the end."
        failures.append(f"{label} {where}: expected {gradelib.show(want)}, got {got_text}.{diagnosis}")

    if kind == "reduce_scatter":
        want = reduce(inputs, op).astype(dtype)
        flat = inputs[r].copy()
        ring.ring_reduce_scatter(group, flat, op)
        expect(f"ring_reduce_scatter: chunk {r} (elements {lo}:{hi}) after", flat[lo:hi], want[lo:hi])
        got = dist.reduce_scatter(inputs[r].copy(), op=op, group=group, algorithm="ring")
        expect("dist.reduce_scatter(algorithm='ring') result of", got, want[lo:hi])
    elif kind == "all_gather":
        want = np.concatenate([inputs[q][a:b] for q, (a, b) in enumerate(chunks)])
        flat = np.full(length, -999, dtype=dtype)  # garbage everywhere except this rank's own chunk
        flat[lo:hi] = inputs[r][lo:hi]
        ring.ring_all_gather(group, flat)
        expect("ring_all_gather: the full array after", flat, want)
        sizes = [(case["seed"] + 3 * q) % (length + 1) for q in range(n)]  # uneven chunks, some empty
        got = dist.all_gather(inputs[r][: sizes[r]].copy(), group=group, algorithm="ring")
        expect(f"dist.all_gather(algorithm='ring') of chunks of sizes {sizes}:", got,
               np.concatenate([inputs[q][: sizes[q]] for q in range(n)]))  # fmt: skip
    elif kind == "all_reduce":
        want = reduce(inputs, op).astype(dtype)
        flat = inputs[r].copy()
        ring.ring_all_reduce(group, flat, op)
        expect("ring_all_reduce: the array after", flat, want)
        got = dist.all_reduce(inputs[r].copy(), op=op, group=group, algorithm="ring")
        expect("dist.all_reduce(algorithm='ring') result of", got, want)
    else:
        raise ValueError(f"unknown case kind {kind!r}")
    return failures


def body(world, config: dict) -> list[str]:
    group = world
    sizes = config.get("groups")
    if sizes:  # consecutive blocks of ranks: ranks keep their order, group ranks start at 0
        color = int(np.searchsorted(np.cumsum(sizes), world.rank, side="right"))
        group = dist.Communicator(world.mpi.Split(color, world.rank))
    failures = []
    for case in config["cases"]:
        failures += check_case(group, case)
    return failures


if __name__ == "__main__":
    gradelib.worker_main(body)

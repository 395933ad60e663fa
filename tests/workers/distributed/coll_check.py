"""MPI worker: run a batch of collective test cases and compare each result with NumPy.

Usage: ``mpiexec -n W python coll_check.py OUT_DIR CASES_JSON``. ``CASES_JSON`` is a list of cases drawn
by hypothesis in the test (see ``tests/distributed/test_collectives.py`` for the fields). Every rank builds
its input from ``(seed, world rank)`` alone, so every rank can also rebuild *all* ranks' inputs and compute
the expected result with plain NumPy, without any communication. Each case runs *every* algorithm of every
collective (``dist.ALGORITHMS``, "auto" included): starting MPI costs far more than a few more calls.
Each rank writes ``rank<r>.json`` with the number of checks it made, the number of (case, algorithm)
pairs skipped because this MPI cannot reduce the dtype, and a list of failure messages (empty when all
is well).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
from dist_worker_utils import run_worker, write_json

import minidist.distributed as dist
from minidist.distributed.staging import mpi_reduction_datatype


def rank_input(seed: int, world_rank: int, length: int, dtype: str) -> np.ndarray:
    """The 1-D input of ``world_rank`` for a case: normal floats, or ints in [-1000, 1000) (no overflow)."""
    rng = np.random.default_rng([seed, world_rank])
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(length).astype(dtype)
    return rng.integers(-1000, 1000, length).astype(dtype)


def gather_length(seed: int, world_rank: int, length: int) -> int:
    """A different chunk length per rank for all_gather, from 0 up to ``length``."""
    return (seed + 7919 * world_rank) % (length + 1)


def expected_reduction(inputs: list[np.ndarray], op: str) -> tuple[np.ndarray, np.ndarray]:
    """The exact-as-possible reduction of the ranks' inputs, and the per-element error tolerance.

    Floats are summed in float64. A sum of n floats in any order is within (n - 1) * u * sum|x_i| of the
    exact sum (recursive summation, Higham, "Accuracy and Stability of Numerical Algorithms", §4.2;
    u = unit roundoff of the dtype). The ring adds in ring order, MPI and NumPy in their own orders, so
    each result is within that bound of the exact float64 sum; we allow 2 n eps sum|x_i| (eps = 2u, so a
    factor 4 of slack, plus a few subnormals for float16 sums that underflow). A plain relative tolerance
    such as rtol=1e-5 would fail where the terms cancel and the sum is near 0, while this bound still
    catches any real error (a missing or doubled contribution is off by |x_i|, far more than eps
    sum|x_i|). max/min and integer sums must be exact.
    """
    stack = np.stack(inputs)
    n, dtype = len(inputs), stack.dtype
    if op in ("max", "min"):
        result = stack.max(axis=0) if op == "max" else stack.min(axis=0)
        return result, np.zeros(result.shape)
    if dtype.kind != "f":
        return stack.sum(axis=0, dtype=np.int64).astype(dtype), np.zeros(stack.shape[1:])
    info = np.finfo(dtype)
    exact = stack.astype(np.float64).sum(axis=0)
    tol = 2 * n * info.eps * np.abs(stack.astype(np.float64)).sum(axis=0) + n * float(info.smallest_subnormal)
    if op == "avg":  # the division by n adds one more rounding of the result
        exact, tol = exact / n, tol / n + info.eps * np.abs(exact / n)
    return exact, tol


def close(got: np.ndarray, want: np.ndarray, tol: np.ndarray, dtype: str) -> bool:
    """``got`` has ``dtype`` and ``want``'s shape, and is within ``tol`` of ``want`` element by element."""
    if got.dtype != np.dtype(dtype) or got.shape != want.shape:
        return False
    return bool(np.all(np.abs(got.astype(np.float64) - want) <= tol))


def mpi_can_reduce(algorithm: str, dtype: str) -> bool:
    """False for MPI's own reductions on a dtype this MPI has no datatype for (float16 on some builds)."""
    return not (algorithm == "mpi" and mpi_reduction_datatype(np.dtype(dtype)) is None)


def main(out_dir: str, cases_path: str) -> None:
    cases = json.loads(Path(cases_path).read_text())
    world = dist.init()
    # Every rank joins the group of ranks with its parity: {0, 2, 4, ...} and {1, 3, 5, ...}.
    parity = world.split(color=world.rank % 2)
    report = {"checks": 0, "skipped": 0, "failures": []}

    def check(ok: bool, what: str, case_index: int) -> None:
        report["checks"] += 1
        if not ok:
            report["failures"].append(f"case {case_index} {cases[case_index]}: {what}")

    def same_on_every_rank(a: np.ndarray, group: dist.Communicator) -> bool:
        """True if every rank of ``group`` holds the same bytes (compared with raw MPI, not our code)."""
        return len(set(group.mpi.allgather(hashlib.sha256(a.tobytes()).hexdigest()))) == 1

    for i, case in enumerate(cases):
        length, dtype, op = case["length"], case["dtype"], case["op"]
        seed, shape = case["seed"], tuple(case["shape"])
        if case["group"] == "world":
            group, members = world, list(range(world.size))
        else:
            group, members = parity, list(range(world.rank % 2, world.size, 2))
        n, me = group.size, group.rank  # members[g] is the world rank of group rank g
        inputs = [rank_input(seed, w, length, dtype) for w in members]
        expected, tol = expected_reduction(inputs, op)
        root = case["src"] % n  # the root of broadcast and reduce

        for algorithm in dist.ALGORITHMS["all_reduce"]:
            name = f"all_reduce ({algorithm})"
            if not mpi_can_reduce(algorithm, dtype):
                report["skipped"] += 1
                continue
            # In place, returns the very same array, keeps the shape.
            a = inputs[me].reshape(shape).copy()
            out = dist.all_reduce(a, op=op, group=group, algorithm=algorithm)
            check(out is a, f"{name} did not return its input array", i)
            check(a.shape == shape and close(a.reshape(-1), expected, tol, dtype), f"{name} result", i)
            if algorithm != "mpi":  # ours combine each element once, or both partners identically
                check(same_on_every_rank(a, group), f"{name} differs between ranks", i)

        for algorithm in dist.ALGORITHMS["reduce_scatter"]:
            name = f"reduce_scatter ({algorithm})"
            if not mpi_can_reduce(algorithm, dtype):
                report["skipped"] += 1
                continue
            # This rank's array_split chunk of the reduction; the input is untouched.
            a = inputs[me].reshape(shape).copy()
            chunk = dist.reduce_scatter(a, op=op, group=group, algorithm=algorithm)
            want, want_tol = np.array_split(expected, n)[me], np.array_split(tol, n)[me]
            check(close(chunk, want, want_tol, dtype), f"{name} chunk", i)
            check(np.array_equal(a.reshape(-1), inputs[me]), f"{name} modified its input", i)

        for algorithm in dist.ALGORITHMS["reduce"]:
            name = f"reduce ({algorithm}) to {root}"
            if not mpi_can_reduce(algorithm, dtype):
                report["skipped"] += 1
                continue
            # In place on the root; every other rank's array is left as it was.
            a = inputs[me].reshape(shape).copy()
            out = dist.reduce(a, dst=root, op=op, group=group, algorithm=algorithm)
            check(out is a and a.shape == shape, f"{name} did not return its input array", i)
            if me == root:
                check(close(a.reshape(-1), expected, tol, dtype), f"{name} result", i)
            else:
                check(np.array_equal(a.reshape(-1), inputs[me]), f"{name} changed a non-root's array", i)

        # all_gather: chunks of different lengths (some possibly empty), concatenated in rank order.
        pieces = [x[: gather_length(seed, w, length)] for x, w in zip(inputs, members, strict=True)]
        for algorithm in dist.ALGORITHMS["all_gather"]:
            gathered = dist.all_gather(pieces[me].copy(), group=group, algorithm=algorithm)
            check(np.array_equal(gathered, np.concatenate(pieces)), f"all_gather ({algorithm})", i)
            check(gathered.dtype == np.dtype(dtype), f"all_gather ({algorithm}) dtype", i)

        # broadcast from a hypothesis-chosen root, in place.
        for algorithm in dist.ALGORITHMS["broadcast"]:
            a = inputs[me].reshape(shape).copy()
            out = dist.broadcast(a, src=root, group=group, algorithm=algorithm)
            ok = out is a and np.array_equal(a.reshape(-1), inputs[root])
            check(ok, f"broadcast ({algorithm}) from {root}", i)

    write_json(out_dir, f"rank{world.rank}.json", report)


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])

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
from itertools import combinations
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import gradelib  # noqa: E402
import rules  # noqa: E402

import minidist.distributed as dist  # noqa: E402
from minidist.distributed.algorithms import ring  # noqa: E402

# The handout's "Not allowed": MPI's own collectives, or minidist's other collectives, called from the
# ring. (ring.py's functions may call each other: all-reduce is built from the two halves.)
_OTHER_COLLECTIVES = (
    "collectives:all_reduce", "collectives:reduce_scatter", "collectives:all_gather",
    "collectives:broadcast", "collectives:reduce", "algorithms.rabenseifner:rabenseifner_all_reduce",
    "algorithms.recursive_doubling:recursive_doubling_all_reduce",
    "algorithms.recursive_halving:recursive_halving_reduce_scatter", "algorithms.tree_reduce:tree_reduce",
    "algorithms.tree_broadcast:tree_broadcast", "algorithms.scatter_allgather:scatter_allgather_broadcast",
)  # fmt: skip
RULE = rules.Rule(
    files=("minidist.distributed.algorithms.ring",),
    why="the handout asks for a ring built on point-to-point messages (link.host_sendrecv), not on a "
    "ready-made collective",
    functions=tuple(f"minidist.distributed.{name}" for name in _OTHER_COLLECTIVES),
    tasks={
        "ring_reduce_scatter": "A2.1",
        "ring_reduce_scatter_chunk": "A2.1",
        "ring_all_gather": "A2.2",
        "ring_all_reduce": "A2.3",
    },
)


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


def nudge_reduced(
    got: np.ndarray, inputs: list[np.ndarray], chunks, c: int, op: str, whole: np.ndarray | None = None
) -> str:
    """For a wrong reduced chunk ``c``: whose contributions does it hold? A nudge, never the schedule.

    The task file's hint asks a question; this says what the numbers show, so that a student can find
    the step that went wrong without being handed the chunk-index formula. ``whole``: this rank's
    whole array after reduce-scatter, to see whether another chunk got finished here instead.
    """
    n, (a, b) = len(inputs), chunks[c]
    if got.shape != (b - a,) or a == b:
        return ""
    for d, (start, stop) in enumerate(chunks):
        finished = reduce([x[start:stop] for x in inputs], op)
        if whole is not None and d != c and stop > start and np.array_equal(whole[start:stop], finished):
            return (
                f" Chunk {d} is the one finished on this rank, not chunk {c}. Which chunk must a rank send"
                " in the first step so that the last chunk it completes is its own?"
            )
    for d, (start, stop) in enumerate(chunks):
        finished = reduce([x[start:stop] for x in inputs], op)
        if d != c and stop - start == b - a and np.array_equal(got, finished):
            return (
                f" Those are the finished values of chunk {d}, not of chunk {c}: your steps complete chunk"
                f" {d} on this rank. Which chunk must a rank send in the first step so that the last chunk it"
                " completes is its own?"
            )
    if op != "avg":  # which ranks' values are in it? (a subset's average would divide differently)
        for size in range(1, n):
            for ranks in combinations(range(n), size):
                if np.array_equal(got, reduce([inputs[q][a:b] for q in ranks], op)):
                    missing = sorted(set(range(n)) - set(ranks))
                    return (
                        f" It holds the contributions of ranks {list(ranks)} only; those of ranks {missing}"
                        f" never reached it. Does every partial result visit all {n} ranks: does each step"
                        " pass on what it has just combined, and are there enough steps?"
                    )
    return ""


def nudge_gathered(got: np.ndarray, want: np.ndarray, chunks) -> str:
    """For a wrong all-gather result: the first chunk that is wrong, and what sits in its place."""
    for c, (a, b) in enumerate(chunks):
        if got.shape != want.shape or np.array_equal(got[a:b], want[a:b]):
            continue
        if np.all(got[a:b] == -999):
            return (
                f" Chunk {c} still holds the fill value -999: it never arrived. Does every chunk travel far"
                " enough around the ring to reach every rank?"
            )
        for d, (start, stop) in enumerate(chunks):
            if d != c and stop - start == b - a and np.array_equal(got[a:b], want[start:stop]):
                return f" The place of chunk {c} holds chunk {d}'s values: does each chunk land in its place?"
        return ""
    return ""


def receives_during(call) -> int:
    """Run ``call()`` (a ring function called directly); return how many point-to-point receives this
    rank started meanwhile (``rules.watch.received``; -1 when no rule is watched)."""
    seen = rules.watch._active
    before = seen.received if seen is not None else 0
    call()
    return seen.received - before if seen is not None else -1


def nothing_received(function: str, task: str, n: int) -> str:
    """The failure of a ring function that needed other ranks' data and received no message at all.

    A collective called in a way the watch cannot name (``MPI.Intracomm.Allreduce(group.mpi, ...)``,
    an unbound method: straight into C) still shows: the data arrived without a point-to-point receive.
    """
    return (
        f"{task} ({function}) received no point-to-point message on a group of {n} ranks, yet other ranks'"
        " data is needed here: it must have come through a ready-made collective, called in a way the"
        " grader cannot name. The handout asks for a ring built on point-to-point messages"
        " (link.host_sendrecv); its 'Not allowed' section forbids ready-made collectives, so this test"
        " scores 0 points."
    )


def check_case(group, case: dict) -> list[str]:
    n, r = group.size, group.rank
    kind, length, dtype, op = case["kind"], case["length"], case["dtype"], case.get("op", "sum")
    inputs = [rank_input(case["seed"], q, length, dtype) for q in range(n)]
    chunks = bounds(length, n)
    lo, hi = chunks[r]
    where = f"{kind} (op={op!r}, {length} {dtype} elements, group of {n} ranks, rank {r})"
    failures = []

    def expect(label: str, got: np.ndarray, want: np.ndarray, nudge=lambda: "") -> None:
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
        diagnosis = diagnosis or nudge()
        failures.append(f"{label} {where}: expected {gradelib.show(want)}, got {got_text}.{diagnosis}")

    if kind == "reduce_scatter":
        want = reduce(inputs, op).astype(dtype)
        flat = inputs[r].copy()
        received = receives_during(lambda: ring.ring_reduce_scatter(group, flat, op))
        if received == 0 and n > 1 and hi > lo:
            failures.append(nothing_received("ring_reduce_scatter", "A2.1", n))
        expect(f"ring_reduce_scatter: chunk {r} (elements {lo}:{hi}) after", flat[lo:hi], want[lo:hi],
               lambda: nudge_reduced(flat[lo:hi], inputs, chunks, r, op, flat))  # fmt: skip
        got = dist.reduce_scatter(inputs[r].copy(), op=op, group=group, algorithm="ring")
        expect("dist.reduce_scatter(algorithm='ring') result of", got, want[lo:hi])
    elif kind == "all_gather":
        want = np.concatenate([inputs[q][a:b] for q, (a, b) in enumerate(chunks)])
        flat = np.full(length, -999, dtype=dtype)  # garbage everywhere except this rank's own chunk
        flat[lo:hi] = inputs[r][lo:hi]
        received = receives_during(lambda: ring.ring_all_gather(group, flat))
        if received == 0 and n > 1 and length > hi - lo:
            failures.append(nothing_received("ring_all_gather", "A2.2", n))
        nudge = lambda: nudge_gathered(flat, want, chunks)  # noqa: E731
        expect("ring_all_gather: the full array after", flat, want, nudge)
        sizes = [(case["seed"] + 3 * q) % (length + 1) for q in range(n)]  # uneven chunks, some empty
        got = dist.all_gather(inputs[r][: sizes[r]].copy(), group=group, algorithm="ring")
        expect(f"dist.all_gather(algorithm='ring') of chunks of sizes {sizes}:", got,
               np.concatenate([inputs[q][: sizes[q]] for q in range(n)]))  # fmt: skip
    elif kind == "all_reduce":
        want = reduce(inputs, op).astype(dtype)
        flat = inputs[r].copy()
        received = receives_during(lambda: ring.ring_all_reduce(group, flat, op))
        if received == 0 and n > 1 and length > 0:
            failures.append(nothing_received("ring_all_reduce", "A2.3", n))
        wrong = next((c for c, (a, b) in enumerate(chunks) if not same(flat[a:b], want[a:b])), r)
        nudge = lambda: nudge_reduced(flat[slice(*chunks[wrong])], inputs, chunks, wrong, op)  # noqa: E731
        expect("ring_all_reduce: the array after", flat, want, nudge)
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
    gradelib.worker_main(body, RULE)

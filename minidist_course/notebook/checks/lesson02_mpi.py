"""Checks of lesson 02 (MPI in five minutes): a rank's neighbours in a ring, and one shift of tokens."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from minidist_course.notebook.checks.harness import NotDone, call, exercise, holds, same


@exercise(
    "Who is the right neighbour of the last rank, and who is the left neighbour of rank 0?",
    "Both neighbours are one step away in rank order, and the ring wraps around: the modulo operator keeps "
    "a rank inside [0, size). Return them in the order (left, right).",
)
def ring_neighbors(fn: Callable[[int, int], tuple[int, int]]) -> None:
    """ring_neighbors(rank, size) gives every rank's (left, right) in rings of 1 to 8 ranks."""
    for n in (1, 2, 3, 5, 8):
        for r in range(n):
            got = tuple(call(fn, r, n))
            want = ((r - 1) % n, (r + 1) % n)
            holds(len(got) == 2, f"ring_neighbors({r}, {n})", got, "return two ranks: (left, right)")
            for side, mine in zip(("left", "right"), got):
                holds(
                    0 <= mine < n,
                    f"ring_neighbors({r}, {n})",
                    got,
                    f"the {side} neighbour is not in [0, {n})",
                )
            same(
                got,
                want,
                f"ring_neighbors({r}, {n})",
                "a neighbour is not one step away, or left and right are swapped",
            )


@exercise(
    "Whom does each rank send its token to, and whom does it receive one from?",
    "Use one sendrecv per rank: send your own token to the right neighbour and receive the left "
    "neighbour's into a fresh buffer.",
)
def ring_pass(received: list[Any]) -> None:
    """after one shift around the ring, every rank holds its left neighbour's token."""
    if any(token is None for token in received):
        raise NotDone()  # the ring pass was skipped because ring_neighbors is not written yet
    n = len(received)
    for r, token in enumerate(received):
        same(
            float(np.ravel(token)[0]),
            float((r - 1) % n),
            f"rank {r}'s token after the pass",
            "each rank must end with the token of the neighbour it receives from",
        )

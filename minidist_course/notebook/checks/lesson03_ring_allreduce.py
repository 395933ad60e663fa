"""Checks of lesson 03 (the ring all-reduce): the chunk a rank sends, and the time of the whole ring."""

from __future__ import annotations

from collections.abc import Callable

from minidist_course.notebook.checks.harness import call, close, exercise, holds, same
from minidist_tools.perfmodel import step as perfmodel


@exercise(
    "In the panels, which cell of each row grows at the first step, and so which chunk must the rank "
    "on its left have sent?",
    "Follow one chunk c through the panels: it must end complete on rank c, one rank further right at "
    "every step, so work out which rank sent it first; then count steps backwards. Wrap indices with % n.",
)
def reduce_scatter_send_chunk(fn: Callable[[int, int, int], int]) -> None:
    """send_chunk(rank, step, n) is the chunk minidist/distributed/algorithms/ring.py sends, for every rank
    and
    reduce-scatter step of rings of 2 to 7 ranks."""
    for n in (2, 3, 4, 7):
        for s in range(n - 1):
            for r in range(n):
                got = call(fn, r, s, n)
                want = (r - s - 1) % n  # as ring_reduce_scatter in minidist/distributed/algorithms/ring.py
                context = f"send_chunk(rank={r}, step={s}, n={n})"
                holds(isinstance(got, int) and 0 <= got < n, context, got, f"a chunk index is in [0, {n})")
                same(got, want, context, "the chunk that arrives next is not the one this rank just reduced")


@exercise(
    "How many steps do reduce-scatter and all-gather take together, and how many bytes does one message "
    "carry?",
    "Each step costs one message, alpha + (its bytes) * beta, and every rank sends at the same time, so "
    "the steps add up and the ranks do not. A message is one chunk: the vector cut into n pieces.",
)
def ring_time(fn: Callable[[float, int, float, float], float]) -> None:
    """ring_time(nbytes, n, alpha, beta) is the alpha-beta time of the ring all-reduce (Patarasuk &
    Yuan 2009) on three networks, as minidist_tools.perfmodel.step computes it."""
    for nbytes, n, alpha, beta in [(1e6, 2, 1e-5, 1e-10), (4e8, 8, 5e-6, 4e-11), (1e3, 64, 2e-6, 1e-9)]:
        want = perfmodel.ring_all_reduce_time(nbytes, n, alpha, beta)
        got = call(fn, nbytes, n, alpha, beta)
        context = f"ring_time(nbytes={nbytes:g}, n={n}, alpha={alpha:g}, beta={beta:g})"
        bigger = call(fn, 2 * nbytes, n, alpha, beta)
        holds(
            bigger > got,
            context,
            got,
            f"twice the bytes take {bigger!r}; a bigger vector should take longer to all-reduce",
            want,
        )
        close(got, want, context, rtol=1e-9)

"""Broadcast for long messages: scatter the array in pieces from the root, then ring all-gather them.

The binomial tree (``tree_broadcast.py``) resends the *whole* array in each of its ``ceil(log2 n)`` rounds.
Van de Geijn's broadcast (as used in MPICH for long messages) instead cuts the array into ``n`` chunks
in ``numpy.array_split`` order and

1. **scatters** them: chunk ``c`` goes to the rank at distance ``c`` from the root, through a binomial
   tree whose subtrees hold *contiguous* ranges of chunks, so each message is one slice of the array;
2. **all-gathers** them with the ring (``ring.ring_all_gather``), after which every rank has every chunk.

Ranks are renumbered relative to the root, ``v = (rank - src) % n``, and ``v`` owns chunk ``v``. Rank
``v`` is the top of a subtree covering ranks ``[v, v + span)`` with ``span`` the lowest set bit of ``v``
(the root's span is the power of two ``>= n``). It receives that range of chunks from its parent
``v - span``, then hands the upper half of what it holds to ``v + span/2``, the upper half of the rest
to ``v + span/4``, and so on:

    n = 8, src = 0:  0 -> 4 (chunks 4-7);  0 -> 2 (2-3), 4 -> 6 (6-7);  0 -> 1, 2 -> 3, 4 -> 5, 6 -> 7

Cost in the alpha-beta model of Thakur, Rabenseifner & Gropp, "Optimization of collective communication
operations in MPICH" (IJHPCA 2005, §4.1), for ``N`` bytes (alpha per message, beta per byte):

    scatter:     ceil(log2 n) alpha + (n-1)/n N beta
    all-gather:        (n-1) alpha + (n-1)/n N beta      (the ring: Patarasuk & Yuan, JPDC 2009)
    total:  (ceil(log2 n) + n - 1) alpha + 2 (n-1)/n N beta

against ``ceil(log2 n) (alpha + N beta)`` for the tree: more latencies but, from ``n = 4`` on, less data
per rank, so it wins for long messages. At ``n = 2`` it moves as much data as the tree, in two steps.
"""

from __future__ import annotations

import numpy as np

from minidist.distributed.algorithms.ring import chunk_bounds, ring_all_gather
from minidist.distributed.comm import Communicator


def scatter_allgather_broadcast(group: Communicator, flat: np.ndarray, src: int) -> None:
    """Copy ``flat`` (1-D host array, same length and dtype on every rank) from rank ``src`` to every rank.

    In place; needs no scratch buffer (every piece is received straight into its place). Any length
    works, including lengths below the group size (some chunks, and so some messages, are empty). The
    root's ``flat`` is rewritten with the same values by the all-gather. Collective over ``group``, on its
    ``collective_channel``. Raises ``DistributedError`` if a rank's length differs from the root's.
    """
    n = group.size
    link = group.collective_channel
    v = (group.rank - src) % n
    bounds = chunk_bounds(flat.size, n)  # bounds[c]: chunk c, which virtual rank c owns
    offsets = [start for start, _ in bounds] + [flat.size]

    def chunks(first: int, end: int) -> np.ndarray:
        """The slice of ``flat`` holding chunks ``first .. end - 1`` (clipped to the ``n`` that exist)."""
        return flat[offsets[first] : offsets[min(end, n)]]

    # Scatter down the binomial tree: receive my subtree's chunks, then split them among my children.
    span = v & -v if v else 1 << (n - 1).bit_length()  # lowest set bit; the root covers everything
    if v:
        link.host_recv(chunks(v, v + span), (v - span + src) % n)
    half = span // 2
    while half:
        child = v + half
        if child < n:
            link.host_send(chunks(child, child + half), (child + src) % n)
        half //= 2

    # All-gather around the ring. ring_all_gather indexes chunks by *real* rank: real rank r owns
    # chunk (r - src) % n.
    ring_all_gather(group, flat, [bounds[(r - src) % n] for r in range(n)])

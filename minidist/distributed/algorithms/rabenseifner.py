"""Rabenseifner's all-reduce: recursive-halving reduce-scatter, then recursive-doubling all-gather.

Like the ring (``ring.py``) it first *reduce-scatters* (each rank ends owning one finished chunk) and then
*all-gathers* (every rank gets every finished chunk), but each half takes ``log2 n`` steps instead of
``n - 1``, so it keeps the ring's low bandwidth term with far fewer messages.

The array (``N`` elements) is cut into ``p`` chunks in ``numpy.array_split`` order (``ring.chunk_bounds``;
chunks may differ by one element, or be empty when ``N < p``). With ``p = 2^k`` ranks:

* **Recursive halving** (reduce-scatter). Each rank is responsible for a range of chunks, at first all
  ``p`` of them. In the step with distance ``d = p/2, p/4, ..., 1`` a rank pairs with ``rank XOR d``; the
  one whose bit ``d`` is 0 keeps the lower half of the range and the other the upper half. Each sends
  the half it gives up and folds the half it receives into the half it keeps. After ``k`` steps rank
  ``v`` keeps exactly chunk ``v``, reduced over all ranks:

      n = 4, chunks c0..c3:   step d=2: 0<->2, 1<->3   (0, 1 keep c0-c1;  2, 3 keep c2-c3)
                              step d=1: 0<->1, 2<->3   (rank v keeps c_v, summed over all 4)

* **Recursive doubling** (all-gather), the same steps backwards, ``d = 1, 2, ..., p/2``: partners swap
  the ranges they own (one chunk, then two, then four, ...) until everyone owns everything.

Each chunk is reduced once, by its owner, and afterwards only copied, so every rank ends with
bit-identical results. Non-power-of-two group sizes are first folded into ``p`` ranks, exactly as in
``recursive_doubling.py`` (:func:`fold_in` / :func:`fold_out`).

Cost in the alpha-beta-gamma model of Thakur, Rabenseifner & Gropp, "Optimization of collective
communication operations in MPICH" (IJHPCA 2005, §4.4), for ``N`` bytes and ``n = p`` a power of two
(alpha per message, beta per byte sent, gamma per byte reduced):

    reduce-scatter:  log2(n) alpha + (n-1)/n N beta + (n-1)/n N gamma
    all-gather:      log2(n) alpha + (n-1)/n N beta
    total:          2 log2(n) alpha + 2 (n-1)/n N beta + (n-1)/n N gamma

The same bandwidth as the ring (Patarasuk & Yuan, JPDC 2009, prove ``2(n-1)/n N beta`` optimal), with
``2 log2 n`` instead of ``2(n-1)`` latencies. If ``n`` is not a power of two the fold adds
``2 alpha + 2 N beta + N gamma``, which is why the ring can still win there for long messages.
"""

from __future__ import annotations

import numpy as np

from minidist.distributed.algorithms.recursive_doubling import (
    fold_in,
    fold_out,
    largest_power_of_two,
    real_rank,
)
from minidist.distributed.algorithms.ring import chunk_bounds
from minidist.distributed.comm import Communicator
from minidist.distributed.reduce_ops import combine_ufunc, finish


def rabenseifner_all_reduce(group: Communicator, flat: np.ndarray, op: str) -> None:
    """Reduce ``flat`` (1-D host array, same length on every rank) over ``group``, in place, on every rank.

    Any length works, including 0 and lengths below the group size (then some chunks are empty and the
    messages carrying them are empty). Allocates one scratch buffer: ``flat.size`` elements on the ranks
    that receive a partner's whole array in :func:`fold_in`, else the largest half (``ceil``-ish
    ``N / 2``), none on ranks that sit out. Collective over ``group``, on its ``collective_channel``.
    Raises ``DistributedError`` if a partner's array has a different length.
    """
    n, rank = group.size, group.rank
    p = largest_power_of_two(n)
    extra = n - p
    # offsets[c] : offsets[c + 1] is chunk c; the lower half of any range is never shorter than the upper.
    offsets = [start for start, _ in chunk_bounds(flat.size, p)] + [flat.size]
    if rank < 2 * extra:  # an odd rank receives the whole array in fold_in; an even one sits out
        scratch = group.collective_channel.scratch(flat.size, flat.dtype) if rank % 2 else None
    else:  # the largest half it can receive
        scratch = group.collective_channel.scratch(offsets[p // 2], flat.dtype)
    virtual = fold_in(group, flat, op, scratch)
    if virtual is not None:
        link = group.collective_channel
        combine = combine_ufunc(op)

        # Recursive halving: my range of chunks is [low, low + 2 * distance); keep one half, send the other.
        low, distance = 0, p // 2
        while distance >= 1:
            partner = real_rank(virtual ^ distance, n)
            if virtual & distance:  # keep the upper half
                keep, give = low + distance, low
            else:  # keep the lower half
                keep, give = low, low + distance
            keep_start, keep_stop = offsets[keep], offsets[keep + distance]
            mine = flat[keep_start:keep_stop]
            incoming = scratch[: keep_stop - keep_start]  # a view: no allocation per step
            link.host_sendrecv(flat[offsets[give] : offsets[give + distance]], partner, incoming, partner)
            combine(mine, incoming, out=mine)
            low, distance = keep, distance // 2

        # Now low == virtual: chunk `virtual` is finished. "avg": divide only the chunk this rank owns.
        finish(op, flat[offsets[virtual] : offsets[virtual + 1]], n)

        # Recursive doubling: I own the `distance` chunks from `low`; swap with the partner's neighbours.
        distance = 1
        while distance < p:
            partner = real_rank(virtual ^ distance, n)
            low = virtual - virtual % distance  # my range starts here; the partner's is low ^ distance
            theirs = low ^ distance
            link.host_sendrecv(
                flat[offsets[low] : offsets[low + distance]], partner,
                flat[offsets[theirs] : offsets[theirs + distance]], partner,
            )  # fmt: skip
            distance *= 2
    fold_out(group, flat)

"""Recursive-halving reduce-scatter: ``log2 n`` steps, each halving the part of the array a rank works on.

The first half of Rabenseifner's all-reduce (``rabenseifner.py``) on its own, as a reduce-scatter whose
result has the chunk layout of ``dist.reduce_scatter``: rank ``r`` gets chunk ``r`` of
``numpy.array_split(reduced, n)``.

With ``n = 2^k`` ranks each rank is at first responsible for all ``n`` chunks. In the step with
distance ``d = n/2, n/4, ..., 1`` it pairs with ``rank XOR d``: the rank whose bit ``d`` is 0 keeps the
lower half of its range of chunks, the other the upper half; each sends the half it gives up and adds
the partner's copy of the half it keeps to its own. After ``k`` steps rank ``r`` keeps chunk ``r``,
summed over all ranks:

    n = 4, chunks c0..c3:   d=2: 0<->2, 1<->3  (0, 1 keep c0-c1; 2, 3 keep c2-c3)
                            d=1: 0<->1, 2<->3  (rank r keeps c_r)

The input is only read: the first step sends straight from it, and the partial sums live in two
buffers that take turns (the one being sent and the one being received into), the last step receiving
into the returned array.

**Group sizes that are not a power of two** are folded as in ``recursive_doubling.py``: with
``p = 2^floor(log2 n)`` and ``r = n - p``, rank ``2i`` (``i < r``) sends its whole array to ``2i + 1``,
which adds it to its own and plays virtual rank ``i``; ranks ``>= 2r`` play ``rank - r``. Virtual rank
``i`` then stands for the *chunks* of the ranks it plays for: chunks ``2i`` and ``2i + 1`` (adjacent,
so still one slice) for ``i < r``, chunk ``i + r`` otherwise. After the halving, rank ``2i + 1`` sends
chunk ``2i`` to rank ``2i``.

Cost in the alpha-beta-gamma model of Thakur, Rabenseifner & Gropp, "Optimization of collective
communication operations in MPICH" (IJHPCA 2005, §4.3), for ``N`` bytes and ``n`` a power of two
(alpha per message, beta per byte sent, gamma per byte reduced):

    log2(n) alpha + (n-1)/n N beta + (n-1)/n N gamma

the ring's bandwidth (``ring.py``) with ``log2 n`` instead of ``n - 1`` latencies. The fold adds
``2 alpha + (1 + 1/n) N beta + N gamma``.
"""

from __future__ import annotations

import numpy as np

from minidist.distributed.algorithms.recursive_doubling import largest_power_of_two, real_rank
from minidist.distributed.algorithms.ring import Bounds
from minidist.distributed.comm import Communicator
from minidist.distributed.reduce_ops import combine_ufunc, finish


def recursive_halving_reduce_scatter(
    group: Communicator, flat: np.ndarray, op: str, bounds: Bounds
) -> np.ndarray:
    """Reduce ``flat`` (1-D host array, same length on every rank) over ``group``; return chunk ``rank``.

    ``bounds`` are the ``n`` chunks in ``numpy.array_split`` order (``ring.chunk_bounds``); the result is
    a new array of ``bounds[rank]``'s length, reduced over all ranks (``"avg"``: divided by ``n``).
    ``flat`` is not modified. Scratch: about ``3/4 N`` elements (``N`` more on ranks that receive a
    partner's whole array in the fold). Raises ``DistributedError`` if a partner's length differs.
    """
    n, rank = group.size, group.rank
    p = largest_power_of_two(n)
    extra = n - p
    link = group.collective_channel
    combine = combine_ufunc(op)
    mine_start, mine_stop = bounds[rank]

    # Fold: rank 2i hands its whole array to 2i + 1 and waits for its finished chunk.
    if rank < 2 * extra and rank % 2 == 0:
        link.host_send(flat, rank + 1)
        result = np.empty(mine_stop - mine_start, dtype=flat.dtype)
        link.host_recv(result, rank + 1)
        return result
    if rank < 2 * extra:
        theirs = np.empty_like(flat)
        link.host_recv(theirs, rank - 1)
        flat = combine(flat, theirs, out=theirs)  # from here on, this rank's input is the sum of both
        virtual = rank // 2
    else:
        virtual = rank - extra

    # Virtual rank v's chunks: those of the ranks it plays for (2v and 2v + 1, or v + extra).
    offsets = [bounds[2 * v if v < extra else v + extra][0] for v in range(p)] + [flat.size]
    # Two buffers for the partial sums, sized for the first two steps' kept halves (the lower half of
    # a range is never shorter than the upper), and the returned array for the last step.
    scratch = np.empty(offsets[p // 2] + offsets[p // 4] if p >= 4 else 0, dtype=flat.dtype)
    buffers = (scratch[: offsets[p // 2]], scratch[offsets[p // 2] :])
    holder, holder_start = flat, 0  # where my partial sums live, and which element is holder[0]
    low, distance, step = 0, p // 2, 0
    while distance >= 1:
        partner = real_rank(virtual ^ distance, n)
        keep, give = (low + distance, low) if virtual & distance else (low, low + distance)
        keep_start, keep_stop = offsets[keep], offsets[keep + distance]
        give_start, give_stop = offsets[give], offsets[give + distance]
        size = keep_stop - keep_start
        if distance == 1:  # last step: the finished sums go straight into the array we return
            incoming = np.empty(size, dtype=flat.dtype)
        else:
            incoming = buffers[step % 2][:size]
        outgoing = holder[give_start - holder_start : give_stop - holder_start]
        link.host_sendrecv(outgoing, partner, incoming, partner)
        combine(holder[keep_start - holder_start : keep_stop - holder_start], incoming, out=incoming)
        holder, holder_start = incoming, keep_start
        low, distance, step = keep, distance // 2, step + 1

    finish(op, holder, n)  # holder is now virtual chunk `virtual`, reduced over all ranks
    if rank >= 2 * extra:
        return holder
    partner_stop = bounds[rank - 1][1]  # rank 2i + 1: chunk 2i is the front of what I hold
    link.host_send(holder[: partner_stop - holder_start], rank - 1)
    return holder[partner_stop - holder_start :].copy()

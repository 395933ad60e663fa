"""Ring reduce-scatter, ring all-gather and ring all-reduce, written with point-to-point messages only.

The ``n`` ranks of a group stand in a circle. Each rank talks only to its two neighbours:

    left = (rank - 1) % n   (it receives from left)        right = (rank + 1) % n   (it sends to right)

The array (``N`` elements, flattened) is cut into ``n`` chunks in ``numpy.array_split`` order: chunk
``c`` is ``flat[start_c:stop_c]`` and the first ``N % n`` chunks are one element longer. Chunks may be
empty when ``N < n``; an empty chunk is simply an empty message.

* **Reduce-scatter** (``n - 1`` steps): partial sums travel around the ring. At the end rank ``r`` holds
  chunk ``r`` reduced over all ranks (other chunks of its array hold partial results: garbage).
* **All-gather** (``n - 1`` steps): each rank's finished chunk travels around the ring until every rank
  has every chunk.
* **All-reduce** = reduce-scatter, then all-gather (Patarasuk & Yuan, "Bandwidth optimal all-reduce
  algorithms for clusters of workstations", JPDC 2009).

Cost in the alpha-beta(-gamma) model of Thakur, Rabenseifner & Gropp, "Optimization of collective
communication operations in MPICH" (IJHPCA 2005): sending a message of ``m`` elements costs
``alpha + m * beta`` (latency plus per-element transfer time), and reducing ``m`` elements costs
``m * gamma``. Every step moves one chunk of ``N / n`` elements, so

    reduce-scatter:  (n-1) alpha + (n-1)/n N beta + (n-1)/n N gamma
    all-gather:      (n-1) alpha + (n-1)/n N beta
    all-reduce:     2(n-1) alpha + 2(n-1)/n N beta + (n-1)/n N gamma

The bandwidth term ``2(n-1)/n N beta`` is (almost) independent of ``n`` and is the minimum any
all-reduce can achieve, which is why rings are used for large gradients. The price is the latency term,
which grows linearly with ``n``; tree algorithms win for short messages.

Why can the ring not deadlock? In every step each rank calls ``sendrecv``: it sends to its right and
receives from its left in one operation whose send does not have to finish before its receive starts.
So every rank is ready to receive while it sends, and every message has a waiting receiver. If instead
each rank first called a blocking ``send``, large messages (which MPI does not buffer) would leave all
``n`` ranks waiting for a receiver that is itself stuck in ``send``: a cycle, a deadlock.

All functions work in place on a host (NumPy) array, are collective over ``group`` (every rank must call
the same function with arrays of the same length and dtype) and talk over ``group.collective_channel``
so that they never intercept a user's point-to-point messages.
"""

from __future__ import annotations

import numpy as np

from minidist.distributed.comm import Communicator
from minidist.distributed.reduce_ops import combine_ufunc, finish

Bounds = list[tuple[int, int]]


def chunk_bounds(length: int, n: int) -> Bounds:
    """``[(start, stop), ...]`` of the ``n`` chunks of ``numpy.array_split(range(length), n)``.

    The first ``length % n`` chunks have ``length // n + 1`` elements, the others ``length // n``.
    """
    base, extra = divmod(length, n)
    bounds = []
    start = 0
    for c in range(n):
        stop = start + base + (1 if c < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def ring_reduce_scatter(group: Communicator, flat: np.ndarray, op: str, bounds: Bounds | None = None) -> None:
    """Reduce ``flat`` (1-D, ``N`` elements) over ``group`` so that rank ``r`` ends with chunk ``r`` reduced.

    In place: afterwards ``flat[bounds[r][0]:bounds[r][1]]`` holds the reduction of that chunk over all
    ranks (divided by ``n`` for ``op="avg"``); the rest of ``flat`` is overwritten with partial results.
    ``bounds`` defaults to :func:`chunk_bounds` ``(N, n)``. Allocates one scratch buffer of the largest
    chunk (``ceil(N / n)`` elements). Raises ``DistributedError`` if a neighbour's chunk has a different
    length, which means the ranks passed different ``N`` (not every such mismatch shows up this way).
    """
    n, r = group.size, group.rank
    if bounds is None:
        bounds = chunk_bounds(flat.size, n)
    # BEGIN SOLUTION A2.1: the reduce-scatter half of the ring, in place
    link = group.collective_channel
    right, left = (r + 1) % n, (r - 1) % n
    combine = combine_ufunc(op)
    scratch = link.scratch(max(stop - start for start, stop in bounds), flat.dtype)

    # Step s: rank r sends chunk (r - s - 1) % n to the right, and receives chunk (r - s - 2) % n from the
    # left, which it adds into its own copy of that chunk. Following one chunk c: rank c + 1 sends its raw
    # copy at step 0; rank c + 2 adds its own and forwards the partial sum at step 1; ... after n - 1
    # steps the sum has visited all n ranks and sits, complete, at rank c + 1 + (n - 1) = c (mod n).
    # So after the last step (s = n - 2) rank r has just finished chunk (r - n) % n = r.
    for step in range(n - 1):
        send_start, send_stop = bounds[(r - step - 1) % n]
        recv_start, recv_stop = bounds[(r - step - 2) % n]
        incoming = scratch[: recv_stop - recv_start]  # a view: no allocation per step
        link.host_sendrecv(flat[send_start:send_stop], right, incoming, left)
        mine = flat[recv_start:recv_stop]
        combine(mine, incoming, out=mine)

    own_start, own_stop = bounds[r]
    finish(op, flat[own_start:own_stop], n)  # "avg": divide only the N/n elements this rank owns
    # END SOLUTION


def ring_reduce_scatter_chunk(
    group: Communicator, flat: np.ndarray, op: str, bounds: Bounds | None = None
) -> np.ndarray:
    """Like :func:`ring_reduce_scatter`, but ``flat`` is only read: return rank ``r``'s finished chunk.

    The result is a new 1-D array of ``bounds[r]``'s length (``bounds`` defaults to :func:`chunk_bounds`).
    Same messages, same order of additions, so the same bits as :func:`ring_reduce_scatter`. The partial
    results travel in two buffers of the largest chunk that take turns: in each step one is sent while
    the other receives the left neighbour's partial result and then has this rank's own contribution,
    read straight from ``flat``, added to it. So the memory used is two chunks (one for ``n = 2``)
    instead of a private copy of the whole of ``flat``, and ``N`` bytes less are copied.
    """
    n, r = group.size, group.rank
    if bounds is None:
        bounds = chunk_bounds(flat.size, n)
    # BEGIN SOLUTION A2.1: the ring reduce-scatter that returns this rank's chunk
    link = group.collective_channel
    right, left = (r + 1) % n, (r - 1) % n
    combine = combine_ufunc(op)
    longest = max(stop - start for start, stop in bounds)
    buffers = [np.empty(longest, dtype=flat.dtype), np.empty(longest if n > 2 else 0, dtype=flat.dtype)]

    # The schedule of ring_reduce_scatter: step s sends chunk (r - s - 1) % n and receives (r - s - 2) % n.
    send_start, send_stop = bounds[(r - 1) % n]
    outgoing = flat[send_start:send_stop]  # step 0 sends this rank's raw contribution
    for step in range(n - 1):
        recv_start, recv_stop = bounds[(r - step - 2) % n]
        incoming = buffers[step % 2][: recv_stop - recv_start]
        link.host_sendrecv(outgoing, right, incoming, left)
        combine(flat[recv_start:recv_stop], incoming, out=incoming)
        outgoing = incoming  # the next step passes this partial result on

    finish(op, outgoing, n)  # after the last step `outgoing` is chunk r, reduced over all ranks
    return outgoing
    # END SOLUTION


def ring_all_gather(group: Communicator, flat: np.ndarray, bounds: Bounds | None = None) -> None:
    """Fill every chunk of ``flat`` (1-D) from its owner: before, rank ``r`` has a correct chunk ``r``.

    In place: afterwards every rank's ``flat`` is the concatenation of all ranks' chunks in rank order.
    ``bounds`` (default :func:`chunk_bounds`) may give chunks of different lengths, as long as every rank
    passes the same ``bounds``. Needs no scratch buffer: each chunk is received straight into its place.
    Raises ``DistributedError`` if a neighbour sends a chunk of the wrong length.
    """
    n, r = group.size, group.rank
    if bounds is None:
        bounds = chunk_bounds(flat.size, n)
    # BEGIN SOLUTION A2.2: the ring all-gather, in place
    link = group.collective_channel
    right, left = (r + 1) % n, (r - 1) % n

    # Step s: rank r forwards chunk (r - s) % n (its own at step 0, then the one it received in the step
    # before) to the right, and receives chunk (r - s - 1) % n from the left. After n - 1 steps each
    # chunk has been passed along n - 1 links and so has reached every rank.
    for step in range(n - 1):
        send_start, send_stop = bounds[(r - step) % n]
        recv_start, recv_stop = bounds[(r - step - 1) % n]
        link.host_sendrecv(flat[send_start:send_stop], right, flat[recv_start:recv_stop], left)
    # END SOLUTION


def ring_all_reduce(group: Communicator, flat: np.ndarray, op: str) -> None:
    """Reduce ``flat`` (1-D, same length on every rank) over ``group``, in place, on every rank.

    Reduce-scatter leaves each rank owning one finished chunk; all-gather then hands every finished
    chunk to everyone. Every rank ends with bit-identical results, because each chunk is reduced once, on
    its owner, and then only copied. Raises ``DistributedError`` if a received chunk has the wrong length
    (the ranks passed different lengths).
    """
    # BEGIN SOLUTION A2.3: all-reduce as reduce-scatter followed by all-gather
    bounds = chunk_bounds(flat.size, group.size)
    ring_reduce_scatter(group, flat, op, bounds)
    ring_all_gather(group, flat, bounds)
    # END SOLUTION

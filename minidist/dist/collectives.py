"""The public collectives: ``all_reduce``, ``reduce_scatter``, ``all_gather`` and ``broadcast``.

A collective is called by *every* rank of a group, with matching arguments, and involves all of them.
Each function here does the same four things, in order, and leaves the algorithm itself to another file:

1. check the arguments (``validate.py``, ``reduce_ops.py``), so misuse fails on the calling rank with a
   clear message instead of deep inside MPI;
2. resolve ``group`` (``None`` = the world);
3. stage GPU arrays through host memory (``staging.py``);
4. run the chosen algorithm: hand-written ``"ring"`` (``ring.py``) or ``"tree"`` (``broadcast.py``), or
   ``"mpi"``, MPI's own built-in (``mpi_builtin.py``), the reference the others are tested against.

Arrays may have any shape and any length, including 0, 1 and lengths smaller than the group size. The
chunk layout of ``reduce_scatter`` and ``all_gather`` is ``numpy.array_split`` order over the flattened
array. A group of size 1 returns at once (after the argument checks).
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any

import numpy as np

from minidist.dist.broadcast import tree_broadcast
from minidist.dist.comm import Communicator, group_or_world
from minidist.dist.mpi_builtin import (
    mpi_all_gather,
    mpi_all_gather_counts,
    mpi_all_reduce,
    mpi_broadcast,
    mpi_reduce_scatter,
)
from minidist.dist.reduce_ops import check_op
from minidist.dist.ring import chunk_bounds, ring_all_gather, ring_all_reduce, ring_reduce_scatter
from minidist.dist.staging import host_copy, host_view, like
from minidist.dist.validate import check_array, check_choice, check_rank

# The algorithms each collective offers, and what "auto" means for it today. ("auto" is where a
# size-based choice would go: a tree for short messages, a ring for long ones.)
ALGORITHMS = {
    "all_reduce": ("auto", "ring", "mpi"),
    "reduce_scatter": ("auto", "ring", "mpi"),
    "all_gather": ("auto", "ring", "mpi"),
    "broadcast": ("auto", "tree", "mpi"),
}
_AUTO = {"all_reduce": "ring", "reduce_scatter": "ring", "all_gather": "ring", "broadcast": "tree"}


def _pick(collective: str, algorithm: str) -> str:
    check_choice(algorithm, ALGORITHMS[collective], f"algorithm for {collective}")
    return _AUTO[collective] if algorithm == "auto" else algorithm


def all_reduce(a: Any, op: str = "sum", group: Communicator | None = None, algorithm: str = "auto") -> Any:
    """Reduce ``a`` element-wise over all ranks of ``group``, in place on every rank; return ``a``.

    ``a``: a C-contiguous NumPy or CuPy array of any shape (``N = a.size`` elements, ``a.nbytes`` bytes),
    with the same shape and dtype on every rank. Afterwards every rank's ``a`` holds ``op`` applied over
    the ranks' arrays (``"avg"``: the sum divided by the group size). The returned object *is* ``a``.

    ``algorithm``: ``"ring"`` (what ``"auto"`` picks): reduce-scatter then all-gather (Patarasuk & Yuan
    2009), cost ``2(n-1) alpha + 2(n-1)/n N beta + (n-1)/n N gamma`` (see ``ring.py``); ``"mpi"``:
    ``MPI_Allreduce`` with ``MPI_IN_PLACE``.

    Raises ``ValueError`` for an unknown ``op`` or ``algorithm`` (listing the valid ones) and for a
    non-contiguous or read-only ``a``; ``TypeError`` for a non-array, a dtype that cannot be reduced,
    ``"avg"`` on integers, or ``"mpi"`` with a dtype this MPI cannot reduce (float16 on some builds);
    ``DistributedError`` if the ring receives a chunk of unexpected length (the ranks' ``a`` differ).
    """
    algorithm = _pick("all_reduce", algorithm)
    check_array(a, writable=True)
    check_op(op, a.dtype)
    group = group_or_world(group)
    if group.size == 1:
        return a  # nothing to combine; "avg" would divide by 1
    with host_view(a, copy_in=True, copy_out=True) as host:
        flat = host.reshape(-1)  # a view, not a copy: host is C-contiguous
        if algorithm == "ring":
            ring_all_reduce(group, flat, op)
        else:
            mpi_all_reduce(group, flat, op)
    return a


def reduce_scatter(
    a: Any, op: str = "sum", group: Communicator | None = None, algorithm: str = "auto"
) -> Any:
    """Reduce ``a`` over all ranks and return only this rank's chunk of the result, as a new 1-D array.

    ``a``: any shape, ``N = a.size`` elements, same shape and dtype on every rank; it is *not* modified.
    The result is chunk ``rank`` of ``numpy.array_split(reduced.reshape(-1), n)``: ``N // n`` or
    ``N // n + 1`` elements (possibly 0), on the same device as ``a``. Concatenating every rank's result
    in rank order gives ``all_reduce(a)`` flattened.

    ``algorithm``: ``"ring"`` (``"auto"``), cost ``(n-1) alpha + (n-1)/n N beta + (n-1)/n N gamma``; it
    works on a private copy of ``a`` (one extra ``a.nbytes``), because the ring overwrites its buffer.
    ``"mpi"``: ``MPI_Reduce_scatter``. Raises like :func:`all_reduce` (``a`` need not be writable).
    """
    algorithm = _pick("reduce_scatter", algorithm)
    check_array(a)
    check_op(op, a.dtype)
    group = group_or_world(group)
    if group.size == 1:
        return a.reshape(-1).copy()
    bounds = chunk_bounds(a.size, group.size)
    start, stop = bounds[group.rank]
    if algorithm == "ring":
        work = host_copy(a).reshape(-1)
        ring_reduce_scatter(group, work, op, bounds)
        mine = work[start:stop].copy()  # copy, so the caller does not keep all of work alive
    else:
        with host_view(a, copy_in=True) as host:
            mine = mpi_reduce_scatter(group, host.reshape(-1), op, [hi - lo for lo, hi in bounds])
    return like(mine, a)


def all_gather(chunk: Any, group: Communicator | None = None, algorithm: str = "auto") -> Any:
    """Return the 1-D concatenation of every rank's ``chunk`` (flattened), in rank order.

    ``chunk``: any shape, same dtype on every rank, but the *lengths may differ* between ranks (0 is
    fine). The result has ``sum of all chunk sizes`` elements, on the same device as ``chunk``; ``chunk``
    is not modified. With equal lengths this undoes :func:`reduce_scatter`'s split.

    Because ranks do not know each other's lengths, they first all-gather the lengths (one int64 per
    rank), an extra small collective: ``(n-1) alpha`` more latency for the ring.

    ``algorithm``: ``"ring"`` (``"auto"``), cost ``(n-1) alpha + (n-1)/n N beta`` for equal chunks of
    total ``N``; ``"mpi"``: ``MPI_Allgather`` of the lengths, then ``MPI_Allgatherv``. Raises
    ``ValueError``/``TypeError`` for a bad ``chunk`` or ``algorithm`` (as :func:`all_reduce`) and
    ``DistributedError`` if the ring receives a message of unexpected length.
    """
    algorithm = _pick("all_gather", algorithm)
    check_array(chunk, "chunk")
    group = group_or_world(group)
    if group.size == 1:
        return chunk.reshape(-1).copy()
    with host_view(chunk, copy_in=True) as host:
        mine = host.reshape(-1)
        if algorithm == "ring":
            # The lengths travel with the same ring: an array of n int64, one chunk of length 1 per rank.
            counts_array = np.zeros(group.size, dtype=np.int64)
            counts_array[group.rank] = mine.size
            ring_all_gather(group, counts_array)
            # Rank i's chunk goes to out[offsets[i]:offsets[i + 1]].
            offsets = [0, *accumulate(counts_array.tolist())]
            bounds = list(zip(offsets[:-1], offsets[1:], strict=True))
            out = np.empty(offsets[-1], dtype=mine.dtype)
            start, stop = bounds[group.rank]
            out[start:stop] = mine
            ring_all_gather(group, out, bounds)
        else:
            out = mpi_all_gather(group, mine, mpi_all_gather_counts(group, mine.size))
    return like(out, chunk)


def broadcast(a: Any, src: int = 0, group: Communicator | None = None, algorithm: str = "auto") -> Any:
    """Copy ``a`` from rank ``src`` of ``group`` into ``a`` on every other rank, in place; return ``a``.

    ``a``: any shape, C-contiguous, same shape and dtype on every rank (``a.nbytes`` bytes are sent to
    each rank). ``algorithm``: ``"tree"`` (``"auto"``), a binomial tree, cost
    ``ceil(log2 n)(alpha + N beta)`` (see ``broadcast.py``); ``"mpi"``: ``MPI_Bcast``.

    Raises ``ValueError`` for an unknown ``algorithm``, a ``src`` outside the group, or a
    non-contiguous/read-only ``a``; ``TypeError`` for a non-array or a non-int ``src``;
    ``DistributedError`` (tree) if a rank's ``a`` has a different length than the root's.
    """
    algorithm = _pick("broadcast", algorithm)
    check_array(a, writable=True)
    group = group_or_world(group)
    check_rank(src, group.size, "src")
    if group.size == 1:
        return a
    is_root = group.rank == src
    # The root only sends (needs its data on the host, changes nothing); the others only receive.
    with host_view(a, copy_in=is_root, copy_out=not is_root) as host:
        flat = host.reshape(-1)
        if algorithm == "tree":
            tree_broadcast(group, flat, src)
        else:
            mpi_broadcast(group, flat, src)
    return a

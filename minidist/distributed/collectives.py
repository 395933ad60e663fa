"""The public collectives: ``all_reduce``, ``reduce_scatter``, ``all_gather``, ``broadcast`` and ``reduce``.

A collective is called by *every* rank of a group, with matching arguments, and involves all of them.
Each function here does the same four things, in order, and leaves the algorithm itself to another file:

1. check the arguments (``checks.py``, ``reduce_ops.py``), so misuse fails on the calling rank with a
   clear message instead of deep inside MPI;
2. resolve ``group`` (``None`` = the world);
3. stage GPU arrays through host memory (``staging.py``);
4. run the chosen algorithm, each in its own file: hand-written ``"ring"`` (``ring.py``),
   ``"recursive_doubling"`` (``recursive_doubling.py``), ``"rabenseifner"`` (``rabenseifner.py``),
   ``"recursive_halving"`` (``recursive_halving.py``),
   ``"tree"`` (``tree_broadcast.py``, ``tree_reduce.py``), ``"scatter_allgather"`` (``scatter_allgather.py``),
   ``"hierarchical"`` (``hierarchical.py``: the three above per node and across nodes, when the group
   spans nodes, ``topology.py``), or ``"mpi"``, MPI's own built-in (``mpi_builtin.py``), the
   reference the others are tested against. ``"auto"`` picks one by message size and group size (and,
   for ``all_reduce`` across nodes, the node layout) from the tables in ``tuning.py``.

Arrays may have any shape and any length, including 0, 1 and lengths smaller than the group size. The
chunk layout of ``reduce_scatter`` and ``all_gather`` is ``numpy.array_split`` order over the flattened
array. A group of size 1 returns at once (after the argument checks).

**Arguments that differ between ranks.** Every rank must pass the same shape and dtype (``all_gather``:
the same dtype) and the same ``op``/``src``/``dst``. A hand-written algorithm that receives a message
of the wrong length raises ``DistributedError`` -- but only on the rank(s) that receive it; the
others may finish with results as if nothing happened (the job then ends through the abort hook, see
``watchdog.py``). ``algorithm="mpi"`` checks even less: MPI's ``Reduce_scatter`` and ``Reduce`` can
return silently wrong numbers for different lengths, and a different dtype or ``op`` is invisible to
every algorithm. ``MINIDIST_DEBUG=1`` compares all of this before each call and raises
``CollectiveMismatchError`` on every rank: use it whenever a result looks wrong.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any

import numpy as np

from minidist.distributed.algorithms.hierarchical import hierarchical_all_reduce
from minidist.distributed.algorithms.mpi_builtin import (
    mpi_all_gather,
    mpi_all_gather_counts,
    mpi_all_reduce,
    mpi_broadcast,
    mpi_reduce,
    mpi_reduce_scatter,
)
from minidist.distributed.algorithms.rabenseifner import rabenseifner_all_reduce
from minidist.distributed.algorithms.recursive_doubling import recursive_doubling_all_reduce
from minidist.distributed.algorithms.recursive_halving import recursive_halving_reduce_scatter
from minidist.distributed.algorithms.ring import (
    chunk_bounds,
    ring_all_gather,
    ring_all_reduce,
    ring_reduce_scatter_chunk,
)
from minidist.distributed.algorithms.scatter_allgather import scatter_allgather_broadcast
from minidist.distributed.algorithms.tree_broadcast import tree_broadcast
from minidist.distributed.algorithms.tree_reduce import tree_reduce
from minidist.distributed.checks import check_array, check_rank
from minidist.distributed.comm import Communicator
from minidist.distributed.reduce_ops import check_op
from minidist.distributed.seam import collective
from minidist.distributed.staging import host_view, like
from minidist.distributed.tuning import check_algorithm, resolve
from minidist.distributed.world import group_or_world

_ALL_REDUCE = {
    "ring": ring_all_reduce,
    "recursive_doubling": recursive_doubling_all_reduce,
    "rabenseifner": rabenseifner_all_reduce,
    "hierarchical": lambda group, flat, op: hierarchical_all_reduce(
        group, flat, op, reduce=reduce, all_reduce=all_reduce, broadcast=broadcast
    ),  # built from this module's collectives, run on the node and leader groups (hierarchical.py)
    "mpi": mpi_all_reduce,
}
_BROADCAST = {"tree": tree_broadcast, "scatter_allgather": scatter_allgather_broadcast, "mpi": mpi_broadcast}


@collective("all_reduce")
def all_reduce(a: Any, op: str = "sum", group: Communicator | None = None, algorithm: str = "auto") -> Any:
    """Reduce ``a`` element-wise over all ranks of ``group``, in place on every rank; return ``a``.

    ``a``: a C-contiguous NumPy or CuPy array of any shape (``N = a.size`` elements, ``a.nbytes`` bytes),
    with the same shape and dtype on every rank. Afterwards every rank's ``a`` holds ``op`` applied over
    the ranks' arrays (``"avg"``: the sum divided by the group size). The returned object *is* ``a``.

    ``algorithm`` (costs for ``N = a.nbytes`` bytes: alpha per message, beta per byte sent, gamma per
    byte reduced; Thakur, Rabenseifner & Gropp 2005):

    * ``"ring"``: reduce-scatter then all-gather around a ring (Patarasuk & Yuan 2009), cost
      ``2(n-1) alpha + 2(n-1)/n N beta + (n-1)/n N gamma`` (``ring.py``); long messages.
    * ``"recursive_doubling"``: ``log2 n`` whole-vector exchanges, cost ``log2(n) (alpha + N beta +
      N gamma)`` (``recursive_doubling.py``); short messages.
    * ``"rabenseifner"``: recursive-halving reduce-scatter, then recursive-doubling all-gather, cost
      ``2 log2(n) alpha + 2(n-1)/n N beta + (n-1)/n N gamma`` (``rabenseifner.py``); long messages.
      For ``n`` not a power of two both recursive algorithms first fold the group to the largest power
      of two ``<= n``, which adds ``2 alpha + 2 N beta + N gamma``.
    * ``"hierarchical"``: reduce to one leader per node, all-reduce across the ``k`` leaders, broadcast
      in each node (Horovod; ``hierarchical.py``), cost ``2 ceil(log2 L)(alpha_i + N beta_i)`` inside
      nodes of ``L`` ranks plus a flat all-reduce over ``k`` ranks across nodes; for groups that span
      nodes (``topology.py``; ``MINIDIST_RANKS_PER_NODE`` simulates nodes). On one node, or with one
      rank per node, it runs the flat algorithm ``"auto"`` would.
    * ``"mpi"``: ``MPI_Allreduce`` with ``MPI_IN_PLACE``.
    * ``"auto"``: one of the hand-written ones, by ``N`` and ``n`` (and for a group that spans nodes,
      by its layout), from the tables in ``tuning.py``.

    The hand-written algorithms leave bit-identical results on all ranks (each element is combined in
    one place and then copied, or both partners of an exchange combine the same two values).

    Raises ``ValueError`` for an unknown ``op`` or ``algorithm`` (listing the valid ones) and for a
    non-contiguous or read-only ``a``; ``TypeError`` for a non-array, a dtype that cannot be reduced,
    ``"avg"`` on integers, or ``"mpi"`` with a dtype this MPI cannot reduce (float16 on some builds);
    ``DistributedError`` if a hand-written algorithm receives a message of unexpected length (the
    ranks' ``a`` differ).
    """
    check_algorithm("all_reduce", algorithm)
    check_array(a, writable=True)
    check_op(op, a.dtype)
    group = group_or_world(group)
    if group.size == 1:
        return a  # nothing to combine; "avg" would divide by 1
    run = _ALL_REDUCE[resolve("all_reduce", algorithm, a.nbytes, group)]
    if isinstance(a, np.ndarray):  # the common case, taken without host_view's ~1 us: small calls count
        # reshape: a view, not a copy, as a is C-contiguous; skipped (~0.3 us) when a is already flat
        run(group, a if a.ndim == 1 else a.reshape(-1), op)
        return a
    with host_view(a, copy_in=True, copy_out=True) as host:
        run(group, host.reshape(-1), op)
    return a


@collective("reduce_scatter")
def reduce_scatter(
    a: Any, op: str = "sum", group: Communicator | None = None, algorithm: str = "auto"
) -> Any:
    """Reduce ``a`` over all ranks and return only this rank's chunk of the result, as a new 1-D array.

    ``a``: any shape, ``N = a.size`` elements, same shape and dtype on every rank; it is *not* modified.
    The result is chunk ``rank`` of ``numpy.array_split(reduced.reshape(-1), n)``: ``N // n`` or
    ``N // n + 1`` elements (possibly 0), on the same device as ``a``. Concatenating every rank's result
    in rank order gives ``all_reduce(a)`` flattened.

    ``algorithm``, for ``N = a.nbytes``: ``"ring"``, cost ``(n-1) alpha + (n-1)/n N beta + (n-1)/n N
    gamma``; it reads ``a`` in place and passes partial results in two chunk-sized buffers (``ring.py``,
    :func:`~minidist.distributed.algorithms.ring.ring_reduce_scatter_chunk`). ``"recursive_halving"``: the
    same bytes in
    ``log2 n`` steps, plus ``2 alpha + (1 + 1/n) N beta + N gamma`` when ``n`` is not a power of two
    (``recursive_halving.py``). ``"mpi"``: ``MPI_Reduce_scatter``. ``"auto"``: from ``tuning.py``.
    Raises like :func:`all_reduce` (``a`` need not be writable).
    """
    check_algorithm("reduce_scatter", algorithm)
    check_array(a)
    check_op(op, a.dtype)
    group = group_or_world(group)
    if group.size == 1:
        return a.reshape(-1).copy()
    algorithm = resolve("reduce_scatter", algorithm, a.nbytes, group)
    bounds = chunk_bounds(a.size, group.size)
    with host_view(a, copy_in=True) as host:
        if algorithm == "ring":
            mine = ring_reduce_scatter_chunk(group, host.reshape(-1), op, bounds)
        elif algorithm == "recursive_halving":
            mine = recursive_halving_reduce_scatter(group, host.reshape(-1), op, bounds)
        else:
            mine = mpi_reduce_scatter(group, host.reshape(-1), op, [hi - lo for lo, hi in bounds])
    return like(mine, a)


@collective("all_gather", same_shape=False)
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
    check_algorithm("all_gather", algorithm)
    check_array(chunk, "chunk")
    group = group_or_world(group)
    if group.size == 1:
        return chunk.reshape(-1).copy()
    # Only one hand-written algorithm so far: "auto" needs no sizes (all ranks must pick alike, and
    # the total size is only known after the lengths are gathered).
    algorithm = resolve("all_gather", algorithm, 0, group)
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


@collective("broadcast")
def broadcast(a: Any, src: int = 0, group: Communicator | None = None, algorithm: str = "auto") -> Any:
    """Copy ``a`` from rank ``src`` of ``group`` into ``a`` on every other rank, in place; return ``a``.

    ``a``: any shape, C-contiguous, same shape and dtype on every rank (``a.nbytes`` bytes are sent to
    each rank). ``algorithm``, for ``N = a.nbytes``: ``"tree"``, a binomial tree, cost
    ``ceil(log2 n)(alpha + N beta)`` (``tree_broadcast.py``), for short messages; ``"scatter_allgather"``,
    binomial scatter of ``n`` chunks then ring all-gather, cost
    ``(ceil(log2 n) + n - 1) alpha + 2(n-1)/n N beta`` (``scatter_allgather.py``), for long messages;
    ``"mpi"``: ``MPI_Bcast``; ``"auto"``: by ``N`` and ``n`` from ``tuning.py``.

    Raises ``ValueError`` for an unknown ``algorithm``, a ``src`` outside the group, or a
    non-contiguous/read-only ``a``; ``TypeError`` for a non-array or a non-int ``src``;
    ``DistributedError`` (hand-written algorithms) if a rank's ``a`` has a different length than the
    root's.
    """
    check_algorithm("broadcast", algorithm)
    check_array(a, writable=True)
    group = group_or_world(group)
    check_rank(src, group.size, "src")
    if group.size == 1:
        return a
    run = _BROADCAST[resolve("broadcast", algorithm, a.nbytes, group)]
    is_root = group.rank == src
    # The root only sends (needs its data on the host, changes nothing: scatter_allgather writes the same
    # values back); the others only receive.
    with host_view(a, copy_in=is_root, copy_out=not is_root) as host:
        run(group, host.reshape(-1), src)
    return a


@collective("reduce")
def reduce(
    a: Any, dst: int = 0, op: str = "sum", group: Communicator | None = None, algorithm: str = "auto"
) -> Any:
    """Reduce ``a`` element-wise over all ranks of ``group`` into ``a`` on rank ``dst``; return ``a``.

    ``a``: a C-contiguous NumPy or CuPy array of any shape (``N = a.nbytes`` bytes), with the same shape
    and dtype on every rank. Afterwards ``a`` on rank ``dst`` holds ``op`` applied over the ranks' arrays
    (``"avg"``: divided by the group size); on every other rank ``a`` is left unchanged (the algorithms
    accumulate in scratch buffers, never in a non-root's ``a``). The returned object *is* ``a``.

    ``algorithm``: ``"tree"``, a binomial tree, cost ``ceil(log2 n)(alpha + N beta + N gamma)``
    (``tree_reduce.py``); ``"mpi"``: ``MPI_Reduce`` (``MPI_IN_PLACE`` on the root); ``"auto"``: from
    ``tuning.py``.

    Raises ``ValueError`` for an unknown ``op`` or ``algorithm``, a ``dst`` outside the group, or a
    non-contiguous/read-only ``a``; ``TypeError`` for a non-array, a non-int ``dst``, a dtype that cannot
    be reduced, ``"avg"`` on integers, or ``"mpi"`` with a dtype this MPI cannot reduce;
    ``DistributedError`` (tree) if a rank's ``a`` has a different length than its tree neighbours'.
    """
    check_algorithm("reduce", algorithm)
    check_array(a, writable=True)
    check_op(op, a.dtype)
    group = group_or_world(group)
    check_rank(dst, group.size, "dst")
    if group.size == 1:
        return a
    algorithm = resolve("reduce", algorithm, a.nbytes, group)
    is_root = group.rank == dst
    # Every rank's data is read; only the root's array is written.
    with host_view(a, copy_in=True, copy_out=is_root) as host:
        flat = host.reshape(-1)
        if algorithm == "tree":
            tree_reduce(group, flat, op, dst)
        else:
            mpi_reduce(group, flat, op, dst)
    return a


@collective("barrier")
def barrier(group: Communicator | None = None) -> None:
    """Block until every rank of ``group`` (default: the world) has called ``barrier`` (``MPI_Barrier``).

    Raises ``CollectiveMismatchError`` (``MINIDIST_DEBUG``) or ``CollectiveTimeoutError``
    (``MINIDIST_TIMEOUT``) like every other collective.
    """
    group_or_world(group).barrier()

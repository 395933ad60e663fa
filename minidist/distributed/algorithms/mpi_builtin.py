"""The reference: each collective done by MPI's own built-in implementation (``algorithm="mpi"``).

MPI libraries pick among many tuned algorithms (rings, trees, recursive doubling, ...) by message size
and group size, so these calls are both the correctness reference for our hand-written versions and the
speed to beat. Like the ring functions, they take host (NumPy) arrays; ``collectives.py`` does the
staging and the argument checks.

MPI's reductions must know the arithmetic type of the data, so :func:`mpi_all_reduce`,
:func:`mpi_reduce` and :func:`mpi_reduce_scatter` raise ``TypeError`` for a dtype that this MPI has no
datatype for (for example ``float16`` on an MPI without that extension). Moving data needs no
arithmetic, so all-gather and broadcast work for every dtype.
"""

from __future__ import annotations

from itertools import accumulate

import numpy as np
from mpi4py import MPI

from minidist.distributed.comm import Communicator
from minidist.distributed.reduce_ops import finish, mpi_op
from minidist.distributed.staging import mpi_buffer, mpi_datatype, mpi_reduction_datatype


def _reduction_type(dtype: np.dtype) -> MPI.Datatype:
    datatype = mpi_reduction_datatype(dtype)
    if datatype is None:
        raise TypeError(
            f"this MPI library has no datatype for {dtype}, so algorithm='mpi' cannot reduce it; use "
            "algorithm='ring' (which reduces with NumPy) or convert the array to float32"
        )
    return datatype


def mpi_all_reduce(group: Communicator, flat: np.ndarray, op: str) -> None:
    """``MPI_Allreduce`` in place (``MPI_IN_PLACE``) on the 1-D host array ``flat``."""
    group.mpi.Allreduce(MPI.IN_PLACE, [flat, _reduction_type(flat.dtype)], op=mpi_op(op))
    finish(op, flat, group.size)


def mpi_reduce(group: Communicator, flat: np.ndarray, op: str, dst: int) -> None:
    """``MPI_Reduce`` to rank ``dst``, in place there (``MPI_IN_PLACE``); other ranks only read ``flat``."""
    datatype = _reduction_type(flat.dtype)
    if group.rank == dst:
        group.mpi.Reduce(MPI.IN_PLACE, [flat, datatype], op=mpi_op(op), root=dst)
        finish(op, flat, group.size)
    else:
        group.mpi.Reduce([flat, datatype], None, op=mpi_op(op), root=dst)


def mpi_reduce_scatter(group: Communicator, flat: np.ndarray, op: str, counts: list[int]) -> np.ndarray:
    """``MPI_Reduce_scatter``: return a new array with this rank's ``counts[rank]`` reduced elements.

    ``counts`` are the chunk lengths in rank order (they must sum to ``flat.size``); ``flat`` is not
    modified.
    """
    datatype = _reduction_type(flat.dtype)
    out = np.empty(counts[group.rank], dtype=flat.dtype)
    group.mpi.Reduce_scatter([flat, datatype], [out, datatype], recvcounts=counts, op=mpi_op(op))
    finish(op, out, group.size)
    return out


def mpi_all_gather(group: Communicator, chunk: np.ndarray, counts: list[int]) -> np.ndarray:
    """``MPI_Allgatherv``: return the 1-D concatenation of every rank's ``chunk``, in rank order.

    ``counts[i]`` is the length of rank ``i``'s chunk (the "v" in Allgatherv: lengths may differ).
    """
    datatype = mpi_datatype(chunk.dtype)
    displacements = [0, *accumulate(counts[:-1])]  # where each rank's chunk starts in the output
    out = np.empty(sum(counts), dtype=chunk.dtype)
    group.mpi.Allgatherv([chunk, datatype], [out, counts, displacements, datatype])
    return out


def mpi_broadcast(group: Communicator, flat: np.ndarray, src: int) -> None:
    """``MPI_Bcast`` in place from rank ``src``."""
    group.mpi.Bcast(mpi_buffer(flat), root=src)


def mpi_all_gather_counts(group: Communicator, count: int) -> list[int]:
    """Every rank's ``count`` in rank order, with ``MPI_Allgather`` of one int64 per rank."""
    counts = np.empty(group.size, dtype=np.int64)
    group.mpi.Allgather([np.array([count], dtype=np.int64), MPI.INT64_T], [counts, MPI.INT64_T])
    return counts.tolist()

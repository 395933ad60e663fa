"""Non-blocking point-to-point messages: start several sends and receives, then wait for all of them.

``Communicator.send``/``recv``/``sendrecv`` (``comm.py``) each finish before they return, so one call
moves at most two messages at once. Some algorithms need more in flight together: the interleaved
pipeline schedule ends a step with up to four messages, to *and* from both neighbours (Narayanan et al.
2021, §2.2.2; Megatron-LM's ``batch_isend_irecv``). Started one after the other with blocking calls, they
could deadlock (two ranks each waiting in a send for the other's receive); started together, every one
progresses independently, as the two halves of ``MPI_Sendrecv`` do::

    requests = [isend(group, out, dst=1, tag=5), irecv(group, into, src=1, tag=6)]
    wait_all(group, requests)          # now ``into`` holds the message, and ``out`` may be reused

or, in one call, ``batch_send_recv(group, sends=[(out, 1, 5)], recvs=[(into, 1, 6)])``.

These work on host NumPy arrays only (stage GPU arrays through host memory first, as ``staging.py``
does): a non-blocking call returns while MPI still reads or writes the array, so the caller must keep it
alive and untouched until :func:`wait_all` returns; the request object holds a reference to it.

Like ``recv``, :func:`wait_all` checks that every receive got exactly the buffer's length
(``DistributedError`` otherwise) and, with ``MINIDIST_TIMEOUT`` set, gives up with
``CollectiveTimeoutError`` when a message does not arrive in time (``watchdog.py``; a wait outside a
collective gets ``timeout`` seconds). The messages use the communicator's ordinary message space, the
one of ``send``/``recv``, never that of the collectives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from minidist.distributed.checks import check_array, check_rank, check_tag
from minidist.distributed.comm import Communicator, from_peer, to_peer
from minidist.distributed.errors import DistributedError


class P2PRequest:
    """A started send or receive of ``array`` to / from rank ``peer`` with ``tag``; finish it with
    :func:`wait_all`. ``done`` is True once it has been waited for."""

    __slots__ = ("array", "done", "is_recv", "mpi", "peer", "status", "tag")

    def __init__(self, mpi_request: MPI.Request, array: np.ndarray, peer: int, tag: int, is_recv: bool):
        self.mpi, self.array, self.peer, self.tag, self.is_recv = mpi_request, array, peer, tag, is_recv
        self.status = MPI.Status()
        self.done = False

    def __repr__(self) -> str:
        what = f"recv from {self.peer}" if self.is_recv else f"send to {self.peer}"
        return f"P2PRequest({what}, tag {self.tag}, {self.array.size} x {self.array.dtype}, done={self.done})"

    def describe(self) -> str:
        """What waiting for this request means, for a timeout message."""
        return from_peer(self.peer, self.tag) if self.is_recv else to_peer(self.peer, self.tag)


def _check(group: Communicator, a: Any, peer: int, tag: int, name: str, writable: bool) -> None:
    if not isinstance(a, np.ndarray):
        raise TypeError(
            f"isend/irecv take host NumPy arrays, got {type(a).__name__}; copy a GPU array to the host "
            "first (minidist.backend.to_numpy) and back after the receive"
        )
    check_array(a, writable=writable)
    check_rank(peer, group.size, name)
    check_tag(tag)


def isend(group: Communicator, a: np.ndarray, dst: int, tag: int = 0) -> P2PRequest:
    """Start sending ``a`` (C-contiguous NumPy array, any shape) to rank ``dst`` of ``group``; return the
    request. ``a`` must stay unchanged until :func:`wait_all` returns. ``dst`` may be this rank (the
    matching :func:`irecv` must then be started before waiting). Raises ``TypeError``/``ValueError`` for a
    non-NumPy or non-contiguous ``a``, a bad ``dst`` or ``tag``."""
    _check(group, a, dst, tag, "dst", writable=False)
    return P2PRequest(group.host_isend(a, dst, tag), a, dst, tag, is_recv=False)


def irecv(group: Communicator, a: np.ndarray, src: int, tag: int = 0) -> P2PRequest:
    """Start receiving a message from rank ``src`` of ``group`` into the preallocated array ``a``; return
    the request. ``a`` holds the message only after :func:`wait_all`, which checks that it had exactly
    ``a.size`` elements. Raises like :func:`isend` (and ``ValueError`` for a read-only ``a``)."""
    _check(group, a, src, tag, "src", writable=True)
    return P2PRequest(group.host_irecv(a, src, tag), a, src, tag, is_recv=True)


def wait_all(group: Communicator, requests: Sequence[P2PRequest]) -> None:
    """Wait until every request of ``group`` has finished; requests already ``done`` are skipped.

    Raises ``DistributedError`` if a receive got a message of another length than its buffer (naming the
    sender, the tag and both lengths), and, with ``MINIDIST_TIMEOUT`` set, ``CollectiveTimeoutError``
    listing what did not arrive in time (the unfinished requests are then cancelled; do not use the
    group again).
    """
    pending = [r for r in requests if not r.done]
    if not pending:
        return
    try:
        group.wait_all(pending)  # MPI_Waitall (the safety net adds heartbeats and a deadline)
    except MPI.Exception as error:
        _explain_truncation(group, error, [r for r in pending if r.is_recv])
        raise
    for r in pending:
        r.done = True
        if r.is_recv:  # a shorter message would leave a stale tail in the buffer
            group._check_received_length(r.status, r.array, r.peer, r.tag)


def _explain_truncation(group: Communicator, error: Any, recvs: list[P2PRequest]) -> None:
    """Raise ``DistributedError`` if ``error`` means a message was longer than its receive buffer."""
    # MPI_Waitall reports each request's error in its status. The watchdog's MPI_Test raises the error
    # of the one request it tested and leaves the status alone, so then we cannot tell which receive it
    # was (unless there is only one) and name all of them.
    flagged = [r for r in recvs if r.status.Get_error() not in (MPI.SUCCESS, MPI.ERR_PENDING)]
    for r in flagged:
        group._raise_if_truncated(MPI.Exception(r.status.Get_error()), r.array, r.peer, r.tag)
    if error.Get_error_class() == MPI.ERR_TRUNCATE and recvs:
        if len(recvs) == 1:
            group._raise_if_truncated(error, recvs[0].array, recvs[0].peer, recvs[0].tag)
        candidates = "; ".join(f"{r.describe()} into {r.array.size} x {r.array.dtype}" for r in recvs)
        raise DistributedError(
            f"rank {group.rank}: a message was longer than its receive buffer, one of: {candidates}; "
            "sender and receiver must use the same length and dtype"
        ) from error


def batch_send_recv(
    group: Communicator,
    sends: Sequence[tuple[np.ndarray, int, int]] = (),
    recvs: Sequence[tuple[np.ndarray, int, int]] = (),
) -> None:
    """Start every ``(array, dst, tag)`` of ``sends`` and ``(buffer, src, tag)`` of ``recvs`` together,
    then wait for all (:func:`isend`, :func:`irecv`, :func:`wait_all`; raises as they do)."""
    requests = [irecv(group, a, src, tag) for a, src, tag in recvs]  # receives first: no unexpected copies
    requests += [isend(group, a, dst, tag) for a, dst, tag in sends]
    wait_all(group, requests)

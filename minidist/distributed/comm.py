"""Communicators and point-to-point messages: the ground floor of ``minidist.distributed``.

A *communicator* is a group of processes, each with a *rank* ``0..size-1`` inside the group, plus a
private channel so that messages of one group never mix with another's. MPI starts every process with
``COMM_WORLD`` (all processes, ``world.py``); :meth:`Communicator.split` carves sub-groups out of it,
e.g. the data-parallel and tensor-parallel groups of a 2-D mesh.

On top of that sit two primitives, and every hand-written collective in this package is built only
from them:

* ``send(a, dst)`` / ``recv(a, src)``: move one array from one rank to another. ``recv`` writes into a
  preallocated array, as MPI does, and checks the message really has ``a.size`` elements.
* ``sendrecv(x, dst, y, src)``: send ``x`` to ``dst`` *and* receive ``y`` from ``src`` at the same time,
  the step of a ring algorithm.

Each is one MPI call (``MPI_Send``, ``MPI_Recv``, ``MPI_Sendrecv``), and every receive checks the length
of the message, always. What keeps a job from hanging when something goes wrong (every message of a
collective tagged with its call, deadlines, a watchdog thread that notices a rank that left) is not
here: ``minidist.distributed`` installs it around these same calls (``seam.py``, ``safety/``).

Importing this module imports ``mpi4py.MPI``, which initialises MPI (``MPI_Init``). A process started
without ``mpiexec`` becomes a world of size 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from minidist.distributed.checks import check_exchange, check_message
from minidist.distributed.errors import DistributedError
from minidist.distributed.staging import host_view, mpi_datatype


class Communicator:
    """A group of ranks that can exchange arrays: a thin wrapper over an mpi4py communicator.

    Attributes: ``rank`` (this process's rank in the group), ``size`` (number of ranks), ``mpi`` (the raw
    ``mpi4py.MPI.Comm``, for calling MPI directly), ``collective_channel`` (see below), ``name`` (a label
    for traces and messages: ``"world"``, or what ``split`` was given, e.g. ``ProcessMesh``'s ``"tp"``;
    ``""`` if none) and ``bytes_sent`` (bytes this rank has sent over this communicator's own message
    space by minidist's point-to-point calls; a collective's messages count on its
    ``collective_channel``, MPI's built-in collectives (``algorithm="mpi"``) not at all). The safety
    net's subclass (``safety/watched.py``) adds ``calls``, which numbers the group's collectives; build
    groups as that, ``minidist.distributed.Communicator(comm)``: this class, built by hand, is the bare
    mechanism (no deadline on its messages), and the collectives refuse it with a ``TypeError``.

    Creating a Communicator is *collective*: every rank of ``mpi_comm`` must create it at the same point,
    because it duplicates the communicator (``MPI_Comm_dup``).

    Why the duplicate? Our collectives are written with ordinary send/recv. If they ran on ``mpi``, a
    message a user sent with ``send`` and has not received yet could be matched by a receive inside
    ``all_reduce`` (same source, same tag), and both would get the wrong data. MPI's own collectives avoid
    this with a hidden context; we do it in the open: hand-written collectives talk only over
    ``collective_channel``, a communicator with the same ranks but its own message space.
    """

    # The class of the communicators this one makes: its channel, ``split``'s and ``dup``'s results.
    # Each class of this package names itself (below the class); a user's subclass, whose constructor
    # may take other arguments, makes groups of the package's class it derives from.
    group_class: type[Communicator]

    def __init__(self, mpi_comm: MPI.Comm, *, name: str = "", _is_channel: bool = False) -> None:
        self.mpi = mpi_comm
        self.rank: int = mpi_comm.Get_rank()
        self.size: int = mpi_comm.Get_size()
        self.name = name
        # Counted per message (one integer addition): what a trace reports as the bytes a call sent
        # (safety/traffic.py), what DDP's comm_stats reports, the quantity the cost formulas count.
        self.bytes_sent = 0
        self.algorithm: str | None = None  # on a channel: the algorithm its last collective ran (trace)
        self._scratch = np.empty(0, dtype=np.uint8)  # see scratch()
        self._scratch_request: tuple = (0, None)  # (count, dtype) of the last scratch() call ...
        self._scratch_view = self._scratch  # ... and the view it returned
        self._node_layout = None  # topology.node_layout's cache: which of these ranks share a node
        # tuning.resolve's answers on this group: (collective, algorithm, bytes) -> algorithm run
        self.resolved: dict[tuple, str] = {}
        # A channel needs no channel of its own; a group's channel is of the group's kind.
        self.collective_channel = (
            self if _is_channel else self.group_class(mpi_comm.Dup(), name=name, _is_channel=True)
        )

    def __repr__(self) -> str:
        named = f", name={self.name!r}" if self.name else ""
        return f"Communicator(rank={self.rank}, size={self.size}{named})"

    def split(self, color: int | None, key: int | None = None, name: str = "") -> Communicator | None:
        """Split into sub-groups: ranks passing the same ``color`` form one new Communicator.

        Collective over this communicator. ``key`` orders the ranks inside the new group (default: this
        rank, so the relative order is kept). ``color=None`` means "join no group" and returns None.
        ``name`` labels the new group in traces (``"tp"``). The new group is a ``group_class``.
        Raises ``ValueError`` for a negative color (MPI reserves those).
        """
        if color is not None and color < 0:
            raise ValueError(f"color must be >= 0 or None (no group), got {color}")
        new = self.mpi.Split(MPI.UNDEFINED if color is None else color, self.rank if key is None else key)
        if new == MPI.COMM_NULL:
            return None
        return self.group_class(new, name=name)

    def dup(self, name: str = "") -> Communicator:
        """A new communicator of the same ranks with a message space of its own (``MPI_Comm_dup``).

        Collective: every rank of the group must call it at the same point. The copy is a
        ``group_class``, so it is watched as its original is (``seam.py``). ``name`` labels it.
        """
        return self.group_class(self.mpi.Dup(), name=name)

    def barrier(self) -> None:
        """Block until every rank of the group has called ``barrier`` (``MPI_Barrier``)."""
        self.mpi.Barrier()

    def send(self, a: Any, dst: int, tag: int = 0) -> None:
        """Send array ``a`` (any shape, ``a.nbytes`` bytes) to rank ``dst``; blocks until ``a`` is reusable.

        ``dst`` must post a matching ``recv`` with an array of the same size and dtype. Raises
        ``TypeError``/``ValueError`` for a non-array, non-contiguous ``a``, a bad ``dst`` or ``tag``, or
        ``dst`` equal to this rank (a blocking send to oneself can wait forever for a receive that this
        same process would only post afterwards).
        """
        check_message(self, a, dst, "dst", tag)
        with host_view(a, copy_in=True) as host:
            self.host_send(host, dst, tag)

    def recv(self, a: Any, src: int, tag: int = 0) -> Any:
        """Receive a message from rank ``src`` into the preallocated array ``a``; return ``a``.

        The message must hold exactly ``a.size`` elements of ``a.dtype``. Raises ``DistributedError``
        naming the sender and both lengths if it does not: a longer message would not fit, and a shorter
        one would leave a stale tail in ``a`` that nobody notices. (MPI carries no type information, so a
        different dtype is caught only when the byte count differs too.) Raises ``TypeError``/
        ``ValueError`` for bad arguments, as :meth:`send` does. With ``MINIDIST_TIMEOUT`` set, this and
        every other call here raises ``CollectiveTimeoutError`` if its peer does not answer in time.
        """
        check_message(self, a, src, "src", tag, writable=True)
        with host_view(a, copy_in=False, copy_out=True) as host:
            self.host_recv(host, src, tag)
        return a

    def sendrecv(
        self, send_a: Any, dst: int, recv_a: Any, src: int, sendtag: int = 0, recvtag: int = 0
    ) -> Any:
        """Send ``send_a`` to ``dst`` and, at the same time, receive from ``src`` into ``recv_a``.

        Returns ``recv_a``. ``dst`` and ``src`` may be equal, or this rank itself. Because the send does
        not have to finish before the receive starts, a ring of ranks that all call ``sendrecv`` at once
        cannot deadlock, unlike a ring of ranks that all call a blocking ``send`` first. Raises like
        :meth:`send` and :meth:`recv` (``DistributedError`` on a length mismatch).
        """
        check_exchange(self, send_a, dst, recv_a, src, sendtag, recvtag)
        with (
            host_view(send_a, copy_in=True) as out,
            host_view(recv_a, copy_in=False, copy_out=True) as into,
        ):
            self.host_sendrecv(out, dst, into, src, sendtag, recvtag)
        return recv_a

    # --- the fast path the hand-written collectives use ------------------------------------------------
    # The public send/recv/sendrecv above check every argument and stage GPU arrays; that costs ~4 us per
    # call, as much as a whole 4 KiB message between two ranks on one machine. A collective checks its
    # arguments and stages its array once, then sends many messages, so its steps call these three
    # methods instead. They skip the argument checks (the caller guarantees C-contiguous host NumPy
    # arrays and valid ranks) but never the length check of what they receive.

    def host_send(self, host: np.ndarray, dst: int, tag: int = 0) -> None:
        """:meth:`send` without argument checks: ``host`` must be a C-contiguous NumPy array."""
        self.bytes_sent += host.nbytes
        self.mpi.Send([host, mpi_datatype(host.dtype)], dest=dst, tag=tag)

    def host_recv(self, host: np.ndarray, src: int, tag: int = 0) -> None:
        """:meth:`recv` without argument checks; raises ``DistributedError`` unless exactly ``host.size``
        elements arrive."""
        status = MPI.Status()
        try:
            self.mpi.Recv([host, mpi_datatype(host.dtype)], source=src, tag=tag, status=status)
        except MPI.Exception as error:
            self._raise_if_truncated(error, host, src, tag)
            raise
        if status.Get_count(MPI.BYTE) != host.nbytes:  # compared here, not in a call: runs per message
            self._check_received_length(status, host, src, tag)  # raises

    def host_sendrecv(
        self, out: np.ndarray, dst: int, into: np.ndarray, src: int, sendtag: int = 0, recvtag: int = 0
    ) -> None:
        """:meth:`sendrecv` without argument checks, for host NumPy arrays; checks the received length."""
        # MPI_Sendrecv starts the send and the receive together, so a ring of ranks that all call it at
        # once cannot deadlock. The length is checked from the receive's status: Isend + Mprobe + Recv,
        # which looks at it before receiving, is ~45x slower with 8 ranks on 2 cores.
        # Every line here runs per message; a 4 KiB message takes ~4 us, so each lookup counts.
        status = MPI.Status()
        send_type = mpi_datatype(out.dtype)  # a collective's two buffers share a dtype: look it up once
        recv_type = send_type if into.dtype is out.dtype else mpi_datatype(into.dtype)
        self.bytes_sent += out.nbytes
        try:
            self.mpi.Sendrecv(
                [out, send_type], dest=dst, sendtag=sendtag,
                recvbuf=[into, recv_type], source=src, recvtag=recvtag, status=status,
            )  # fmt: skip
        except MPI.Exception as error:
            self._raise_if_truncated(error, into, src, recvtag)
            raise
        if status.Get_count(MPI.BYTE) != into.nbytes:  # compared here, not in a call: runs per message
            self._check_received_length(status, into, src, recvtag)  # raises

    # --- non-blocking messages, for p2p_batch.py: start several, then wait for all ----------------------

    def host_isend(self, host: np.ndarray, dst: int, tag: int = 0) -> MPI.Request:
        """Start sending ``host`` (``MPI_Isend``); ``host`` must stay unchanged until the wait returns."""
        self.bytes_sent += host.nbytes
        return self.mpi.Isend([host, mpi_datatype(host.dtype)], dest=dst, tag=tag)

    def host_irecv(self, host: np.ndarray, src: int, tag: int = 0) -> MPI.Request:
        """Start receiving into ``host`` (``MPI_Irecv``); it holds the message once the wait returns."""
        return self.mpi.Irecv([host, mpi_datatype(host.dtype)], source=src, tag=tag)

    def wait_all(self, requests: Sequence[Any]) -> None:
        """Wait until every started request has finished (``MPI_Waitall``).

        ``requests``: objects with ``mpi`` (the ``MPI.Request``) and ``status`` (the ``MPI.Status`` it
        fills), ``p2p_batch.P2PRequest``. An MPI error of a request propagates as ``MPI.Exception``.
        """
        MPI.Request.Waitall([r.mpi for r in requests], [r.status for r in requests])

    def scratch(self, count: int, dtype: Any) -> np.ndarray:
        """A host buffer of ``count`` elements of ``dtype`` for a collective's intermediate results.

        The same memory is handed out again by the next call (it grows to the largest request and is
        kept), so use the buffer only until the collective returns, and never return it to a caller.
        Why keep it: a fresh 32 MiB ``np.empty`` per call is memory the kernel must map and zero page by
        page at first touch, which cost 30 % of a 64 MiB ring all-reduce's time on our machine. (One
        thread per communicator, as MPI's message order needs anyway; DDP's thread has its own.)
        """
        if (count, dtype) == self._scratch_request:  # the same as last call: hand out the same view
            return self._scratch_view
        nbytes = count * np.dtype(dtype).itemsize
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(nbytes, dtype=np.uint8)
        # Slicing and viewing cost ~1 us, a fifth of a whole 4 KiB all-reduce between two ranks; a
        # training loop asks for the same size every step, so the last view is kept and handed out again.
        self._scratch_request = (count, dtype)
        self._scratch_view = self._scratch[:nbytes].view(dtype)
        return self._scratch_view

    def _check_received_length(self, status: Any, host: np.ndarray, src: int, tag: int) -> None:
        """A message shorter than the buffer leaves a stale tail: MPI allows it, we do not."""
        nbytes = status.Get_count(MPI.BYTE)
        if nbytes != host.nbytes:
            raise DistributedError(
                f"rank {self.rank} expected {host.size} elements of {host.dtype} ({host.nbytes} bytes) from "
                f"rank {src} (tag {tag}), but rank {src} sent {nbytes} bytes "
                f"(= {nbytes / host.dtype.itemsize:g} elements of {host.dtype}); sender and receiver must "
                "use the same length and dtype"
            )

    def _raise_if_truncated(self, error: Any, host: np.ndarray, src: int, tag: int) -> None:
        """A message longer than the buffer makes MPI fail with MPI_ERR_TRUNCATE: say what happened."""
        if error.Get_error_class() == MPI.ERR_TRUNCATE:
            raise DistributedError(
                f"rank {self.rank} expected {host.size} elements of {host.dtype} ({host.nbytes} bytes) from "
                f"rank {src} (tag {tag}), but rank {src} sent a longer message; sender and receiver must "
                "use the same length and dtype"
            ) from error


Communicator.group_class = Communicator


def to_peer(dst: int, tag: int) -> str:
    """What a send waits for, in words (for a timeout message)."""
    return f"rank {dst} to receive this rank's message (tag {tag})"


def from_peer(src: int, tag: int) -> str:
    """What a receive waits for, in words (for a timeout message)."""
    return f"a message from rank {src} (tag {tag})"

"""``WatchedCommunicator``: the same primitives as ``comm.py``'s, with what keeps a job from hanging silently.

``minidist.distributed`` builds every communicator as this subclass (``seam.py``): the world at
``init()`` and every group split or duplicated from it. It changes no result; around each primitive:

* **tags** (``tags.py``): on a channel, every message carries the running collective's number and
  identity (``tag_base``, set by ``liveness.enter``); a receive of a collective takes its peer's next
  message whatever its tag and raises ``CollectiveMismatchError`` if it belongs to another call;
* **deadlines** (``watchdog.py``, ``MINIDIST_TIMEOUT``): a blocking call becomes its non-blocking twin
  plus a wait that raises ``CollectiveTimeoutError`` when the deadline passes;
* **liveness marks** (``liveness.py``): whom this rank waits for (``peer``; ``p2p_wait`` and
  ``p2p_kind`` on the channel during a send or receive of the group's own), for the watchdog's messages
  and heartbeats; a channel is watched from its creation, and one that Python collects tells its peers
  this rank left the group;
* **trace spans** of the user's own messages (``traffic.py``, ``trace.enable(messages=True)``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from mpi4py import MPI

from minidist.distributed.checks import check_exchange, check_message
from minidist.distributed.comm import Communicator, from_peer, to_peer
from minidist.distributed.errors import CollectiveMismatchError
from minidist.distributed.safety import leaving, liveness
from minidist.distributed.safety.traffic import message_span
from minidist.distributed.safety.watchdog import CallTracker
from minidist.distributed.staging import host_view, mpi_datatype


class WatchedCommunicator(Communicator):
    """A :class:`~minidist.distributed.comm.Communicator` whose calls are tagged, timed and watched.

    Adds ``calls`` (a :class:`~minidist.distributed.safety.watchdog.CallTracker`, shared with the channel)
    and ``tag_base`` (added to every message's tag: 0 on a user's communicator, on a channel the running
    collective's). Collective to create (with ``MINIDIST_TIMEOUT`` set, the tracker is an RMA window).
    """

    def __init__(self, mpi_comm: MPI.Comm, *, name: str = "", _is_channel: bool = False) -> None:
        self.tag_base = 0
        super().__init__(mpi_comm, name=name, _is_channel=_is_channel)
        if _is_channel:
            self.calls = CallTracker(mpi_comm)
            liveness.watch(self)
        else:
            self.calls = self.collective_channel.calls

    def __del__(self) -> None:
        # A channel collected before exit: its peers must learn that this rank left the group
        # (leaving.announce_drop); a user's communicator has nothing to announce.
        if getattr(self, "collective_channel", None) is self:
            leaving.announce_drop(self)

    @contextmanager
    def _waiting_for(self, kind: str, *peers: int) -> Iterator[None]:
        """Heartbeats for these peers while a ``kind`` (``waits.KINDS``) of the group's own waits."""
        channel = self.collective_channel
        channel.p2p_kind, channel.p2p_wait = kind, peers
        try:
            yield
        finally:
            channel.p2p_wait = None

    def barrier(self) -> None:
        if not self.calls.timed():
            super().barrier()
        else:
            self.calls.wait([self.mpi.Ibarrier()], ["every rank of the group to enter barrier"])

    # send and sendrecv check their arguments before the span opens: a rejected call sent nothing.

    def send(self, a: Any, dst: int, tag: int = 0) -> None:
        check_message(self, a, dst, "dst", tag)
        with self._waiting_for("send", dst), host_view(a, copy_in=True) as host:
            with message_span(self, "send", host, dst):
                self.host_send(host, dst, tag)

    def recv(self, a: Any, src: int, tag: int = 0) -> Any:
        with self._waiting_for("recv", src):
            return super().recv(a, src, tag)

    def sendrecv(
        self, send_a: Any, dst: int, recv_a: Any, src: int, sendtag: int = 0, recvtag: int = 0
    ) -> Any:
        check_exchange(self, send_a, dst, recv_a, src, sendtag, recvtag)
        with (
            self._waiting_for("sendrecv", dst, src),
            host_view(send_a, copy_in=True) as out,
            host_view(recv_a, copy_in=False, copy_out=True) as into,
            message_span(self, "sendrecv", out, dst),
        ):
            self.host_sendrecv(out, dst, into, src, sendtag, recvtag)
        return recv_a

    # The fast path: the running collective's tag always; the non-blocking twin and a deadline only with
    # MINIDIST_TIMEOUT. Every line runs per message (Communicator.host_send(self, ...) costs less than
    # super().host_send(...)). In a collective a receive takes its peer's next message of *any* tag (MPI
    # keeps one sender's messages in order: in step, this call's); one of another call raises here at
    # once, not at the watchdog's look. Comparing the status's tag costs nothing measurable.

    def host_send(self, host: np.ndarray, dst: int, tag: int = 0) -> None:
        tag += self.tag_base
        if not self.calls.timed():
            Communicator.host_send(self, host, dst, tag)
            return
        self.bytes_sent += host.nbytes
        sending = self.mpi.Isend([host, mpi_datatype(host.dtype)], dest=dst, tag=tag)
        self.calls.wait([sending], [to_peer(dst, tag)])

    def host_recv(self, host: np.ndarray, src: int, tag: int = 0) -> None:
        tag += self.tag_base
        self.peer = src  # for the liveness watchdog's message, should this wait never end
        status, into = MPI.Status(), [host, mpi_datatype(host.dtype)]
        matching = MPI.ANY_TAG if self.tag_base else tag  # in a collective: any tag, see above
        try:
            if not self.calls.timed():
                self.mpi.Recv(into, src, matching, status)
            else:
                self.calls.wait([self.mpi.Irecv(into, src, matching)], [from_peer(src, tag)], [status])
        except MPI.Exception as error:
            self._check_received(status, host, src, tag, error)
            raise
        if status.Get_tag() != tag or status.Get_count(MPI.BYTE) != host.nbytes:  # runs per message
            self._check_received(status, host, src, tag)

    def host_sendrecv(
        self, out: np.ndarray, dst: int, into: np.ndarray, src: int, sendtag: int = 0, recvtag: int = 0
    ) -> None:
        sendtag, recvtag = sendtag + self.tag_base, recvtag + self.tag_base
        self.peer = src  # for the liveness watchdog's message, should this wait never end
        datatype, status = mpi_datatype(out.dtype), MPI.Status()  # (a collective's buffers share a dtype)
        sending = [out, datatype]
        receiving = [into, datatype if into.dtype is out.dtype else mpi_datatype(into.dtype)]
        matching = MPI.ANY_TAG if self.tag_base else recvtag
        self.bytes_sent += out.nbytes
        try:
            if not self.calls.timed():
                self.mpi.Sendrecv(sending, dst, sendtag, receiving, src, matching, status)
            else:  # the same two messages, started together, then awaited with a deadline
                requests = [self.mpi.Isend(sending, dst, sendtag), self.mpi.Irecv(receiving, src, matching)]
                waits = [to_peer(dst, sendtag), from_peer(src, recvtag)]
                self.calls.wait(requests, waits, [MPI.Status(), status])
        except MPI.Exception as error:
            self._check_received(status, into, src, recvtag, error)
            raise
        if status.Get_tag() != recvtag or status.Get_count(MPI.BYTE) != into.nbytes:
            self._check_received(status, into, src, recvtag)

    def _check_received(self, status: Any, host: np.ndarray, src: int, tag: int, error: Any = None) -> None:
        """Raise for a message of another call (``CollectiveMismatchError``: the watchdog's words), then
        for one that did not fit (``error``) or was short (``comm.py``)."""
        if status.tag not in (tag, MPI.ANY_TAG):  # (ANY_TAG: an error before MPI filled the status)
            self.use_tags = False  # the watchdog stops judging this broken group: no second, stale report
            raise CollectiveMismatchError(liveness.wrong_call(self, src, status.tag)) from None
        if error is not None:
            self._raise_if_truncated(error, host, src, tag)
        else:
            self._check_received_length(status, host, src, tag)

    def host_isend(self, host: np.ndarray, dst: int, tag: int = 0) -> MPI.Request:
        with message_span(self, "isend", host, dst):  # a span only under trace.enable(messages=True)
            return super().host_isend(host, dst, tag)

    def wait_all(self, requests: Sequence[Any]) -> None:
        # Without a timeout this is one MPI_Waitall; with one, a test-and-sleep loop with a deadline.
        with self._waiting_for("wait", *sorted({r.peer for r in requests})):
            waiting_for = [r.describe() for r in requests]
            self.calls.wait([r.mpi for r in requests], waiting_for, [r.status for r in requests])


WatchedCommunicator.group_class = WatchedCommunicator  # its groups are watched (comm.py's group_class)

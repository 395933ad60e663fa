"""Passing a block round the ring: the only communication of ring attention, kept apart from its math.

The cp ranks of a group form a ring: rank r sends to ``r + 1`` and receives from ``r - 1`` (mod cp).
:class:`RingPass` moves one array one hop in the background: :meth:`RingPass.start` starts the send
and the receive (non-blocking, ``minidist.distributed.p2p_batch``) and returns at once, so the caller
can compute on the block it already holds; :meth:`RingPass.wait` returns the neighbour's array. That is
how ring attention hides communication behind compute (Liu et al. 2023, §3): the transfer of block
s + 1 runs while block s is being used. After cp hops every block has visited every rank.

Arrays travel through host memory (``backend.to_numpy``: a no-op on the CPU backend, a copy from the
GPU on CuPy); the received array is a new one, on the caller's device. With cp = 1 nothing is sent:
:meth:`RingPass.wait` returns the array given to :meth:`RingPass.start`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist import backend, trace
from minidist.distributed.comm import Communicator
from minidist.distributed.p2p_batch import irecv, isend, wait_all


class RingPass:
    """One hop round the ring of ``group`` at a time, for messages with tag ``tag``: ``start(a)`` sends
    ``a`` to the next rank and receives the previous rank's array; ``wait()`` returns it.

    ``start`` and ``wait`` alternate; the array given to ``start`` must stay unchanged until ``wait``
    returns (MPI may still be reading it). Every rank of the group must use the same order of starts
    and of ``tag``s. Raises as :func:`minidist.distributed.p2p_batch.wait_all` (``DistributedError``:
    the neighbour sent an array of another size).
    """

    def __init__(self, group: Communicator, tag: int, what: str = "ring block") -> None:
        self.group, self.tag, self.what = group, tag, what
        self.next, self.prev = (group.rank + 1) % group.size, (group.rank - 1) % group.size
        self.requests: list = []
        self.received: Any = None

    def start(self, a: Any) -> None:
        if self.group.size == 1:  # a ring of one: the block "arrives" from this rank itself
            self.received = a
            return
        self.on_gpu = backend.is_gpu_array(a)
        host = np.ascontiguousarray(backend.to_numpy(a))
        self.received = np.empty_like(host)
        # The receive first, so the neighbour's message lands in our buffer rather than being copied
        # into MPI's queue of unexpected messages.
        self.requests = [
            irecv(self.group, self.received, self.prev, self.tag),
            isend(self.group, host, self.next, self.tag),
        ]

    def wait(self) -> Any:
        if self.group.size == 1:
            return self.received
        with trace.span(lambda: f"wait {self.what}", trace.WAIT):
            wait_all(self.group, self.requests)
        received, self.received, self.requests = self.received, None, []
        if self.on_gpu:
            import cupy  # noqa: PLC0415  (only on the GPU backend)

            return cupy.asarray(received)
        return received

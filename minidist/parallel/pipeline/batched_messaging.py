"""The interleaved schedule's messaging: every message of a step started together, then awaited together.

A :class:`~minidist.parallel.pipeline.schedules.Batch` of the interleaved schedule (``interleaved.py``)
holds up to four messages, to and from both neighbours. Started one after the other with blocking
calls they could deadlock (two ranks each waiting in a send for the other's receive); started together
as non-blocking sends and receives and then awaited together (``minidist.distributed.p2p_batch``;
Megatron-LM's ``batch_isend_irecv``), every message progresses independently, as ``simulate`` assumes
when it proves the schedule deadlock-free.

Activations go from virtual stage g to g + 1, i.e. from rank s to rank ``(s + 1) % p`` (rank p-1's chunk
k feeds rank 0's chunk k+1), gradients come back the same way. With ``p = 2`` a rank's two neighbours
are the same rank, so every message's tag names the boundary it crosses and its microbatch
(``messages.batched_tag``).

**Shapes.** Chunks may have different output widths, so each boundary has its own activation shape and
its own header (``messages.py``). In a Batch, the header is started together with the activation and
every other message; a receiver that still lacks the shape waits for the header alone (its other
messages are already in flight, so nothing waits on it that would not in the simulation), then starts
the activation's receive.

Arrays travel through host memory (``backend.to_numpy``; a no-op on the CPU backend).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist import backend, trace
from minidist.distributed.p2p_batch import P2PRequest, irecv, isend, wait_all
from minidist.parallel.pipeline.messages import (
    ACT,
    GRAD,
    HEADER,
    batched_tag,
    decode_header,
    encode_header,
    header_buffer,
)
from minidist.parallel.pipeline.messaging import Executor
from minidist.parallel.pipeline.schedules import RECV_GRAD, SEND_ACT, SEND_GRAD, Instruction, Step, parts


class BatchedMessaging:
    """Moves each message step of a ``StageExecutor`` as one non-blocking batch (module docstring)."""

    def __init__(self, executor: Executor) -> None:
        self.ex, self.group = executor, executor.group
        self.boundaries = max(executor.last, 1)  # p v - 1 chunk boundaries (at least 1 for the tag)

    def start_step(self) -> None:
        """Forget the last step's activation shapes: the batch size may have changed."""
        self._shapes: dict[int, tuple[tuple[int, ...], Any]] = {}  # boundary -> activation shape, dtype
        self._headers_sent: set[int] = set()

    def _tag(self, boundary: int, microbatch: int, kind: int) -> int:
        return batched_tag(boundary, microbatch, kind, self.boundaries)

    def run(self, step: Step) -> None:
        """Start every message of ``step`` together, then wait for all (module docstring)."""
        requests: list[P2PRequest] = []
        arrivals: list[tuple[Instruction, P2PRequest]] = []
        unknown: list[tuple[Instruction, int, P2PRequest]] = []  # activations whose shape is still unknown
        for ins in parts(step):
            i, peer, b = ins.microbatch, self.ex.peer(ins), self.ex.boundary(ins)
            if ins.kind in (SEND_ACT, SEND_GRAD):
                host = backend.to_numpy(self.ex.outgoing(ins))
                if ins.kind == SEND_ACT and b not in self._headers_sent:
                    requests.append(isend(self.group, encode_header(host), peer, self._tag(b, 0, HEADER)))
                    self._headers_sent.add(b)
                kind = ACT if ins.kind == SEND_ACT else GRAD
                requests.append(isend(self.group, host, peer, self._tag(b, i, kind)))
            elif ins.kind == RECV_GRAD:
                buffer = np.empty(*self.ex.grad_buffer_spec(ins))
                arrivals.append((ins, irecv(self.group, buffer, peer, self._tag(b, i, GRAD))))
            elif b in self._shapes:
                buffer = np.empty(*self._shapes[b])
                arrivals.append((ins, irecv(self.group, buffer, peer, self._tag(b, i, ACT))))
            else:
                unknown.append((ins, b, irecv(self.group, header_buffer(), peer, self._tag(b, 0, HEADER))))
        with trace.span(step.__str__, trace.WAIT):
            if unknown:  # everything else is in flight; the activations' receives follow their headers
                wait_all(self.group, [request for _, _, request in unknown])
                for ins, b, request in unknown:
                    self._shapes[b] = decode_header(request.array)
                    buffer = np.empty(*self._shapes[b])
                    tag = self._tag(b, ins.microbatch, ACT)
                    arrivals.append((ins, irecv(self.group, buffer, self.ex.peer(ins), tag)))
            wait_all(self.group, requests + [request for _, request in arrivals])
        for ins, request in arrivals:  # host arrays: a device copy on a GPU, the same memory on the CPU
            self.ex.received(ins, backend.asarray(request.array))

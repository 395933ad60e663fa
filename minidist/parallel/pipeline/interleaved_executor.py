"""Run one rank's interleaved-1F1B program (``interleaved.py``) over non-blocking MPI messages.

Rank s holds ``v`` model chunks; chunk k is *virtual stage* ``g = k * p + s`` of the ``p * v`` pieces of
the model (Narayanan et al. 2021, §2.2.2). Activations go from virtual stage g to g + 1, i.e. from
rank s to rank ``(s + 1) % p`` (rank p-1's chunk k feeds rank 0's chunk k+1), gradients come back the
same way. What the executor does per instruction is what ``executor.py`` does per stage, keyed by
``(microbatch, chunk)`` instead of microbatch: the first virtual stage reads the data, the last applies
the loss (scaled by ``1/m``), every other one receives its input as a leaf that requires grad.

**Messages.** Each :class:`~minidist.parallel.pipeline.schedules.Batch` (up to four messages, to and
from both neighbours) is started as non-blocking sends and receives and then awaited together
(``minidist.distributed.p2p_batch``; Megatron-LM's ``batch_isend_irecv``), so every message progresses
independently, as ``simulate`` assumes when it proves the schedule deadlock-free. With ``p = 1`` all
chunks are on one rank and activations and gradients are handed over in memory.

**Tags.** With ``p = 2`` a rank's next and previous rank are the same, and a Batch can hold an
activation and a gradient for the same neighbour, of different chunks, at once. So every message's tag
names what it carries: with ``b`` the chunk boundary it crosses (between virtual stages ``b`` and
``b + 1``, ``0 <= b < p v - 1``), ``i`` the microbatch and ``kind`` 0 (activation), 1 (gradient) or 2
(shape header)::

    tag = TAG_BASE + 3 * (b + (p v - 1) * (i mod W)) + kind

with ``W`` the largest period that keeps tags within MPI's guaranteed 0..32767 (``W = 725`` for
``p v = 16``: larger than ``m`` in every ordinary configuration). Two messages in flight at the same time thus
never share a tag; two that do (microbatches ``i`` and ``i + W`` of one boundary) are sent and received
in the same order on both sides, and MPI does not let messages with the same source, tag and
communicator overtake each other, so they still pair up correctly. The tags start at ``TAG_BASE``
(100), above those of ``executor.py`` and ``inference.py``.

**Shapes.** Chunks may have different output widths, so each boundary has its own activation shape.
As in ``executor.py`` the sender knows it and the receiver does not: the first activation a step sends
across a boundary is preceded by a header (int64: dtype code, number of axes, axes), every later one of
that step has the same shape, and gradients have the shape of the activation the receiver produced
itself. In a Batch, the header is started together with the activation and every other message; a
receiver that still lacks the shape waits for the header alone (its other messages are already in
flight, so nothing waits on it that would not in the simulation), then starts the activation's receive.

**A failing loss** is handled as in ``executor.py``: the rank holding the last virtual stage keeps the
error in ``error``, stops computing losses and sends zero gradients, so every rank finishes the step.

Arrays travel through host memory (``backend.to_numpy``; a no-op on the CPU backend).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from minidist import backend, trace
from minidist.autograd import Tensor
from minidist.distributed import Communicator
from minidist.distributed.p2p_batch import P2PRequest, irecv, isend, wait_all
from minidist.distributed.validate import MAX_TAG
from minidist.nn.module import Module
from minidist.parallel.pipeline.executor import _MAX_DIMS, StepStats, _header, _parse_header, apply_loss
from minidist.parallel.pipeline.schedules import (
    BACKWARD,
    FORWARD,
    RECV_ACT,
    RECV_GRAD,
    SEND_ACT,
    SEND_GRAD,
    Instruction,
    Schedule,
    parts,
)

TAG_BASE = 100
ACT, GRAD, HEADER = 0, 1, 2


class InterleavedExecutor:
    """Runs rank ``group.rank``'s program of ``schedule`` (interleaved, ``v`` chunks) on ``chunks``.

    ``chunks[k]`` is virtual stage ``k * p + rank``; ``len(chunks)`` must be ``schedule.virtual_stages``.
    """

    def __init__(self, chunks: Sequence[Module], group: Communicator, schedule: Schedule) -> None:
        self.chunks, self.group, self.schedule = tuple(chunks), group, schedule
        self.stage, self.p = group.rank, group.size
        self.v, self.m = schedule.virtual_stages, schedule.num_microbatches
        if len(self.chunks) != self.v or schedule.num_stages != self.p:
            raise ValueError(
                f"rank {self.stage} holds {len(self.chunks)} chunks of a {self.p}-rank group, but the "
                f"schedule is for {schedule.num_stages} stages x {self.v} chunks"
            )
        self.program = schedule.stages[self.stage]
        self.last = self.p * self.v - 1  # the last virtual stage (on rank p - 1)
        self.boundaries = max(self.last, 1)
        self.period = max((MAX_TAG - TAG_BASE + 1) // (3 * self.boundaries), 1)  # W in the docstring
        self.stats = StepStats()
        self.error: Exception | None = None  # of the last step's loss_fn (rank p-1; executor.py)

    def run(self, inputs: Sequence[Any] | None, targets: Sequence[Any] | None, loss_fn: Callable) -> float:
        """Run one step; return the sum over microbatches of ``loss_i / m`` (rank p-1) or nan (others).

        ``inputs`` (rank 0) and ``targets`` (rank p-1) hold one entry per microbatch. If ``loss_fn``
        fails or does not return a one-element Tensor, the step still runs to the end and ``error``
        holds a ``TypeError``/``ValueError`` saying why (the returned loss is then nan).
        """
        self.error = None
        self._inputs: dict[tuple[int, int], Tensor] = {}  # (microbatch, chunk) -> received activation
        self._outputs: dict[tuple[int, int], Tensor] = {}  # -> output (the loss on the last chunk)
        self._grads: dict[tuple[int, int], Any] = {}  # -> gradient received for the output
        self._shapes: dict[int, tuple[tuple[int, ...], Any]] = {}  # boundary -> activation shape, dtype
        self._headers_sent: set[int] = set()
        self._data, self._targets, self._loss_fn = inputs, targets, loss_fn
        self.stats, self._live, self._loss = StepStats(), 0, 0.0
        for step in self.program:
            if isinstance(step, Instruction) and step.kind == FORWARD:
                self._forward(step.microbatch, step.chunk)
            elif isinstance(step, Instruction) and step.kind == BACKWARD:
                self._backward(step.microbatch, step.chunk)
            else:
                self._messages(step)
        self._data = self._targets = None  # drop references to the batch
        return self._loss if self.stage == self.p - 1 and self.error is None else float("nan")

    # -- computation -----------------------------------------------------------------------------
    def _forward(self, i: int, c: int) -> None:
        g = c * self.p + self.stage
        x = self._data[i] if g == 0 else self._inputs[(i, c)]
        start = time.perf_counter()
        with trace.span(_name(FORWARD, i, c), FORWARD):
            out = None if g == self.last and self.error else self.chunks[c](x)  # failed loss: skip
            if g == self.last and self.error is None:
                out, self.error = apply_loss(self._loss_fn, out, self._targets[i], i)
        self.stats.busy_s += time.perf_counter() - start
        self._outputs[(i, c)] = out
        self._live += 1
        self.stats.peak_activations = max(self.stats.peak_activations, self._live)
        if self.p == 1 and g < self.last:  # the next chunk is on this rank: hand over in memory
            self._inputs[(i, c + 1)] = Tensor(out.data, requires_grad=True)

    def _backward(self, i: int, c: int) -> None:
        g = c * self.p + self.stage
        out = self._outputs.pop((i, c))
        start = time.perf_counter()
        with trace.span(_name(BACKWARD, i, c), BACKWARD):
            if g == self.last:
                if out is not None:  # None: loss_fn failed (self.error); the gradient sent back is zero
                    # mean over microbatches of the per-microbatch mean = mean over the batch (equal sizes)
                    self._loss += out.item() / self.m
                    if out.requires_grad:
                        (out * (1.0 / self.m)).backward()
            else:
                grad = self._grads.pop((i, c))
                if out.requires_grad:  # a parameter-free first chunk has nothing to differentiate
                    out.backward(grad)
        self.stats.busy_s += time.perf_counter() - start
        self._live -= 1
        if self.p == 1 and g > 0:
            self._grads[(i, c - 1)] = self._input_grad(i, c)

    def _input_grad(self, i: int, c: int) -> Any:
        inp = self._inputs.pop((i, c))
        return inp.grad if inp.grad is not None else backend.xp().zeros_like(inp.data)

    # -- messages --------------------------------------------------------------------------------
    def _tag(self, boundary: int, microbatch: int, kind: int) -> int:
        return TAG_BASE + 3 * (boundary + self.boundaries * (microbatch % self.period)) + kind

    def _messages(self, step: Any) -> None:
        """Start every message of ``step`` together, then wait for all (module docstring)."""
        requests: list[P2PRequest] = []
        arrivals: list[tuple[Instruction, P2PRequest]] = []
        unknown: list[tuple[Instruction, int, P2PRequest]] = []  # activations whose shape is still unknown
        for ins in parts(step):
            i, c = ins.microbatch, ins.chunk
            peer = self.schedule.peer(self.stage, ins)[0]
            g = c * self.p + self.stage
            b = g if ins.kind in (SEND_ACT, RECV_GRAD) else g - 1  # the boundary the message crosses
            if ins.kind == SEND_ACT:
                host = backend.to_numpy(backend.xp().ascontiguousarray(self._outputs[(i, c)].data))
                if b not in self._headers_sent:
                    requests.append(isend(self.group, _header(host), peer, self._tag(b, 0, HEADER)))
                    self._headers_sent.add(b)
                requests.append(isend(self.group, host, peer, self._tag(b, i, ACT)))
            elif ins.kind == SEND_GRAD:
                host = backend.to_numpy(backend.xp().ascontiguousarray(self._input_grad(i, c)))
                requests.append(isend(self.group, host, peer, self._tag(b, i, GRAD)))
            elif ins.kind == RECV_GRAD:
                out = self._outputs[(i, c)]
                buffer = np.empty(out.shape, out.data.dtype)
                arrivals.append((ins, irecv(self.group, buffer, peer, self._tag(b, i, GRAD))))
            elif b in self._shapes:
                buffer = np.empty(*self._shapes[b])
                arrivals.append((ins, irecv(self.group, buffer, peer, self._tag(b, i, ACT))))
            else:
                header = np.zeros(2 + _MAX_DIMS, np.int64)
                unknown.append((ins, b, irecv(self.group, header, peer, self._tag(b, 0, HEADER))))
        with trace.span(str(step), trace.WAIT):
            if unknown:  # everything else is in flight; the activations' receives follow their headers
                wait_all(self.group, [request for _, _, request in unknown])
                for ins, b, request in unknown:
                    self._shapes[b] = _parse_header(request.array)
                    peer = self.schedule.peer(self.stage, ins)[0]
                    buffer = np.empty(*self._shapes[b])
                    tag = self._tag(b, ins.microbatch, ACT)
                    arrivals.append((ins, irecv(self.group, buffer, peer, tag)))
            wait_all(self.group, requests + [request for _, request in arrivals])
        for ins, request in arrivals:
            data = backend.asarray(request.array)  # the same memory on the CPU, a device copy on a GPU
            key = (ins.microbatch, ins.chunk)
            if ins.kind == RECV_ACT:
                self._inputs[key] = Tensor(data, requires_grad=True)
            else:
                self._grads[key] = data


def _name(kind: str, i: int, c: int) -> str:
    """Trace span name: ``"forward 3"`` for chunk 0, ``"forward 3.1"`` for chunk 1 (``gantt.py``)."""
    return f"{kind} {i}" + (f".{c}" if c else "")

"""Run one rank's program of a pipeline schedule: the computation here, the messages through a strategy.

Rank s of the pipeline group holds ``v`` model chunks (one for GPipe and 1F1B); chunk k is *virtual
stage* ``g = k * p + s`` of the ``p * v`` pieces of the model (``interleaved.py``). It runs its program
from the schedule step by step, keyed by ``(microbatch i, chunk c)``:

* ``forward``: run chunk c on microbatch i's input (virtual stage 0: the data; the others: the received
  activation, a leaf tensor that requires grad so that backward produces the gradient to send back).
  The last virtual stage also applies the loss.
* ``backward``: the last virtual stage calls ``(loss_i / m).backward()``; the others call
  ``output.backward(grad)`` with the gradient received from the next virtual stage. Parameter gradients
  accumulate over the microbatches, so after the last backward they are the gradient of the mean loss.
* a message step (``send_act``, ``recv_grad``, ..., an ``Exchange`` or a ``Batch``): handed to the
  messaging strategy (``messaging.py``), which moves the arrays (header and tags: ``messages.py``) and
  hands back what it receives (:meth:`StageExecutor.received`): ``BlockingMessaging`` (GPipe, 1F1B:
  blocking send/recv, an Exchange as one sendrecv, ``messaging.py``) or ``BatchedMessaging``
  (interleaved: a Batch of non-blocking messages; ``batched_messaging.py``). With ``p = 1`` all chunks
  are on one rank and activations and gradients are handed over in memory.

**User code that fails.** Only the last virtual stage calls ``loss_fn``, in the middle of the schedule,
while the other ranks wait for its gradients; a chunk's forward or backward may raise too, and a
microbatch's activation may leave a stage with another shape or dtype than the step's first one did.
The rank must not stop there, or its neighbours would wait forever: it keeps the error in ``error``
and plays the rest of its program with stand-ins (zeros to send on, no loss), so every rank finishes
the step; ``PipelineParallel`` then reports the error on every rank (the step's gradients are
incomplete and must be discarded). That safety net is ``checks.SafetyNet`` (``self.net``): the
computation below calls it where user code runs.

**Bookkeeping.** ``stats``: the last step's busy (forward + backward) time and the most microbatches
whose activations this rank held at once. With ``minidist.trace`` on, each computation and message
wait is a span (``"forward"``, ``"backward"``, ``trace.WAIT``): the timeline shows the bubble.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from minidist import backend, trace
from minidist.autograd import Tensor
from minidist.distributed import Communicator
from minidist.nn.module import Module
from minidist.parallel.pipeline.batched_messaging import BatchedMessaging
from minidist.parallel.pipeline.checks import SafetyNet, check_program
from minidist.parallel.pipeline.messaging import BlockingMessaging
from minidist.parallel.pipeline.schedules import (
    BACKWARD,
    FORWARD,
    RECV_ACT,
    RECV_GRAD,
    SEND_ACT,
    SEND_GRAD,
    Instruction,
    Schedule,
)


@dataclass
class StepStats:
    """Measurements of one step on one stage (seconds; ``step_s`` is set by the caller)."""

    busy_s: float = 0.0
    step_s: float = 0.0
    peak_activations: int = 0

    @property
    def idle_s(self) -> float:
        """Seconds of the step this stage spent waiting (step time - busy time)."""
        return max(self.step_s - self.busy_s, 0.0)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the step on this stage; compare with ``Timeline.bubble_fraction``."""
        return self.idle_s / self.step_s if self.step_s > 0 else 0.0


class StageExecutor:
    """Runs rank ``group.rank``'s program of ``schedule`` on its model ``chunks`` (module docstring).

    ``chunks[k]`` is virtual stage ``k * p + rank``; ``len(chunks)`` must be ``schedule.virtual_stages``.
    ``messaging``: a strategy class, called once with this executor; its ``start_step()`` runs first in
    each step, its ``run(step)`` for each message step. Default: ``BatchedMessaging`` for the
    interleaved schedule, ``BlockingMessaging`` for the others (``messaging.py``).
    Raises ``ValueError`` if the chunks or the group size do not fit the schedule, or a message of this
    rank's program has no peer (``checks.check_program``).
    """

    def __init__(
        self, chunks: Sequence[Module], group: Communicator, schedule: Schedule, messaging: Any = None
    ) -> None:
        self.chunks, self.group, self.schedule = tuple(chunks), group, schedule
        self.stage, self.p = group.rank, group.size
        self.v, self.m = schedule.virtual_stages, schedule.num_microbatches
        # Every message goes to or comes from a neighbour rank (with chunks, virtual stage g + 1 is on
        # rank (s + 1) % p). Checked once, so that :meth:`peer` need not check.
        check_program(schedule, self.stage, self.p, len(self.chunks))
        self.program = schedule.stages[self.stage]
        self.last = self.p * self.v - 1  # the last virtual stage (on rank p - 1)
        self.next_rank, self.prev_rank = (self.stage + 1) % self.p, (self.stage - 1) % self.p
        if messaging is None:
            messaging = BatchedMessaging if schedule.name == "interleaved" else BlockingMessaging
        self.messaging = messaging(self)
        self.stats = StepStats()
        self.net = SafetyNet(self.stage, self.p, self.v)  # failures of user code (module docstring)

    @property
    def error(self) -> Exception | None:
        """The last step's first failure on this rank, or None (module docstring)."""
        return self.net.error

    @property
    def error_at(self) -> tuple[int, int]:
        """Where ``error`` happened: (microbatch, virtual stage); ``(m, p v)`` if nowhere."""
        return self.net.error_at

    def run(self, inputs: Sequence[Any] | None, targets: Sequence[Any] | None, loss_fn: Callable) -> float:
        """Run one step; return the sum over microbatches of ``loss_i / m`` (rank p-1) or nan (others).

        ``inputs`` (rank 0) and ``targets`` (rank p-1) hold one entry per microbatch. If a chunk's
        forward raises, ``loss_fn`` fails or does not return a one-element Tensor, or an activation to
        send changes shape from one microbatch to the next, the step still runs to the end; ``error``
        then holds the first such failure here (``checks.py``), ``error_at`` its (microbatch,
        virtual stage), and the returned loss is nan.
        """
        self.net.start_step(self.m)
        self._inputs: dict[tuple[int, int], Tensor] = {}  # (microbatch, chunk) -> received activation
        self._outputs: dict[tuple[int, int], Tensor] = {}  # -> output (the loss on the last chunk)
        self._grads: dict[tuple[int, int], Any] = {}  # -> gradient received for the output
        self._data, self._targets, self._loss_fn = inputs, targets, loss_fn
        self.stats, self._live, self._loss = StepStats(), 0, 0.0
        self.messaging.start_step()
        for step in self.program:
            if isinstance(step, Instruction) and step.kind == FORWARD:
                self._forward(step.microbatch, step.chunk)
            elif isinstance(step, Instruction) and step.kind == BACKWARD:
                self._backward(step.microbatch, step.chunk)
            else:
                self.messaging.run(step)
        self._data = self._targets = None  # drop references to the batch
        return self._loss if self.stage == self.p - 1 and self.error is None else float("nan")

    # -- computation -----------------------------------------------------------------------------
    def _forward(self, i: int, c: int) -> None:
        g = c * self.p + self.stage
        x = self._data[i] if g == 0 else self._inputs[(i, c)]
        start = time.perf_counter()
        out = self.net.output(self.chunks[c], x, i, c)  # chunk(x); a stand-in if it raises
        if g == self.last:  # the last virtual stage turns its output into the microbatch's loss
            out = self.net.loss(self._loss_fn, out, self._targets[i], i)  # None if anything failed
        self._busy(FORWARD, i, c, start)
        self._outputs[(i, c)] = out  # kept for the backward: its graph leads back to the input
        self._live += 1
        self.stats.peak_activations = max(self.stats.peak_activations, self._live)
        if self.p == 1 and g < self.last:  # the next chunk is on this rank: hand over in memory
            self._inputs[(i, c + 1)] = Tensor(out.data, requires_grad=True)

    def _backward(self, i: int, c: int) -> None:
        g = c * self.p + self.stage
        out = self._outputs.pop((i, c))
        start = time.perf_counter()
        if g == self.last:
            if out is not None:  # None: the loss failed (self.error); the gradient sent back is zero
                # mean over microbatches of the per-microbatch mean = mean over the batch (equal sizes)
                self._loss += out.item() / self.m
                if out.requires_grad:  # backward from d(loss / m)/d(loss) = 1/m: the numbers of
                    # backpropagating ``out * (1 / m)`` from 1, bit for bit, with one op fewer per microbatch
                    seed = backend.xp().full(out.data.shape, 1.0 / self.m, dtype=out.data.dtype)
                    self.net.backward(out, seed, i, c)  # a failure is kept; the peers still get gradients
        else:
            grad = self._grads.pop((i, c))
            if out.requires_grad:  # a parameter-free first chunk has nothing to differentiate
                self.net.backward(out, grad, i, c)
        self._busy(BACKWARD, i, c, start)
        self._live -= 1
        if self.p == 1 and g > 0:
            self._grads[(i, c - 1)] = self._input_grad(i, c)

    def _busy(self, kind: str, i: int, c: int, start: float) -> None:
        """Add the computation that began at ``start`` (``time.perf_counter()``) to the busy time and,
        while ``minidist.trace`` is on, record it as a span. Recorded after the fact, not in a ``with
        trace.span`` block: entering even the do-nothing span of tracing off costs ~3,600 instructions
        (a closure, three calls), and a step has 2 m of these blocks."""
        end = time.perf_counter()
        self.stats.busy_s += end - start
        if trace.is_enabled():
            zero = end - trace.now()  # the time.perf_counter() reading at which the trace clock started
            trace.record(_name(kind, i, c), kind, start - zero, end - zero)

    def _input_grad(self, i: int, c: int) -> Any:
        inp = self._inputs.pop((i, c))
        return inp.grad if inp.grad is not None else backend.xp().zeros_like(inp.data)

    # -- what the messaging strategies use ---------------------------------------------------------
    def peer(self, ins: Instruction) -> int:
        """The rank that message ``ins`` goes to or comes from (checked in ``__init__``)."""
        return self.next_rank if ins.kind in (SEND_ACT, RECV_GRAD) else self.prev_rank

    def boundary(self, ins: Instruction) -> int:
        """The chunk boundary message ``ins`` crosses: ``b`` lies between virtual stages b and b + 1."""
        g = ins.chunk * self.p + self.stage
        return g if ins.kind in (SEND_ACT, RECV_GRAD) else g - 1

    def outgoing(self, ins: Instruction) -> Any:
        """The contiguous backend array a send sends: the chunk's output (``send_act``) or the gradient
        of its input (``send_grad``; zeros if the input got none).

        The first activation sent across a boundary in a step fixes its shape and dtype (its header
        sizes every receive buffer, ``messages.py``); one of another shape later in the step becomes
        this rank's ``error``, and zeros of the agreed shape travel in its place
        (``checks.SafetyNet.same_shape``).
        """
        key = (ins.microbatch, ins.chunk)
        if ins.kind == SEND_GRAD:
            return backend.xp().ascontiguousarray(self._input_grad(*key))
        out = self._outputs[key] = self.net.same_shape(self._outputs[key], ins, self.boundary(ins))
        return backend.xp().ascontiguousarray(out.data)

    def grad_buffer_spec(self, ins: Instruction) -> tuple[tuple[int, ...], Any]:
        """``(shape, dtype)`` of the gradient a ``recv_grad`` receives: those of the output it belongs to."""
        out = self._outputs[(ins.microbatch, ins.chunk)]
        return out.shape, out.data.dtype

    def received(self, ins: Instruction, data: Any) -> None:
        """Keep what receive ``ins`` got (a backend array): an activation as this chunk's input (a leaf
        that requires grad), or the gradient for its output."""
        key = (ins.microbatch, ins.chunk)
        if ins.kind == RECV_ACT:
            self._inputs[key] = Tensor(data, requires_grad=True)
        else:
            self._grads[key] = data


def _name(kind: str, i: int, c: int) -> str:
    """Trace span name: ``"forward 3"`` for chunk 0, ``"forward 3.1"`` for chunk 1 (read by gantt.py)."""
    return f"{kind} {i}" + (f".{c}" if c else "")

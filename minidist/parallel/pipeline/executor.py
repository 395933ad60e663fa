"""Run one stage's schedule over MPI point-to-point messages along the pipeline group.

Rank s of the pipeline group runs stage s's program from ``schedules.py`` step by step:

* ``forward i``: run the stage on microbatch i's input (stage 0: the data; others: the received
  activation, a leaf tensor that requires grad so that backward produces the gradient to send back).
  The last stage also applies the loss.
* ``backward i``: the last stage calls ``(loss_i / m).backward()``; the others call
  ``output_i.backward(grad_i)`` with the gradient received from stage s+1. Parameter gradients
  accumulate over the microbatches, so after the last backward they are the gradient of the mean loss.
* ``send_act``/``recv_act``/``send_grad``/``recv_grad``: blocking ``Communicator.send``/``recv`` to
  s+1 / s-1 (length-checked, under the ``MINIDIST_TIMEOUT`` watchdog); an ``Exchange`` is one
  ``Communicator.sendrecv``. Why this order cannot deadlock is explained in ``schedules.py``.

**Shapes.** A receiver must preallocate its buffer, but only the sender knows the shape of what it
sends (it depends on the batch). The first activation of every step is preceded by a small header
(int64: dtype code, number of axes, the axes); all microbatches of a step have that shape, and the
gradients coming back have the shape of the activation they belong to, which the receiving stage
produced itself. The header costs one tiny message per stage boundary and step, and lets the batch
size change between steps. (Both schedules begin every stage's traffic with a plain ``recv_act 0``
/ ``send_act 0``, never an Exchange, so the header travels alone, in the same direction.)

**A failing loss.** Only the last stage calls ``loss_fn``, in the middle of the schedule, while the
other stages wait for its gradients. If ``loss_fn`` raises or returns something that is not a
one-element Tensor, the last stage keeps the error in ``error`` and plays the rest of its program
without computing (sending zero gradients), so every stage finishes the step; ``PipelineParallel``
then reports the error on every rank (the step's gradients are incomplete and must be discarded).

**Bookkeeping.** ``stats`` of the last step: busy (forward + backward) time, and the most microbatches
whose activations this stage held at once. With ``minidist.trace`` enabled each computation and each
message wait is a span (categories ``"forward"``, ``"backward"``, ``trace.WAIT``), so the timeline
shows the bubble.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from minidist import backend, trace
from minidist.autograd import Tensor
from minidist.distributed import Communicator
from minidist.nn.module import Module
from minidist.parallel.pipeline.schedules import (
    BACKWARD,
    FORWARD,
    RECV_ACT,
    SEND_ACT,
    SEND_GRAD,
    Exchange,
    Instruction,
    Step,
)

TAG_HEADER, TAG_ACT, TAG_GRAD = 1, 2, 3
_DTYPES = ("float16", "float32", "float64")
_MAX_DIMS = 8


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
    """Runs ``program`` (one stage's list of steps) for stage ``group.rank`` of ``group.size``."""

    def __init__(self, module: Module, group: Communicator, program: Sequence[Step], num_microbatches: int):
        self.module, self.group, self.program = module, group, tuple(program)
        self.m = num_microbatches
        self.stage, self.num_stages = group.rank, group.size
        self.stats = StepStats()
        self.error: Exception | None = None  # of the last step's loss_fn (last stage; module docstring)

    def run(self, inputs: Sequence[Any] | None, targets: Sequence[Any] | None, loss_fn: Callable) -> float:
        """Run one step; return the sum over microbatches of ``loss_i / m`` (last stage) or nan (others).

        ``inputs`` (stage 0) and ``targets`` (last stage) hold one entry per microbatch. If ``loss_fn``
        fails or does not return a one-element Tensor, the step still runs to the end and ``error``
        holds a ``TypeError``/``ValueError`` saying why (the returned loss is then nan).
        """
        self.error = None
        self._inputs: dict[int, Tensor] = {}  # microbatch -> this stage's input (received activation)
        self._outputs: dict[int, Tensor] = {}  # microbatch -> output (loss on the last stage)
        self._grads: dict[int, Any] = {}  # microbatch -> gradient received for the output
        self._act_shape: tuple[tuple[int, ...], Any] | None = None  # set by the header
        self._header_sent = False
        self._data, self._targets, self._loss_fn = inputs, targets, loss_fn
        self.stats, self._live, self._loss = StepStats(), 0, 0.0
        # BEGIN SOLUTION A5.2: run each step: Exchange, forward, backward, blocking send or receive
        for step in self.program:
            if isinstance(step, Exchange):
                self._exchange(step)
            elif step.kind == FORWARD:
                self._forward(step.microbatch)
            elif step.kind == BACKWARD:
                self._backward(step.microbatch)
            elif step.kind in (SEND_ACT, SEND_GRAD):
                array = self._outgoing(step)
                with trace.span(str(step), trace.WAIT):
                    self.group.send(array, self._peer(step), tag=_tag(step))
            else:
                buffer = self._incoming(step)
                with trace.span(str(step), trace.WAIT):
                    self.group.recv(buffer, self._peer(step), tag=_tag(step))
                self._received(step, buffer)
        # END SOLUTION
        self._data = self._targets = None  # drop references to the batch
        return self._loss if self.stage == self.num_stages - 1 and self.error is None else float("nan")

    # -- computation -----------------------------------------------------------------------------
    def _forward(self, i: int) -> None:
        x = self._data[i] if self.stage == 0 else self._inputs[i]
        last = self.stage == self.num_stages - 1
        start = time.perf_counter()
        with trace.span(f"forward {i}", "forward"):
            out = None if last and self.error else self.module(x)  # after a failed loss: nothing to do
            if last and self.error is None:
                out, self.error = apply_loss(self._loss_fn, out, self._targets[i], i)
        self.stats.busy_s += time.perf_counter() - start
        self._outputs[i] = out
        self._live += 1
        self.stats.peak_activations = max(self.stats.peak_activations, self._live)

    def _backward(self, i: int) -> None:
        out = self._outputs.pop(i)
        start = time.perf_counter()
        with trace.span(f"backward {i}", "backward"):
            if self.stage == self.num_stages - 1:
                if out is not None:  # None: loss_fn failed (self.error); the gradient sent back is zero
                    # mean over microbatches of the per-microbatch mean = mean over the batch (equal sizes)
                    self._loss += out.item() / self.m
                    if out.requires_grad:
                        (out * (1.0 / self.m)).backward()
            elif out.requires_grad:  # a parameter-free first stage has nothing to differentiate
                out.backward(self._grads.pop(i))
        self.stats.busy_s += time.perf_counter() - start
        self._live -= 1
        if self.stage == 0:
            self._inputs.pop(i, None)

    # -- messages --------------------------------------------------------------------------------
    def _peer(self, ins: Instruction) -> int:
        return self.stage + ins.peer_offset()

    def _outgoing(self, ins: Instruction) -> Any:
        """The array a send instruction sends (sending the header first for the step's first activation)."""
        if ins.kind == SEND_ACT:
            array = backend.xp().ascontiguousarray(self._outputs[ins.microbatch].data)
            if not self._header_sent:
                self.group.send(_header(array), self._peer(ins), tag=TAG_HEADER)
                self._header_sent = True
            return array
        inp = self._inputs.pop(ins.microbatch)
        grad = inp.grad if inp.grad is not None else backend.xp().zeros_like(inp.data)
        return backend.xp().ascontiguousarray(grad)

    def _incoming(self, ins: Instruction) -> Any:
        """A fresh buffer for a receive instruction (receiving the header first if the shape is unknown)."""
        xp = backend.xp()
        if ins.kind == RECV_ACT:
            if self._act_shape is None:
                header = self.group.recv(np.zeros(2 + _MAX_DIMS, np.int64), self._peer(ins), tag=TAG_HEADER)
                self._act_shape = _parse_header(header)
            shape, dtype = self._act_shape
            return xp.empty(shape, dtype)
        out = self._outputs[ins.microbatch]
        return xp.empty(out.shape, out.dtype)

    def _received(self, ins: Instruction, buffer: Any) -> None:
        if ins.kind == RECV_ACT:
            self._inputs[ins.microbatch] = Tensor(buffer, requires_grad=True)
        else:
            self._grads[ins.microbatch] = buffer

    def _exchange(self, step: Exchange) -> None:
        first_send = step.send.kind == SEND_ACT and not self._header_sent
        first_recv = step.recv.kind == RECV_ACT and self._act_shape is None
        if first_send or first_recv:
            raise RuntimeError(
                f"schedule bug: the first activation of a step travels in an Exchange ({step})"
            )
        # BEGIN SOLUTION A5.2: one sendrecv with the neighbour: both halves progress together
        array, buffer = self._outgoing(step.send), self._incoming(step.recv)
        peer = self._peer(step.send)
        with trace.span(str(step), trace.WAIT):
            self.group.sendrecv(array, peer, buffer, peer, sendtag=_tag(step.send), recvtag=_tag(step.recv))
        self._received(step.recv, buffer)
        # END SOLUTION


def apply_loss(loss_fn: Callable, output: Tensor, targets: Any, i: int) -> tuple[Any, Exception | None]:
    """``(loss_fn(output, targets), None)``, or ``(None, error)`` if it raises or returns anything but a
    one-element Tensor: a ``TypeError``/``ValueError`` naming microbatch ``i`` and the shapes involved."""
    try:
        loss = loss_fn(output, targets)
    except Exception as e:  # any failure of user code: reported on every rank by PipelineParallel
        return None, ValueError(
            f"loss_fn(output, targets) failed on microbatch {i}: {type(e).__name__}: {e} (the last "
            f"stage's output has shape {output.shape}, the microbatch's targets "
            f"{getattr(targets, 'shape', type(targets).__name__)}); check the targets and loss_fn"
        )
    if not isinstance(loss, Tensor) or loss.size != 1:
        return None, TypeError(
            f"loss_fn must return a one-element minidist Tensor (the mean loss of the microbatch), "
            f"got {type(loss).__name__}{f' of shape {loss.shape}' if isinstance(loss, Tensor) else ''} "
            f"on microbatch {i}"
        )
    return loss, None


def _tag(ins: Instruction) -> int:
    return TAG_ACT if ins.kind in (SEND_ACT, RECV_ACT) else TAG_GRAD


def _header(array: Any) -> np.ndarray:
    if str(array.dtype) not in _DTYPES or array.ndim > _MAX_DIMS:
        raise TypeError(
            f"a pipeline stage's output must be a floating array ({', '.join(_DTYPES)}) with at most "
            f"{_MAX_DIMS} axes to be sent to the next stage, got {array.dtype} with shape {array.shape}"
        )
    header = np.zeros(2 + _MAX_DIMS, np.int64)
    header[0], header[1] = _DTYPES.index(str(array.dtype)), array.ndim
    header[2 : 2 + array.ndim] = array.shape
    return header


def _parse_header(header: np.ndarray) -> tuple[tuple[int, ...], Any]:
    ndim = int(header[1])
    return tuple(int(d) for d in header[2 : 2 + ndim]), np.dtype(_DTYPES[int(header[0])])

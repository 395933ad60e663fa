"""How a stage's messages travel: the strategy a ``StageExecutor`` hands every message step to.

The executor (``executor.py``) runs the computation of its program; every message step (``send_act``,
``recv_grad``, ..., an ``Exchange`` or a ``Batch``) it hands to a *messaging strategy*, which moves the
arrays (the shape header and the tags: ``messages.py``) and gives back what it receives
(``StageExecutor.received``). A strategy is a class called once with the executor, with two methods:
``start_step()``, run first in every step, and ``run(step)``, run for each message step. Two exist:

* :class:`BlockingMessaging` (here; GPipe and 1F1B): each message one blocking ``send`` or ``recv``, an
  ``Exchange`` one ``sendrecv``;
* ``BatchedMessaging`` (``batched_messaging.py``; the interleaved schedule): every message of a
  ``Batch`` started together, non-blocking, then awaited together.

:class:`Executor` lists what a strategy may use of its executor, so neither strategy imports
``executor.py`` (which imports them both).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from minidist import backend, trace
from minidist.distributed import Communicator
from minidist.parallel.pipeline import messages
from minidist.parallel.pipeline.checks import check_first_activation
from minidist.parallel.pipeline.schedules import RECV_ACT, SEND_ACT, SEND_GRAD, Exchange, Instruction, Step


class Executor(Protocol):
    """What a messaging strategy uses of its ``StageExecutor`` (each documented in ``executor.py``)."""

    group: Communicator  # the pipeline group
    program: Sequence[Step]  # this rank's steps of the schedule
    last: int  # the last virtual stage, p v - 1

    def peer(self, ins: Instruction) -> int:
        """The rank that message ``ins`` goes to or comes from."""

    def boundary(self, ins: Instruction) -> int:
        """The chunk boundary ``ins`` crosses: ``b`` lies between virtual stages b and b + 1."""

    def outgoing(self, ins: Instruction) -> Any:
        """The contiguous backend array a send sends."""

    def grad_buffer_spec(self, ins: Instruction) -> tuple[tuple[int, ...], Any]:
        """``(shape, dtype)`` of the gradient a ``recv_grad`` receives."""

    def received(self, ins: Instruction, data: Any) -> None:
        """Keep what receive ``ins`` got (a backend array)."""


class BlockingMessaging:
    """GPipe and 1F1B: each message is one blocking ``send`` or ``recv``, an ``Exchange`` one ``sendrecv``.

    Blocking calls cannot deadlock here because of the order the schedule fixes (``schedules.py``,
    rules 1 and 2): per direction both neighbours agree on the order, and where two neighbours would
    send to each other at the same moment the schedule has an ``Exchange``, whose two halves progress
    together in one ``MPI_Sendrecv``. The first activation of a step is preceded by its header
    (``messages.py``); both schedules begin every stage's traffic with a plain ``recv_act 0`` /
    ``send_act 0``, never an Exchange, so the header travels alone, in the same direction (a program that
    does not is a ``ValueError`` when the executor is built).
    """

    def __init__(self, executor: Executor) -> None:
        self.ex, self.group = executor, executor.group
        # The header travels alone, just before the step's first activation: neither end of that first
        # activation may be half of an Exchange (checked once per program, not per message).
        check_first_activation(executor.program)

    def start_step(self) -> None:
        """Forget the last step's activation shape: the batch size may have changed."""
        self._header_sent = False
        self._act_shape: tuple[tuple[int, ...], Any] | None = None

    def run(self, step: Step) -> None:
        """Move the message(s) of ``step``: a send, a receive, or an ``Exchange``."""
        # BEGIN SOLUTION A5.2: a blocking send or receive, or an Exchange as ONE sendrecv
        if isinstance(step, Exchange):  # both halves progress together: no deadlock (schedules.py)
            array, buffer = self._outgoing(step.send), self._incoming(step.recv)
            peer = self.ex.peer(step.send)
            with trace.span(step.__str__, trace.WAIT):
                self.group.sendrecv(
                    array, peer, buffer, peer, sendtag=_tag(step.send), recvtag=_tag(step.recv)
                )
            self.ex.received(step.recv, buffer)
        elif step.kind in (SEND_ACT, SEND_GRAD):
            array = self._outgoing(step)
            with trace.span(step.__str__, trace.WAIT):
                self.group.send(array, self.ex.peer(step), tag=_tag(step))
        else:
            buffer = self._incoming(step)
            with trace.span(step.__str__, trace.WAIT):
                self.group.recv(buffer, self.ex.peer(step), tag=_tag(step))
            self.ex.received(step, buffer)
        # END SOLUTION

    def _outgoing(self, ins: Instruction) -> Any:
        """The array a send instruction sends (sending the header first for the step's first activation)."""
        array = self.ex.outgoing(ins)
        if ins.kind == SEND_ACT and not self._header_sent:
            self.group.send(messages.encode_header(array), self.ex.peer(ins), tag=messages.TAG_HEADER)
            self._header_sent = True
        return array

    def _incoming(self, ins: Instruction) -> Any:
        """A fresh buffer for a receive instruction (receiving the header first if the shape is unknown)."""
        if ins.kind == RECV_ACT:
            if self._act_shape is None:
                header = self.group.recv(messages.header_buffer(), self.ex.peer(ins), tag=messages.TAG_HEADER)
                self._act_shape = messages.decode_header(header)
            return backend.xp().empty(*self._act_shape)
        return backend.xp().empty(*self.ex.grad_buffer_spec(ins))


def _tag(ins: Instruction) -> int:
    return messages.TAG_ACT if ins.kind in (SEND_ACT, RECV_ACT) else messages.TAG_GRAD

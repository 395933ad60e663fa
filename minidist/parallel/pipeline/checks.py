"""The pipeline's checks and safety net: wrong arguments, and user code that fails mid-schedule.

Nothing here moves the step's data; it makes a mistake end as one clear error on every rank instead of
a hang. (The small exchange that begins every step, so that the ranks agree on the call, is
``step_checks.py``.)

* **Arguments** of ``PipelineParallel`` and of the executor (``check_*``), raised on the calling rank;
  ``PipelineParallel`` spreads its own to every rank (``minidist.distributed.safety.agreement``), and a
  program that does not fit its rank is a ``ValueError`` when the executor is built, not a hang later.
* **User code that fails in the middle of a schedule** (:class:`SafetyNet`). A stage cannot simply
  raise when its chunk or ``loss_fn`` fails: its neighbours are waiting in the schedule for its
  activations or gradients, and would wait forever. So the executor keeps the error
  (``StageExecutor.error``), plays the rest of its program with stand-ins (zeros of the right shape
  for what it must send, no backward for what failed), and ``PipelineParallel`` raises the error on
  every rank after the step. The stand-ins may make later stages fail too; ``PipelineParallel``
  reports the failure that came first in the data flow (smallest microbatch, then virtual stage:
  :func:`first_failure`).

Failures of the communication itself (``minidist.distributed`` errors: a timeout, a collective
mismatch inside a tensor-parallel stage) are not kept: the peers of that call cannot be trusted to
continue, so those still end the job (``minidist/distributed/safety/watchdog.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.autograd import Tensor
from minidist.distributed import Communicator, DistributedError
from minidist.nn.layers import Sequential
from minidist.nn.module import Module
from minidist.parallel.pipeline.schedules import (
    COMPUTE,
    RECV_ACT,
    SEND_ACT,
    Exchange,
    Instruction,
    Schedule,
    Step,
    parts,
)


# -- arguments -----------------------------------------------------------------------------------------
def check_arguments(microbatches: Any, v: Any, schedule: str) -> None:
    """``PipelineParallel``'s counts: ``ValueError`` for ``microbatches`` or ``virtual_stages`` below 1,
    or ``virtual_stages > 1`` without the interleaved schedule."""
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise ValueError(f"microbatches must be an integer >= 1, got {microbatches!r}")
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"virtual_stages (model chunks per rank) must be an integer >= 1, got {v!r}")
    if v > 1 and schedule != "interleaved":
        raise ValueError(
            f"virtual_stages={v} needs schedule='interleaved' (the only schedule that runs "
            f"several model chunks per rank); {schedule!r} runs one: pass virtual_stages=1"
        )


def check_chunks(model: Any, p: int, v: int) -> None:
    """``ValueError`` if an interleaved ``model`` has fewer layers than its ``p * v`` chunks."""
    if v > 1 and isinstance(model, Sequential) and len(model) < p * v:
        raise ValueError(
            f"cannot split a model with {len(model)} layer(s) into p*v = {p * v} chunks ({p} "
            f"stages x {v} virtual stages): every chunk needs at least one layer; use fewer "
            "virtual stages or a model with more layers"
        )


def check_program(schedule: Schedule, stage: int, p: int, chunks: int) -> None:
    """``ValueError`` unless rank ``stage`` of a ``p``-rank group with ``chunks`` model chunks fits the
    schedule, and every message of its program has a peer (a schedule bug is then a ``ValueError`` when
    the executor is built, not a hang later)."""
    if chunks != schedule.virtual_stages or schedule.num_stages != p:
        raise ValueError(
            f"rank {stage} holds {chunks} chunks of a {p}-rank group, but the "
            f"schedule is for {schedule.num_stages} stages x {schedule.virtual_stages} chunks"
        )
    for step in schedule.stages[stage]:
        for ins in parts(step):
            if ins.kind not in COMPUTE:
                schedule.peer(stage, ins)  # raises ValueError if there is no such (virtual) stage


def check_first_activation(program: Sequence[Step]) -> None:
    """``ValueError`` if either end of a step's first activation is half of an Exchange: blocking messages
    send the shape header alone, just before it (``messaging.py``). Checked once per program, not per
    message."""
    for kind in (SEND_ACT, RECV_ACT):
        first = next((st for st in program if any(ins.kind == kind for ins in parts(st))), None)
        if isinstance(first, Exchange):
            raise ValueError(f"schedule bug: the first activation of a step travels in an Exchange ({first})")


# -- user code that fails in the middle of a schedule ---------------------------------------------------
class SafetyNet:
    """One rank's failures in a step: the first is kept, and stand-ins keep the schedule running.

    ``error``: the step's first failure on this rank, or None. ``error_at``: its (microbatch, virtual
    stage or chunk boundary), ``(m, p v)`` while there is none, so that :func:`first_failure` reports
    the failure that came first in the data flow, not one that followed from the zeros sent after it.
    Each failure of user code becomes an error of the original's class for ``ValueError`` and
    ``TypeError`` (else ``RuntimeError``) that names the stage, the microbatch and the shapes involved.
    """

    def __init__(self, stage: int, p: int, v: int) -> None:
        self.stage, self.p, self.v, self.last = stage, p, v, p * v - 1
        self.start_step(0)

    def start_step(self, m: int) -> None:
        """Forget the last step of ``m`` microbatches: no error, no activation shape seen yet."""
        self.error: Exception | None = None
        self.error_at = (m, self.last + 1)  # (microbatch, virtual stage)
        self._sent: dict[int, tuple[Any, ...]] = {}  # boundary -> (shape, dtype, microbatch) first sent

    def fail(self, error: Exception, i: int, where: int) -> None:
        """Keep the step's first error, of microbatch ``i`` at virtual stage (or boundary) ``where``."""
        if self.error is None:
            self.error, self.error_at = error, (i, where)

    def output(self, chunk: Module, x: Any, i: int, c: int) -> Tensor | None:
        """``chunk(x)`` for chunk ``c`` on microbatch ``i`` (:func:`run_chunk`). If it raises, the error is
        kept and zeros take its place, since the next virtual stage still needs an input: of the shape the
        step's first activation across this boundary had, else :func:`stand_in_spec`. The last virtual
        stage sends nothing on: None there; after an earlier failure it does not run its chunk at all."""
        g = c * self.p + self.stage
        if g == self.last and self.error is not None:  # after a failure the last chunk computes no loss
            return None
        out, error = run_chunk(chunk, x, self.stage, c, g, i, self.v)
        if error is None:
            return out
        self.fail(error, i, g)
        if g == self.last:
            return None
        known = self._sent.get(g)
        return Tensor(backend.xp().zeros(*(known[:2] if known else stand_in_spec(x))))

    def loss(self, loss_fn: Callable, output: Tensor | None, targets: Any, i: int) -> Tensor | None:
        """``loss_fn(output, targets)`` on the last virtual stage, or None if ``output`` is None (a failure
        came first) or ``loss_fn`` fails (:func:`apply_loss`; the error is kept): then no loss is computed
        and the gradients sent back are zero."""
        if output is None:
            return None
        loss, error = apply_loss(loss_fn, output, targets, i)
        if error is not None:
            self.fail(error, i, self.last)
        return loss

    def backward(self, out: Tensor, grad: Any, i: int, c: int) -> None:
        """``out.backward(grad)`` for chunk ``c`` on microbatch ``i``; if it raises (:func:`run_backward`),
        the error is kept like a forward failure, and the peers still get gradients (zeros where none
        was computed)."""
        g = c * self.p + self.stage
        error = run_backward(out, grad, self.stage, c, g, i, self.v)
        if error is not None:
            self.fail(error, i, g)

    def same_shape(self, out: Tensor, ins: Instruction, boundary: int) -> Tensor:
        """``out``, the activation send ``ins`` sends across ``boundary``, or zeros of the agreed shape.

        The first activation sent across a boundary in a step fixes its shape and dtype (its header
        sizes every receive buffer, ``messages.py``). A later microbatch's output of another shape would
        arrive as a bare length error on the next rank alone, leaving this one waiting; instead it
        becomes this rank's error (:func:`shape_changed`) and zeros of the agreed shape travel in its
        place (no graph: its backward is skipped, its gradient sized alike), so the step runs to its
        end and ``PipelineParallel`` raises it on every rank.
        """
        got = (tuple(out.data.shape), out.data.dtype)
        first = self._sent.setdefault(boundary, (*got, ins.microbatch))
        if got == first[:2]:
            return out
        self.fail(shape_changed(self.stage, ins, self.p, self.v, got, first), ins.microbatch, boundary)
        return Tensor(backend.xp().zeros(*first[:2]))


def first_failure(
    error: Exception | None, error_at: tuple[int, int], group: Communicator
) -> Exception | None:
    """Collective over ``group``: ``error`` if this rank's failure (at ``error_at``) came first in the data
    flow of the step (smallest microbatch, then virtual stage), else None: later ones may only follow
    from the zeros sent after it."""
    where = dist.all_gather(np.array(error_at, np.int64), group=group).reshape(-1, 2)
    first = min(range(len(where)), key=lambda r: tuple(where[r]))
    return error if first == group.rank else None


def run_chunk(
    chunk: Module, x: Any, stage: int, c: int, g: int, i: int | None, v: int
) -> tuple[Any, Exception | None]:
    """``(chunk(x), None)``, or ``(None, error)`` if chunk ``c`` (virtual stage ``g``, of ``v`` per rank)
    of ``stage`` raises on microbatch ``i`` (None: in ``predict``): a ``ValueError``/``TypeError`` (the
    original's class; any other becomes a ``RuntimeError``) naming the stage, the microbatch, the input's
    shape and where it came from, e.g. a stage whose output does not fit the next stage's first layer."""
    try:
        return chunk(x), None
    except DistributedError:
        raise  # communication failed: the job ends (module docstring)
    except Exception as e:  # any failure of user code: reported on every rank by PipelineParallel
        where = _where(stage, c, g, v)
        source = "the batch" if g == 0 else f"{'virtual stage' if v > 1 else 'stage'} {g - 1}"
        cls = type(e) if isinstance(e, (TypeError, ValueError)) else RuntimeError
        return None, cls(
            f"{where} failed in forward {'in predict' if i is None else f'on microbatch {i}'}: "
            f"{type(e).__name__}: {e} (its input, from "
            f"{source}, has shape {tuple(x.shape)} and dtype {x.dtype}); "
            + ("check the batch and this stage's layers" if g == 0 else f"check that {source}'s output "
               "fits this stage's first layer")
        )  # fmt: skip


def _where(stage: int, c: int, g: int, v: int) -> str:
    return f"pipeline stage {stage}" + (f" (model chunk {c}, virtual stage {g})" if v > 1 else "")


def stand_in_spec(x: Any) -> tuple[tuple[int, ...], Any]:
    """``(shape, dtype)`` of the zeros a failed chunk sends on when no activation crossed its boundary
    yet in this step: its input's, as a dtype every activation sent must have (``messages.DTYPES``, in
    this machine's byte order), else float32. (A big-endian or long-double input, which the chunk
    rejected, must not make the stand-in unsendable: its header would raise on this rank alone.)"""
    dtype = np.dtype(x.dtype)
    dtype = dtype.newbyteorder("=") if dtype.kind == "f" and dtype.itemsize in (2, 4, 8) else np.float32
    return tuple(x.shape), dtype


def run_backward(out: Tensor, grad: Any, stage: int, c: int, g: int, i: int, v: int) -> Exception | None:
    """None, or the error if ``out.backward(grad)`` raises in chunk ``c`` (virtual stage ``g``) of ``stage``
    on microbatch ``i`` (e.g. a custom ``Function`` whose backward fails): of the original's class for
    ``ValueError``/``TypeError``, else ``RuntimeError``, naming the stage, the microbatch and the output's
    shape. The gradients this rank then sends back are zeros where none was computed."""
    try:
        out.backward(grad)
        return None
    except DistributedError:
        raise  # communication failed: the job ends (module docstring)
    except Exception as e:  # any failure of user code: reported on every rank by PipelineParallel
        cls = type(e) if isinstance(e, (TypeError, ValueError)) else RuntimeError
        return cls(
            f"{_where(stage, c, g, v)} failed in backward on microbatch {i}: {type(e).__name__}: {e} (its "
            f"output has shape {tuple(out.shape)}); check the backward of this stage's layers"
        )


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


def shape_changed(stage: int, ins: Any, p: int, v: int, got: tuple, first: tuple) -> ValueError:
    """The error for send ``ins`` of ``stage`` (of ``p`` ranks, ``v`` chunks each) whose activation has
    ``got = (shape, dtype)`` where the step's first one across that boundary had ``first = (shape,
    dtype, microbatch)``: it names the stage, both microbatches and both shapes."""
    where = f"pipeline stage {stage}"
    if v > 1:
        where += f" (model chunk {ins.chunk}, virtual stage {ins.chunk * p + stage})"
    return ValueError(
        f"{where} produced an activation of shape {got[0]} ({got[1]}) for microbatch {ins.microbatch}, "
        f"but of shape {first[0]} ({first[1]}) for microbatch {first[2]}: every microbatch must leave a "
        "stage with the same shape and dtype (the next stage's receive buffers are sized from the "
        "step's first activation); check the layers of this stage for an output shape that depends on "
        "the data"
    )

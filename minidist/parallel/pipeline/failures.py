"""User code that fails in the middle of a pipeline schedule: the error is kept, the schedule runs on.

A stage cannot simply raise when its chunk or ``loss_fn`` fails: its neighbours are waiting in the
schedule for its activations or gradients, and would wait forever. So the executor keeps the error
(``StageExecutor.error``), plays the rest of its program with stand-ins (zeros of the right shape for
what it must send, no backward for what failed), and ``PipelineParallel`` raises the error on every
rank after the step. The stand-ins may make later stages fail too; ``PipelineParallel`` reports the
failure that came first in the data flow (smallest microbatch, then virtual stage).

Failures of the communication itself (``minidist.distributed`` errors: a timeout, a collective
mismatch inside a tensor-parallel stage) are not kept: the peers of that call cannot be trusted to
continue, so those still end the job (``minidist/distributed/safety/watchdog.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from minidist.autograd import Tensor
from minidist.distributed import DistributedError
from minidist.nn.module import Module


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

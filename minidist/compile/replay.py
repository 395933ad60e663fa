"""``Replay``: a training step that is recorded on its first calls and replayed from then on.

    step = md.compile.Replay(model, optimizer, lambda x, y: F.cross_entropy(model(x), y), max_grad_norm=1.0)
    for x, y in batches:
        loss = step(x, y)  # forward, backward, clip_grad_norm_, optimizer.step(), optimizer.zero_grad()
        scheduler.step()   # a scheduler changes the groups' lr: the replay reads it at every step

Calls 1 and 2 run eagerly and record the step (``program.py``); if both recordings are the same program,
call 3 on replays it, for as long as the guards hold (``guards.py``); else that call runs eagerly and
a ``ReplayFallbackWarning`` names the reason, once per reason. A layout that communicates outside the
recorded ops (FSDP, ZeRO, tensor, pipeline and context parallelism) and a step whose recordings differ
always run eagerly, with a warning that says so.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from minidist.autograd import Tensor
from minidist.compile import fused, guards
from minidist.compile.program import Program, forward_and_backward, record_step
from minidist.nn.utils import clip_grad_norm_


class ReplayFallbackWarning(UserWarning):
    """A step ran eagerly instead of being replayed; the message is the one-line reason."""


class Replay:
    """One training step of ``model`` with ``optimizer``, recorded once and replayed (module docstring).

    Args:
        model: the ``Module`` whose parameters the step trains (a ``DistributedDataParallel`` too).
        optimizer: its optimizer; AdamW is replayed as one fused update (``fused.py``), any
            other runs its own ``step()``.
        loss_fn: ``loss_fn(*inputs) -> Tensor``, the scalar loss, computed from the inputs with minidist
            ops (arrays made from an input outside the ops are refused at recording).
        max_grad_norm: clip the gradients' 2-norm over ``model.parameters()`` to this (``clip_grad_norm_``)
            before the update; None: no clipping.

    What the step reads besides its inputs and the parameters' arrays (Python numbers such as a loss
    scale, arrays it builds such as positions or masks, the branches its Python takes) is fixed when the
    step is recorded, as in any trace: calls 1 and 2 must agree on it, or the step never replays. A negative
    integer input runs eagerly (whose ops raise for it); an id too large fails in NumPy's indexing.

    Calling it with the step inputs (NumPy arrays or Tensors, e.g. token ids (B, T) and targets (B, T))
    trains one step and returns the loss as a Tensor without a graph. A call that runs eagerly raises what
    the eager step raises; a replayed one, what the kernels raise (see above). Attributes: ``program`` (the
    recording, printable), ``replays`` (how many calls were replayed), ``fallback_reason`` (why the last
    call ran eagerly, or None).
    """

    def __init__(
        self, model: Any, optimizer: Any, loss_fn: Callable[..., Tensor], max_grad_norm: float | None = None
    ) -> None:
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.max_grad_norm = max_grad_norm
        self.program: Program | None = None
        self.replays = 0
        self.fallback_reason: str | None = None
        self._never = guards.unsupported_layout(model, optimizer)  # a reason to never record
        self._calls = 0
        self._guard: guards.Guard | None = None
        self._scratch = fused.Scratch()
        self._warned: set[str] = set()

    def __call__(self, *inputs: Any) -> Tensor:
        arrays = tuple(x._data if isinstance(x, Tensor) else x for x in inputs)
        self._calls += 1
        reason = self._never
        if reason is None and self._calls > 2:
            reason = self._guard.check(arrays)
            if reason is None:
                return self._replay(arrays)
        self._fall_back(reason)
        if reason is not None or self._calls > 2:
            loss = forward_and_backward(lambda: self.loss_fn(*inputs))
        else:  # calls 1 and 2: eager, recorded
            loss, program = record_step(lambda: self.loss_fn(*inputs), arrays)
            self._keep(program, arrays)
        self._update(use_fused=False)
        return loss.detach()

    def _keep(self, program: Program | str, arrays: tuple) -> None:
        """Keep the second recording if it equals the first; else never replay, saying why."""
        if isinstance(program, str):
            self._never = f"the step cannot be recorded: {program}"
        elif self._calls == 2:
            differ = guards.differs(self.program, program)
            if differ is not None:
                self._never = f"two recordings of the step differ ({differ}): it depends on more than inputs"
            else:
                self._guard = guards.Guard(self.model, self.optimizer, arrays)
        self.program = None if isinstance(program, str) else program
        if self._never is not None:
            self._fall_back(self._never)

    def _replay(self, arrays: tuple) -> Tensor:
        self.fallback_reason = None
        loss = self.program.replay(arrays)
        self._update(use_fused=fused.supports(self.optimizer))
        self.replays += 1
        return Tensor(loss)

    def _update(self, use_fused: bool) -> None:
        """Clip (if asked), step and clear the gradients: eagerly or with the fused update."""
        if self.max_grad_norm is not None:
            clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        if use_fused:
            fused.fused_step(self.optimizer, self._scratch)
        else:
            self.optimizer.step()
        self.optimizer.zero_grad()

    def _fall_back(self, reason: str | None) -> None:
        self.fallback_reason = reason
        if reason is not None and reason not in self._warned:
            self._warned.add(reason)
            warnings.warn(f"minidist.compile: running eagerly: {reason}", ReplayFallbackWarning, stacklevel=3)

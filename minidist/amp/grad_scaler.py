"""``GradScaler``: dynamic loss scaling for float16 training (Micikevicius et al. 2018, §3.2).

float16 has 5 exponent bits: gradients below 2^-24 (~6e-8) round to zero, and in a network's backward
many do. Multiplying the loss by S (a power of two, so exact) multiplies every gradient by S, shifting
them into float16's range; the float32 master gradients are divided by S again before the step. S is
chosen dynamically (§3.2, "dynamic loss scaling", the scheme PyTorch implements):

* if any gradient is inf or NaN after backward, S was too large: *skip* the optimizer step (parameters
  and optimizer state untouched), S *= ``backoff_factor``;
* after ``growth_interval`` consecutive good steps, S *= ``growth_factor`` (try a larger scale again).

bfloat16 has float32's 8 exponent bits, so it needs no scaling (Kalamkar et al. 2019, §3); a disabled
scaler (``enabled=False``) makes every call a pass-through, so one training loop serves all dtypes.

Distributed: with ZeRO or FSDP each rank checks only its own gradients, yet all must skip the same
steps, so with ``group`` the found-inf flag is agreed by one ``all_reduce(max)`` of one number. Under
DDP the gradients are equal on every rank already (no group needed, though one does no harm).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minidist import backend
from minidist.autograd import Tensor
from minidist.autograd.autocast import is_low

_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"


def _parameters(optimizer: Any) -> list[Tensor]:
    """Every parameter ``optimizer`` updates: ``optimizer.params`` (minidist's optimizers, ZeRO's full
    parameters), else those of its ``param_groups`` (as PyTorch's scaler reads them)."""
    params = getattr(optimizer, "params", None)
    if params is None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
    return list(params)


class GradScaler:
    """Scale the loss, unscale the gradients, skip steps with inf/NaN gradients, adapt the scale.

    As ``torch.amp.GradScaler``; usage::

        scaler = GradScaler()                    # float16; GradScaler(enabled=False) for the others
        with md.autocast("float16"):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)               # optional: clip the true gradients
        clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)                   # skipped if a gradient is inf/NaN
        scaler.update()

    Args:
        device: "cpu", "cuda" or None, first as in ``torch.amp.GradScaler("cuda")``; accepted and
            ignored (minidist's backend decides where arrays live).
        init_scale: the first S (default 2^16).
        growth_factor: S *= this after ``growth_interval`` steps without inf/NaN (> 1).
        backoff_factor: S *= this after a step with inf/NaN (in (0, 1)).
        growth_interval: good steps before growing (>= 1).
        enabled: False: ``scale`` returns the loss, ``step`` just steps, ``update`` does nothing.
        group: a communicator over which to agree on skipping (ZeRO/FSDP: the data-parallel group);
            then ``unscale_`` (or ``step``) is collective.

    Attributes: ``skipped_steps`` (steps skipped so far, kept in ``state_dict``).

    Differences from PyTorch (tests/torch_oracle/test_torch_oracle_amp_fsdp_memory.py compares the two): the
    scale is a Python float, not a tensor; ``state_dict`` has one more key, ``skipped_steps`` (each library
    loads the other's); the arguments are checked (torch takes any factor); ``step`` on an optimizer whose
    parameters have no gradient steps it (torch asserts) so that every rank of ``group`` reaches the
    collective; ``scale`` of a non-Tensor is a ``TypeError`` (torch: ``ValueError``).

    Raises ``ValueError`` for factors or an interval out of range, another device, or (``unscale_``,
    ``step``) float16 parameters, PyTorch's "Attempting to unscale FP16 gradients."; ``RuntimeError``
    for calls out of order (``unscale_`` twice, or after ``step``, before ``update``; ``step`` twice;
    ``update`` with no ``step``/``unscale_`` since the last ``update``), PyTorch's texts, and for a
    scale backed off to 0 (the loss itself is then inf/NaN).
    """

    def __init__(
        self,
        device: str | None = None,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        group: Any = None,
    ) -> None:
        if device not in (None, "cpu", "cuda"):  # torch.amp.GradScaler's first argument
            raise ValueError(
                f"GradScaler: the first argument is the device, 'cpu' or 'cuda' (as torch.amp.GradScaler; "
                f"accepted and ignored: minidist's backend decides), got {device!r}; pass the scale as "
                "init_scale=..."
            )
        if not 0 < init_scale < math.inf:  # inf: every loss would overflow and every step be skipped
            raise ValueError(f"GradScaler: init_scale must be positive and finite, got {init_scale}")
        if not growth_factor > 1.0:
            raise ValueError(f"GradScaler: growth_factor must be > 1 got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"GradScaler: backoff_factor must lie in (0, 1), got {backoff_factor}")
        if int(growth_interval) != growth_interval or growth_interval < 1:
            raise ValueError(f"GradScaler: growth_interval must be an integer >= 1, got {growth_interval}")
        self._enabled = bool(enabled)
        self._scale = float(init_scale)
        self._growth_factor, self._backoff_factor = float(growth_factor), float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._growth_tracker = 0  # good steps since the scale last changed
        self.skipped_steps = 0
        self.group = group
        self._per_optimizer: dict[int, dict[str, Any]] = {}  # id(optimizer) -> {"stage", "found_inf"}

    def is_enabled(self) -> bool:
        return self._enabled

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = int(new_interval)

    def get_scale(self) -> float:
        """The current scale S (1.0 when disabled), a Python float."""
        return self._scale if self._enabled else 1.0

    def scale(self, outputs: Any) -> Any:
        """``outputs`` (a loss Tensor, or a list/tuple of them) times S; unchanged when disabled.

        A 2-byte float loss (float16, bfloat16) is cast to float32 first, as PyTorch's float32 scale
        promotes it: 2^16 times a float16 loss above 1 is inf (float16's largest value is 65504), which
        would skip every step. The cast is differentiable: the gradient reaches the loss in its dtype."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        if not isinstance(outputs, Tensor):
            raise TypeError(f"GradScaler.scale: expected a Tensor (the loss), got {type(outputs).__name__}")
        if is_low(outputs.dtype):
            outputs = outputs.float()
        return outputs * self._scale

    def unscale_(self, optimizer: Any) -> None:
        """Divide the gradients of ``optimizer``'s parameters by S, in place, and note whether any is
        inf/NaN (agreed over ``group`` when given: collective). Call it at most once per step, before
        ``step``, e.g. to clip the true gradients. Raises ``RuntimeError`` when called twice or after
        ``step`` before ``update``."""
        if not self._enabled:
            return
        state = self._state(optimizer)
        if state["stage"] == _UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update()."
            )
        if state["stage"] == _STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        if not self._scale > 0:  # backed off to 0 (float underflow): 1/S would be a ZeroDivisionError
            raise RuntimeError(
                f"GradScaler: the loss scale has backed off to {self._scale} after {self.skipped_steps} "
                "skipped steps: the gradients are inf/NaN whatever the scale, so the loss itself is probably "
                "inf/NaN (check the data, the learning rate, the model's output)"
            )
        params = _parameters(optimizer)
        # float16 parameters (not float32 master weights): the unscaled update would be lost to their
        # rounding. Checked on the parameters, which every rank of a group holds (a gradient may be
        # missing on one), so all ranks raise before the collective. PyTorch's text, then the fix.
        if any(p.dtype == np.float16 for p in params):
            raise ValueError(
                "Attempting to unscale FP16 gradients. GradScaler is for float32 parameters (master "
                "weights) trained under minidist.autocast('float16'); keep the model in float32"
            )
        inverse = 1.0 / self._scale  # exact: S is a power of two with the default factors
        found = False
        for p in params:
            g = p.grad
            if g is None:
                continue
            g *= g.dtype.type(inverse)
            if not found and not bool(backend.array_module(g).isfinite(g).all()):
                found = True
        state["found_inf"] = self._agree(found)
        state["stage"] = _UNSCALED

    def _agree(self, found: bool) -> bool:
        """``found`` on any rank of ``group`` (one all_reduce(max) of one number), else ``found``."""
        if self.group is None:
            return found
        import minidist.distributed as dist  # noqa: PLC0415  (MPI only when a group is given)

        flag = np.array([1.0 if found else 0.0])
        dist.all_reduce(flag, op="max", group=self.group)
        return bool(flag[0] > 0)

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """``optimizer.step()`` unless a gradient is inf/NaN (then the step is skipped and counted in
        ``skipped_steps``). Unscales first if ``unscale_`` was not called. Returns what step returns,
        None when skipped. Raises ``RuntimeError`` if called twice before ``update``."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        state = self._state(optimizer)
        if state["stage"] == _STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] == _READY:
            self.unscale_(optimizer)
        state["stage"] = _STEPPED
        if state["found_inf"]:
            return None  # parameters and optimizer state untouched: the step never happened
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale: float | None = None) -> None:
        """Adapt S after the step(s): back off if any optimizer found inf/NaN, grow after
        ``growth_interval`` good steps; or set it to ``new_scale``. Then a new step may begin.
        Raises ``RuntimeError`` when no ``step`` (or ``unscale_``) came since the last ``update``: a
        second ``update`` would otherwise count a step that never ran towards growing the scale."""
        if not self._enabled:
            return
        if not self._per_optimizer and new_scale is None:
            # Counting a step that never checked its gradients would grow the scale for nothing. PyTorch's
            # text, word for word (tests/torch_oracle/test_torch_oracle_amp_fsdp_memory.py): call
            # step(optimizer) first.
            raise RuntimeError("No inf checks were recorded prior to update.")
        found = any(s["found_inf"] for s in self._per_optimizer.values())
        if found:
            self.skipped_steps += 1
        if new_scale is not None:
            self._scale = float(new_scale)
        elif found:
            self._scale *= self._backoff_factor
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self._growth_interval:
                if math.isfinite(self._scale * self._growth_factor):  # as PyTorch: never grow to inf,
                    self._scale *= self._growth_factor  # which no backoff could bring back
                self._growth_tracker = 0
        self._per_optimizer = {}

    def _state(self, optimizer: Any) -> dict[str, Any]:
        return self._per_optimizer.setdefault(id(optimizer), {"stage": _READY, "found_inf": False})

    def state_dict(self) -> dict[str, Any]:
        """Plain numbers (JSON-serialisable, for ``checkpoint.save(..., extra=)``); {} when disabled."""
        if not self._enabled:
            return {}
        return {
            "scale": self._scale,
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._growth_tracker,
            "skipped_steps": self.skipped_steps,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned. Raises ``RuntimeError`` for an empty one (a disabled
        scaler's), as PyTorch."""
        if not self._enabled:
            return
        if not state_dict:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved from a disabled "
                "instance of GradScaler."
            )
        self._scale = float(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._growth_tracker = int(state_dict["_growth_tracker"])
        self.skipped_steps = int(state_dict.get("skipped_steps", 0))

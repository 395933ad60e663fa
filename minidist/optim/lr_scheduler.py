"""Learning-rate schedules, as ``torch.optim.lr_scheduler``: each sets ``group["lr"]`` of its optimizer.

Use: build the scheduler after the optimizer, call ``scheduler.step()`` once after every
``optimizer.step()``. Construction already sets the rate of step 0, as PyTorch does. Each rate is a
closed-form function of the step count (PyTorch's ``_get_closed_form_lr``): ``lr_at(base_lr, t)``,
with ``base_lr`` the group's ``"initial_lr"`` (its ``lr`` when the first scheduler was attached).

Warmup then cosine decay, the schedule of most transformer training (Loshchilov & Hutter 2017,
"SGDR", eq. 5 for the cosine; Goyal et al. 2017, "Accurate, Large Minibatch SGD", §2.2 for the linear
warmup), is ``cosine_with_warmup(...)``: a ``SequentialLR`` of ``LinearLR`` and ``CosineAnnealingLR``,
which is how PyTorch spells it too.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from typing import Any


class LRScheduler:
    """Base class: subclasses define ``lr_at(base_lr, t)``, the rate after ``t`` calls of ``step()``.

    ``last_epoch`` counts the calls (PyTorch's name; it counts whatever you step per: steps or epochs).
    Arguments get torch's checks and messages (NaN fails each); one torch takes but crashes on at the first
    ``step()`` is refused, with our message. Raises ``TypeError`` for an object without ``param_groups``."""

    def __init__(self, optimizer: Any) -> None:
        if not hasattr(optimizer, "param_groups"):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])  # a second scheduler starts from the same base
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = -1
        self.step()

    def lr_at(self, base_lr: float, t: int) -> float:
        raise NotImplementedError

    def step(self) -> None:
        """Advance one step and write the new rates into the optimizer's groups."""
        self.last_epoch += 1
        self._apply()

    def _apply(self) -> None:
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = self.lr_at(base, self.last_epoch)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        """The rate of every group as the last ``step()`` (or the constructor) set it."""
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        """Everything but the optimizer (and functions, which a checkpoint cannot hold)."""
        return {k: v for k, v in self.__dict__.items() if k != "optimizer" and not callable(v)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore ``state_dict()``'s values. The group rates come back with the optimizer's own state."""
        self.__dict__.update(state_dict)


class LambdaLR(LRScheduler):
    """lr = base_lr * lr_lambda(t); ``lr_lambda`` one function, or a list of one per group (or ValueError)."""

    def __init__(self, optimizer: Any, lr_lambda: Callable[[int], float] | Sequence[Callable]) -> None:
        n = len(optimizer.param_groups)
        lambdas = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * n
        if len(lambdas) != n:
            raise ValueError(f"Expected {n} lr_lambdas, but got {len(lambdas)}")
        self.lr_lambdas = lambdas
        super().__init__(optimizer)

    def _apply(self) -> None:
        for k, (group, base) in enumerate(zip(self.optimizer.param_groups, self.base_lrs)):
            group["lr"] = base * self.lr_lambdas[k](self.last_epoch)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in super().state_dict().items() if k != "lr_lambdas"}


class StepLR(LRScheduler):
    """lr = base_lr * gamma^floor(t / step_size). Raises ``ValueError`` for step_size < 1."""

    def __init__(self, optimizer: Any, step_size: int, gamma: float = 0.1) -> None:
        if not step_size >= 1:
            raise ValueError(f"StepLR: step_size must be >= 1, got {step_size}")
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer)

    def lr_at(self, base_lr: float, t: int) -> float:
        return base_lr * self.gamma ** (t // self.step_size)


class LinearLR(LRScheduler):
    """lr = base_lr * (s + (e - s) * min(t, total_iters) / total_iters), s/e the start/end factors.
    Raises ``ValueError`` unless 0 < start_factor <= 1, 0 <= end_factor <= 1 and total_iters >= 1."""

    def __init__(
        self, optimizer: Any, start_factor: float = 1 / 3, end_factor: float = 1.0, total_iters: int = 5
    ) -> None:
        if not 0 < start_factor <= 1:
            raise ValueError(
                "Starting multiplicative factor expected to be greater than 0 and less or equal to 1."
            )
        if not 0 <= end_factor <= 1:
            raise ValueError("Ending multiplicative factor expected to be between 0 and 1.")
        if not total_iters >= 1:
            raise ValueError(f"LinearLR: total_iters must be >= 1, got {total_iters}")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer)

    def lr_at(self, base_lr: float, t: int) -> float:
        s, e = self.start_factor, self.end_factor
        return base_lr * (s + (e - s) * min(t, self.total_iters) / self.total_iters)


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base_lr - eta_min) (1 + cos(pi t / T_max)) / 2 (SGDR, eq. 5, without restarts).
    Raises ``ValueError`` for T_max < 1."""

    def __init__(self, optimizer: Any, T_max: int, eta_min: float = 0.0) -> None:  # noqa: N803 (torch's name)
        if not T_max >= 1:
            raise ValueError(f"CosineAnnealingLR: T_max must be >= 1, got {T_max}")
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer)

    def lr_at(self, base_lr: float, t: int) -> float:
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * t / self.T_max)) / 2


class SequentialLR(LRScheduler):
    """``schedulers[k]`` from step ``milestones[k-1]`` on, restarted at its own step 0 there. Raises
    ``ValueError`` unless there is a scheduler, every one drives ``optimizer``, and there is one
    milestone fewer than schedulers (torch's checks), the milestones increasing (ours)."""

    def __init__(self, optimizer: Any, schedulers: Sequence[LRScheduler], milestones: Sequence[int]) -> None:
        if not schedulers:
            raise ValueError("SequentialLR expects at least one scheduler, but got no scheduler.")
        for k, s in enumerate(schedulers):
            if s.optimizer is not optimizer:
                raise ValueError(
                    "SequentialLR expects all schedulers to belong to the same optimizer, but got scheduler "
                    f"{type(s).__name__} at index {k} has {s.optimizer}, which is different from "
                    f"{type(optimizer).__name__}."
                )
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(
                "Sequential Schedulers expects number of schedulers provided to be one more than the number "
                f"of milestone points, but got number of schedulers {len(schedulers)} and the number of "
                f"milestones to be equal to {len(milestones)}"
            )
        if list(milestones) != sorted(milestones):
            raise ValueError(f"SequentialLR: milestones must increase, got {list(milestones)}")
        self.schedulers, self.milestones = list(schedulers), list(milestones)
        for scheduler in self.schedulers:  # undo their construction steps: the first starts at step 0 below
            scheduler.last_epoch -= 1
        super().__init__(optimizer)

    def step(self) -> None:
        self.last_epoch += 1
        k = bisect.bisect_right(self.milestones, self.last_epoch)
        current = self.schedulers[k]
        current.last_epoch = (
            0 if k > 0 and self.milestones[k - 1] == self.last_epoch else current.last_epoch + 1
        )
        current._apply()
        self._last_lr = current.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in super().state_dict().items() if k != "schedulers"}
        return out | {"schedulers": [s.state_dict() for s in self.schedulers]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        for scheduler, sub in zip(self.schedulers, state.pop("schedulers")):
            scheduler.load_state_dict(sub)
        self.__dict__.update(state)


def cosine_with_warmup(
    optimizer: Any, warmup_steps: int, total_steps: int, eta_min: float = 0.0, start_factor: float = 1e-3
) -> SequentialLR:
    """Linear warmup from ``start_factor * lr`` to ``lr`` over ``warmup_steps``, then cosine decay to
    ``eta_min`` at ``total_steps``: ``SequentialLR([LinearLR, CosineAnnealingLR], [warmup_steps])``, the
    same schedule as that composition in PyTorch. ``ValueError`` unless 1 <= warmup_steps < total_steps."""
    if not 1 <= warmup_steps < total_steps:
        raise ValueError(
            f"cosine_with_warmup: needs 1 <= warmup_steps < total_steps, got {warmup_steps}, {total_steps}"
        )
    warmup = LinearLR(optimizer, start_factor=start_factor, total_iters=warmup_steps)
    decay = CosineAnnealingLR(optimizer, T_max=total_steps - warmup_steps, eta_min=eta_min)
    return SequentialLR(optimizer, [warmup, decay], milestones=[warmup_steps])

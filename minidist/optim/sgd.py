"""Stochastic gradient descent with momentum, Nesterov momentum and L2 weight decay."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from minidist.autograd import Tensor, no_grad
from minidist.optim.optimizer import Optimizer


class SGD(Optimizer):
    """SGD in PyTorch's formulation (Sutskever et al. 2013 for momentum and Nesterov):

    g = grad + weight_decay * p
    b = g on the first step, else momentum * b + (1 - dampening) * g
    g = g + momentum * b if nesterov else b           (only when momentum > 0)
    p = p - lr * g

    ``params``: tensors, or parameter groups (dicts, as PyTorch) whose values override these
    arguments. Defaults are torch's. Raises ``ValueError`` as torch does (for the arguments or any
    group): lr, momentum or weight_decay below 0 or NaN, nesterov without momentum or with dampening.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        super().__init__(
            params,
            dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov),
        )

    def check_group(self, group: dict[str, Any]) -> None:
        super().check_group(group)
        for name in ("momentum", "weight_decay"):  # torch's order
            if not 0.0 <= group[name]:
                raise ValueError(f"Invalid {name} value: {group[name]}")
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")

    def step(self) -> None:
        """Update every parameter that has a gradient, in place, with its group's values."""
        with no_grad():
            i = -1  # the parameter's index into self.state, counted over all groups
            for group in self.param_groups:
                # A group's values are read once per step, not per parameter (a scheduler may change
                # them between steps, never within one).
                lr, momentum, dampening = group["lr"], group["momentum"], group["dampening"]
                weight_decay, nesterov = group["weight_decay"], group["nesterov"]
                for p in group["params"]:
                    i += 1
                    if p.grad is None:
                        continue
                    g = p.grad
                    if weight_decay:
                        g = g + weight_decay * p.data
                    if momentum:
                        state = self.state.setdefault(i, {})
                        if "momentum_buffer" not in state:
                            state["momentum_buffer"] = g.copy()
                        else:
                            buf = state["momentum_buffer"]
                            buf *= momentum
                            buf += (1 - dampening) * g
                        buf = state["momentum_buffer"]
                        g = g + momentum * buf if nesterov else buf
                    p.data -= lr * g
        self.step_count += 1

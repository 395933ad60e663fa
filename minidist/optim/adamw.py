"""AdamW: Adam with decoupled weight decay (Loshchilov & Hutter 2019, Algorithm 2)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from minidist.autograd import Tensor, no_grad
from minidist.optim.optimizer import Optimizer


class AdamW(Optimizer):
    """AdamW (Kingma & Ba 2015 for Adam; Loshchilov & Hutter 2019 for the decoupled decay):

    p = p * (1 - lr * weight_decay)
    m = beta1 m + (1 - beta1) g,     v = beta2 v + (1 - beta2) g^2
    p = p - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)

    Defaults are PyTorch's. ``params``: tensors, or parameter groups (dicts, as PyTorch) whose values
    override these arguments. Raises ``ValueError`` as torch does (for the arguments or any group): lr,
    eps or weight_decay below 0, betas outside [0, 1), any of them NaN.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    def check_group(self, group: dict[str, Any]) -> None:
        super().check_group(group)
        if not 0.0 <= group["eps"]:
            raise ValueError(f"Invalid epsilon value: {group['eps']}")
        for k, beta in enumerate(group["betas"]):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"Invalid beta parameter at index {k}: {beta}")
        if not 0.0 <= group["weight_decay"]:
            raise ValueError(f"Invalid weight_decay value: {group['weight_decay']}")

    def step(self) -> None:
        """Update every parameter that has a gradient, in place, with its group's values."""
        self.step_count += 1
        with no_grad():
            for d, i, p in self.indexed_groups():
                if p.grad is None:
                    continue
                beta1, beta2 = d["betas"]
                g = p.grad
                state = self.state.setdefault(i, {})
                if "exp_avg" not in state:
                    state["exp_avg"] = g * 0
                    state["exp_avg_sq"] = g * 0
                    state["step"] = 0
                # Steps are counted per parameter (as PyTorch does): a parameter whose first gradient
                # arrives late gets the bias correction of its own first step.
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                p.data *= 1 - d["lr"] * d["weight_decay"]
                m *= beta1
                m += (1 - beta1) * g
                v *= beta2
                v += (1 - beta2) * g * g
                m_hat = m / (1 - beta1**t)
                v_hat = v / (1 - beta2**t)
                p.data -= d["lr"] * m_hat / (v_hat**0.5 + d["eps"])

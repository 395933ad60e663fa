"""Training steps through a ``Replay``, or the same steps written out eagerly: what replay tests compare."""

from __future__ import annotations

from typing import Any

from minidist.compile import Replay
from minidist.nn.utils import clip_grad_norm_


def train_steps(step: Replay, batches: list[tuple[Any, Any]], replay: bool) -> list[float]:
    """The loss of each step on ``batches``: through ``step`` if ``replay``, else the step ``step`` records,
    by hand with its model, optimizer and loss (forward, backward, clip, optimizer step, zero_grad)."""
    losses = []
    for x, y in batches:
        if replay:
            losses.append(step(x, y).item())
            continue
        loss = step.loss_fn(x, y)
        loss.backward()
        if step.max_grad_norm is not None:
            clip_grad_norm_(step.model.parameters(), step.max_grad_norm)
        step.optimizer.step()
        step.optimizer.zero_grad()
        losses.append(loss.item())
    return losses

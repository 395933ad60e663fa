"""Grad mode and the state of the backward pass: the autograd package's module-level state, all of it.

Read first in ``minidist/autograd/`` (then ``tensor.py``, ``function.py``, ``graph.py``). Two things
live here, each in ONE module variable that every other file reads through this module (never a copy
taken by ``from ... import _grad_enabled``, which would not see later changes):

* grad mode: ``no_grad()`` / ``enable_grad()`` switch ``_grad_enabled``, which ``Function.apply``
  reads to decide whether to record the graph;
* the running backward pass: ``run_pass`` (called by ``Tensor.backward``) counts passes and runs the
  callbacks that hooks queued with ``queue_callback`` (DistributedDataParallel's end of pass) once the
  graph walk is done.

Source: the API of PyTorch's ``torch.no_grad``, ``torch.enable_grad`` and
``Variable._execution_engine.queue_callback`` (Paszke et al. 2019).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

_grad_enabled = True  # False inside no_grad(): ops record no graph


class _GradMode(contextlib.ContextDecorator):
    """Sets grad mode for a ``with`` block (or a decorated function) and restores the previous one.

    A class, not a ``@contextlib.contextmanager`` generator: entering and leaving one costs 7,400
    instructions instead of 13,100 (callgrind, docs/performance.md, "What the cuts took out"), and
    every optimizer step enters one. The previous mode is restored on an exception too.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.previous: list[bool] = []  # a stack: the same object may be entered again while in use

    def __enter__(self) -> None:
        global _grad_enabled
        self.previous.append(_grad_enabled)
        _grad_enabled = self.enabled

    def __exit__(self, *exc: object) -> None:
        global _grad_enabled
        _grad_enabled = self.previous.pop()


def no_grad() -> contextlib.AbstractContextManager[None]:
    """Context manager: ops inside record no graph (for evaluation and optimizer updates)."""
    return _GradMode(False)


def enable_grad() -> contextlib.AbstractContextManager[None]:
    """Context manager: ops inside record the graph even within ``no_grad()`` (as ``torch.enable_grad``).

    Activation recomputation needs it: it records a segment's graph during a backward pass that the
    caller may have started under ``no_grad()``.
    """
    return _GradMode(True)


def is_grad_enabled() -> bool:
    """False inside ``no_grad()``."""
    return _grad_enabled


# --- callbacks run when the current backward pass ends (used by DistributedDataParallel) ---------
_end_of_backward_callbacks: list[Callable[[], None]] = []
_in_backward = False
_backward_passes = 0  # how many backward passes have started in this process


def backward_pass_count() -> int:
    """The number of backward passes started so far; a hook can tell one pass from the next with it.

    DDP stores it when it queues its end-of-pass callback: if a later pass sees a different number
    while the callback is still pending, the earlier pass failed (its callback was dropped).
    """
    return _backward_passes


def queue_callback(callback: Callable[[], None]) -> None:
    """Run ``callback()`` once, after the backward pass that is running now has finished.

    Raises ``RuntimeError`` outside a backward pass. DDP uses it to finish its gradient
    communication before ``loss.backward()`` returns, as PyTorch's autograd engine does.
    """
    if not _in_backward:
        raise RuntimeError("queue_callback() can only be called from a hook during backward()")
    _end_of_backward_callbacks.append(callback)


def run_pass(walk: Callable[[], None]) -> None:
    """Run one backward pass: ``walk()`` (the graph walk), then the callbacks queued during it.

    ``Tensor.backward`` calls it. Errors from ``walk`` propagate; a failed pass drops its queued
    callbacks, so they cannot run at the end of the next, unrelated pass.
    """
    global _in_backward, _backward_passes
    _in_backward = True
    _backward_passes += 1
    succeeded = False
    try:
        walk()
        succeeded = True
    finally:
        _in_backward = False
        if not succeeded:  # a failed pass must not leave callbacks for the next, unrelated one
            _end_of_backward_callbacks.clear()
    callbacks = list(_end_of_backward_callbacks)
    _end_of_backward_callbacks.clear()
    for callback in callbacks:
        callback()

"""Reverse-mode automatic differentiation: ``Tensor``, ``Function`` and ``backward``.

A ``Tensor`` wraps a backend array (NumPy or CuPy). Every differentiable operation is a ``Function``
subclass (in ``minidist/ops/``); calling one on tensors that require gradients records it on the
result, so the tensors form a directed acyclic graph that ``loss.backward()`` walks once, in reverse,
accumulating gradients into the leaves' ``.grad`` as PyTorch does.

Reading order, one concept per file:

1. ``grad_mode.py``: ``no_grad`` / ``enable_grad`` and the state of the running backward pass
   (``queue_callback``): the package's only module-level state;
2. ``tensor.py``: ``Tensor`` (data, version counter, operators, ``backward``) and ``tensor()``;
3. ``function.py``: ``Function`` (``apply`` records the graph; saved-version checks; ``release``);
4. ``graph.py``: ``run_backward``, the one graph walk.

This file only re-exports their public names, so ``from minidist.autograd import Tensor`` and
``autograd.no_grad()`` work as before the split.

The one import circle of minidist, on purpose: ``tensor.py`` imports ``minidist.ops`` (``x + y`` calls
``ops.add``) and every op imports ``Tensor`` and ``Function`` from here. ``torch.Tensor``'s operators
call its ops the same way; splitting the circle would take the operators off the tensor, or hide
them behind a registry, and a student would lose the line that shows what ``+`` does.

Source: the chain rule in reverse mode, as in Griewank & Walther, "Evaluating Derivatives" (2008),
ch. 3; the API follows PyTorch (Paszke et al. 2019) and the code layout micrograd (Karpathy 2020).
"""

from __future__ import annotations

from typing import Any

from minidist.autograd import grad_mode
from minidist.autograd.grad_mode import (
    backward_pass_count,
    enable_grad,
    is_grad_enabled,
    no_grad,
    queue_callback,
)

# tensor.py first: it loads minidist.ops, whose ops need Tensor (and then load function.py).
# isort: off
from minidist.autograd.tensor import DEFAULT_DTYPE, Tensor, bump_version, tensor
from minidist.autograd.function import Function, _asarray_like, _lift
from minidist.autograd.graph import run_backward

# isort: on

__all__ = [
    "DEFAULT_DTYPE",
    "Function",
    "Tensor",
    "backward_pass_count",
    "bump_version",
    "enable_grad",
    "is_grad_enabled",
    "no_grad",
    "queue_callback",
    "run_backward",
    "tensor",
    "_asarray_like",
    "_lift",
]


def __getattr__(name: str) -> Any:
    """``autograd._grad_enabled`` (and the pass state) read from ``grad_mode``, where it lives.

    Re-exporting those by ``from grad_mode import _grad_enabled`` would copy the value once and never
    see ``no_grad()`` change it; a module ``__getattr__`` (PEP 562) reads the current one.
    """
    if name in ("_grad_enabled", "_in_backward", "_backward_passes"):
        return getattr(grad_mode, name)
    raise AttributeError(f"module 'minidist.autograd' has no attribute {name!r}")

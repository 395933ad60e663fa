"""In-place updates of a tensor: ``x += y`` (and -=, *=, /=), ``add_ sub_ mul_ div_ copy_ zero_``.

They change ``x.data`` itself (every reference to the array sees the change) and bump
``x._version``, so that an op which saved ``x`` for its backward notices (see
``Function.check_saved_versions``). They follow PyTorch's rules:

* inside ``no_grad()``, or on tensors that are not part of a graph, the array is updated in place:
  ``with md.no_grad(): p -= lr * p.grad`` is the plain SGD step;
* a leaf that requires grad may not be updated in place while gradients are recorded (torch raises
  "a leaf Variable that requires grad is being used in an in-place operation."): the graph would
  lose the value it was built from;
* a tensor inside the graph (a non-leaf, or a constant combined with one that requires grad) is not
  updated in place, because the autograd graph here cannot record in-place ops. ``y += 1`` then binds
  ``y`` to the new result ``y + 1`` (the old tensor is unchanged; other names for it still see the old
  value), which gives the gradients torch gives. ``y.add_(1)`` raises instead, since its whole point is
  to change the tensor that other names share.
"""

from __future__ import annotations

from typing import Any

from minidist.autograd import grad_mode
from minidist.autograd.tensor import Tensor
from minidist.backend import array_module
from minidist.ops import arithmetic

_UFUNCS = {"add": "add", "sub": "subtract", "mul": "multiply", "div": "true_divide"}
_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


def _records_graph(x: Tensor, other: Any) -> bool:
    other_grad = isinstance(other, Tensor) and other.requires_grad
    return grad_mode.is_grad_enabled() and (x.requires_grad or other_grad)


def _check_leaf(x: Tensor) -> None:
    if grad_mode.is_grad_enabled() and x.requires_grad and x.is_leaf:
        raise RuntimeError(
            "a leaf Variable that requires grad is being used in an in-place operation. Update "
            "parameters inside `with md.no_grad():` (as optimizers do), or assign `x.data = ...`."
        )


def _apply(x: Tensor, other: Any, op: str, alpha: Any = 1) -> Tensor:
    """``x.data op= other`` (``copy``: ``x.data[...] = other``) and bump the version."""
    value = other.data if isinstance(other, Tensor) else other
    if op == "copy":
        x.data[...] = value
    else:
        if alpha != 1:
            value = value * alpha
        ufunc = getattr(array_module(x.data), _UFUNCS[op])
        try:
            ufunc(x.data, value, out=x.data)
        except TypeError as e:  # NumPy's UFuncTypeError: e.g. an int tensor /= 2 or += 0.5
            raise RuntimeError(
                f"result type of {x.dtype} {_SYMBOLS[op]} {type(value).__name__} can't be cast to the "
                f"tensor's dtype {x.dtype} in place ({e}); write x = x {_SYMBOLS[op]} other instead, "
                "or convert x first with x.to(...)"
            ) from None
    x._version += 1
    return x


def update(x: Tensor, other: Any, op: str) -> Tensor:
    """``x op= other`` for ``op`` in add/sub/mul/div: in place, or ``x op other`` inside a graph.

    Raises ``RuntimeError`` on a leaf that requires grad while gradients are recorded, and when the
    result cannot be stored in ``x``'s dtype (int tensor ``/= 2``).
    """
    _check_leaf(x)
    if _records_graph(x, other):  # a non-leaf: the graph cannot record in place; rebind the name
        return getattr(arithmetic, op)(x, other)
    return _apply(x, other, op)


def update_(x: Tensor, other: Any, op: str, alpha: Any = 1) -> Tensor:
    """``add_ sub_ mul_ div_ copy_ zero_``: always in place, on ``x`` itself; returns ``x``.

    Raises ``RuntimeError`` on a tensor of the graph while gradients are recorded (a leaf that
    requires grad as in torch; a non-leaf because minidist cannot record in-place ops).
    """
    _check_leaf(x)
    if _records_graph(x, other):
        raise RuntimeError(
            f"{op}_() on a tensor inside the autograd graph: minidist does not record in-place ops; "
            f"write y = y {_SYMBOLS.get(op, '+')} other (out of place), or do it inside md.no_grad()"
        )
    return _apply(x, other, op, alpha)

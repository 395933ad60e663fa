"""``Optimizer``: the base class that holds parameters, per-parameter state and hyperparameters."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from minidist import backend
from minidist.autograd import Tensor


class Optimizer:
    """Base class. Subclasses implement ``step()``; updates happen in place on ``param.data``.

    ``state[i]`` holds the arrays of the i-th parameter (e.g. a momentum buffer), so that
    ``state_dict()`` can name them by index, as PyTorch does.

    Raises ``ValueError`` for an empty parameter list or a non-positive learning rate, and
    ``TypeError`` for something that is not a tensor.
    """

    def __init__(self, params: Iterable[Tensor], defaults: dict[str, Any]) -> None:
        self.params: list[Tensor] = []
        seen: set[int] = set()
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizers take tensors (model.parameters()), got a {type(p).__name__}")
            if id(p) not in seen:  # a parameter shared by two layers is updated once
                seen.add(id(p))
                self.params.append(p)
        if not self.params:
            raise ValueError("optimizer got an empty parameter list; pass model.parameters()")
        if defaults.get("lr", 1.0) <= 0:
            raise ValueError(f"learning rate must be positive, got lr={defaults['lr']}")
        self.defaults = dict(defaults)
        self.state: dict[int, dict[str, Any]] = {}
        self.step_count = 0

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients: set ``.grad`` to None (default, as PyTorch) or fill it with zeros."""
        clear_grads(self.params, set_to_none)

    def step(self) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """``{"state": {index: {name: array copy or int}}, "defaults": {...}, "step_count": int}``.

        Arrays (e.g. momentum buffers, of the parameter's shape) are copied; integer counters (AdamW's
        per-parameter ``step``) are stored as Python ints.
        """
        return {
            "state": {i: {k: _copy(v) for k, v in s.items()} for i, s in self.state.items()},
            "defaults": copy.deepcopy(self.defaults),
            "step_count": self.step_count,
        }

    def load_state_dict(self, state_dict: dict[str, Any], copy: bool = True) -> None:
        """Restore what ``state_dict()`` returned; nothing changes unless all of it fits.

        The arrays are copied, so the caller's dict stays independent of the optimizer (as in
        PyTorch). ``copy=False`` takes them over instead, for a caller whose arrays nobody else holds:
        ``minidist.checkpoint.load`` passes freshly read arrays and saves copying the whole state.

        Raises ``ValueError`` if the state names a parameter index that does not exist or holds an
        array whose shape differs from its parameter's (it belongs to another model).
        """
        for i, s in state_dict["state"].items():
            i = int(i)
            if not 0 <= i < len(self.params):
                raise ValueError(
                    f"optimizer state has an entry for parameter {i}, but there are {len(self.params)}"
                )
            for name, value in s.items():
                if hasattr(value, "shape") and tuple(value.shape) != self.params[i].shape:
                    raise ValueError(
                        f"optimizer state {name!r} of parameter {i} has shape {tuple(value.shape)}, "
                        f"expected {self.params[i].shape}"
                    )
        self.state = {
            int(i): {k: _take(v, copy) if hasattr(v, "shape") else v for k, v in s.items()}
            for i, s in state_dict["state"].items()
        }
        self.defaults.update(state_dict["defaults"])
        self.step_count = int(state_dict["step_count"])


def _take(array: Any, copy: bool) -> Any:
    """``array`` on the backend, as a private copy or (``copy=False``) as it is when already there."""
    on_backend = backend.asarray(array)
    return on_backend.copy() if copy or not _writable(on_backend) else on_backend


def _writable(array: Any) -> bool:
    """Steps update the state in place, so an array taken over must be writable and contiguous."""
    flags = getattr(array, "flags", None)
    return flags is None or (getattr(flags, "writeable", True) and flags.c_contiguous)


def _copy(value: Any) -> Any:
    return value.copy() if hasattr(value, "copy") else value


def clear_grads(params: Iterable[Tensor], set_to_none: bool = True) -> None:
    """Set each tensor's ``.grad`` to None, or (``set_to_none=False``) fill an existing one with zeros."""
    for p in params:
        if set_to_none or p.grad is None:
            p.grad = None
        else:
            p.grad[...] = 0

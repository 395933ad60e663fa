"""``Module`` and ``Parameter``: the containers that hold a model's weights.

Assigning a ``Parameter`` or a ``Module`` to an attribute registers it (``self.fc = Linear(...)``),
so ``parameters()``, ``state_dict()`` and ``train()``/``eval()`` can walk the tree of submodules.
Parameter names are dotted paths, as in PyTorch: ``"0.weight"``, ``"encoder.fc1.bias"``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from minidist import backend
from minidist.autograd import Tensor


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict`` did not match: parameters absent from the dict, its keys not in the model."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class Parameter(Tensor):
    """A leaf tensor that a ``Module`` registers as a weight; requires grad by default.

    Tensor-parallel metadata (set by ``minidist.parallel.tensor_parallel`` layers, read by gradient
    clipping, pipelines and checkpoints): ``tp_dim`` is None for a parameter replicated across its
    tensor-parallel group (every ordinary parameter), or the axis along which this array is the
    ``tp_group.rank``-th of ``tp_group.size`` slices of the full tensor; ``tp_group`` is that group.
    The slices are equal when the axis divides evenly, else the first ones are one row longer
    (``numpy.array_split``'s rule); ``tp_stride`` > 1 splits each of that many equal blocks of the axis
    (attention's [q; k; v]). ``minidist/parallel/tensor_parallel/split.py`` is the one rule for all three.

    Further flags, all read by training loops, clipping and checkpoints:
    ``sequence_parallel``: a replicated parameter used on sequence shards (LayerNorm under sequence
    parallelism, Korthikanti et al. 2022): each tp rank's gradient covers only its tokens, so the
    gradients are summed over ``tp_group`` before the optimizer step.
    ``is_tied_copy``: a second copy, on another pipeline stage, of a parameter stored under the same name
    (the output head tied to the token embedding): its gradient is combined with the original's, and
    checkpoints save only the original.
    """

    tp_dim: int | None = None
    tp_group: Any = None
    tp_stride: int = 1
    sequence_parallel: bool = False
    is_tied_copy: bool = False

    def __init__(self, data: Any, requires_grad: bool = True) -> None:
        if isinstance(data, Tensor):
            data = data.data
        super().__init__(backend.asarray(data), requires_grad=requires_grad)

    def __repr__(self) -> str:
        return f"Parameter(shape={self.shape}, dtype={self.dtype})"


class Module:
    """Base class of every layer and model: subclasses set attributes in ``__init__``, define ``forward``."""

    def __init__(self) -> None:
        # object.__setattr__ skips our own __setattr__, which needs these dicts to exist already.
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise RuntimeError(
                f"{type(self).__name__}.__init__ must call super().__init__() before setting attributes"
            )
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    # -- walking the tree ------------------------------------------------------------------------
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """Yield ``(dotted_name, module)`` for this module and all submodules, depth first."""
        yield prefix, self
        for name, child in self._modules.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def children(self) -> Iterator[Module]:
        yield from self._modules.values()

    def named_parameters(self) -> Iterator[tuple[str, Parameter]]:
        """Yield ``(dotted_name, parameter)`` in registration order; a shared parameter appears once."""
        seen: set[int] = set()
        for mod_name, module in self.named_modules():
            for name, p in module._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{mod_name}.{name}" if mod_name else name), p

    def parameters(self) -> Iterator[Parameter]:
        for _, p in self.named_parameters():
            yield p

    # -- modes and gradients ---------------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        """Set training mode (dropout active) on this module and every submodule; returns self."""
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> Module:
        """Set evaluation mode (dropout off); same as ``train(False)``."""
        return self.train(False)

    def zero_grad(self) -> None:
        """Set every parameter's ``.grad`` to None (PyTorch's default ``set_to_none=True``)."""
        for p in self.parameters():
            p.grad = None

    # -- state dict ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{dotted_name: array copy}`` for every parameter (backend arrays, detached copies)."""
        return {name: p.data.copy() for name, p in self.named_parameters()}

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> IncompatibleKeys:
        """Copy values from ``state_dict`` into the parameters, in place (optimizers keep working).

        A value may be a backend array, a minidist ``Tensor`` or ``Parameter`` (another model's
        ``named_parameters()``), anything ``numpy.asarray`` takes (a nested list, a CPU torch tensor), and
        is cast to the parameter's dtype. Nothing changes unless every value fits.

        Returns ``IncompatibleKeys(missing_keys, unexpected_keys)``, as PyTorch (both empty with ``strict``).

        Raises:
            KeyError: with ``strict``, names missing from or unexpected in ``state_dict`` (both listed).
            ValueError: a value whose shape differs from the parameter's (name and both shapes given).
        """
        params = dict(self.named_parameters())
        missing = sorted(set(params) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(params))
        if strict and (missing or unexpected):
            raise KeyError(
                f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}; "
                "pass strict=False to load the keys that match"
            )
        # Convert and check every value before copying anything, so a failed load leaves the model unchanged.
        values = {}
        for name, p in params.items():
            if name in state_dict:
                value = state_dict[name]
                value = value.data if isinstance(value, Tensor) else value
                values[name] = value if hasattr(value, "shape") else np.asarray(value)
                if tuple(values[name].shape) != p.shape:
                    raise ValueError(
                        f"load_state_dict: {name!r} has shape {tuple(values[name].shape)} in the state dict "
                        f"but {p.shape} in the model"
                    )
        for name, value in values.items():
            p = params[name]
            p.data[...] = backend.asarray(value).astype(p.dtype, copy=False)
        return IncompatibleKeys(missing, unexpected)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, child in self._modules.items():
            lines.append("  (" + name + "): " + repr(child).replace("\n", "\n  "))
        return lines[0] + ")" if len(lines) == 1 else "\n".join(lines) + "\n)"

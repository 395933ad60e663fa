"""``Optimizer``: the base class that holds parameter groups, per-parameter state and hyperparameters.

As in PyTorch, parameters come in *groups*, each a dict ``{"params": [...], "lr": ..., ...}`` whose
hyperparameters default to the constructor's: ``SGD([{"params": body}, {"params": head, "lr": 0.1}],
lr=0.01)``. ``step()`` reads each group's values at every call, so a learning-rate scheduler (or you)
changes ``optimizer.param_groups[k]["lr"]`` and the next step uses it.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable
from typing import Any

from minidist import backend
from minidist.autograd import Tensor


class Optimizer:
    """Base class. Subclasses implement ``step()`` and may check a group's values in ``check_group``;
    updates happen in place on ``param.data``. ``params`` is an iterable of tensors (one group) or of
    dicts (one group each, with a ``"params"`` key). ``self.params`` lists every parameter, group after
    group, and ``state[i]`` holds the arrays of the i-th (e.g. a momentum buffer), so that
    ``state_dict()`` names them by index, as PyTorch does. ``defaults`` fills in groups added later.

    Raises ``ValueError`` for an empty parameter list (an empty group is fine, as in torch), a parameter
    in two groups, a group without ``"params"`` or an invalid value (torch's checks and messages, on every
    group: ``lr`` must be >= 0, and NaN never is), and ``TypeError`` for something that is not a tensor.
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], defaults: dict[str, Any]) -> None:
        if isinstance(params, Tensor):
            raise TypeError("optimizers take an iterable of tensors (model.parameters()), got one Tensor")
        self.defaults = Defaults(defaults)
        self.check_group(self.defaults)
        self.param_groups: list[dict[str, Any]] = []
        self.params: list[Tensor] = []
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list; pass model.parameters()")
        for group in groups if isinstance(groups[0], dict) else [{"params": groups}]:
            self.add_param_group(group)
        self.state: dict[int, dict[str, Any]] = {}
        self.step_count = 0

    def add_param_group(self, group: dict[str, Any]) -> None:
        """Append a group ``{"params": tensors, name: value, ...}``; missing values come from ``defaults``.

        Raises ``TypeError``/``ValueError`` as the constructor does.
        """
        if not isinstance(group, dict) or "params" not in group:
            raise ValueError(
                'a parameter group must be a dict with a "params" key, e.g. {"params": model.parameters()}'
            )
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        unique: list[Tensor] = []
        seen, taken = set(), {id(q) for q in self.params}
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizers take tensors (model.parameters()), got a {type(p).__name__}")
            if getattr(p, "_fsdp_unit_name", None) is not None:
                # FSDP keeps empty arrays in the original parameters and steps shard tensors: an
                # optimizer over these would silently train nothing (duck-typed: optim imports no nn).
                raise ValueError(
                    f"a parameter of shape {tuple(p.shape)} is sharded by FullyShardedDataParallel "
                    f"(unit {p._fsdp_unit_name!r}): build the optimizer over fsdp.parameters() or "
                    "fsdp.shard_param_groups(groups), whose shard tensors FSDP trains"
                )
            if id(p) in seen:
                continue  # a parameter shared by two layers is updated once
            if id(p) in taken:
                raise ValueError("a parameter appears in more than one parameter group; list it once")
            seen.add(id(p))
            unique.append(p)
        # A group may be empty, as in torch (a pipeline stage whose layers hold no vector for the
        # no-decay group): it keeps the groups' numbering the same on every stage, which checkpoints
        # compare. Only an optimizer without any group is an error (the constructor's check).
        full = {**self.defaults, **{k: v for k, v in group.items() if k != "params"}, "params": unique}
        self.check_group(full)
        self.param_groups.append(full)
        self.params.extend(unique)

    def check_group(self, group: dict[str, Any]) -> None:
        """Raise ``ValueError`` as torch does for a bad value; subclasses add their own. Written as
        ``not 0.0 <= value``, as torch's Adam writes them: any comparison with NaN is False."""
        if not 0.0 <= group.get("lr", 0.0):
            raise ValueError(f"Invalid learning rate: {group['lr']}")

    def indexed_groups(self) -> Iterable[tuple[dict[str, Any], int, Tensor]]:
        """``(group, i, parameter)`` for every parameter, ``i`` its index into ``params`` and ``state``."""
        i = 0
        for group in self.param_groups:
            for p in group["params"]:
                yield group, i, p
                i += 1

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients: set ``.grad`` to None (default, as PyTorch) or fill it with zeros."""
        clear_grads(self.params, set_to_none)

    def step(self) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """PyTorch's layout, plus our step counter::

            {"state": {index: {name: array copy or int}},
             "param_groups": [{"lr": ..., ..., "params": [indices]}], "step_count": int}

        Arrays (e.g. momentum buffers, of the parameter's shape) are copied; integer counters (AdamW's
        per-parameter ``step``) are stored as Python ints.
        """
        groups, first = [], 0
        for g in self.param_groups:
            hyper = {k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
            groups.append({**hyper, "params": list(range(first, first + len(g["params"])))})
            first += len(g["params"])
        return {
            "state": {i: {k: _copy(v) for k, v in s.items()} for i, s in self.state.items()},
            "param_groups": groups,
            "step_count": self.step_count,
        }

    def load_state_dict(self, state_dict: dict[str, Any], copy: bool = True) -> None:
        """Restore what ``state_dict()`` returned; nothing changes unless all of it fits.

        Each group's hyperparameters (a scheduled ``lr`` included) are restored from ``"param_groups"``;
        a saved group without ``"params"`` restores values only (checkpoints do this, as ZeRO's groups
        hold a different number of shards at another data-parallel size). The older layout with
        ``"defaults"`` instead of ``"param_groups"`` sets every group's values. The arrays are copied,
        so the caller's dict stays independent of the optimizer (as in PyTorch); ``copy=False`` takes
        them over instead, for a caller whose arrays nobody else holds (``minidist.checkpoint.load``,
        with freshly read arrays, saves copying the whole state).

        Raises ``ValueError`` if the state has another number of groups or of parameters in a group
        (torch's messages, then the numbers), names a parameter index that does not exist, or holds an
        array whose shape differs from its parameter's (it belongs to another model).
        """
        saved_groups = state_dict.get("param_groups")
        if saved_groups is not None:
            if len(saved_groups) != len(self.param_groups):
                raise ValueError(
                    f"loaded state dict has a different number of parameter groups ({len(saved_groups)} "
                    f"saved, {len(self.param_groups)} here); build the optimizer with the saved groups"
                )
            for k, (saved, ours) in enumerate(zip(saved_groups, self.param_groups)):
                if "params" in saved and len(saved["params"]) != len(ours["params"]):
                    raise ValueError(
                        "loaded state dict contains a parameter group that doesn't match the size of "
                        f"optimizer's group (group {k}: {len(saved['params'])} saved, "
                        f"{len(ours['params'])} here)"
                    )
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
        if saved_groups is not None:
            for saved, ours in zip(saved_groups, self.param_groups):
                ours.update({k: v for k, v in saved.items() if k != "params"})
        if "defaults" in state_dict:
            self.defaults.update(state_dict["defaults"])
            if saved_groups is None:
                for group in self.param_groups:
                    group.update(state_dict["defaults"])
        self.step_count = int(state_dict.get("step_count", self.step_count))


class Defaults(dict):
    """``optimizer.defaults``, the values that groups added later take: writing to it warns, once."""

    def __setitem__(self, key: str, value: Any) -> None:
        if not self.__dict__.get("warned"):  # (a rate changed here would reach no existing group)
            self.warned = True
            warnings.warn(
                "opt.defaults only fills in groups added later (add_param_group); to change the rate of "
                "existing groups set group['lr'] for group in opt.param_groups",
                stacklevel=2,
            )
        super().__setitem__(key, value)

    def __reduce__(self) -> tuple:  # copies and pickles rebuild it from its items, without a warning
        return type(self), (dict(self),)


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

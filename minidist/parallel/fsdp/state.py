"""FSDP's views of the whole model: full state dicts, the optimizer's parameter groups, set-up helpers.

Outside, a user (and a checkpoint) speaks of the ORIGINAL parameters by their names; inside, a rank
holds only shard tensors, one per owned segment of a unit's flat vector (``flat_unit.py``). These
functions translate: ``full_state_dict`` all-gathers every unit into full arrays by name (PyTorch's
FULL_STATE_DICT), ``load_full_state_dict`` keeps this rank's slices of full arrays, and
``shard_groups`` turns groups of original parameters (train_gpt's weight-decay split) into groups of
their shards, so any unmodified optimizer updates exactly what one process would.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.autograd import Tensor
from minidist.nn.module import IncompatibleKeys, Module, Parameter
from minidist.parallel.fsdp.flat_unit import FlatUnit


def full_state_dict(units: list[FlatUnit], module: Module) -> dict[str, Any]:
    """``{name: full array}`` in ``module.named_parameters()`` order; collective (an all-gather per unit)."""
    values = {n: v for u in units for n, v in zip(u.names, u.full_values())}
    return {name: values[name] for name, _ in module.named_parameters()}


def load_full_state_dict(units: list[FlatUnit], state_dict: dict[str, Any], strict: bool) -> IncompatibleKeys:
    """Keep this rank's slices of ``state_dict``'s full arrays; checks everything before changing anything.

    Raises ``KeyError`` (with ``strict``) naming missing and unexpected keys, ``ValueError`` for a shape
    that differs from the parameter's.
    """
    shapes = {n: shape for u in units for n, shape in zip(u.names, u.shapes)}
    missing, unexpected = sorted(set(shapes) - set(state_dict)), sorted(set(state_dict) - set(shapes))
    if strict and (missing or unexpected):
        raise KeyError(
            f"FullyShardedDataParallel.load_state_dict: missing keys {missing}, unexpected keys "
            f"{unexpected}; pass strict=False to load the keys that match"
        )
    for name, shape in shapes.items():
        value = _array(state_dict.get(name))
        got = None if value is None else tuple(getattr(value, "shape", np.shape(value)))
        if got is not None and got != tuple(shape):
            raise ValueError(
                f"FullyShardedDataParallel.load_state_dict: {name!r} has shape {got} in the state dict "
                f"but {shape} in the model"
            )
    for u in units:
        u.load_full([_array(state_dict.get(n)) for n in u.names])
    return IncompatibleKeys(missing, unexpected)


def shard_groups(
    units: list[FlatUnit], groups: list[dict[str, Any]], placeholder: Tensor
) -> list[dict[str, Any]]:
    """Groups of original parameters -> the same groups of this rank's shard tensors (see
    ``FullyShardedDataParallel.shard_param_groups``); ``placeholder`` fills the first group if this
    rank owns nothing at all (an optimizer needs one tensor)."""
    where = {id(p): (u, i) for u in units for i, p in enumerate(u.params)}
    out = []
    for g in groups:
        if not isinstance(g, dict) or "params" not in g:
            raise TypeError(f"shard_param_groups takes dicts with 'params' (as optimizers do), got {g!r:.80}")
        params = [g["params"]] if isinstance(g["params"], Tensor) else list(g["params"])
        shards = []
        for p in params:
            if id(p) not in where:
                raise ValueError(
                    f"shard_param_groups: a parameter of shape {p.shape} is not one of the wrapped "
                    "model's; build the groups from the model passed to FullyShardedDataParallel"
                )
            u, i = where[id(p)]
            shards += [s for s, seg in zip(u.shards, u.layout.segments) if seg.param_index == i]
        out.append({**{k: v for k, v in g.items() if k != "params"}, "params": shards})
    if out and not any(g["params"] for g in out):
        out[0]["params"] = [placeholder]
    return out


def broadcast_params(params: list[Parameter], group: Any) -> None:
    """Overwrite every rank's ``params`` with rank 0's (one broadcast of their flat concatenation)."""
    xp = backend.array_module(params[0].data)
    flat = xp.concatenate([p.data.reshape(-1) for p in params])
    dist.broadcast(flat, src=0, group=group)
    offset = 0
    for p in params:
        p.data[...] = flat[offset : offset + p.size].reshape(p.shape)
        offset += p.size


def resolve_dtype(value: Any, what: str) -> Any:
    """None, or the NumPy dtype named by ``value`` ("bfloat16" comes from ml_dtypes, imported lazily).

    Raises ``ValueError`` for anything that is not a floating-point dtype.
    """
    if value is None:
        return None
    if str(value) == "bfloat16":
        from minidist.parallel.comm_hooks.default import bfloat16

        return bfloat16()
    try:
        dtype = np.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind != "f":
        raise ValueError(
            f"FullyShardedDataParallel: {what} must be None, 'bfloat16', 'float16', 'float32' or "
            f"'float64', got {value!r}"
        )
    return dtype


def _array(value: Any) -> Any:
    return value.data if isinstance(value, Tensor) else value

"""Optimizer state by global parameter name, for plain optimizers and ``ZeroRedundancyOptimizer``.

An ``Optimizer`` keys its state by parameter *index* (``state[i]["exp_avg"]``), which means nothing
to a run with another layout. A checkpoint keys it by the parameter's global name instead:
``{name: {"exp_avg": array of the parameter's local shape, "step": int}}``. Arrays become tensors in
the shard files; integers (AdamW's per-parameter ``step``) go into the manifest.

ZeRO (Rajbhandari et al. 2020, §5) keeps only this rank's 1-D slice of each state array. Saving
all-gathers the slices over the data-parallel group, so a ZeRO checkpoint looks exactly like a plain
one and loads into either (and into ZeRO at any other data-parallel size); loading cuts this rank's
slice back out. Both directions are exact copies (no arithmetic on the values). FSDP's optimizer
steps the same kind of slices, one flat layout per unit: ``fsdp_state.py`` applies
:func:`gather_segments` and :func:`slice_segment` to each unit and restores through
:func:`load_by_index` (it uses this module; this module knows nothing of FSDP).
"""

from __future__ import annotations

from typing import Any

from minidist import backend
from minidist.nn.module import Module


def _is_zero(optimizer: Any) -> bool:
    return type(optimizer).__name__ == "ZeroRedundancyOptimizer"


def inner(optimizer: Any) -> Any:
    """The ``Optimizer`` doing the arithmetic (ZeRO's wrapped one, or the optimizer itself)."""
    return optimizer.optimizer if _is_zero(optimizer) else optimizer


def _names_of(optimizer: Any, model: Module) -> list[str]:
    """The global name of each of ``optimizer.params``; ValueError if one is not in the model."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    names = []
    for i, p in enumerate(optimizer.params):
        if id(p) not in name_of:
            raise ValueError(
                f"optimizer parameter {i} (shape {p.shape}) is not a parameter of the model passed to "
                "checkpoint; build the optimizer from model.parameters()"
            )
        names.append(name_of[id(p)])
    return names


def header(optimizer: Any) -> dict[str, Any] | None:
    """``{"class", "defaults", "param_groups", "step_count"}``: the optimizer's JSON-able state, or None."""
    if optimizer is None:
        return None
    opt = inner(optimizer)
    defaults = {k: list(v) if isinstance(v, tuple) else v for k, v in opt.defaults.items()}
    # Each group's current values (a scheduled "lr" differs from the defaults), without its tensors.
    # ZeRO's own param_groups are the user's groups, the same on every rank (its wrapped optimizer
    # has groups of this rank's shards only, maybe fewer).
    groups = [
        {k: list(v) if isinstance(v, tuple) else v for k, v in g.items() if k != "params"}
        for g in optimizer.param_groups
    ]
    return {
        "class": type(opt).__name__,
        "defaults": defaults,
        "param_groups": groups,
        "step_count": int(opt.step_count),
    }


def state_by_name(optimizer: Any, model: Module) -> dict[str, dict[str, Any]]:
    """``{global name: {state name: array (parameter's local shape) or int}}``; collective for ZeRO."""
    names = _names_of(optimizer, model)
    if _is_zero(optimizer):
        return _zero_gather(optimizer, names)
    return {names[i]: dict(s) for i, s in optimizer.state.items()}


def load_by_name(optimizer: Any, model: Module, header: dict[str, Any], state: dict[str, dict]) -> None:
    """Restore what :func:`state_by_name` produced (arrays already cut to this rank's local shapes)."""
    if _is_zero(optimizer):
        per_index = _zero_slices(optimizer, _names_of(optimizer, model), state)
    else:
        per_index = {i: state[n] for i, n in enumerate(_names_of(optimizer, model)) if n in state}
    load_by_index(optimizer, header, per_index)


def load_by_index(optimizer: Any, header: dict[str, Any], per_index: dict[int, dict[str, Any]]) -> None:
    """Restore ``{optimizer index: state}`` and the ``header``'s hyperparameters and step count into
    ``optimizer`` (under FSDP, ``fsdp_state.load_by_name`` hands the shard tensors' slices here)."""
    defaults = {k: tuple(v) if isinstance(v, list) else v for k, v in header["defaults"].items()}
    groups = [  # older checkpoints have none: then the defaults set every group
        {k: tuple(v) if isinstance(v, list) else v for k, v in g.items()}
        for g in header.get("param_groups", [])
    ]
    if _is_zero(optimizer):
        # The saved groups are ZeRO's outer groups: restore their values there; each step hands them
        # to the wrapped optimizer's groups of shards.
        for ours, saved in zip(optimizer.param_groups, groups or [defaults] * len(optimizer.param_groups)):
            ours.update(saved)
        groups = []
    inner(optimizer).load_state_dict(
        {"state": per_index, "defaults": defaults, "step_count": header["step_count"]}
        | ({"param_groups": groups} if groups else {}),
        copy=False,  # the arrays were just read for this optimizer: nobody else holds them
    )


def _zero_gather(zero: Any, names: list[str]) -> dict[str, dict[str, Any]]:
    state = zero.optimizer.state  # the wrapped optimizer's parameters are the segments, in order
    seg_states = [state.get(i, {}) for i in range(len(zero.layout.segments))]
    shapes = [tuple(p.shape) for p in zero.params]
    return gather_segments(seg_states, zero.layout, shapes, names, zero.group, zero.params[0].data)


def gather_segments(
    seg_states: list[dict[str, Any]], layout: Any, shapes: list[tuple[int, ...]], names: list[str],
    group: Any, like: Any,
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Collective over ``group``: the full state of every parameter of a flat ``ShardLayout``.

    ``seg_states[i]`` is the optimizer state of this rank's segment ``layout.segments[i]`` (1-D arrays
    of the segment's length, and counters; ``{}`` if it has none yet); ``shapes`` and ``names`` are
    those of the layout's parameters, ``like`` an array of their dtype and device. Returns
    ``{name: {state: array of the parameter's shape, counter: int}}`` for every parameter that has
    state on some rank. ZeRO has one such layout (the whole model), FSDP one per unit.
    """
    import minidist.distributed as dist  # noqa: PLC0415  (only sharded optimizers communicate here)

    # Which state arrays and counters exist anywhere (a rank owning nothing has none).
    mine = sorted({k for s in seg_states for k, v in s.items() if hasattr(v, "shape")})
    keys = sorted({k for ks in dist.all_gather_json(mine, group) for k in ks})
    counters: dict[str, dict[str, int]] = {}
    for seg, s in zip(layout.segments, seg_states):
        for k, v in s.items():
            if not hasattr(v, "shape"):
                counters.setdefault(names[seg.param_index], {})[k] = int(v)
    present = sorted({names[seg.param_index] for seg, s in zip(layout.segments, seg_states) if s})
    present = {n for part in dist.all_gather_json(present, group) for n in part}
    merged: dict[str, dict[str, int]] = {}
    for part in dist.all_gather_json(counters, group):
        for n, c in part.items():
            for k, v in c.items():
                merged.setdefault(n, {})[k] = max(v, merged.get(n, {}).get(k, v))
    xp = backend.array_module(like)
    out: dict[str, dict[str, Any]] = {n: dict(merged.get(n, {})) for n in present}
    for key in keys:
        # This rank's owned elements of every parameter's state, in flat order (zeros where a
        # parameter had no state yet), all-gathered exactly as the parameters are gathered.
        pieces = [
            s.get(key, xp.zeros(seg.numel, dtype=like.dtype)).reshape(-1)
            for seg, s in zip(layout.segments, seg_states)
        ]
        mine_flat = xp.concatenate(pieces) if pieces else xp.zeros(0, dtype=like.dtype)
        flat = dist.all_gather(mine_flat, group=group)
        for shape, offset, size, n in zip(shapes, layout.offsets, layout.sizes, names):
            if n in present:
                out[n][key] = flat[offset : offset + size].reshape(shape).copy()
    return out


def slice_segment(full: dict[str, Any], seg: Any) -> dict[str, Any]:
    """A segment's optimizer state cut from its parameter's full state (arrays flattened, counters kept)."""
    return {k: v.reshape(-1)[seg.lo : seg.hi].copy() if hasattr(v, "shape") else v for k, v in full.items()}


def _zero_slices(zero: Any, names: list[str], state: dict[str, dict]) -> dict[int, dict[str, Any]]:
    per_index = {}
    for seg_index, seg in enumerate(zero.layout.segments):
        full = state.get(names[seg.param_index])
        if full:
            per_index[seg_index] = slice_segment(full, seg)
    return per_index

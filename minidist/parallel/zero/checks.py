"""Argument checks of ``ZeroRedundancyOptimizer``, including the collective one: do all ranks agree?

ZeRO flattens the parameters into one vector and splits it by position, so every rank must pass the
same number of parameters with the same sizes and dtype. If they do not, the ranks would compute
different layouts and the next reduce-scatter would mismatch or hang. A rank cannot see the others'
parameters, so the check has two rounds: ``minidist.distributed.safety.agreement`` compares the count, total
size and dtype (and spreads a rank's own error to all); then, with equal counts, one all-reduce
compares the sizes one by one: each rank contributes ``v`` and ``-v`` under op="max", which yields
the maximum and minus the minimum of ``v`` over the group. Max == min means all agree. Every rank
gets the same answer, so every rank raises the same error and none is left waiting.

All of it runs before ``ZeroRedundancyOptimizer.__init__``'s body, through one seam: the decorator
:func:`arguments` (first in this file, ``@agreed_arguments(checks.arguments)``), which also fills
in the user's parameter groups (:func:`fill_in_groups`) and hands the body the agreed values.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist.autograd import Tensor
from minidist.optim.optimizer import Optimizer
from minidist.parallel.zero.groups import group_summary
from minidist.parallel.zero.layout import ShardLayout


def arguments(params: Any, optimizer_class: Any, group: Any, stage: Any, optimizer_kwargs: dict) -> dict:
    """The check of ``ZeroRedundancyOptimizer``'s arguments (``@agreed_arguments(checks.arguments)``).

    ``group`` None becomes the world. A bad ``stage``, optimizer class or parameter group on one rank
    only must raise on every rank: those checks travel with the collective parameter check
    (:func:`check_params`) instead of raising alone. Returns the arguments with ``group`` resolved and
    ``params`` replaced by the user's groups, filled in (:func:`fill_in_groups`) and agreed.
    """
    group = group if group is not None else dist.init()
    argument_error, groups = None, []
    try:
        check_stage(stage)
        check_optimizer_class(optimizer_class)
        groups = fill_in_groups(params, optimizer_class, optimizer_kwargs)
    except (TypeError, ValueError) as e:
        argument_error = e
    flat = [p for g in groups for p in g["params"]]
    check_params(flat, group, argument_error, stage, group_summary(groups))  # collective
    return {"params": groups, "optimizer_class": optimizer_class, "group": group, "stage": stage,
            "optimizer_kwargs": optimizer_kwargs}  # fmt: skip


def check_stage(stage: Any) -> None:
    """``ValueError`` unless ``stage`` is 1 or 2 (stage 3, sharded parameters, is not implemented)."""
    if stage not in (1, 2) or isinstance(stage, bool):
        raise ValueError(
            f"ZeroRedundancyOptimizer: stage must be 1 (shard optimizer state) or 2 (also shard gradients), "
            f"got {stage!r}; stage 3 (shard parameters) is not implemented"
        )


def check_optimizer_class(optimizer_class: Any) -> None:
    """``TypeError`` unless ``optimizer_class`` is a subclass of ``minidist.optim.Optimizer``."""
    if isinstance(optimizer_class, type) and issubclass(optimizer_class, Optimizer):
        return
    hint = ""
    if isinstance(optimizer_class, Optimizer):
        name = type(optimizer_class).__name__
        hint = f" (got an instance; pass optimizer_class=optim.{name} and its keyword arguments)"
    raise TypeError(
        "ZeroRedundancyOptimizer: optimizer_class must be a minidist.optim.Optimizer subclass such as "
        f"optim.SGD or optim.AdamW, got {optimizer_class!r}{hint}"
    )


def check_params(
    params: Iterable[Any],
    group: dist.Communicator,
    argument_error: Exception | None = None,
    stage: Any = 1,
    also_agree: dict[str, Any] | None = None,
) -> list[Tensor]:
    """The parameters without duplicates, after checking them on this rank and across ``group``.

    Collective (one agreement, one small all-reduce). ``argument_error``: this rank's problem with the
    other arguments (a bad ``stage``, a bad parameter group), raised on every rank like the parameters'
    own. ``also_agree``: more JSON values the ranks must agree on (the parameter groups, see
    ``groups.group_summary``). Raises on every rank: ``TypeError`` if some rank passed a
    non-tensor (or ``argument_error`` is one); ``ValueError`` for an empty list, mixed or non-float
    dtypes, or a count, total size, dtype, per-parameter size, ``stage`` or ``also_agree`` value that
    differs between ranks.
    """
    unique: list[Any] = []
    seen: set[int] = set()
    for p in params:
        if id(p) not in seen:  # a parameter shared by two layers is one parameter
            seen.add(id(p))
            unique.append(p)
    local_error = argument_error or local_problem(unique)

    # Round 1: what every rank can compare whatever its parameters (any count, or none).
    summary = {}
    if local_error is None:
        summary = {
            "parameter count": len(unique),
            "total number of elements": sum(p.size for p in unique),
            "dtype": str(unique[0].dtype),
            "stage": stage,
            **(also_agree or {}),
        }
    dist.agree(
        summary,
        local_error,
        group,
        what="ZeroRedundancyOptimizer",
        fix="every rank must pass the same model's parameters in the same order (and the same groups)",
    )

    # Round 2: the counts agree, so the per-parameter sizes can be compared element by element.
    high, low = _max_and_min(np.array([p.size for p in unique], dtype=np.int64), group)
    bad = np.flatnonzero(high != low)
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"ZeroRedundancyOptimizer: parameter {i} has between {low[i]} and {high[i]} elements on "
            f"different ranks ({bad.size} parameters differ); this rank's has shape {unique[i].shape}. "
            "Every rank must pass the same model's parameters in the same order"
        )
    return unique


def fill_in_groups(
    params: Iterable[Any], optimizer_class: type[Optimizer], optimizer_kwargs: dict[str, Any]
) -> list[dict[str, Any]]:
    """The user's groups, ``"params"`` without duplicates and every hyperparameter filled in.

    Building ``optimizer_class`` over the full parameters is how the groups get exactly the defaults
    and checks of that class (our optimizers allocate no state before their first step, so this costs
    nothing); only its ``param_groups`` are kept. Raises what ``optimizer_class`` raises (a
    ``ValueError`` for a parameter in two groups, a group without ``"params"``, a bad value; a
    ``TypeError`` for an unknown keyword), and ZeRO's own errors for the parameters
    (:func:`local_problem`: not a tensor, empty, mixed or non-float dtypes).
    """
    if isinstance(params, Tensor):
        raise TypeError(
            "ZeroRedundancyOptimizer takes an iterable of tensors (model.parameters()), got one Tensor"
        )
    items = list(params)
    grouped = bool(items) and all(isinstance(g, dict) for g in items)
    # Materialise every group's "params" once: a generator would be used up by the first look.
    groups = [_listed(g) for g in items] if grouped else [{"params": items}]
    flat = [p for g in groups if isinstance(g, dict) for p in g.get("params", [])]
    problem = local_problem(flat)
    if problem is not None:
        raise problem
    filled = optimizer_class(groups, **optimizer_kwargs).param_groups
    return [{**g, "params": list(g["params"])} for g in filled]


def _listed(group: dict[str, Any]) -> dict[str, Any]:
    if "params" not in group:
        return group  # the optimizer's own check names the problem
    ps = group["params"]
    return {**group, "params": [ps] if isinstance(ps, Tensor) else list(ps)}


def local_problem(params: list[Any]) -> Exception | None:
    """What is wrong with this rank's parameters on their own, as an exception to raise, or None."""
    for i, p in enumerate(params):
        if not isinstance(p, Tensor):
            return TypeError(
                f"ZeroRedundancyOptimizer: parameter {i} is a {type(p).__name__}, not a tensor; "
                "pass model.parameters()"
            )
    if not params:
        return ValueError("ZeroRedundancyOptimizer got an empty parameter list; pass model.parameters()")
    dtypes = sorted({str(p.dtype) for p in params})
    if len(dtypes) > 1:
        return ValueError(
            f"ZeroRedundancyOptimizer flattens all parameters into one vector, so they need one dtype; "
            f"got {dtypes}"
        )
    if np.dtype(params[0].dtype).kind != "f":
        return ValueError(f"ZeroRedundancyOptimizer needs floating-point parameters, got {dtypes[0]}")
    return None


def _max_and_min(values: np.ndarray, group: dist.Communicator) -> tuple[np.ndarray, np.ndarray]:
    """Element-wise maximum and minimum of ``values`` over the group, with one all-reduce."""
    both = np.concatenate([values, -values])
    dist.all_reduce(both, op="max", group=group)
    return both[: values.size], -both[values.size :]


def check_chunk(averaged: Any, layout: ShardLayout) -> None:
    """``RuntimeError`` unless the reduce-scatter's result ``averaged`` has as many elements as this rank
    owns in ``layout``: ``dist.reduce_scatter`` and ``layout.py`` must cut the flat vector alike."""
    if averaged.size != layout.shard_numel:  # dist and layout.py disagree on the chunk layout
        raise RuntimeError(
            f"reduce_scatter returned {averaged.size} elements, but this rank owns "
            f"{layout.shard_numel} (elements {layout.start}:{layout.stop})"
        )

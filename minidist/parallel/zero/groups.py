"""Parameter groups under ZeRO: the user's groups outside, this rank's shards grouped alike inside.

As any optimizer, ``ZeroRedundancyOptimizer`` takes tensors (one group) or dicts, one group each,
whose values override the constructor's: ``[{"params": matrices}, {"params": biases,
"weight_decay": 0.0}]`` (GPT training decays only the weight matrices). The ZeRO paper (Rajbhandari et
al. 2020) does not discuss groups: the flat-vector partition (``layout.py``) ignores them, and a
segment simply belongs to the group of its parameter. So there are two lists of groups:

* **outer**, ``zero.param_groups``: one dict per user group, ``"params"`` its *full* parameters,
  every hyperparameter filled in as ``optimizer_class`` fills it in (``checks.fill_in_groups``). These
  are the same on every rank (checked at construction); schedulers, the user and checkpoints read and
  write them.
* **inner**, the wrapped optimizer's groups: one per outer group of which this rank owns at least one
  segment, holding the shard tensors of those segments. A group this rank owns nothing of is left out
  (an ``Optimizer`` group cannot be empty); a rank that owns nothing at all gets one group with one
  empty shard, so that it still has an optimizer. ``owner[k]`` is the outer group of inner group k.

Before every step ``push_values`` copies each outer group's values into its inner group, so a rate a
scheduler set on ``zero.param_groups`` reaches the shards (PyTorch's ``ZeroRedundancyOptimizer`` keeps
the same split between its ``param_groups`` and its local optimizer's). Inner groups hold the
segments in flat order, so the wrapped optimizer's parameter ``k`` is still segment ``k``.
"""

from __future__ import annotations

from typing import Any

from minidist.autograd import Tensor
from minidist.parallel.zero.layout import ShardLayout


def values_of(group: dict[str, Any]) -> dict[str, Any]:
    """A group's hyperparameters (everything but ``"params"``)."""
    return {k: v for k, v in group.items() if k != "params"}


def group_summary(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """What the ranks must agree on, as JSON values for ``dist.agree``: the number of groups and, per
    group, its parameter count, element count and every hyperparameter (tuples as lists)."""
    summary: dict[str, Any] = {"parameter groups": len(groups)}
    for k, g in enumerate(groups):
        summary[f"group {k} parameter count"] = len(g["params"])
        summary[f"group {k} elements"] = sum(p.size for p in g["params"])
        for name, value in values_of(g).items():
            summary[f"group {k} {name}"] = list(value) if isinstance(value, tuple) else value
    return summary


def group_of_each_parameter(groups: list[dict[str, Any]]) -> list[int]:
    """Index of the group of each parameter, in flat order (groups' parameters laid end to end)."""
    return [k for k, g in enumerate(groups) for _ in g["params"]]


def shard_groups(
    groups: list[dict[str, Any]], layout: ShardLayout, shards: list[Tensor], empty: Tensor
) -> tuple[list[dict[str, Any]], list[int]]:
    """``(inner groups, owner)``: ``shards[i]`` (of ``layout.segments[i]``) in its parameter's group.

    ``empty``: the 0-element shard that a rank owning nothing puts in one group (of outer group 0).
    """
    group_of = group_of_each_parameter(groups)
    inner: list[dict[str, Any]] = []
    owner: list[int] = []
    for shard, seg in zip(shards, layout.segments):
        k = group_of[seg.param_index]
        if not owner or owner[-1] != k:  # segments run in flat order, so a group's shards are adjacent
            owner.append(k)
            inner.append({**values_of(groups[k]), "params": []})
        inner[-1]["params"].append(shard)
    if not inner:
        owner, inner = [0], [{**values_of(groups[0]), "params": [empty]}]
    return inner, owner


def groups_state(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each group's values and, as ``"params"``, the indices of its parameters in the flat order (the
    layout of ``Optimizer.state_dict()["param_groups"]``)."""
    out, first = [], 0
    for g in groups:
        out.append({**values_of(g), "params": list(range(first, first + len(g["params"])))})
        first += len(g["params"])
    return out


def check_same_sizes(saved: list[dict[str, Any]], groups: list[dict[str, Any]]) -> None:
    """``ValueError`` unless the ``saved`` groups (``groups_state``; [] for none) hold as many
    parameters, group by group, as ``groups``."""
    sizes = [len(g["params"]) for g in groups]
    if saved and [len(g["params"]) for g in saved] != sizes:
        raise ValueError(
            "ZeroRedundancyOptimizer.load_state_dict: the saved parameter groups hold "
            f"{[len(g['params']) for g in saved]} parameters, these {sizes}; build it with the same groups"
        )


def push_values(outer: list[dict[str, Any]], inner: list[dict[str, Any]], owner: list[int]) -> None:
    """Copy every outer group's current values (a scheduled ``lr``, ...) into its inner group."""
    for group, k in zip(inner, owner):
        group.update(values_of(outer[k]))

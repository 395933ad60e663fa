"""Sequence parallelism: the regions between tensor-parallel layers split along the sequence axis.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", §4.2.2).
Plain tensor parallelism (``mappings.py``) leaves the LayerNorms, dropouts and residual adds of a
transformer *replicated*: every tp rank computes and stores the same (B, T, C) activations there. Those
operations act on each position separately, so they can just as well run on a slice of the sequence:
rank r keeps positions ``[r T/t, (r+1) T/t)`` (axis 1, t = the tp group size), and its activations
there shrink by t. The communication stays the same volume: Megatron's all-reduce ``g`` is a
reduce-scatter followed by an all-gather, and sequence parallelism puts the reduce-scatter at the end
of one tensor-parallel region and the all-gather at the start of the next::

    x_r (B, T/t, C) --LayerNorm--> g-bar --> (B, T, C) --column .. row--> partials --> g --> (B, T/t, C)
                                   all-gather                                   reduce-scatter

The paper names the two new operators **g** (forward all-gather, backward reduce-scatter; here
:func:`gather_from_sequence_parallel_region`) and **g-bar** (forward reduce-scatter, backward all-gather;
:func:`reduce_scatter_to_sequence_parallel_region`). Each one's backward is the other's forward, as f
and g are conjugate in plain tensor parallelism. The third mapping,
:func:`scatter_to_sequence_parallel_region`, enters the sequence-parallel region from a replicated
tensor (keep the own slice; backward all-gather).

Activations here are (B, T, C) with the sequence on **axis 1**, so a collective first moves that axis to
the front (one copy; Megatron lays activations out as (T, B, C) to avoid it). The chunk of a flat
reduce-scatter is then exactly a block of whole positions (``dist.reduce_scatter``'s array_split order).

Replicated parameters that act on sequence shards (LayerNorm gains and shifts, a row-parallel layer's
bias, the position embedding) see only this rank's positions, so their gradients are partial sums:
they carry ``Parameter.sequence_parallel = True`` and :func:`allreduce_sequence_parallel_grads` sums
them over the tp group after backward, before gradient clipping and the optimizer step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import minidist.distributed as dist
from minidist.autograd import Function, Tensor
from minidist.backend import array_module
from minidist.distributed.comm import Communicator
from minidist.distributed.world import group_or_world
from minidist.nn.module import Parameter
from minidist.parallel.tensor_parallel.mappings import tag_shard


def _check_sequence(x: Any, group: Communicator, length: int, what: str) -> None:
    """Raise ``ValueError`` unless ``x`` has a sequence axis 1 whose ``length`` divides by the group size."""
    if x.ndim < 2:
        raise ValueError(
            f"{what}: expects activations (B, T, ...) with the sequence on axis 1, got shape {x.shape}"
        )
    if length % group.size:
        raise ValueError(
            f"{what}: a sequence of {length} positions cannot be split into {group.size} equal "
            f"sequence-parallel parts; use a sequence length divisible by the tensor-parallel size "
            f"{group.size}, or turn sequence parallelism off"
        )


def split_sequence(x: Any, group: Communicator) -> Any:
    """This rank's slice of ``x`` (B, T, ...) along axis 1: (B, T / size, ...), a view.

    Raises ``ValueError`` if ``x`` has fewer than 2 axes or T is not divisible by the group size.
    """
    _check_sequence(x, group, x.shape[1] if x.ndim >= 2 else 0, "split_sequence")
    width = x.shape[1] // group.size
    return x[:, group.rank * width : (group.rank + 1) * width]


def gather_sequence(x: Any, group: Communicator) -> Any:
    """Every rank's ``x`` (B, T_r, ...) concatenated along axis 1 in rank order: (B, size T_r, ...)."""
    if group.size == 1:
        return x
    xp = array_module(x)
    front = xp.ascontiguousarray(xp.moveaxis(x, 1, 0))  # (T_r, B, ...): a rank's chunk is whole positions
    flat = dist.all_gather(front, group=group)  # [rank 0's T_r positions | rank 1's | ...]
    full = flat.reshape(group.size * front.shape[0], *front.shape[1:])
    return xp.ascontiguousarray(xp.moveaxis(full, 0, 1))


def reduce_scatter_sequence(x: Any, group: Communicator) -> Any:
    """The sum over ranks of ``x`` (B, T, ...), of which this rank keeps its positions: (B, T / size, ...).

    Raises ``ValueError`` if ``x`` has fewer than 2 axes or T is not divisible by the group size.
    """
    _check_sequence(x, group, x.shape[1] if x.ndim >= 2 else 0, "reduce_scatter_sequence")
    if group.size == 1:
        return x.copy()
    xp = array_module(x)
    front = xp.ascontiguousarray(xp.moveaxis(x, 1, 0))  # (T, B, ...)
    mine = dist.reduce_scatter(front, op="sum", group=group)  # equal chunks: T / size whole positions
    mine = mine.reshape(front.shape[0] // group.size, *front.shape[1:])
    return xp.ascontiguousarray(xp.moveaxis(mine, 0, 1))


class ScatterToSequenceParallelRegion(Function):
    """y = x[:, r T/t : (r+1) T/t] (own positions);  dL/dx = all_gather over the group of dL/dy (axis 1).

    ``x`` is replicated, so the loss depends on it only through the ranks' slices: the slices'
    gradients side by side are the whole gradient, the same on every rank.
    """

    saved_inputs = ()
    is_view = True
    returns_new_arrays = True

    def forward(self, x, group=None):
        self.group = group
        return split_sequence(x, group)

    def backward(self, grad):
        return (gather_sequence(grad, self.group),)


class GatherFromSequenceParallelRegion(Function):
    """The paper's g: y = [x_0, ..., x_{t-1}] on axis 1 (all-gather);  dL/dx_r = slice r of sum_s dL/dy_s.

    Every rank uses the gathered y in its own part of the following tensor-parallel layer, so each
    rank's dL/dy_s is a partial gradient; dL/dx_r sums them over the ranks and keeps rank r's positions
    (a reduce-scatter), as the f operator all-reduces in plain tensor parallelism.
    """

    saved_inputs = ()
    returns_new_arrays = True

    def forward(self, x, group=None):
        self.group = group
        _check_sequence(x, group, x.shape[1] * group.size if x.ndim >= 2 else 0, "gather")
        return gather_sequence(x, group)

    def backward(self, grad):
        return (reduce_scatter_sequence(grad, self.group),)


class ReduceScatterToSequenceParallelRegion(Function):
    """The paper's g-bar: y_r = slice r (axis 1) of sum_s x_s (reduce-scatter);  dL/dx_s = [dL/dy_0, ...].

    Each x_s enters every position's sum with coefficient 1, so its gradient is the gradient of the
    whole sum: the ranks' dL/dy_r side by side (an all-gather), the same on every rank.
    """

    saved_inputs = ()
    returns_new_arrays = True

    def forward(self, x, group=None):
        self.group = group
        return reduce_scatter_sequence(x, group)

    def backward(self, grad):
        return (gather_sequence(grad, self.group),)


def scatter_to_sequence_parallel_region(x: Tensor, group: Communicator | None = None) -> Tensor:
    """Keep this rank's positions of a replicated ``x`` (B, T, ...) -> (B, T / size, ...); gather backward.

    The result is a shard (``Tensor.sharded_over``): dropout on it draws a mask per rank. Raises
    ``ValueError`` (on every rank, as T is the same everywhere) if T is not divisible by the group size.
    """
    group = group_or_world(group)
    return tag_shard(ScatterToSequenceParallelRegion.apply(x, group=group), group)


def gather_from_sequence_parallel_region(x: Tensor, group: Communicator | None = None) -> Tensor:
    """All-gather the ranks' ``x`` (B, T / size, ...) on axis 1 -> (B, T, ...); reduce-scatter backward.

    The result is the same on every rank (not a shard). Raises ``ValueError`` for fewer than 2 axes.
    """
    group = group_or_world(group)
    return tag_shard(GatherFromSequenceParallelRegion.apply(x, group=group), None)


def reduce_scatter_to_sequence_parallel_region(x: Tensor, group: Communicator | None = None) -> Tensor:
    """Sum the ranks' partial ``x`` (B, T, ...) and keep this rank's positions -> (B, T / size, ...).

    Backward all-gathers. The result is a shard (``Tensor.sharded_over``). Raises ``ValueError`` (on
    every rank) if T is not divisible by the group size.
    """
    group = group_or_world(group)
    return tag_shard(ReduceScatterToSequenceParallelRegion.apply(x, group=group), group)


def allreduce_sequence_parallel_grads(params: Iterable[Parameter], group: Communicator | None = None) -> int:
    """Sum over ``group`` (the tp group) the gradients of the parameters flagged ``sequence_parallel``.

    Call after ``backward`` and before gradient clipping, the data-parallel reduction's use of the
    gradients and the optimizer step (Megatron-LM does it in its finalize-grads step). The gradients
    travel in one flat buffer per dtype, one all-reduce each, instead of one small message per
    LayerNorm. Parameters without the flag, or with no gradient, are skipped: every rank of the group
    must hold the same flagged parameters with gradients (they do, as the tp ranks run one graph).
    Returns the number of gradients summed. Collective over ``group``.
    """
    group = group_or_world(group)
    flagged = [p for p in params if p.sequence_parallel and p.grad is not None]
    if group.size == 1 or not flagged:
        return len(flagged)
    by_dtype: dict[Any, list[Parameter]] = {}
    for p in flagged:
        by_dtype.setdefault(p.grad.dtype, []).append(p)
    for dtype in sorted(by_dtype, key=str):  # the same order on every rank
        members = by_dtype[dtype]
        xp = array_module(members[0].grad)
        flat = xp.concatenate([p.grad.reshape(-1) for p in members])
        dist.all_reduce(flat, op="sum", group=group)
        offset = 0
        for p in members:
            p.grad[...] = flat[offset : offset + p.grad.size].reshape(p.grad.shape)
            offset += p.grad.size
    return len(flagged)

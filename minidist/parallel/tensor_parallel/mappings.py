"""The communication operators of tensor parallelism, as autograd Functions.

Megatron-LM (Shoeybi et al. 2019, §3, Fig. 3) needs only two: ``f`` and ``g``, conjugates of each
other. Each is the identity in one direction and an all-reduce over the tensor-parallel group in the
other:

* **f** (:class:`CopyToTensorParallelRegion`) enters a parallel region: forward ``y = x`` (every rank
  already holds the whole ``x``); backward ``dL/dx = sum over ranks of dL/dy_r``, because each rank
  used ``x`` for a different part of the computation and the loss depends on all of them.
* **g** (:class:`ReduceFromTensorParallelRegion`) leaves it: forward ``y = sum over ranks of x_r`` (the
  partial results of a row-parallel matmul); backward ``dL/dx_r = dL/dy`` on every rank, because each
  ``x_r`` enters the sum with coefficient 1 and ``dL/dy`` is the same (replicated) on every rank.

Their variants along the last axis, for ``gather_output=True`` and ``input_is_parallel=False``:

* :class:`GatherFromTensorParallelRegion`: forward ``y = [x_0, x_1, ..., x_{n-1}]`` (all-gather,
  concatenated on the last axis); backward ``dL/dx_r`` = slice r of ``dL/dy``.
* :class:`ScatterToTensorParallelRegion`: forward ``y_r`` = slice r of ``x`` (no communication);
  backward ``dL/dx = [dL/dy_0, ..., dL/dy_{n-1}]`` (all-gather).

Where the loss is computed on replicated values, every rank computes the same loss, and the model's
loss is that value once (not n times): that is what makes these backward rules the true gradients.
"""

from __future__ import annotations

from typing import Any

import minidist.distributed as dist
from minidist.autograd import Function, Tensor
from minidist.backend import array_module
from minidist.distributed.comm import Communicator
from minidist.distributed.world import group_or_world


def split_last_axis(x: Any, group: Communicator) -> Any:
    """This rank's slice of ``x`` (..., n) along the last axis: (..., n / group.size).

    Raises ``ValueError`` if n is not divisible by the group size.
    """
    n, size = x.shape[-1], group.size
    if n % size:
        raise ValueError(
            f"cannot split a last axis of {n} into {size} equal tensor-parallel parts; "
            f"use a size divisible by {size}"
        )
    width = n // size
    return x[..., group.rank * width : (group.rank + 1) * width]


def gather_last_axis(x: Any, group: Communicator) -> Any:
    """Concatenate every rank's ``x`` (..., m) along the last axis, in rank order: (..., m * group.size)."""
    if group.size == 1:
        return x
    xp = array_module(x)
    flat = dist.all_gather(xp.ascontiguousarray(x), group=group)  # rank-major: [x_0 | x_1 | ...]
    return xp.concatenate(list(flat.reshape(group.size, *x.shape)), axis=-1)


class CopyToTensorParallelRegion(Function):
    """The f operator: y = x;  dL/dx = all_reduce_sum(dL/dy) over the tensor-parallel group."""

    def forward(self, x, group=None):
        # BEGIN SOLUTION A4.1: f forward: the identity (remember the group for backward)
        self.group = group
        return x
        # END SOLUTION

    def backward(self, grad):
        # BEGIN SOLUTION A4.1: f backward: sum the gradient over the tensor-parallel group
        return (dist.all_reduce(grad.copy(), op="sum", group=self.group),)
        # END SOLUTION


class ReduceFromTensorParallelRegion(Function):
    """The g operator: y = all_reduce_sum(x) over the tensor-parallel group;  dL/dx = dL/dy."""

    def forward(self, x, group=None):
        # BEGIN SOLUTION A4.1: g forward: sum the partial results over the group, leaving x unchanged
        return dist.all_reduce(x.copy(), op="sum", group=group)  # copy: x stays this rank's partial
        # END SOLUTION

    def backward(self, grad):
        # BEGIN SOLUTION A4.1: g backward: the identity
        return (grad,)
        # END SOLUTION


class ScatterToTensorParallelRegion(Function):
    """y = slice r of x on the last axis;  dL/dx = all_gather(dL/dy) on the last axis."""

    def forward(self, x, group=None):
        self.group = group
        return split_last_axis(x, group)

    def backward(self, grad):
        return (gather_last_axis(grad, self.group),)


class GatherFromTensorParallelRegion(Function):
    """y = all_gather(x) on the last axis;  dL/dx = slice r of dL/dy."""

    def forward(self, x, group=None):
        self.group = group
        return gather_last_axis(x, group)

    def backward(self, grad):
        return (split_last_axis(grad, self.group),)


def tag_shard(out: Tensor, group: Communicator | None) -> Tensor:
    """Mark ``out`` as one rank's part of a tensor split over ``group`` (``Tensor.sharded_over``), or,
    for None or a group of one rank, as the same on every rank; returns ``out``. Results computed from
    a shard inherit the tag (``Function.apply``), so dropout can give every shard its own mask."""
    out.sharded_over = group if group is not None and group.size > 1 else None
    return out


def copy_to_tensor_parallel_region(x: Tensor, group: Communicator | None = None) -> Tensor:
    """The f operator (identity forward, all-reduce backward) over ``group`` (default: the world)."""
    return CopyToTensorParallelRegion.apply(x, group=group_or_world(group))


def reduce_from_tensor_parallel_region(x: Tensor, group: Communicator | None = None) -> Tensor:
    """The g operator (all-reduce forward, identity backward) over ``group`` (default: the world).

    The result is the same on every rank: it is not a shard, whatever ``x`` was."""
    return tag_shard(ReduceFromTensorParallelRegion.apply(x, group=group_or_world(group)), None)


def scatter_to_tensor_parallel_region(x: Tensor, group: Communicator | None = None) -> Tensor:
    """Keep this rank's slice of the last axis of ``x`` (..., n) -> (..., n / size); gather backward.

    The result is a shard (``tag_shard``). Raises ``ValueError`` if n is not divisible by the group size.
    """
    group = group_or_world(group)
    return tag_shard(ScatterToTensorParallelRegion.apply(x, group=group), group)


def gather_from_tensor_parallel_region(x: Tensor, group: Communicator | None = None) -> Tensor:
    """Concatenate the ranks' ``x`` (..., m) on the last axis -> (..., m * size); slice backward.

    The result is the same on every rank: it is not a shard."""
    return tag_shard(GatherFromTensorParallelRegion.apply(x, group=group_or_world(group)), None)

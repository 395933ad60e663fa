"""``ColumnParallelLinear`` and ``RowParallelLinear``: one linear layer split over a tensor-parallel group.

Megatron-LM (Shoeybi et al. 2019, §3, eq. 3 and Fig. 3a) splits ``Y = X A`` (here ``y = x W^T + b``,
``W`` of shape (out, in)) in two ways across the n ranks of a group:

* **Column parallel**: ``W`` split on the *output* axis, ``W = [W_0; ...; W_{n-1}]``. Every rank needs
  the whole input ``x`` and computes ``y_r = x W_r^T + b_r``, its own slice of the output features.
  No communication forward (f is the identity); backward, ``dL/dx`` is the sum over ranks of
  ``dL/dy_r W_r``: the f operator all-reduces it.
* **Row parallel**: ``W`` split on the *input* axis, ``W = [W_0, ..., W_{n-1}]``. Rank r holds the
  slice ``x_r`` of the input features (exactly what a column-parallel layer produced) and computes a
  partial product ``x_r W_r^T`` of the full output; the g operator all-reduces the partials. The bias
  is replicated and added once, *after* the reduction (added before, it would count n times).

**Initialisation equals one device's.** Each rank draws the *full* weight from minidist's seeded
generator exactly as ``nn.Linear`` does (weight, then bias, U(-1/sqrt(in), 1/sqrt(in)) of the full
fan-in) and keeps its slice, as Megatron's CPU initialisation does. So every rank's generator
advances alike, tp=n and tp=1 start from the same model, and the next layer draws the same numbers
too. The price, one full weight per rank for a moment, is irrelevant at the sizes minidist trains.
That needs the same generator state on every rank of the group, which a per-rank seed
(``md.manual_seed(rank)``) breaks; so at construction the ranks adopt the group's first rank's state
(``random.share_generator``, one small all-gather), as DDP adopts rank 0's weights. The layer is then
the one the first rank's seed builds on one device, sharded and replicated parameters alike.

Every sharded parameter gets ``tp_dim`` (0: out axis, 1: in axis) and ``tp_group``; a replicated
one keeps ``tp_dim = None`` (see ``nn.Parameter``). A sharded parameter is also tagged as a shard
(``Tensor.sharded_over``), and so is everything computed from it until the g operator or a gather
makes it replicated again: a plain ``nn.Dropout`` on a column layer's output then draws a different
mask on every rank, from the RNG tracker (``random.py``).

``from_linear`` builds either layer from a full ``nn.Linear`` instead (the transformer of
``transformer.py`` cuts a whole single-process block this way), with a ``stride`` for [q; k; v] and
the ``sequence_parallel`` variant of ``sequence_parallel.py`` (all-gather in, keeping only the shard
for backward: ``sequence_parallel_linear.py``; reduce-scatter out).
"""

from __future__ import annotations

import math
from typing import Any

from minidist.autograd import DEFAULT_DTYPE, Tensor
from minidist.distributed.comm import Communicator
from minidist.nn import functional as F
from minidist.nn.layers import Linear, uniform
from minidist.nn.module import Module, Parameter
from minidist.parallel.agreed import agreed_arguments
from minidist.parallel.tensor_parallel import checks
from minidist.parallel.tensor_parallel.cut import cut_parameter
from minidist.parallel.tensor_parallel.mappings import (
    copy_to_tensor_parallel_region,
    gather_from_tensor_parallel_region,
    reduce_from_tensor_parallel_region,
    scatter_to_tensor_parallel_region,
    tag_shard,
)
from minidist.parallel.tensor_parallel.sequence_parallel import reduce_scatter_to_sequence_parallel_region
from minidist.parallel.tensor_parallel.sequence_parallel_linear import all_gather_linear


def shard_parameter(full: Parameter, tp_dim: int, group: Communicator) -> Parameter:
    """This rank's slice (rank ``group.rank`` of ``group.size`` equal ones) of ``full`` along ``tp_dim``."""
    # BEGIN SOLUTION A4.2: this rank's contiguous slice along tp_dim, as a Parameter with tp_dim/tp_group
    width = full.shape[tp_dim] // group.size
    index = [slice(None)] * full.ndim
    index[tp_dim] = slice(group.rank * width, (group.rank + 1) * width)
    shard = Parameter(full.data[tuple(index)].copy())  # copy: contiguous, and the full array is freed
    shard.tp_dim, shard.tp_group = tp_dim, group
    return tag_shard(shard, group)  # what is computed from it is a shard too (dropout: ops/dropout.py)
    # END SOLUTION


class ColumnParallelLinear(Module):
    """y = x W^T + b with W (out, in) split on the out axis: this rank holds W_r (out/n, in), b_r (out/n,).

    Input ``x`` (..., in_features), the same on every rank of ``group``. Output: this rank's slice
    (..., out_features / n), or with ``gather_output=True`` the whole (..., out_features) on every rank
    (one all-gather forward). Backward all-reduces ``dL/dx`` (the f operator).

    Collective: every rank of ``group`` must build it, with the same arguments; they are compared at
    construction (one small all-gather, ``checks/``), so a mismatch is reported by every rank. The
    ranks then adopt the first rank's generator state (a per-rank seed still builds one layer; module
    docstring).

    Raises (at construction on every rank of ``group``): ``TypeError`` for a size that is not an int
    (NumPy integers are fine), a flag that is not a bool, or a ``group`` that is not a Communicator
    (``checks/arguments.py``), ``ValueError`` for a size < 1, ``out_features`` not divisible by
    ``group.size``, or ranks that passed different ``in_features``, ``out_features``, ``bias``,
    ``gather_output`` or ``dtype``. In ``forward``: ``ValueError`` for an input whose last axis is not
    ``in_features`` (or a scalar).
    """

    sequence_parallel = False  # input (..., T / n, in): all-gather on the sequence axis instead of f

    @agreed_arguments(checks.linear("ColumnParallelLinear", split="out_features"))
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        group: Communicator | None = None,
        gather_output: bool = False,
        dtype: Any = DEFAULT_DTYPE,
    ) -> None:
        super().__init__()
        self.group = group  # agreed, like every argument here (checks.linear); None became the world
        self.in_features, self.out_features, self.gather_output = in_features, out_features, gather_output
        self.out_features_per_partition = out_features // self.group.size
        bound = 1.0 / math.sqrt(in_features)  # the full layer's fan-in, as nn.Linear
        self.weight = shard_parameter(uniform((out_features, in_features), bound, dtype), 0, self.group)
        self.bias = shard_parameter(uniform((out_features,), bound, dtype), 0, self.group) if bias else None

    @classmethod
    @agreed_arguments(checks.cut("ColumnParallelLinear"))
    def from_linear(
        cls,
        linear: Linear,
        group: Communicator | None = None,
        stride: int = 1,
        sequence_parallel: bool = False,
    ) -> ColumnParallelLinear:
        """The column-parallel layer whose shards are cut from the full ``linear`` (Megatron's CPU init).

        ``stride`` s: the out axis is s equal blocks, each split over the group (``split.py``;
        attention's [q; k; v] uses 3). ``sequence_parallel``: the input is this rank's positions
        (B, T / n, in) and is all-gathered on the sequence axis first (Korthikanti et al. 2022, §4.2.2).
        Output: this rank's features (..., out / n), never gathered. Collective over ``group`` (one
        small agreement). Raises on every rank ``TypeError`` for something else than an ``nn.Linear``
        or a bad group, ``ValueError`` if out_features / stride is not divisible by the group size.
        """
        layer = cls.__new__(cls)
        Module.__init__(layer)
        layer.group, layer.gather_output, layer.sequence_parallel = group, False, sequence_parallel
        layer.in_features, layer.out_features = linear.in_features, linear.out_features
        layer.out_features_per_partition = linear.out_features // group.size
        layer.weight = cut_parameter(linear.weight, 0, group, stride)
        layer.bias = None if linear.bias is None else cut_parameter(linear.bias, 0, group, stride)
        return layer

    @checks.checked_input  # x (..., in_features), else ValueError
    def forward(self, x: Tensor) -> Tensor:
        if self.sequence_parallel:  # the paper's g, fused: all-gather the positions, keep only the shard
            return all_gather_linear(x, self.weight, self.bias, self.group)
        # BEGIN SOLUTION A4.3: f, this rank's slice of the output features, gather if gather_output
        x = copy_to_tensor_parallel_region(x, self.group)  # f
        y = F.linear(x, self.weight, self.bias)  # (..., out / n)
        return gather_from_tensor_parallel_region(y, self.group) if self.gather_output else y
        # END SOLUTION

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features} "
            f"({self.out_features_per_partition} per rank), bias={self.bias is not None}, "
            f"gather_output={self.gather_output}"
        )


class RowParallelLinear(Module):
    """y = x W^T + b with W (out, in) split on the in axis: this rank holds W_r (out, in/n); b (out,) whole.

    Input: with ``input_is_parallel=True`` (the default) this rank's slice x_r (..., in_features / n),
    e.g. a column-parallel layer's output; with ``False`` the whole (..., in_features), of which each
    rank keeps its slice (no communication). Output (..., out_features), the same on every rank:
    ``g(x_r W_r^T) + b``, one all-reduce forward, none backward.

    Collective: every rank of ``group`` must build it, with the same arguments; they are compared at
    construction (one small all-gather, ``checks/``), so a mismatch is reported by every rank. The
    ranks then adopt the first rank's generator state (a per-rank seed still builds one layer; module
    docstring).

    Raises (at construction on every rank of ``group``): ``TypeError`` for a size that is not an int
    (NumPy integers are fine), a flag that is not a bool, or a ``group`` that is not a Communicator
    (``checks/arguments.py``), ``ValueError`` for a size < 1, ``in_features`` not divisible by
    ``group.size``, or ranks that passed different ``in_features``, ``out_features``, ``bias``,
    ``input_is_parallel`` or ``dtype``. In ``forward``: ``ValueError`` for an input whose last axis
    has the wrong length (or a scalar).
    """

    sequence_parallel = False  # output (..., T / n, out): reduce-scatter on the sequence axis instead of g

    @agreed_arguments(checks.linear("RowParallelLinear", split="in_features"))
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        group: Communicator | None = None,
        input_is_parallel: bool = True,
        dtype: Any = DEFAULT_DTYPE,
    ) -> None:
        super().__init__()
        self.group = group  # agreed, like every argument here (checks.linear); None became the world
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel = input_is_parallel
        self.in_features_per_partition = in_features // self.group.size
        bound = 1.0 / math.sqrt(in_features)
        self.weight = shard_parameter(uniform((out_features, in_features), bound, dtype), 1, self.group)
        self.bias = uniform((out_features,), bound, dtype) if bias else None  # replicated: tp_dim None

    @classmethod
    @agreed_arguments(checks.cut("RowParallelLinear"))
    def from_linear(
        cls, linear: Linear, group: Communicator | None = None, sequence_parallel: bool = False
    ) -> RowParallelLinear:
        """The row-parallel layer whose weight shards are cut from the full ``linear``; bias copied whole.

        Input: this rank's features (..., in / n). ``sequence_parallel``: the partial products are
        reduce-scattered on the sequence axis (B, T, out) -> (B, T / n, out) instead of all-reduced
        (the paper's g-bar), and the bias, then added on sequence shards, is flagged
        ``sequence_parallel`` (its gradient is summed over the group after backward). Collective over
        ``group``. Raises on every rank ``TypeError`` for something else than an ``nn.Linear`` or a
        bad group, ``ValueError`` if in_features is not divisible by the group size.
        """
        layer = cls.__new__(cls)
        Module.__init__(layer)
        layer.group, layer.input_is_parallel, layer.sequence_parallel = group, True, sequence_parallel
        layer.in_features, layer.out_features = linear.in_features, linear.out_features
        layer.in_features_per_partition = linear.in_features // group.size
        layer.weight = cut_parameter(linear.weight, 1, group)
        layer.bias = None if linear.bias is None else cut_parameter(linear.bias, None, group)
        if layer.bias is not None and sequence_parallel:
            layer.bias.sequence_parallel, layer.bias.tp_group = True, group
        return layer

    @checks.checked_input  # x (..., in_features / n) or, not input_is_parallel, (..., in_features)
    def forward(self, x: Tensor) -> Tensor:
        if not self.input_is_parallel:
            x = scatter_to_tensor_parallel_region(x, self.group)  # keep this rank's slice
        if self.sequence_parallel:  # the paper's g-bar: reduce-scatter the partials, then the bias once
            y = reduce_scatter_to_sequence_parallel_region(F.linear(x, self.weight), self.group)
            return y if self.bias is None else y + self.bias
        # BEGIN SOLUTION A4.4: partial product, g (all-reduce), then the bias once
        partial = F.linear(x, self.weight)  # (..., out): this rank's share of the sum over in
        y = reduce_from_tensor_parallel_region(partial, self.group)  # g
        return y if self.bias is None else y + self.bias  # once, after the reduction
        # END SOLUTION

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features} ({self.in_features_per_partition} per rank), "
            f"out_features={self.out_features}, bias={self.bias is not None}, "
            f"input_is_parallel={self.input_is_parallel}"
        )

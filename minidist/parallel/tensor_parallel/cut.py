"""Cutting a full single-process layer into this tensor-parallel rank's piece (Megatron's CPU init).

A parallel model in minidist starts as the very model one process builds: every rank builds the full
layer from the same seed and keeps its piece (``ColumnParallelLinear.from_linear``,
``RowParallelLinear.from_linear``, the GPT blocks of ``transformer.py``, ``ParallelGPT``). Which piece
is ``split.py``'s rule (even, uneven, strided); this file applies it to Parameters. Whether a cut can be
made is checked across the group before (``checks/layers.py``, ``cut``).
"""

from __future__ import annotations

import copy

from minidist.distributed.comm import Communicator
from minidist.nn.module import Module, Parameter
from minidist.parallel.tensor_parallel.mappings import tag_shard
from minidist.parallel.tensor_parallel.split import shard_index


def cut_parameter(full: Parameter, tp_dim: int | None, group: Communicator, stride: int = 1) -> Parameter:
    """This rank's piece of ``full`` along ``tp_dim`` by ``split.py``'s rule (uneven and strided too), a
    new Parameter with ``tp_dim``, ``tp_group`` and ``tp_stride`` set; ``tp_dim=None``: a replicated copy."""
    if tp_dim is None:
        return Parameter(full.data.copy())
    where = shard_index(full.shape, tp_dim, group.size, group.rank, stride)
    shard = Parameter(full.data[where].copy())  # copy: contiguous, and independent of the full model
    shard.tp_dim, shard.tp_group, shard.tp_stride = tp_dim, group, stride
    return tag_shard(shard, group)


def replicate(module: Module, group: Communicator, sequence_parallel: bool = False) -> Module:
    """A copy of a leaf ``module`` (LayerNorm, Embedding, Dropout: no submodules) with its own copies of
    the parameters, held whole by every rank of ``group``. Nothing else is copied: no gradient, no hook
    (a DDP wrapping the original), and no random draw (constructing a new layer would advance the
    generator). ``sequence_parallel``: the parameters will see this rank's positions only, so they are
    flagged for ``allreduce_sequence_parallel_grads`` over ``group``. Raises ``ValueError`` for a module
    with submodules."""
    if module._modules:
        raise ValueError(f"replicate: {type(module).__name__} has submodules; replicate its leaves instead")
    twin = copy.copy(module)  # the same sizes and options (plain attributes)
    object.__setattr__(twin, "_parameters", {})  # its own tables, not the original's
    object.__setattr__(twin, "_modules", {})
    for name, p in module._parameters.items():
        if p is None:
            setattr(twin, name, None)
            continue
        piece = Parameter(p.data.copy(), requires_grad=p.requires_grad)
        piece.sequence_parallel, piece.tp_group = sequence_parallel, group if sequence_parallel else None
        setattr(twin, name, piece)
    return twin

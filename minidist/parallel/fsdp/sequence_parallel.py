"""Sequence-parallel gradients under FSDP: summed over tp after FSDP's reduce-scatter.

With sequence parallelism (Korthikanti et al. 2022, §4.2.2) each tp rank runs the LayerNorms (and
``wpe``, the row-parallel biases) on its T / tp positions only, so their gradients are partial sums
that must be added over the tp group (``tensor_parallel.allreduce_sequence_parallel_grads`` does it for
DDP). Under FSDP those gradients exist only as shards after the reduce-scatter over FSDP's group, and
the tp ranks' shards of one parameter need not cover the same elements: a unit's flat vector also holds
the tp pieces of sharded parameters, which differ in size between tp ranks where a split is uneven (the
GPT's vocabulary: 65 rows over tp 2 are 33 + 32), moving everything after them.

So, per unit, the ranks all-gather over FSDP's group the elements they own of the flagged parameters
(in flat order; ranks own consecutive ranges, so the concatenation is every flagged parameter whole,
in order), all-reduce those full gradients over tp (one message for all units), and each rank copies
its own elements back into its shards' ``.grad``. Communication: the flagged parameters' size, twice
(they are small: LayerNorms, biases, ``wpe``).
"""

from __future__ import annotations

from typing import Any

import minidist.distributed as dist
from minidist.backend import array_module
from minidist.distributed.comm import Communicator


def allreduce_sequence_parallel_grads_(fsdp: Any, tp_group: Communicator) -> int:
    """Sum over ``tp_group`` the gradients of ``fsdp``'s parameters flagged ``sequence_parallel``.

    Call after backward (FSDP has reduce-scattered the gradients into its shard tensors), before
    clipping and the optimizer step. Returns the number of flagged parameters. Collective over
    ``fsdp.group`` and ``tp_group``: every rank of the mesh calls it. A shard without a gradient
    counts as zeros (and gets one).
    """
    if tp_group.size == 1:
        return 0
    plans, fulls, count = [], [], 0
    for unit in fsdp.units:
        flagged = [i for i, p in enumerate(unit.params) if getattr(p, "sequence_parallel", False)]
        if not flagged:
            continue
        count += len(flagged)
        owned = [
            (seg, shard)
            for seg, shard in zip(unit.layout.segments, unit.shards)
            if seg.param_index in flagged
        ]
        xp = array_module(unit.flat_shard)
        mine = [
            shard.grad if shard.grad is not None else xp.zeros(seg.numel, dtype=unit.flat_shard.dtype)
            for seg, shard in owned
        ]
        local = xp.concatenate(mine) if mine else xp.zeros(0, dtype=unit.flat_shard.dtype)
        fulls.append(dist.all_gather(local, group=fsdp.group))  # every flagged parameter whole, in order
        plans.append((unit, flagged, owned))
    if not fulls:
        return 0
    xp = array_module(fulls[0])
    summed = xp.concatenate(fulls)
    dist.all_reduce(summed, op="sum", group=tp_group)
    offset = 0
    for (unit, flagged, owned), full in zip(plans, fulls):
        starts, position = {}, offset  # where each flagged parameter begins in ``summed``
        for i in flagged:
            starts[i] = position
            position += unit.layout.sizes[i]
        for seg, shard in owned:
            start = starts[seg.param_index]
            values = summed[start + seg.lo : start + seg.hi]
            if shard.grad is None:
                shard.grad = values.copy()
            else:
                shard.grad[...] = values
        offset += full.size
    return count

"""``clip_grad_norm_`` for FSDP composed with tensor parallelism: the norm one process would compute.

FSDP over a mesh's data-parallel group (dp x cp with context parallelism) wrapping a tensor-parallel
model (``ParallelGPT``) splits every parameter twice: over tp into pieces (Shoeybi et al. 2019, §3;
``tp_dim`` says along which axis), and each tp rank's piece over FSDP's group into flat shards (ZeRO-3,
Rajbhandari et al. 2020 §5.3). After FSDP's reduce-scatter, the shard tensors' ``.grad`` hold the
averaged gradient, each element on exactly one rank of FSDP's group. The global norm (Pascanu et al.
2013, §3.2) therefore adds up:

* over FSDP's group: every shard once (they are disjoint pieces of this tp rank's parameters);
* over the tp group: sharded parameters' totals summed (disjoint pieces of the full tensor), replicated
  ones (``tp_dim`` None: LayerNorms, biases of row-parallel layers, ``wpe``) counted once, since every
  tp rank holds the same gradient (their largest value is taken: equal in normal use, and a NaN or inf
  that one copy holds reaches every rank, as in ``parallel/clip_grad.py``).

Two all-gathers of two float64 numbers each; the contributions are float64 (``nn.utils``). Under
sequence parallelism, sum the LayerNorms' partial gradients over tp first
(``sequence_parallel.allreduce_sequence_parallel_grads_``): replicated gradients must be equal here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist.distributed.comm import Communicator
from minidist.nn.utils import (
    check_clip_args,
    check_finite,
    combine_contributions,
    finish_norm,
    norm_contribution,
    scale_grads_,
)


def clip_grad_norm_(
    fsdp: Any,
    max_norm: float,
    norm_type: float = 2.0,
    tp_group: Communicator | None = None,
    error_if_nonfinite: bool = False,
) -> float:
    """Scale the shard tensors' ``.grad`` of ``fsdp`` in place so that the global norm is <= ``max_norm``.

    Args:
        fsdp: a ``FullyShardedDataParallel`` after backward (its shards' gradients reduce-scattered).
        max_norm: the largest norm allowed (>= 0).
        norm_type: the norm's order p (> 0, ``math.inf`` allowed).
        tp_group: the tensor-parallel group of the wrapped model's sharded parameters (``mesh.tp_group``);
            None or size 1: no tensor parallelism, then this is FSDP's own global norm.
        error_if_nonfinite: raise instead of returning a NaN or inf norm (gradients then unchanged).

    Returns:
        the global norm before clipping, a Python float, the same on every rank. Collective over
        ``fsdp.group`` and ``tp_group``: every rank of the mesh calls it.

    Raises:
        TypeError / ValueError: for a non-number, ``max_norm < 0`` or ``norm_type <= 0`` (checked
            before any communication: every rank passes the same arguments).
        RuntimeError: for a non-finite norm with ``error_if_nonfinite`` (on every rank alike).
    """
    norm_type = check_clip_args(max_norm, norm_type)
    sharded, replicated = [], []
    for unit in fsdp.units:
        for seg, shard in zip(unit.layout.segments, unit.shards):
            if shard.grad is None:
                continue
            original = unit.params[seg.param_index]
            (replicated if getattr(original, "tp_dim", None) is None else sharded).append(shard.grad)
    mine = np.array([norm_contribution(sharded, norm_type), norm_contribution(replicated, norm_type)])
    # all_gather + combine rather than all_reduce: combine_contributions makes a NaN win for p = inf too.
    over_dp = dist.all_gather(mine, group=fsdp.group).reshape(-1, 2)
    this_tp_rank = [combine_contributions(over_dp[:, k], norm_type) for k in (0, 1)]
    if tp_group is not None and tp_group.size > 1:
        over_tp = dist.all_gather(np.array(this_tp_rank), group=tp_group).reshape(-1, 2)
        total = combine_contributions(
            [combine_contributions(over_tp[:, 0], norm_type), over_tp[:, 1].max()], norm_type
        )
    else:
        total = combine_contributions(this_tp_rank, norm_type)
    norm = finish_norm(total, norm_type)
    check_finite(norm, norm_type, error_if_nonfinite)
    scale_grads_(sharded + replicated, max_norm, norm)
    return norm

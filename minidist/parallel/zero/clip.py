"""Gradient clipping when the averaged gradient exists only as shards (ZeRO, after the reduce-scatter).

Clipping by global norm (Pascanu et al. 2013, §3.2) needs the norm of the *averaged* gradient of the
whole model. Under ZeRO (Rajbhandari et al. 2020, §5) no rank holds that gradient: after the
reduce-scatter, rank r holds the average of its own chunk of the flat vector only. The chunks
partition the vector (every element is owned by exactly one rank), so

    ||g||_p^p = sum over ranks r of sum over owned elements |g_i|^p      (max instead of sum for p = inf)

and one all-gather of one number per rank gives every rank the same norm. Each rank then scales its
own shard by ``max_norm / (norm + 1e-6)``, which is what one process would do to the whole gradient
(``minidist/nn/utils.py``), so the clipped ZeRO step equals one process's ``clip_grad_norm_`` + step.

The same all-gather carries every rank's arguments, so a rank that passed another ``max_norm`` (or a
bad one) raises on every rank instead of clipping differently or leaving the others waiting.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist.nn.utils import (
    check_clip_args,
    check_finite,
    combine_contributions,
    finish_norm,
    norm_contribution,
    scale_grads_,
)


def clip_shards_(
    shard_grads: Iterable[Any],
    group: dist.Communicator,
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    what: str = "ZeroRedundancyOptimizer.clip_grad_norm_",
) -> float:
    """Scale this rank's ``shard_grads`` in place so that the norm of all ranks' shards together is at
    most ``max_norm``; return that norm before clipping (a Python float, the same on every rank).

    Collective over ``group``: one all-gather of five float64 numbers per rank. NaN or inf anywhere
    gives a NaN or inf norm on every rank and leaves the gradients unchanged (as
    ``minidist.nn.utils.clip_grad_norm_``). Raises on every rank: ``TypeError``/``ValueError`` as
    ``check_clip_args`` (the lowest failing rank's error), ``ValueError`` if the ranks' arguments
    differ, ``RuntimeError`` for a non-finite norm if ``error_if_nonfinite``. ``what`` names the
    caller in the messages (FSDP's ``clip_grad_norm_`` uses this too).
    """
    grads = [g for g in shard_grads if g is not None]
    try:
        norm_type = check_clip_args(max_norm, norm_type)
        flag = float(bool(error_if_nonfinite))
        mine = [norm_contribution(grads, norm_type), float(max_norm), norm_type, flag, 0.0]
        local_error = None
    except (TypeError, ValueError) as e:
        mine, local_error = [0.0, 0.0, 0.0, 0.0, 1.0], e  # column 4 flags a rank with bad arguments
    everyone = dist.all_gather(np.array(mine, np.float64), group=group).reshape(group.size, 5)
    arguments = everyone[:, 1:]
    if (arguments != arguments[0]).any():  # every rank sees the same table: all take this path together
        named = {"max_norm": max_norm, "norm_type": norm_type, "error_if_nonfinite": bool(error_if_nonfinite)}
        fix = "call it on every rank with the same max_norm, norm_type and error_if_nonfinite"
        dist.agree({} if local_error else named, local_error, group, what="clip_grad_norm_", fix=fix)
        raise ValueError(f"{what}: the ranks' arguments differ; {fix}")
    norm = finish_norm(combine_contributions(everyone[:, 0], norm_type), norm_type)
    check_finite(norm, norm_type, error_if_nonfinite)  # the same norm on every rank: all raise alike
    scale_grads_(grads, max_norm, norm)
    return norm

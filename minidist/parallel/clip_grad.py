"""``clip_grad_norm_`` for tensor- (and pipeline-) parallel models: the true global norm.

The norm to clip by is the one the single-device model would have (Pascanu et al. 2013, §3.2), so
that tp=n trains exactly like tp=1. Under tensor parallelism a rank holds two kinds of parameters
(Shoeybi et al. 2019, §3; their ``tp_dim`` attribute says which, see ``nn.Parameter``):

* **sharded** (``tp_dim`` 0 or 1): this rank holds 1/n of the tensor. Its share of the squared norm is
  summed over the tp group (one all-reduce per distinct group, usually one);
* **replicated** (``tp_dim`` None): every tp rank holds the same gradient. Summing over the group
  would count it n times, so each rank adds it once, locally.

Pipeline stages hold disjoint parameters, so with ``pp_group`` the per-stage totals are summed over
it. Data-parallel replicas need nothing: after DDP their gradients are already equal.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from minidist import dist
from minidist.autograd import Tensor
from minidist.dist.comm import Communicator
from minidist.nn.utils import check_clip_args, finish_norm, norm_contribution, scale_grads_


def clip_grad_norm_(
    parameters: Iterable[Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    pp_group: Communicator | None = None,
) -> float:
    """Scale every ``.grad`` in place so that the global ``norm_type``-norm is at most ``max_norm``.

    The norm is over all gradients of the *whole* model as one vector: sharded parameters summed over
    their ``tp_group``, replicated ones counted once, stages summed over ``pp_group`` (if given).
    Returns that norm before clipping (a Python float, the same on every rank). Collective over each
    ``tp_group`` (and ``pp_group``): every rank must call it, with the same kinds of parameters.
    A parameter without a gradient contributes nothing.

    Raises ``TypeError``/``ValueError`` for a non-number, ``max_norm < 0`` or ``norm_type <= 0``;
    ``ValueError`` for a sharded parameter (``tp_dim`` set) without a ``tp_group``.
    """
    norm_type = check_clip_args(max_norm, norm_type)
    op = "max" if math.isinf(norm_type) else "sum"
    params = list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    replicated = norm_contribution(
        (p.grad for p in params if p.grad is not None and getattr(p, "tp_dim", None) is None), norm_type
    )
    # Sharded parameters, grouped by their tp group (in order of first appearance, the same on every rank).
    by_group: dict[int, tuple[Communicator, list]] = {}
    for p in params:
        if getattr(p, "tp_dim", None) is not None:
            if getattr(p, "tp_group", None) is None:
                raise ValueError(
                    f"clip_grad_norm_: a parameter of shape {p.shape} has tp_dim={p.tp_dim} but no tp_group; "
                    "set p.tp_group to the communicator it is sharded over"
                )
            group, members = by_group.setdefault(id(p.tp_group), (p.tp_group, []))
            if p.grad is not None:
                members.append(p.grad)
    parts = [replicated]
    for group, members in by_group.values():
        part = np.array([norm_contribution(members, norm_type)])
        parts.append(float(dist.all_reduce(part, op=op, group=group)[0]))
    total = np.array([max(parts) if op == "max" else sum(parts)])
    if pp_group is not None:
        dist.all_reduce(total, op=op, group=pp_group)
    norm = finish_norm(float(total[0]), norm_type)
    scale_grads_(grads, max_norm, norm)
    return norm

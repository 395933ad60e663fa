"""``clip_grad_norm_`` for tensor- (and pipeline-) parallel models: the true global norm.

The norm to clip by is the one the single-device model would have (Pascanu et al. 2013, §3.2), so
that tp=n trains exactly like tp=1. Under tensor parallelism a rank holds two kinds of parameters
(Shoeybi et al. 2019, §3; their ``tp_dim`` attribute says which, see ``nn.Parameter``):

* **sharded** (``tp_dim`` 0 or 1): this rank holds 1/n of the tensor. Its share of the squared norm is
  summed over the tp group (one small all-gather per distinct group, usually one);
* **replicated** (``tp_dim`` None): every tp rank holds the same gradient. Summing over the group
  would count it n times, so it is counted once.

Pipeline stages hold disjoint parameters, so with ``pp_group`` the per-stage totals are summed over
it; the one exception, a tied weight's copy on a later stage (``is_tied_copy``: the GPT's output head
reading the token table, ``pipeline/tied.py``), has its original's gradient and is counted once, on
the original's stage (it is still scaled). The all-gathers (rather than all-reduces: same cost for a
few numbers) also carry a hash of every rank's parameter list and arguments, so ranks that disagree
raise instead of clipping differently.
Data-parallel replicas need nothing: after DDP their gradients are already equal.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist.autograd import Tensor
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
    parameters: Iterable[Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    pp_group: Communicator | None = None,
    error_if_nonfinite: bool = False,
) -> float:
    """Scale every ``.grad`` in place so that the global ``norm_type``-norm is at most ``max_norm``.

    The norm is over all gradients of the *whole* model as one vector: sharded parameters summed over
    their ``tp_group``, replicated ones counted once, stages summed over ``pp_group`` (if given), a
    tied copy (``is_tied_copy``) not at all: its original counts for it.
    Returns that norm before clipping (a Python float, the same on every rank). Collective over each
    ``tp_group`` (and ``pp_group``): every rank must call it, with its shard of the same parameters.
    A parameter without a gradient contributes nothing. A NaN or inf gradient anywhere makes the
    returned norm NaN or inf (also for ``norm_type=inf``) on every rank, and the gradients are then
    left unchanged (``minidist/nn/utils.py`` explains why); skip the step, or pass
    ``error_if_nonfinite=True`` to raise.

    Each tp group exchanges, with the contributions it sums anyway, a hash of every rank's parameter
    list (shapes, ``tp_dim``s) and arguments, so a rank that passed other parameters (or another
    ``max_norm``) is an error on every rank instead of a silently wrong norm: one all-gather of five
    numbers per tp group and one over ``pp_group``, the collectives this function needs anyway. The
    replicated part travels along too (its largest value is used: equal on every rank in normal use),
    so the norm is the same on every rank even if one rank's copy of a replicated gradient is NaN.

    Raises (on every rank of the groups): ``TypeError``/``ValueError`` for a non-number,
    ``max_norm < 0`` or ``norm_type <= 0`` (local checks, before any message: pass the same arguments
    everywhere); ``ValueError`` for a sharded parameter (``tp_dim`` set) without a ``tp_group``, or for
    ranks of a tp group (pp group) whose parameter lists or arguments differ; ``RuntimeError`` for a
    non-finite norm if ``error_if_nonfinite``.
    """
    norm_type = check_clip_args(max_norm, norm_type)
    params = list(parameters)
    grads = [p.grad for p in params if p.grad is not None]  # all scaled, tied copies too
    # ... but a tied copy is counted once, as its original (module docstring)
    params = [p for p in params if not getattr(p, "is_tied_copy", False)]
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
    arguments = (float(max_norm), norm_type, bool(error_if_nonfinite))
    named = dict(zip(("max_norm", "norm_type", "error_if_nonfinite"), arguments))
    layout = _digest([_piece_shape(p) for p in params], arguments)
    sharded = sum(getattr(p, "tp_dim", None) is not None for p in params)
    parts = [] if by_group else [replicated]
    for group, members in by_group.values():  # the replicated part travels with the first group's
        mine = [norm_contribution(members, norm_type), replicated, layout, len(params), sharded]
        details = {"parameters": len(params), "sharded": sharded, **named}
        parts.append(_gather_and_check(group, mine, norm_type, "tensor-parallel", details))
        replicated = 0.0
    total = combine_contributions(parts, norm_type)
    if pp_group is not None:  # stages hold different parameters: compare only the arguments
        mine = [total, 0.0, _digest([], arguments), len(params), sharded]
        total = _gather_and_check(pp_group, mine, norm_type, "pipeline", named)
    norm = finish_norm(total, norm_type)
    check_finite(norm, norm_type, error_if_nonfinite)  # the same norm on every rank: all raise alike
    scale_grads_(grads, max_norm, norm)
    return norm


def _piece_shape(p: Tensor) -> tuple[Any, ...]:
    """What every tp rank's piece of ``p`` has in common: its shape with the split axis left out (an
    uneven split, e.g. a 65-row vocabulary over 2 ranks, gives pieces of 33 and 32 rows), and ``tp_dim``."""
    tp_dim = getattr(p, "tp_dim", None)
    shape = tuple(-1 if axis == tp_dim else n for axis, n in enumerate(p.shape))
    return shape, tp_dim


def _digest(layout: list[Any], arguments: tuple[Any, ...]) -> float:
    """A 48-bit hash of ``(layout, arguments)`` as a float64 (exact: below 2**53), equal across processes."""
    blob = repr((layout, arguments)).encode()
    return float(int.from_bytes(hashlib.blake2b(blob, digest_size=6).digest(), "little"))


def _gather_and_check(
    group: Communicator, mine: list[float], norm_type: float, kind: str, details: dict[str, Any]
) -> float:
    """All-gather ``[sharded contribution, replicated contribution, hash, #params, #sharded]``; raise on
    every rank if the hashes differ (naming, through one more exchange of ``details`` on that error
    path only, what differs), else return the combined contribution: the sharded ones combined
    (in rank order, so identical on every rank) with the largest replicated one. Replicated gradients
    are equal on every rank, so that is counting them once; the max also makes a NaN or inf that only
    one rank's copy holds reach every rank (NaN wins in ``ndarray.max``), so all ranks agree."""
    everyone = dist.all_gather(np.array(mine, np.float64), group=group).reshape(group.size, 5)
    if len(set(everyone[:, 2].tolist())) > 1:  # every rank sees this: all take this path together
        fix = (
            "every rank must pass its shard of the same parameters, with the same max_norm, norm_type "
            "and error_if_nonfinite"
        )
        dist.agree(details, None, group, what="clip_grad_norm_", label=f"{kind} group", fix=fix)
        raise ValueError(  # equal counts and arguments: the shapes or tp_dims differ
            f"clip_grad_norm_: the ranks of the {kind} group passed parameters of different shapes or "
            f"tp_dims; {fix}"
        )
    sharded = combine_contributions(everyone[:, 0], norm_type)
    return combine_contributions([sharded, everyone[:, 1].max()], norm_type)

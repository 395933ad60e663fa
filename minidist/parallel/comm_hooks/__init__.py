"""DDP communication hooks: how a bucket of gradients is averaged, including compressed (PyTorch's API).

``ddp.register_comm_hook(state, hook)`` replaces DDP's plain ``all_reduce(op="avg")`` of each bucket by
``hook(state, bucket)``, which must return the bucket's averaged flat gradient (PyTorch's
``torch.distributed.algorithms.ddp_comm_hooks``; ours are synchronous, see ``default.py``). Reading
order: ``bucket.py`` (what a hook sees, and the byte counts) -> ``default.py`` (plain, float16 and
bfloat16 all-reduce) -> ``powersgd.py`` (low-rank compression with error feedback) -> ``registration.py``
(the checks every rank agrees on, and how DDP calls a hook).

Fewer bytes per step matter when the network, not the arithmetic, limits a step: on a slow link between
machines an all-reduce of ``N`` bytes costs about ``2 (n-1)/n N / bandwidth``, so halving (16-bit) or
cutting ``N`` by 10-100x (PowerSGD) buys that much of the communication time, at some cost in accuracy
that ``benchmarks/README.md`` ("Gradient compression") measures.
"""

from typing import Any

from minidist.parallel.comm_hooks.bucket import CommStats, GradBucket
from minidist.parallel.comm_hooks.default import allreduce_hook, bf16_compress_hook, fp16_compress_hook
from minidist.parallel.comm_hooks.powersgd import PowerSGDState, orthogonalize, powerSGD_hook

HOOKS = {"none": None, "allreduce": allreduce_hook, "fp16": fp16_compress_hook, "bf16": bf16_compress_hook,
         "powersgd": powerSGD_hook}  # fmt: skip
"""The hooks by the short names the examples' ``--comm-hook`` flag takes (``"none"``: no hook)."""


def register_by_name(ddp: Any, name: str, *, powersgd_rank: int = 1, start_powerSGD_iter: int = 10) -> None:  # noqa: N803
    """``ddp.register_comm_hook`` for one of :data:`HOOKS`' names (``"none"``: nothing), as the examples'
    ``--comm-hook NAME --powersgd-rank R`` do; PowerSGD gets ``PowerSGDState(None, powersgd_rank,
    start_powerSGD_iter)``. Collective (every rank, before the first backward). Raises ``ValueError``
    for an unknown name, and as ``register_comm_hook``.
    """
    if name not in HOOKS:
        raise ValueError(f"unknown communication hook {name!r}; valid choices are {', '.join(HOOKS)}")
    if name == "powersgd":
        ddp.register_comm_hook(PowerSGDState(None, powersgd_rank, start_powerSGD_iter), powerSGD_hook)
    elif name != "none":
        ddp.register_comm_hook(None, HOOKS[name])


__all__ = [
    "GradBucket", "CommStats", "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook",
    "PowerSGDState", "powerSGD_hook", "orthogonalize", "HOOKS", "register_by_name",
]  # fmt: skip

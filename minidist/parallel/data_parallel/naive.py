"""Naive data parallelism: one all-reduce per gradient, as soon as backward has finished it.

Every rank holds the whole model and a slice of each global batch. Two rules keep the replicas one model:

1. They start identical: wrapping a model broadcasts rank 0's parameters to the group.
2. They take identical steps: after backward every rank holds the *average* of all ranks' gradients,
   so the (deterministic) optimizer makes the same update everywhere.

If each rank's loss is the mean over its equal share of the global batch, the average of the ranks'
gradients is exactly the gradient of the mean loss over the whole global batch, so N ranks train the
same model as one process would (up to float rounding of the summation order).

``DataParallelNaive`` is the two rules and nothing else: a hook on every parameter
(``register_post_accumulate_grad_hook``) all-reduces its gradient with ``op="avg"`` the moment backward
has finished it. Correct, and slow: P parameters cost P all-reduces per step, so the latency alpha is
paid P times (a ResNet has ~160 gradient tensors, many of them tiny), and each all-reduce stops backward
until it is done (Li et al., "PyTorch Distributed", VLDB 2020, §3.2). ``ddp.py`` is the real one: the
same two rules with buckets, overlap, ``no_sync`` and the checks; the tests train both and compare.

**Left out**, with the checks: the hooks pair the k-th gradient finished on one rank with the k-th on
every other, so a parameter that backward reaches on some ranks only (a branch taken by rank, a layer
frozen on one rank) pairs the wrong gradients and the replicas drift apart, without an error. DDP
compares the ranks' gradients before it reduces any, and says which parameter is missing where.
"""

from __future__ import annotations

from typing import Any

import minidist.distributed as dist
from minidist.nn.module import Module, Parameter


class DataParallelNaive(Module):
    """Wrap ``module`` so that ``loss.backward()`` leaves every ``.grad`` averaged over ``group``.

    Collective: every rank of ``group`` (default: the world) wraps the same model together, and runs
    the same backward passes (the hooks fire in the order backward finishes the gradients, the same on
    every rank for the same model). ``naive(x)`` calls ``module(x)``.
    """

    def __init__(self, module: Module, group: Any = None) -> None:
        super().__init__()
        self.module = module
        self.group = group if group is not None else dist.init()
        for p in module.parameters():
            dist.broadcast(p.data, src=0, group=self.group)  # rule 1: rank 0's parameters everywhere
            p.register_post_accumulate_grad_hook(self._average)  # rule 2, one gradient at a time

    def _average(self, param: Parameter) -> None:
        dist.all_reduce(param.grad, op="avg", group=self.group)  # in place: .grad is the average

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

"""Data parallelism: every rank holds the whole model and a slice of each global batch.

``DistributedDataParallel`` (DDP) keeps the replicas identical by two rules:

1. They start identical: wrapping a model broadcasts rank 0's parameters to the group.
2. They take identical steps: after backward every rank holds the *average* of all ranks'
   gradients, so the (deterministic) optimizer makes the same update everywhere.

If each rank's loss is the mean over its equal share of the global batch, the average of the
ranks' gradients is exactly the gradient of the mean loss over the whole global batch, so N ranks
train the same model as one process would (up to float rounding of the summation order).

This first version communicates once, after backward: a hook on each parameter notices that its
gradient is complete; the first hook of a backward pass queues a callback that the autograd engine
runs when backward ends; the callback packs every gradient into one flat buffer and averages it
with one ring all-reduce (fewer, larger messages: the latency term alpha is paid 2(n-1) times per
step instead of per parameter). Bucketing and overlapping communication with backward come later.

Source: Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training",
VLDB 2020, §3.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from minidist import autograd, backend, dist
from minidist.nn.module import Module, Parameter


def _flatten(arrays: list[Any]) -> Any:
    """One contiguous 1-D copy of ``arrays``, concatenated in order."""
    return backend.array_module(arrays[0]).concatenate([a.reshape(-1) for a in arrays])


def _unflatten_into(flat: Any, arrays: list[Any]) -> None:
    """Copy consecutive pieces of ``flat`` back into ``arrays`` (in place)."""
    offset = 0
    for a in arrays:
        a[...] = flat[offset : offset + a.size].reshape(a.shape)
        offset += a.size


class DistributedDataParallel(Module):
    """Wrap ``module`` so that ``loss.backward()`` leaves gradients averaged over ``group``.

    Args:
        module: the model; ``ddp(x)`` calls ``module(x)``. Its parameters are overwritten with rank
            0's when wrapping (a collective: every rank of ``group`` must construct DDP together).
        group: the data-parallel communicator from ``dist`` (default: the world).
        bucket_cap_mb, overlap: accepted for the public API; this first version uses a single bucket
            after backward whatever their values (bucketed, overlapped communication is a later step).

    Gradients are averaged with ``dist.all_reduce(op="avg")`` over one flat buffer of all gradients
    (4 bytes x number of parameters for float32). ``state_dict()`` names start with ``"module."``,
    as in PyTorch.

    Raises:
        RuntimeError: after a backward pass in which some parameter received no gradient (its name is
            given); every rank must produce gradients for the same parameters.
    """

    def __init__(
        self,
        module: Module,
        group: Any = None,
        bucket_cap_mb: float = 25,
        overlap: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel wraps a Module, got a {type(module).__name__}")
        self.module = module
        self.group = group if group is not None else dist.init()
        self.bucket_cap_mb = bucket_cap_mb
        self.overlap = overlap
        self._named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._sync_enabled = True
        self._ready: set[int] = set()  # ids of parameters whose gradient this backward pass completed
        self._callback_queued = False

        # Rule 1: identical start. One broadcast of all parameters packed together.
        params = [p.data for p in module.parameters()]
        if params:
            flat = _flatten(params)
            dist.broadcast(flat, src=0, group=self.group)
            _unflatten_into(flat, params)

        for _, p in self._named:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Skip gradient communication inside this block: gradients accumulate locally in ``.grad``.

        The first backward outside the block averages the accumulated sums. For k micro-steps of
        local batch b on N ranks, each with a mean loss, divide each loss by k to get the gradient
        of the mean over the k*N*b samples.
        """
        previous, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = previous

    # -- called by the autograd engine during loss.backward() -----------------------------------
    def _on_grad_ready(self, param: Parameter) -> None:
        if not self._sync_enabled:
            return
        self._ready.add(id(param))
        if not self._callback_queued:
            self._callback_queued = True
            autograd.queue_callback(self._all_reduce_gradients)

    def _all_reduce_gradients(self) -> None:
        """Rule 2: identical steps. Average all gradients over the group, in place."""
        self._callback_queued = False
        unused = [name for name, p in self._named if id(p) not in self._ready]
        self._ready.clear()
        if unused:
            raise RuntimeError(
                f"DistributedDataParallel: parameters {unused} received no gradient in this backward pass; "
                "every parameter must take part in the loss on every rank (remove unused parameters, or "
                "freeze them with requires_grad=False before wrapping)"
            )
        grads = [p.grad for _, p in self._named]
        flat = _flatten(grads)
        dist.all_reduce(flat, op="avg", group=self.group)
        _unflatten_into(flat, grads)

"""Gradient buckets for DDP: which gradients travel together in one all-reduce, and the flat buffers.

Why buckets? One all-reduce per parameter pays the latency alpha once per parameter (a ResNet has
~160 tensors, many of them tiny); one all-reduce of all gradients after backward pays it once but can
only start when backward is over. A bucket of about ``bucket_cap_mb`` megabytes is the middle ground:
few enough messages that alpha hardly matters, and each bucket can start as soon as its gradients exist,
while backward computes the rest (Li et al., "PyTorch Distributed", VLDB 2020, §3.2.3).

Backward produces gradients roughly in *reverse* registration order (the last layer's first), so
buckets are filled in reverse registration order: bucket 0 holds the last layer's parameters and is
normally the first to fill. The plan is a pure function of the parameters' sizes and dtypes, computed
identically on every rank (no communication), which is what lets every rank issue the same all-reduces
in the same order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from minidist import backend


def plan_buckets(nbytes: Sequence[int], dtypes: Sequence[Any], cap_bytes: float) -> list[list[int]]:
    """Group parameter indices ``0..P-1`` into buckets of at most ``cap_bytes`` bytes of gradients each.

    Walks the parameters in reverse order (``P-1`` first) and closes a bucket when the next gradient
    would push it over ``cap_bytes`` or has another dtype (one bucket is one flat array of one dtype).
    A gradient bigger than ``cap_bytes`` gets a bucket of its own, so a tiny cap (``1e-6`` MB) gives one
    bucket per parameter. Returns the buckets in launch order, each a list of parameter indices in
    reverse registration order; every index appears exactly once.

    Raises ``ValueError`` if ``cap_bytes`` is not positive or the two sequences differ in length.
    """
    if not cap_bytes > 0:
        raise ValueError(f"bucket_cap_mb must be positive, got a cap of {cap_bytes} bytes")
    if len(nbytes) != len(dtypes):
        raise ValueError(f"plan_buckets: {len(nbytes)} sizes but {len(dtypes)} dtypes")
    # BEGIN SOLUTION A3.1: greedy buckets in reverse registration order, split by cap and dtype
    buckets: list[list[int]] = []
    size = 0
    for i in reversed(range(len(nbytes))):
        if (
            buckets
            and size + nbytes[i] <= cap_bytes
            and np.dtype(dtypes[i]) == np.dtype(dtypes[buckets[-1][0]])
        ):
            buckets[-1].append(i)
            size += nbytes[i]
        else:
            buckets.append([i])
            size = nbytes[i]
    return buckets
    # END SOLUTION


def flatten(arrays: Sequence[Any]) -> Any:
    """One contiguous 1-D copy of ``arrays`` (a non-empty sequence), concatenated in order."""
    return backend.array_module(arrays[0]).concatenate([a.reshape(-1) for a in arrays])


def unflatten_into(flat: Any, arrays: Sequence[Any]) -> None:
    """Copy consecutive pieces of the 1-D ``flat`` back into ``arrays``, in place (undoes :func:`flatten`)."""
    offset = 0
    for a in arrays:
        a[...] = flat[offset : offset + a.size].reshape(a.shape)
        offset += a.size


class Bucket:
    """One flat buffer that carries the gradients of some parameters through one all-reduce.

    Args:
        index: the bucket's position in launch order.
        params: the parameters (``Tensor``s) whose gradients it carries, in buffer order.
        extra: number of additional elements at the end of the buffer, after the gradients (DDP puts
            its per-step bookkeeping there, see ``ddp.py``), exposed as :attr:`extra`.

    The buffer ``flat`` has ``sum(p.size) + extra`` elements of the parameters' (common) dtype, on the
    parameters' device, allocated once and reused every step. What DDP needs of it every step is worked
    out here once: ``gradient_bytes`` (of the ``numel`` gradient elements), ``device`` (a context that
    makes the buffer's GPU current in the calling thread, as CuPy's current device is per thread; a
    do-nothing context on the host) and the bucket's names in traces, ``name``
    (``"allreduce bucket {index}"``) and ``start_name`` (``"start bucket {index}"``).
    """

    def __init__(self, index: int, params: Sequence[Any], extra: int = 0) -> None:
        self.index = index
        self.params = list(params)
        xp = backend.array_module(self.params[0].data)
        self.numel = sum(p.size for p in self.params)
        self.flat = xp.empty(self.numel + extra, dtype=self.params[0].dtype)
        self.extra = self.flat[self.numel :]  # a view: writing it writes the buffer
        self.nbytes = self.flat.nbytes
        self.gradient_bytes = self.numel * self.flat.itemsize
        self.device = self.flat.device if backend.is_gpu_array(self.flat) else contextlib.nullcontext()
        self.name, self.start_name = f"allreduce bucket {index}", f"start bucket {index}"
        # Each parameter's piece of the buffer, shaped like the parameter: made once, so that packing and
        # unpacking cost one assignment per parameter each step (no slicing or reshaping on the way).
        self.views = []
        offset = 0
        for p in self.params:
            self.views.append(self.flat[offset : offset + p.size].reshape(p.shape))
            offset += p.size

    def pack(self) -> None:
        """Copy every parameter's ``.grad`` into the buffer; a parameter without one contributes zeros."""
        # BEGIN SOLUTION A3.2: copy every gradient into the flat buffer (zeros for a missing one)
        for p, view in zip(self.params, self.views):
            grad = p.grad
            if grad is None:
                view[...] = 0
            elif grad is not view:  # (still the view from the last unpack: already in place)
                view[...] = grad
        # END SOLUTION

    def pack_zeros(self) -> None:
        """Fill the gradient part of the buffer with zeros (a rank that takes part without gradients)."""
        self.flat[: self.numel] = 0

    def unpack(self) -> None:
        """Make every parameter's ``.grad`` a view of its (reduced) piece of the buffer: no copy.

        Copying the averaged gradients back would move every gradient byte once more per step (67 MB
        for the benchmark's MLP, ~8 ms here); PyTorch offers the same as ``gradient_as_bucket_view``.
        The catch: the buffer is reused, so the next step's all-reduce overwrites it. That is what a
        training loop expects (``.grad`` holds the latest step's gradient), but keep a ``.copy()`` of a
        gradient you want to look at after the next backward.
        """
        # BEGIN SOLUTION A3.2: make every .grad a view of its piece of the buffer
        for p, view in zip(self.params, self.views):
            p.grad = view
        # END SOLUTION

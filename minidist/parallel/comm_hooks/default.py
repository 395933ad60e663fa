"""The default hooks: a plain all-reduce, and all-reduces in 16-bit floats (half the bytes).

PyTorch's ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks`` offers the same three. Their
``state`` is the process group (``None``: DDP's group); ours always communicate on ``bucket.group``,
DDP's private copy of that group (``bucket.py``), which ``register_comm_hook`` checks has the same ranks.

**Our hooks are synchronous.** PyTorch's hooks return a ``torch.futures.Future`` and DDP waits on it;
ours run the collective to the end and return the bucket's averaged flat gradient, an array of
``bucket.buffer()``'s shape and dtype (the buffer itself here). Overlap with backward still happens:
DDP calls the hook on its communication thread (``data_parallel/ddp.py``).

**Why 16 bits pays, and what it costs.** On a link of ``B`` bytes/s an all-reduce of ``N`` bytes takes
about ``2 (n-1)/n N / B``; sending float16 or bfloat16 instead of float32 halves ``N`` (Micikevicius et
al., "Mixed Precision Training", ICLR 2018, for float16 training; Kalamkar et al. 2019 for bfloat16).
Each value is rounded once when cast (relative error at most ``u = 2**-11`` for float16, ``2**-8`` for
bfloat16), and every addition of the all-reduce rounds again in 16 bits, so the average of ``n`` ranks
has a relative error of order ``n u``. float16's range ends at 65504 and its smallest normal number is
6.1e-5 (smaller gradients lose digits, below 6e-8 they become 0); bfloat16 keeps float32's range and
pays with fewer digits. On a CPU, prefer bfloat16: NumPy's float16 arithmetic has no fast path there
(adding two float16 arrays of 85,002 elements took 13x as long as in bfloat16 and 200x as long as in
float32 on the machine of ``benchmarks/README.md``, "Gradient compression"), and the all-reduce adds in
the compressed dtype, so float16 can cost more time than its halved bytes save.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist import backend
from minidist.parallel.comm_hooks.bucket import GradBucket, all_reduce


def bfloat16() -> np.dtype:
    """``ml_dtypes.bfloat16``, imported on first use: the import costs about 1 s of CPU per process
    here, which every rank of every launch would pay at ``import minidist``, compressing or not."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def allreduce_hook(state: Any, bucket: GradBucket) -> Any:
    """Average the bucket over the group with one all-reduce: what DDP does without a hook.

    ``state``: None or DDP's group (unused: ``bucket.group`` is used). Returns ``bucket.buffer()``,
    averaged in place (synchronous, see the module docstring). Sends what plain DDP sends, but DDP's
    bookkeeping flags (``data_parallel/checks.py``) travel in a second, tiny all-reduce when a hook is
    registered.
    """
    return all_reduce(bucket.buffer(), bucket, op="avg")


def fp16_compress_hook(state: Any, bucket: GradBucket) -> Any:
    """Average the bucket in float16: divide by ``n``, cast, all-reduce (sum) in float16, cast back.

    ``state``: None or DDP's group (unused). Returns ``bucket.buffer()`` (synchronous), holding the
    float16 average converted to the buffer's dtype. Half the payload of a float32 all-reduce. Dividing
    by ``n`` *before* the sum, as PyTorch does, keeps the sum of ``n`` gradients within float16's
    range; a gradient above ``65504 n`` still becomes ``inf`` (use :func:`bf16_compress_hook`, or clip).
    Our all-reduce sums float16 with NumPy; ``algorithm="mpi"`` would need MPI's float16 extension.
    """
    return _low_precision_average(bucket, np.dtype(np.float16))


def bf16_compress_hook(state: Any, bucket: GradBucket) -> Any:
    """Average the bucket in bfloat16 (``ml_dtypes.bfloat16``): as :func:`fp16_compress_hook`.

    float32's exponent range (no overflow, no underflow that float32 would not have) with 8 significant
    bits instead of 11. MPI has no bfloat16 datatype: the hand-written all-reduce sums it with NumPy
    (ml_dtypes' ufuncs). CuPy has no bfloat16 either: a GPU bucket is compressed on the host, where it
    is staged for MPI anyway.
    """
    return _low_precision_average(bucket, bfloat16())


def _low_precision_average(bucket: GradBucket, dtype: np.dtype) -> Any:
    buffer = bucket.buffer()
    source = backend.to_numpy(buffer) if dtype.name == "bfloat16" and backend.is_gpu_array(buffer) else buffer
    compressed = (source / bucket.group.size).astype(dtype)
    all_reduce(compressed, bucket, op="sum")
    buffer[...] = backend.array_module(buffer).asarray(compressed.astype(buffer.dtype))
    return buffer

"""Shard files in the safetensors format, with their sha256, through the ``safetensors`` library.

The format (https://github.com/huggingface/safetensors): an 8-byte little-endian header length, a
JSON header ``{key: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}}``, then the raw
little-endian tensor bytes. It holds only data, so reading it can never run code (unlike pickle).

We let the library do the encoding and decoding (``safetensors.numpy.save`` / ``load``), which is
what the project's rule asks for: file formats come from a well-kept library, even when a
hand-written streaming writer would save a copy. What is ours is around it: the checksum that makes
a damaged file an error instead of a silently different model, and the fsync that makes the file
durable before the checkpoint is committed (``atomic.py``).
"""

from __future__ import annotations

import hashlib
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import safetensors
import safetensors.numpy

from minidist.checkpoint.errors import CheckpointError


def write_shard(path: Path, arrays: dict[str, np.ndarray]) -> tuple[str, int]:
    """Write ``arrays`` (NumPy, any shapes) as a safetensors file, fsynced.

    Returns ``(sha256 hex digest of the file, its size in bytes)``. The library writes the file
    (``safetensors.numpy.save_file``); then a helper thread hashes it from the page cache through a
    memory map while this thread waits for ``fsync``: the checksum costs no copy and hides behind the
    disk. Raises ``TypeError`` for a dtype safetensors cannot store (e.g. complex).
    """
    for key, a in arrays.items():
        if a.dtype.kind not in "biuf":
            raise TypeError(f"checkpoint: cannot store {key!r} of dtype {a.dtype} in safetensors")
    safetensors.numpy.save_file({key: np.ascontiguousarray(a) for key, a in arrays.items()}, str(path))
    with open(path, "rb+") as f, ThreadPoolExecutor(max_workers=1) as pool:
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as pages:
            digest = pool.submit(lambda: hashlib.sha256(pages).hexdigest())
            os.fsync(f.fileno())  # on disk before the manifest that vouches for it is written
            return digest.result(), len(pages)


def read_shard(path: Path, sha256: str, nbytes: int, keep: bool = True) -> dict[str, np.ndarray]:
    """Read a shard into fresh arrays, checking its size and sha256 (``keep=False``: only check).

    The file is memory-mapped; a helper thread computes its sha256 while the ``safetensors`` library
    decodes the tensors from the same pages (hashlib releases the GIL), so the check costs little extra
    time. The arrays are returned only after the checksum matched. Raises ``CheckpointError`` naming
    the file if it is missing, truncated or extended (size differs from ``nbytes``), corrupt (checksum
    differs), or not a valid safetensors file.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CheckpointError("shard file missing", path) from None
    # BEGIN SOLUTION A6.3: refuse a file whose size differs from the manifest's (truncated or extended)
    if size != nbytes or size == 0:
        raise CheckpointError(
            f"shard file truncated or changed: {size} bytes, the manifest says {nbytes}", path
        )
    # END SOLUTION
    arrays: dict[str, np.ndarray] = {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as pages:
        with ThreadPoolExecutor(max_workers=1) as pool:
            digest = pool.submit(lambda: hashlib.sha256(pages).hexdigest())
            try:
                if keep:
                    with safetensors.safe_open(str(path), framework="numpy") as tensors:
                        arrays = {key: tensors.get_tensor(key) for key in tensors.keys()}  # noqa: SIM118
            except (safetensors.SafetensorError, ValueError, OSError) as err:
                if digest.result() != sha256:  # a damaged file: say so rather than "invalid format"
                    raise CheckpointError(
                        "shard file corrupt: its sha256 checksum differs from the manifest", path
                    ) from None
                raise CheckpointError(
                    f"shard file corrupt: not a valid safetensors file ({err})", path
                ) from None
            # BEGIN SOLUTION A6.3: return the arrays only if the file's sha256 matches the manifest's
            if digest.result() != sha256:
                raise CheckpointError(
                    "shard file corrupt: its sha256 checksum differs from the manifest", path
                )
            # END SOLUTION
    return arrays

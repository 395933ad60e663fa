"""The bytes behind arrays: each underlying buffer counted once, and NumPy's own count as a cross-check.

A view, a reshape or a ZeRO shard that views a parameter shares its base array's buffer: counting
``a.nbytes`` per array would count that memory twice. :func:`unique_nbytes` charges every buffer once,
to its base (``activations.base_of``). :func:`traced_numpy_bytes` asks ``tracemalloc`` what NumPy itself
allocated, independently of minidist: the tests compare the tracker's figures with it.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np

from minidist.memory import activations


def unique_nbytes(arrays: Any) -> int:
    """Bytes behind ``arrays`` (``None`` skipped), each underlying buffer once (views charged to it)."""
    owners = {}
    for a in arrays:
        if a is not None:
            b = activations.base_of(a)
            owners[id(b)] = int(b.nbytes)
    return sum(owners.values())


def traced_numpy_bytes() -> int:
    """Bytes of NumPy buffers alive now, as ``tracemalloc`` traced them (0 if it is not tracing).

    NumPy reports each array buffer it allocates to tracemalloc in its own domain
    (``numpy.lib.tracemalloc_domain``), independently of minidist: the cross-check of the tracker.
    """
    if not tracemalloc.is_tracing():
        return 0
    domain = tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)
    stats = tracemalloc.take_snapshot().filter_traces([domain]).statistics("filename")
    return sum(s.size for s in stats)

"""Memory accounting: bytes held per category on this rank, current and peak.

This package is at the bottom layer (beside ``backend`` and ``trace``), because the autograd engine
itself reports the activations its graph saves, and higher layers (FSDP's gathered parameters,
communication buffers) report theirs through the same two functions:

    from minidist import memory
    memory.allocated("gathered_parameters", +nbytes, owner="blocks.0")   # on gather
    memory.allocated("gathered_parameters", -nbytes, owner="blocks.0")   # on free

When no tracker is active, :func:`allocated` costs one flag check, so the hot paths may call it
unconditionally. ``MemoryTracker`` (tracker.py) turns the reports, together with the parameters,
gradients and optimizer state it measures itself, into the per-rank table the examples print and
into the optional budget that raises :class:`OutOfMemoryError`.

Reading order: ``counters.py`` (the categories and the one table) -> ``activations.py`` (what the
autograd graph keeps, counted per buffer; ``unique_nbytes``, each buffer once) -> ``sizes.py`` ("64MiB") ->
``errors.py`` (the message) -> ``tracker.py``. The formulas the measurements are compared with:
``minidist_tools/perfmodel/memory.py``.
"""

from __future__ import annotations

from minidist.memory.activations import traced_numpy_bytes, unique_nbytes
from minidist.memory.counters import CATEGORIES, allocated, tracking
from minidist.memory.errors import OutOfMemoryError
from minidist.memory.sizes import format_bytes, parse_size
from minidist.memory.tracker import BUDGET_ENV, MemoryTracker

__all__ = [
    "CATEGORIES", "allocated", "tracking", "traced_numpy_bytes", "unique_nbytes",
    "MemoryTracker", "BUDGET_ENV", "OutOfMemoryError", "format_bytes", "parse_size",
]  # fmt: skip

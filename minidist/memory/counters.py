"""The counters the library reports into: bytes per category, current and peak (see ``__init__``).

One module-level flag and one table, the only global state of the package: the reports come from deep
inside library code (an op's forward, FSDP's gather) that has no tracker object to hand.
"""

from __future__ import annotations

import threading

# What a rank's memory is spent on. Parameters, gradients and optimizer state are measured by the
# tracker from the model and optimizer; the others are reported by the code that allocates them.
CATEGORIES = (
    "parameters",  # the model's parameters as this rank holds them (a shard under FSDP)
    "gradients",  # their .grad arrays
    "optimizer_state",  # momentum, exp_avg, exp_avg_sq, ... (and master weights under mixed precision)
    "activations",  # arrays the autograd graph saved for backward, freed as backward releases them
    "gathered_parameters",  # FSDP: a unit's full parameters while it is gathered
    "communication",  # buffers that collectives and DDP's buckets hold
)

_active = False  # True while a tracker listens; allocated() checks only this when off
_current: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
_peak: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
_owners: dict[tuple[str, str], int] = {}  # (category, owner) -> bytes now, for the out-of-memory message
_listeners: list = []  # callables(category) run after each increase while active (the budget check)
# Communication threads report too (FSDP frees a gradient buffer once its reduce-scatter has run): a
# read-modify-write of the table must not interleave with the main thread's. Taken only while tracking.
_lock = threading.RLock()


def tracking() -> bool:
    """Whether a tracker is listening (reports are counted only then)."""
    return _active


def allocated(category: str, nbytes: int, owner: str = "") -> None:
    """Count ``nbytes`` more (or, if negative, fewer) bytes held in ``category``, by ``owner``.

    Args:
        category: one of :data:`CATEGORIES`.
        nbytes: bytes, positive when allocated, negative when freed.
        owner: a short name of what holds them (a module path, an op's name), for the error message.

    Raises:
        ValueError: an unknown category (only while tracking: off, the call returns at once).
    """
    if not _active:
        return
    if category not in _current:
        raise ValueError(f"unknown memory category {category!r}; use one of {CATEGORIES}")
    with _lock:
        now = _current[category] + nbytes
        _current[category] = now
        if now > _peak[category]:
            _peak[category] = now
        key = (category, owner)
        _owners[key] = _owners.get(key, 0) + nbytes
    if nbytes > 0:  # only growth is checked: freeing must never raise (clean-up after an error frees)
        for listener in _listeners:
            listener(category)

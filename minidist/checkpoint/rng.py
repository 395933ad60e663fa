"""Random-generator states to save and restore: minidist's default generator and, when tensor
parallelism is in use, its RNG tracker (``minidist.parallel.tensor_parallel.get_rng_tracker``)."""

from __future__ import annotations

import importlib
import sys
from typing import Any

from minidist import random as md_random

_TRACKER_MODULE = "minidist.parallel.tensor_parallel.random"


def _tracker(load: bool) -> Any:
    """The TP tracker; without ``load`` only if tensor parallelism was imported already.

    Importing it would initialise MPI, which ``recompute`` in a single process must not do; and a
    tracker nobody imported holds no state worth saving.
    """
    module = sys.modules.get(_TRACKER_MODULE)
    if module is None and load:
        try:
            module = importlib.import_module(_TRACKER_MODULE)
        except ImportError:
            return None
    return None if module is None else module.get_rng_tracker()


def get_states() -> dict[str, Any]:
    """``{"rng": default generator state, "tp_rng": tracker states or None}``, JSON-serialisable."""
    tracker = _tracker(load=False)
    return {"rng": md_random.get_rng_state(), "tp_rng": None if tracker is None else tracker.get_states()}


def set_states(states: dict[str, Any]) -> None:
    """Restore what :func:`get_states` returned (the tracker part only if one was saved)."""
    md_random.set_rng_state(states["rng"])
    if states.get("tp_rng") is not None:
        tracker = _tracker(load=True)
        if tracker is not None:
            tracker.set_states(states["tp_rng"])

"""The seeded random generator every minidist component draws from.

``manual_seed(s)`` resets it, so two runs (or one process and N processes) that call
``manual_seed`` with the same seed draw the same numbers: initial weights and dropout masks
are then reproducible. Numbers are drawn on the host with NumPy's PCG64 and moved to the
backend, so the CPU and GPU backends draw identical values from one seed.
"""

from __future__ import annotations

import numpy as np

_generator = np.random.default_rng(0)


def manual_seed(seed: int) -> None:
    """Seed the generator that minidist uses on this rank (weights init, dropout).

    Raises ``TypeError`` if ``seed`` is not an integer.
    """
    global _generator
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise TypeError(f"manual_seed expects an integer seed, got {type(seed).__name__}")
    _generator = np.random.default_rng(int(seed))


def generator() -> np.random.Generator:
    """The current generator (replaced by every ``manual_seed`` call)."""
    return _generator


def get_rng_state() -> dict:
    """The generator's state as a JSON-serialisable dict (for checkpoints)."""
    return _generator.bit_generator.state


def set_rng_state(state: dict) -> None:
    """Restore a state returned by :func:`get_rng_state`."""
    _generator.bit_generator.state = state

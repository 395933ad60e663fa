"""Argument checks shared by the loader and the sampler (kept apart so each file stays about one idea)."""

from __future__ import annotations

from typing import Any

import numpy as np


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` as a Python int >= ``minimum``.

    Raises ``TypeError`` if ``value`` is not an integer (``bool`` is rejected too, although Python
    counts it as one, because ``batch_size=True`` is surely a mistake) and ``ValueError`` if it is
    smaller than ``minimum``; both messages name the argument.
    """
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}.")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}.")
    return int(value)

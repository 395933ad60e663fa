"""Argument checks of the loader and the sampler (kept apart so each file stays about one idea)."""

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


def dataset_length(dataset: Any) -> int:
    """The number of samples in ``dataset``: an int length, a tuple ``(x, y, ...)`` or a sized object.

    A tuple or list of arrays counts as the length of its first array (the samples), not as the
    number of arrays. Raises ``TypeError`` for anything else and ``ValueError`` for a negative int.
    """
    if isinstance(dataset, (int, np.integer)) and not isinstance(dataset, bool):
        if dataset < 0:
            raise ValueError(f"a data set length must be >= 0, got {dataset}.")
        return int(dataset)
    if isinstance(dataset, (tuple, list)) and len(dataset) > 0 and hasattr(dataset[0], "__len__"):
        return len(dataset[0])
    if hasattr(dataset, "__len__"):
        return len(dataset)
    raise TypeError(
        f"cannot tell how many samples a {type(dataset).__name__} holds; pass an int length, "
        "a tuple of arrays (x, y), or an object with __len__."
    )


def check_same_permutation(state: dict[str, Any], **mine: Any) -> None:
    """Raise ``ValueError`` if a saved sampler ``state`` has another ``seed``, ``shuffle`` or
    ``dataset_len`` than ``mine``: it would draw another permutation (states saved before these were
    recorded lack them, and are not checked)."""
    for field, value in mine.items():
        if field in state and state[field] != value:
            raise ValueError(
                f"the saved sampler state has {field}={state[field]!r} but this DistributedSampler has "
                f"{field}={value!r}, so it would draw another permutation (samples repeated or skipped); "
                f"create the sampler with {field}={state[field]!r} as the run that saved (e.g. the same "
                "--seed and data), or restore only the model and optimizer (no sampler) for a new order."
            )

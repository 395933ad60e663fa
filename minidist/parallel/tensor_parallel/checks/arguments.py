"""The pieces every tensor-parallel check is made of: one argument on this rank, then the agreement.

Each layer's check (``layers.py``, ``vocab.py`` beside this file) first looks at its own arguments on
this rank with these helpers (a size, a flag, the group, the dtype written as text), catching the
first ``TypeError`` or ``ValueError``, and then calls :func:`agree` with that error (or None) and the
values every rank must share: one exchange that raises the same error on every rank.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist.distributed.comm import Communicator
from minidist.distributed.world import group_or_world
from minidist.parallel.tensor_parallel.random import share_generator

_skip_depth = 0  # > 0 inside `already_agreed()`


def positive_int(layer: str, name: str, value: Any) -> int:
    """``value`` as a Python int (NumPy integers accepted). Raises ``TypeError`` for anything that is
    not an integer (a float, a bool, a string) and ``ValueError`` for a value < 1."""
    if isinstance(value, bool):  # True == 1 would silently pass as a size
        raise TypeError(f"{layer}: {name} must be a positive int, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{layer}: {name} must be a positive int, got {value!r}") from None
    if value < 1:
        raise ValueError(f"{layer}: {name} must be a positive int, got {value}")
    return value


def flag(layer: str, name: str, value: Any) -> bool:
    """``value`` as a Python bool (NumPy booleans accepted). Raises ``TypeError`` for anything else: an
    array given as ``bias`` (a bias *tensor*, as some APIs take) must not pass as "truthy"."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(
        f"{layer}: {name} must be True or False, got {type(value).__name__}"
        + (" (the layer creates its own bias; pass bias=True)" if name == "bias" else "")
    )


def resolve_group(layer: str, group: Any) -> tuple[Communicator, Exception | None]:
    """``(communicator, None)`` for a valid ``group`` (None: the world); ``(world, TypeError)`` otherwise.

    A rank given something that is not a ``Communicator`` cannot take part in its peers' agreement over
    their group, so it joins it over the world instead and reports its error there: every rank then
    raises it when the others' group is the world (the default). With a smaller group the ranks' calls
    do not pair up; ``MINIDIST_TIMEOUT`` then turns the wait into an error.
    """
    try:
        return group_or_world(group), None
    except TypeError as e:
        return group_or_world(None), TypeError(f"{layer}: {e}")


def check_divisible(layer: str, name: str, value: int, group: Communicator) -> None:
    """Raise ``ValueError`` if ``value`` (the split size ``name``) is not divisible by the group size."""
    if value % group.size:
        raise ValueError(
            f"{layer}: {name}={value} is not divisible by the tensor-parallel group size {group.size}; "
            f"choose a size divisible by {group.size} or a different tp"
        )


def describe_dtype(dtype: Any) -> str:
    """``dtype`` as text the ranks can compare (``"float64"``), or its repr if NumPy does not know it."""
    try:
        return str(np.dtype(dtype))
    except TypeError:
        return repr(dtype)


@contextmanager
def already_agreed() -> Iterator[None]:
    """Inside, layers skip their agreement: for a block (``ParallelMLP``) that agreed on all of its
    arguments once, so that it costs one collective, not one per sub-layer."""
    global _skip_depth
    _skip_depth += 1
    try:
        yield
    finally:
        _skip_depth -= 1


def agree(group: Communicator, layer: str, arguments: dict[str, Any], error: Exception | None) -> None:
    """Raise the same error on every rank of ``group`` if any rank has ``error`` or the ranks'
    ``arguments`` (name -> int, bool or str) differ; nothing to exchange inside ``already_agreed()``.

    Collective (:func:`minidist.distributed.safety.agreement`): raises the failing rank's ``TypeError`` or
    ``ValueError`` prefixed with ``"rank R of the tensor-parallel group: "``, or a ``ValueError``
    naming each argument that differs and its value on every rank. Then the ranks adopt the group's
    first rank's generator state (``random.share_generator``), so that the layer they build next is one.
    """
    if _skip_depth:
        if error is not None:
            raise error
        return
    dist.agree(
        arguments,
        error,
        group,
        what=layer,
        label="tensor-parallel group",
        fix="build the layer with the same arguments on every rank of the group",
    )
    share_generator(group)

"""Argument checks for the tensor-parallel layers, agreed over the tp group before anything can fail.

A tensor-parallel layer is *one* layer spread over the ranks of a group: every rank must build it with
the same sizes and flags. A rank that builds ``RowParallelLinear(8, 4)`` while its peer builds
``RowParallelLinear(12, 4)`` would otherwise compute a different output with no error, and a
``gather_output`` on one rank only would fail much later in a collective with a message about
array lengths. So each layer describes its arguments and, in one small all-gather at construction
(a fixed-size record of bytes per rank), compares them across the group; an argument that is bad on
*any* rank is reported by *every* rank, so no rank is left waiting in the next collective.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist.distributed.comm import Communicator

RECORD_BYTES = 512  # per rank: an error kind and message, then the description of the arguments
_SEP = "\x1f"  # ASCII unit separator: never part of a repr we format
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
    ``arguments`` (name -> value, compared by their reprs) differ.

    One all-gather of ``RECORD_BYTES`` bytes per rank; nothing at all on a group of one rank.
    Raises ``TypeError``/``ValueError`` (the failing rank's kind) naming the rank, or ``ValueError``
    listing every rank's arguments.
    """
    description = ", ".join(f"{k}={v}" for k, v in arguments.items())
    if _skip_depth or group.size == 1:
        if error is not None:
            raise error
        return
    kind = type(error).__name__ if error is not None else ""
    text = _SEP.join([kind, str(error) if error is not None else "", description]).encode()
    record = np.zeros(RECORD_BYTES, np.uint8)
    record[: min(len(text), RECORD_BYTES)] = np.frombuffer(text[:RECORD_BYTES], np.uint8)
    everyone = _gather(group, record).reshape(group.size, RECORD_BYTES)
    fields = [row.tobytes().rstrip(b"\0").decode(errors="replace").split(_SEP) for row in everyone]
    fields = [(f + ["", "", ""])[:3] for f in fields]  # a truncated record may have lost separators
    for rank, (kind, message, _) in enumerate(fields):
        if kind:
            cls = TypeError if kind == "TypeError" else ValueError
            raise cls(f"{message} (raised on rank {rank} of the tensor-parallel group)")
    descriptions = [d for _, _, d in fields]
    if len(set(descriptions)) > 1:
        ranks: dict[str, list[int]] = {}
        for rank, d in enumerate(descriptions):
            ranks.setdefault(d, []).append(rank)
        listing = "; ".join(f"rank{'s' if len(r) > 1 else ''} {_ranks(r)}: {d}" for d, r in ranks.items())
        raise ValueError(
            f"{layer}: the ranks of its tensor-parallel group passed different arguments ({listing}); "
            "build the layer with the same arguments on every rank of the group"
        )


def _gather(group: Communicator, record: np.ndarray) -> np.ndarray:
    """Every rank's record, in rank order (a separate function so one-process tests can stand in for it)."""
    return dist.all_gather(record, group=group)


def _ranks(ranks: list[int]) -> str:
    return str(ranks[0]) if len(ranks) == 1 else ", ".join(map(str, ranks))

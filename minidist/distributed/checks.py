"""Argument checks shared by point-to-point calls and collectives.

A wrong argument to an MPI call often does not fail cleanly: a non-contiguous array is sent as the wrong
bytes, a rank out of range aborts the whole job with a cryptic MPI error. So every public entry point of
``dist`` checks its arguments first, on the calling rank, and raises ``TypeError`` or ``ValueError`` with
a message that says how to fix the call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from minidist.backend import is_gpu_array

# The MPI standard guarantees that tags 0..32767 are valid on every implementation (MPI_TAG_UB >= 32767).
MAX_TAG = 32767


def check_array(a: Any, name: str = "a", *, writable: bool = False) -> None:
    """Check that ``a`` is a C-contiguous NumPy or CuPy array that MPI can use directly.

    Raises ``TypeError`` if ``a`` is not an array or holds Python objects, and ``ValueError`` if it is not
    C-contiguous (MPI would read the wrong bytes, and an in-place result could not be written back
    through a flat view) or, with ``writable``, if it is read-only.
    """
    if not (isinstance(a, np.ndarray) or is_gpu_array(a)):
        raise TypeError(f"{name} must be a NumPy or CuPy array, got {type(a).__name__}")
    if a.dtype.hasobject:
        raise TypeError(f"{name} has dtype {a.dtype}: object arrays hold pointers, which cannot be sent")
    flags = a.flags  # a new object per access: read it once (this runs before every collective)
    if not flags.c_contiguous:
        raise ValueError(
            f"{name} (shape {a.shape}) is not C-contiguous, e.g. a transposed or strided view; "
            f"pass np.ascontiguousarray({name}) (and copy the result back if you need it in the view)"
        )
    if writable and not getattr(flags, "writeable", True):
        raise ValueError(f"{name} is read-only but this operation writes into it; pass a writable copy")


def check_rank(rank: Any, size: int, name: str) -> None:
    """Check that ``rank`` is an int in ``[0, size)``; raises ``TypeError`` or ``ValueError``."""
    if isinstance(rank, bool) or not isinstance(rank, int | np.integer):
        raise TypeError(f"{name} must be an int rank, got {type(rank).__name__}")
    if not 0 <= rank < size:
        raise ValueError(f"{name}={rank} is not a rank of this group: valid ranks are 0..{size - 1}")


def check_tag(tag: Any) -> None:
    """Check that ``tag`` is an int in ``[0, MAX_TAG]``; raises ``TypeError`` or ``ValueError``."""
    if isinstance(tag, bool) or not isinstance(tag, int | np.integer):
        raise TypeError(f"tag must be an int, got {type(tag).__name__}")
    if not 0 <= tag <= MAX_TAG:
        raise ValueError(f"tag={tag} is outside 0..{MAX_TAG}, the range every MPI implementation allows")


def check_message(group: Any, a: Any, peer: Any, name: str, tag: Any, *, writable: bool = False) -> None:
    """The arguments of ``group.send(a, dst, tag)`` (``name="dst"``) or ``recv`` (``"src"``, writable).

    Raises as :func:`check_array`, :func:`check_rank` and :func:`check_tag`, and ``ValueError`` for a
    peer that is this rank itself: a blocking send to oneself waits for a receive never posted.
    """
    check_rank(peer, group.size, name)
    if peer == group.rank:
        raise ValueError(
            f"{name}={peer} is this rank itself; a blocking send/recv to oneself would wait forever. "
            "Use sendrecv, or copy the array locally"
        )
    check_array(a, writable=writable)
    check_tag(tag)


def check_exchange(
    group: Any, send_a: Any, dst: Any, recv_a: Any, src: Any, sendtag: Any, recvtag: Any
) -> None:
    """The arguments of ``group.sendrecv(send_a, dst, recv_a, src, sendtag, recvtag)``; raises as above."""
    check_rank(dst, group.size, "dst")
    check_rank(src, group.size, "src")
    check_array(send_a, "send_a")
    check_array(recv_a, "recv_a", writable=True)
    check_tag(sendtag)
    check_tag(recvtag)


def check_choice(value: Any, valid: Sequence[str], name: str) -> None:
    """Raise ``ValueError`` naming the valid choices if ``value`` is not one of ``valid``."""
    if value not in valid:
        options = ", ".join(repr(v) for v in valid)
        raise ValueError(f"unknown {name} {value!r}; valid choices are {options}")

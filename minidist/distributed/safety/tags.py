"""Message tags that name the collective a message belongs to, so that mismatched calls never pair up.

Every hand-written collective moves its data with point-to-point messages on the group's
``collective_channel``, and MPI matches a message by (source, tag, communicator) only. With tag 0 for
all, rank 0 in a ``broadcast(src=0)`` and rank 1 in a ``broadcast(src=1)`` each send the other their
array, both calls "succeed", and the next ``all_reduce`` takes the stale message: wrong numbers, no
error. So the tag of every message on a channel says which call it belongs to::

    bits 16..27   the call's sequence number on the group, modulo 4096 (the k-th collective called on it)
    bits 13..15   which collective (all_reduce, reduce_scatter, all_gather, broadcast, reduce, barrier)
    bits 11..12   op (sum, avg, max, min)
    bits  6..10   src / dst, modulo 32
    bits  0..5    the dtype (NumPy's type number, modulo 64)

A collective's receive takes its peer's next message whatever its tag and compares the tag (MPI keeps
one sender's messages in order): one of another call raises ``CollectiveMismatchError`` there and then
(``watched.py``). One that no receive takes waits in MPI's queue, where the liveness watchdog
(``liveness.py``) finds it with ``MPI_Iprobe``. Either way both calls are named. Building the tag costs
a few integer operations per collective, nothing per message (the channel adds ``tag_base`` to each).

What the tag cannot tell apart: two calls with the same name, op, src/dst and dtype issued in a
different order (the lengths may differ: then the receive's length check fails instead), a src or
dtype that differs by a multiple of 32 or 64, and calls 4096 apart (the watchdog judges only messages
at most ``liveness.STALE_WINDOW`` calls old). Debug mode (``MINIDIST_DEBUG=1``) compares full
fingerprints, call sites included. MPI's built-in collectives (``algorithm="mpi"``) carry no tags of
ours. MPI guarantees tags only up to 32767, MPICH up to 2^29 - 1; with an ``MPI_TAG_UB`` below
:data:`PONG_TAG`, tags are not used (``tags_supported`` is False) and these checks are off.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

NAMES = ("?", "all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "barrier")
OPS = ("sum", "avg", "max", "min")
SEQ_BITS = 12
SEQ_WINDOW = 1 << SEQ_BITS  # sequence numbers are compared modulo this
NAME_BITS = 7 << 13  # the collective's code in a tag; 0 = a message of no numbered collective
DEPARTURE_TAG = 1 << 28  # above every collective tag: "this rank has left the program" (liveness.py)
PING_TAG = DEPARTURE_TAG + 1  # "are you there?" from a waiting rank (heartbeat.py)
PONG_TAG = DEPARTURE_TAG + 2  # "yes": the answer of a peer's watchdog thread


def tags_supported() -> bool:
    """True if this MPI allows tags up to :data:`PONG_TAG` (MPICH and Open MPI do)."""
    upper = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
    return upper is not None and upper >= PONG_TAG


def name_code(name: str) -> int:
    """The bits 13..15 of the tags of collective ``name`` (0 for a name not in :data:`NAMES`)."""
    return (NAMES.index(name) if name in NAMES else 0) << 13


def identity(name: str, op: Any = None, root: Any = None, dtype: Any = None) -> int:
    """The low 16 bits of a call's tags: which collective, op, src/dst and dtype (see the module doc).
    Never raises: arguments the collective will reject (an unknown op, a non-int src) count as 0."""
    # isinstance, not `type(x) is`: ranks may pass the same root as an int and as a NumPy integer
    # (``src=np.argmax(...)`` on one rank, ``int(...)`` on another), or the op as a ``np.str_``; the
    # collective accepts both spellings, so their tags must be equal. (Runs once per distinct
    # argument tuple: calls.collective_call caches identities.)
    op_code = OPS.index(op) if isinstance(op, str) and op in OPS else 0
    root_code = int(root) % 32 if isinstance(root, (int, np.integer)) and not isinstance(root, bool) else 0
    dtype_code = getattr(dtype, "num", 0) % 64
    return name_code(name) | op_code << 11 | root_code << 6 | dtype_code


def call_tag(seq: int, ident: int) -> int:
    """The tag of every message of call number ``seq`` with identity ``ident``."""
    return (seq % SEQ_WINDOW) << 16 | ident


def describe(tag: int, seq: int | None = None) -> str:
    """A tag in words: ``"#7 broadcast(src=1, float32)"``: the call's number, or ``seq`` when given
    (a tag holds only the number modulo 4096)."""
    seq, ident = (tag >> 16) if seq is None else seq, tag & 0xFFFF
    name = NAMES[ident >> 13] if ident >> 13 < len(NAMES) else "?"
    parts = []
    if name in ("all_reduce", "reduce_scatter", "reduce"):
        parts.append(f"op={OPS[(ident >> 11) & 3]}")
    if name in ("broadcast", "reduce"):
        parts.append(f"{'src' if name == 'broadcast' else 'dst'}={(ident >> 6) & 31}")
    dtype_num = ident & 63
    known = [t for t in np.sctypeDict.values() if np.dtype(t).num == dtype_num]
    if name != "barrier" and known:
        parts.append(str(np.dtype(known[0])))
    return f"#{seq} {name}({', '.join(parts)})"


def seq_offset(seq: int, current: int) -> int:
    """How far ``seq`` (a tag's 12-bit sequence number) lies after ``current``, in ``-2048..2047``."""
    return (seq - current + SEQ_WINDOW // 2) % SEQ_WINDOW - SEQ_WINDOW // 2

"""Debug mode (``MINIDIST_DEBUG=1``): before each collective, the ranks check they are calling the same one.

Every rank of a group must call the same collectives, in the same order, with matching arguments. When
one does not (an ``all_reduce`` inside ``if rank == 0:``, a loop one step shorter on one rank, a tensor
of another shape), MPI rarely notices: the program computes wrong numbers or hangs, far from the mistake.

In debug mode every collective first builds a *fingerprint* of the call: its number on the communicator
(the k-th collective called on it), its name, the arguments that must agree (``op``, ``src``/``dst``,
the array's shape and dtype, the algorithm when not ``"auto"``), the group (its size and its members'
world ranks) and the *call site*, the file and line of the user's program that made it
(:func:`call_site`: the first frame outside minidist, its tools and course, and the standard library)::

    #17 all_reduce(op=sum, shape=(100,), float32) at train.py:42

The site tells apart two same-shape calls made in a different order (``all_reduce(loss)`` then
``all_reduce(acc)`` on rank 0, the other way round on rank 1); not calls from the *same* line in a
different order (a loop over a set of metric names, ordered differently per process): the numbers come
out swapped. The price: in debug mode every rank must make a collective from the same line.

The ranks then gather every fingerprint with MPI's own ``MPI_Iallgather`` (debugging infrastructure,
not an algorithm we teach) over the ``collective_channel``; MPI never matches a collective with
point-to-point messages, so it cannot be confused with the algorithms' or the user's. If they differ,
*every* rank raises the same ``CollectiveMismatchError``::

    collective #17 mismatch on a group of 4 ranks: ranks [0, 1, 3] called all_reduce(op=sum,
    shape=(100,), float32) at train.py:42; rank 2 called all_gather(float32) at train.py:40

``all_gather`` compares only the dtype: its chunks may differ in length between ranks. (Argument checks
elsewhere agree through ``agreement.py``, on our own ``all_gather``; this check runs *inside* every
collective, that one included, and must wait with a deadline: MPI's non-blocking built-in it is.)

The end of the program counts as one more call on the world (:func:`check_at_exit`, at interpreter
exit), so a rank that skipped the last collective and finished is reported ("rank 2 reached the end of
the program") instead of leaving the others waiting. With ``MINIDIST_TIMEOUT`` (``watchdog.py``) the
exchange waits at most until the collective's deadline: a rank that never arrives gives a
``CollectiveTimeoutError`` naming it. Ranks in collectives on *different* groups never meet in one
exchange; each waits for its missing members (the timeout, or by default the heartbeats of
``waits.py``, turn that into an error). Cost: a latency-bound all-gather of 256 bytes per rank per
collective, for debugging, not speed. Every public collective runs these checks through ``calls.py``'s
wrapper, which the safety net puts around it (``seam.py``).
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import sysconfig
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from mpi4py import MPI

import minidist
from minidist.distributed import world
from minidist.distributed.comm import Communicator
from minidist.distributed.errors import CollectiveMismatchError, DistributedError
from minidist.distributed.safety import leaving
from minidist.distributed.safety.arrivals import ranks as describe_ranks
from minidist.distributed.safety.watchdog import CallInfo, abort_job, timeout_seconds

DEBUG_ENV = "MINIDIST_DEBUG"
FINGERPRINT_BYTES = 256  # fixed size, so the exchange is one MPI_Iallgather of bytes
EXIT = "exit"  # the name of the pseudo-collective "the program ended"


# Frames in these folders are not "the user's code": minidist itself and the tools and course beside
# it (a straggler monitor's all-gather is the user's call of monitor.step()), and the standard library
# (contextlib's `with`, threading's run() of DDP's communication thread).
_FRAMEWORK = os.path.dirname(os.path.abspath(minidist.__file__))
_NOT_USER = tuple(
    os.path.join(folder, "")  # with a trailing separator: ".../minidist/" is not ".../minidist_x/"
    for folder in (
        _FRAMEWORK,
        os.path.join(os.path.dirname(_FRAMEWORK), "minidist_tools"),
        os.path.join(os.path.dirname(_FRAMEWORK), "minidist_course"),
        sysconfig.get_paths()["stdlib"],
    )
)


def call_site() -> str:
    """``"train.py:42"``: the file (its last two path parts) and line of the first frame outside
    minidist (and its tools and course) and the standard library: the user's line that made this call.
    On a thread of minidist's own (DDP's ``ddp-comm``), which runs no user line: ``"thread 'ddp-comm'"``."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_NOT_USER):
        frame = frame.f_back
    if frame.f_code.co_filename.startswith(_NOT_USER):
        return f"thread {threading.current_thread().name!r}"
    parts = frame.f_code.co_filename.replace(os.sep, "/").split("/")
    return f"{'/'.join(parts[-2:])}:{frame.f_lineno}"


@functools.cache  # read once per process (at the first collective), as it is checked before every one
def debug_enabled() -> bool:
    """True if ``MINIDIST_DEBUG`` is set to anything but empty, ``0``, ``false``, ``no`` or ``off``."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


@functools.cache  # both settings are read once per process (see above): so is their combination
def checks_enabled() -> bool:
    """True if debug mode or a timeout is on, i.e. collectives must be numbered and tracked."""
    return debug_enabled() or timeout_seconds() is not None


def describe_call(
    name: str, array: Any = None, *, same_shape: bool = True, site: str | None = None, **args: Any
) -> str:
    """The human-readable part of a fingerprint, e.g. ``all_reduce(op=sum, shape=(100,), float32) at
    train.py:42``: ``args`` (``op``, ``src``, ``dst``, then ``algorithm`` unless ``"auto"``); ``array``'s
    shape (unless ``same_shape`` is False) and dtype, or the type name of a non-array (the collective
    will reject it anyway); ``site`` (:func:`call_site`), where the user's program made the call."""
    if name == EXIT:
        return "the end of the program"
    algorithm = args.pop("algorithm", "auto")
    parts = [f"{key}={value}" for key, value in args.items()]
    if array is not None and hasattr(array, "shape") and hasattr(array, "dtype"):
        parts += [f"shape={tuple(array.shape)}"] if same_shape else []
        parts.append(str(array.dtype))
    elif array is not None:
        parts.append(f"array={type(array).__name__}")
    if algorithm != "auto":
        parts.append(f"algorithm={algorithm}")
    return f"{name}({', '.join(parts)})" + (f" at {site}" if site else "")


def fingerprint(seq: int, text: str, world_ranks: list[int]) -> bytes:
    """``"seq|group|text"`` as exactly :data:`FINGERPRINT_BYTES` bytes; equal calls give equal bytes. The
    group is its size and a hash of its members' world ranks. A text too long to fit (a shape with dozens
    of dimensions) is cut and followed by a hash of the whole, so comparison stays exact."""
    group = f"{len(world_ranks)}:{hashlib.sha1(str(world_ranks).encode()).hexdigest()[:12]}"
    record = f"{seq}|{group}|{text}".encode()
    if len(record) > FINGERPRINT_BYTES:
        record = record[: FINGERPRINT_BYTES - 20] + b"..#" + hashlib.sha1(record).hexdigest()[:17].encode()
    return record.ljust(FINGERPRINT_BYTES, b"\0")


@contextmanager
def collective_scope(
    group: Communicator,
    name: str,
    array: Any = None,
    *,
    same_shape: bool = True,
    site: str | None = None,
    **args: Any,
) -> Iterator[None]:
    """Run the ``with`` block as collective ``name`` on ``group``, with the checks the environment asks for.

    Nothing without ``MINIDIST_DEBUG`` and ``MINIDIST_TIMEOUT``, or on one rank. Otherwise it numbers the
    call, records this rank's arrival and sets the deadline (``watchdog.CallTracker.call``), and in debug
    mode compares fingerprints first (``array``, ``args``: as for :func:`describe_call`). Raises
    ``CollectiveMismatchError`` on every rank if they differ, ``CollectiveTimeoutError`` if a rank does
    not arrive before the deadline."""
    debug = debug_enabled()
    if group.size == 1 or not (debug or timeout_seconds() is not None):
        yield
        return
    with group.calls.call(name) as info:
        if debug:
            text = describe_call(name, array, same_shape=same_shape, site=site, **args)
            check_fingerprints(group, info, text)
        yield


def check_fingerprints(group: Communicator, info: CallInfo, text: str) -> None:
    """Gather every rank's fingerprint of call ``info``; raise ``CollectiveMismatchError`` if any differ."""
    tracker = group.calls
    mine = np.frombuffer(fingerprint(info.seq, text, tracker.world_ranks), dtype=np.uint8)
    everyone = np.empty((group.size, FINGERPRINT_BYTES), dtype=np.uint8)
    request = group.collective_channel.mpi.Iallgather([mine, MPI.BYTE], [everyone, MPI.BYTE])
    tracker.wait([request], [f"every rank of the group to join the {DEBUG_ENV} check of its calls"])
    records = [row.tobytes().rstrip(b"\0").decode(errors="replace") for row in everyone]
    if any(record != records[0] for record in records):
        is_world = tracker.world_ranks == list(range(MPI.COMM_WORLD.Get_size()))
        raise CollectiveMismatchError(mismatch_message(records, None if is_world else tracker.world_ranks))


def mismatch_message(records: list[str], world_ranks: list[int] | None = None) -> str:
    """Group the ranks by the fingerprint they sent and say who called what (the same text on every rank).
    ``records[r]``: rank ``r``'s decoded fingerprint; ``world_ranks`` (None for the world itself): the
    group's members, named in the header of a sub-group's message."""
    callers: dict[str, list[int]] = {}
    for rank, record in enumerate(records):
        callers.setdefault(record, []).append(rank)
    seqs = {record.split("|", 1)[0] for record in callers}
    header = f"collective #{next(iter(seqs))} mismatch" if len(seqs) == 1 else "collective mismatch"
    header += f" on a group of {len(records)} ranks"
    if world_ranks is not None:
        header += f" (world ranks {world_ranks})"
    clauses = []
    for record, ranks in callers.items():
        seq, _group, text = record.split("|", 2)
        who = describe_ranks(ranks)
        action = "reached the end of the program" if text == describe_call(EXIT) else f"called {text}"
        clauses.append(f"{who} {action}" + (f" as collective #{seq}" if len(seqs) > 1 else ""))
    return (
        f"{header}: {'; '.join(clauses)}. Every rank of a group must call the same collectives in the same "
        "order with matching arguments; look for a collective under an `if rank ...` branch, or a loop that "
        "runs a different number of times on some ranks."
    )


def check_at_exit() -> None:
    """At interpreter exit, in debug mode: tell ranks still waiting in a collective that this one ended.

    Every rank takes part in one last exchange on the world, named :data:`EXIT`, which ranks ending
    normally just pass. No deadline, even with ``MINIDIST_TIMEOUT``: a rank merely slower to finish (rank
    0 writing the results) must not be killed; ranks stuck in a collective time out there by themselves.
    An exception cannot leave an exit handler (Python would print it and exit with code 0): a mismatch is
    printed and the job aborted. ``safety.install`` registers it last, so it runs first."""
    if not world.is_initialized() or MPI.Is_finalized() or not debug_enabled():
        return
    everyone = world.init()
    if everyone.size == 1:
        return
    # Tell the groups first that this rank left: a rank waiting on a sub-group never joins the exchange
    # below on the world, and without the notice both would wait forever.
    leaving.announce_departure(wait=False)
    try:
        with everyone.calls.call(EXIT, timed=False) as info:
            check_fingerprints(everyone, info, describe_call(EXIT))
    except DistributedError as error:
        abort_job(everyone.mpi, f"{type(error).__name__}: {error}\n")
    leaving.receive_departures()  # after the exchange: ranks waiting in a collective could join it

"""The hang watchdog: deadlines for blocking calls, and ending the whole job when one rank fails.

A distributed program that goes wrong rarely crashes: it *hangs*. One rank raises and exits, or skips a
collective, and the others wait forever for a message that will never come. (The checks on by default,
a rank that left and calls that do not match, live in ``liveness.py``; here are the opt-in timeout and
the abort on an uncaught exception.)

**Timeouts** (``MINIDIST_TIMEOUT=seconds``; unset, empty or ``0``: off, the default). ``watched.py`` then
replaces each blocking MPI call (``Send``, ``Recv``, ``Sendrecv``, ``Barrier``) by its non-blocking twin
and :meth:`CallTracker.wait`, which tests the requests, sleeping in between (backing off up to
:data:`MAX_PAUSE`), until they finish or the deadline passes, and then raises
``CollectiveTimeoutError``, naming the collective, its number on the group (the k-th called on it),
what this rank waited for and, from the group's arrival record (``arrivals.py``), which ranks never
reached it. The deadline is ``timeout`` seconds after the collective began (a ring of 14 steps does
not get 14 timeouts); each ``send``/``recv`` of the user's own gets ``timeout`` seconds. Without a
timeout the blocking calls run as before, for one cached function call per message. Like
``MINIDIST_DEBUG``, the variable is read once per process, at ``dist.init()``.

**A rank that dies** (``MINIDIST_ABORT_GRACE=seconds``, default 1). :func:`install_excepthook`, called by
``dist.init()`` with more than one rank, makes an uncaught exception print its traceback with every
line prefixed ``[rank r]``, wait the grace period (ranks failing at the same moment print theirs too)
and call ``MPI_Abort``, which ends every rank: ``mpiexec`` exits non-zero instead of hanging. (``python
-m mpi4py script.py`` does the same, without prefix and grace.) ``sys.exit`` is no uncaught exception:
it still exits normally, with its own code.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from mpi4py import MPI

from minidist.distributed.errors import CollectiveTimeoutError
from minidist.distributed.safety.arrivals import ArrivalRecord, describe_arrivals

TIMEOUT_ENV = "MINIDIST_TIMEOUT"
GRACE_ENV = "MINIDIST_ABORT_GRACE"
MAX_PAUSE = 1e-3  # longest sleep between two tests of a request: the most latency a timed wait adds


def seconds_setting(name: str, default: float) -> float | None:
    """Environment variable ``name`` as seconds (``default`` when unset); None for 0 or ``off``. Raises
    ``ValueError`` naming the variable for anything but a finite number >= 0 or ``off``."""
    value = os.environ.get(name, "").strip().lower()
    if value in ("off", "false", "no"):
        return None
    try:
        seconds = float(value) if value else default
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number of seconds or 'off'; e.g. {name}=60") from None
    if not 0 <= seconds < math.inf:  # also rejects nan, and inf (an endless grace period is a hang)
        raise ValueError(f"{name}={value!r} must be a finite number of seconds >= 0, or 'off'")
    return seconds or None


@functools.cache  # read once per process: a look-up in os.environ costs ~1 us, and this runs per message
def timeout_seconds() -> float | None:
    """``MINIDIST_TIMEOUT`` in seconds, or None when off (``ValueError`` if malformed). Read once, when
    first needed (normally by ``dist.init()``): set it before the job starts."""
    return seconds_setting(TIMEOUT_ENV, 0.0)


@dataclass(frozen=True)
class CallInfo:
    """The collective a rank is in: its name, its sequence number on the group, and when it must end."""

    name: str
    seq: int
    deadline: float | None  # a time.monotonic() value, or None without a timeout


class CallTracker:
    """Per-communicator bookkeeping, shared by a :class:`~minidist.distributed.comm.Communicator` and its
    channel: ``seq`` counts the collectives entered while checks are on (debug mode or a timeout),
    ``current`` is the one running, ``world_ranks[r]`` the world rank of group rank ``r``, ``arrivals``
    the group's :class:`~minidist.distributed.safety.arrivals.ArrivalRecord`, made only with
    ``MINIDIST_TIMEOUT`` set at the communicator's creation (collective: every rank must see the same
    setting, as ranks started by one ``mpiexec`` do).
    """

    def __init__(self, mpi_comm: MPI.Comm) -> None:
        self.rank = mpi_comm.Get_rank()
        self.seq = 0
        self.current: CallInfo | None = None
        self.world_ranks = _world_ranks(mpi_comm)
        self.arrivals = ArrivalRecord(mpi_comm) if timeout_seconds() and mpi_comm.Get_size() > 1 else None

    @contextmanager
    def call(self, name: str, *, timed: bool = True) -> Iterator[CallInfo]:
        """Number the collective ``name``, record the arrival and set its deadline, for the ``with`` block
        (``timed=False``: no deadline, even with ``MINIDIST_TIMEOUT`` set)."""
        self.seq += 1
        timeout = timeout_seconds() if timed else None
        info = CallInfo(name, self.seq, None if timeout is None else time.monotonic() + timeout)
        if self.arrivals is not None:
            self.arrivals.enter(self.seq, name)
        previous, self.current = self.current, info
        try:
            yield info
        finally:
            self.current = previous

    def timed(self) -> bool:
        """True if a wait starting now has a deadline, i.e. must use the non-blocking calls."""
        return self.current.deadline is not None if self.current else timeout_seconds() is not None

    def wait(
        self, requests: Sequence[MPI.Request], waiting_for: Sequence[str], statuses: Sequence[Any] = ()
    ) -> None:
        """Complete every request, or raise ``CollectiveTimeoutError`` when the deadline passes: the
        current collective's, or ``timeout`` seconds from now outside one; without a timeout, simply block
        (``MPI_Waitall``). ``waiting_for[i]`` says what request ``i`` waits for ("a message from rank 3
        (tag 0)"), for the error; ``statuses[i]`` (optional) receives its status. An MPI error of a request
        (``MPI_ERR_TRUNCATE``) propagates as ``mpi4py.MPI.Exception``. After a timeout the unfinished
        requests are cancelled (best effort: no late message may land in a receive buffer); the group
        should not be used again (its other ranks are in an unknown state)."""
        timeout = None if self.current else timeout_seconds()  # outside a collective: timeout s from now
        deadline = self.current.deadline if self.current else timeout and time.monotonic() + timeout
        statuses = list(statuses) or [MPI.Status() for _ in requests]
        if deadline is None:  # no timeout (debug mode's exchange without MINIDIST_TIMEOUT): just block
            MPI.Request.Waitall(list(requests), statuses)
            return
        pending, pause = list(range(len(requests))), 0.0
        while True:
            pending = [i for i in pending if not requests[i].Test(statuses[i])]
            if not pending:
                return
            if time.monotonic() > deadline:
                break
            # Sleep rather than spin: with more ranks than cores, a spinning waiter takes the CPU from
            # the very rank it waits for. Start with a bare yield (sleep 0) and double up to MAX_PAUSE.
            time.sleep(pause)
            pause = min(max(2 * pause, 1e-5), MAX_PAUSE)
        for i in pending:
            with contextlib.suppress(MPI.Exception):  # cancelling is best effort; the error comes next
                requests[i].Cancel()
        raise CollectiveTimeoutError(self.timeout_message([waiting_for[i] for i in pending]))

    def timeout_message(self, waiting_for: Sequence[str]) -> str:
        """What timed out, what it waited for and, from the arrival record, who has not arrived."""
        call = self.current
        what = f"{call.name} (collective #{call.seq} on this group)" if call else "a point-to-point call"
        me, world = f"rank {self.rank}", self.world_ranks
        if world != list(range(MPI.COMM_WORLD.Get_size())):  # a sub-group: its ranks are not world ranks
            me = f"rank {self.rank} of the group of world ranks {world} (all ranks named are group ranks)"
        text = (
            f"{me}: {what} did not finish within {TIMEOUT_ENV}={timeout_seconds() or 0:g} s; "
            f"it was waiting for {' and '.join(waiting_for)}."
        )
        if call is not None and self.arrivals is not None:
            text += " " + describe_arrivals(self.arrivals.read(), call.seq, call.name)
        return text + (
            " A rank that never arrives has usually failed (see its own error), is stuck in a long"
            " computation, or took a code path that skips this call; MINIDIST_DEBUG=1 compares every"
            " rank's calls."
        )


def _world_ranks(mpi_comm: MPI.Comm) -> list[int]:
    group, world = mpi_comm.Get_group(), MPI.COMM_WORLD.Get_group()
    ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world)
    group.Free()
    world.Free()
    return [int(r) for r in ranks]


def install_excepthook(world: MPI.Comm) -> None:
    """Make an uncaught exception end every rank of ``world`` (``MPI_Abort``) instead of hanging the rest:
    the hook prints the traceback and calls :func:`abort_job`. Idempotent. Raises ``ValueError`` now (a
    typo shows at start-up) for a malformed ``MINIDIST_ABORT_GRACE``."""
    _grace()
    if getattr(sys.excepthook, "minidist_abort", False):
        return

    def abort_on_uncaught_exception(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        abort_job(world, "".join(traceback.format_exception(kind, value, tb)))

    abort_on_uncaught_exception.minidist_abort = True  # type: ignore[attr-defined]
    sys.excepthook = abort_on_uncaught_exception


def abort_job(world: MPI.Comm, text: str, code: int = 1) -> None:
    """Print ``text`` with every line prefixed ``[rank r]``, wait the grace period (``MINIDIST_ABORT_GRACE``
    s, default 1: ranks failing at the same moment print their errors too), ``MPI_Abort``. No return."""
    grace = _grace()
    lines = text.splitlines(keepends=True)
    lines.append(f"aborting all {world.Get_size()} ranks in {grace:g} s (MPI_Abort), so none waits forever\n")
    sys.stdout.flush()
    sys.stderr.write("".join(f"[rank {world.Get_rank()}] {line}" for line in lines))
    sys.stderr.flush()
    time.sleep(grace)
    world.Abort(code)
    # MPI_Abort can return on a rank that the launcher is already ending (another rank aborted first):
    # never fall through into the caller, which would print its error a second time.
    os._exit(code)


def abort(message: str, code: int = 1) -> None:
    """End the whole job from this rank: print ``message`` (prefixed ``[rank r]``), wait the grace period,
    then ``MPI_Abort`` every rank of the world with exit ``code``. Does not return. For an error that may
    have happened on this rank only (a file missing on one node): a plain ``sys.exit`` would leave the
    other ranks waiting forever in their next collective."""
    abort_job(MPI.COMM_WORLD, message if message.endswith("\n") else message + "\n", code)


def _grace() -> float:
    return seconds_setting(GRACE_ENV, 1.0) or 0.0

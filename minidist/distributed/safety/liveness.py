"""The liveness watchdog: by default, no rank waits forever for a rank that left, fell behind or disagrees.

A rank that leaves (``sys.exit``, a ``return`` out of the training loop) while the others wait in a
collective, or whose collectives do not match theirs, hangs the whole job forever, silently. So
``dist.init()`` starts, on every rank of a job of several, a daemon thread that looks at every
``collective_channel`` each :data:`TICK` seconds (PyTorch's NCCL watchdog, which fires after 10 minutes,
is the same idea) and ends the job (``watchdog.abort_job``: ``MPI_Abort`` after the grace period, every
line prefixed ``[rank r]``) on:

* **A rank that left**, within a tick: its *departure notice* (``departures.py``; sent at exit, or when
  Python collects a group it dropped, ``leaving.py``) says it called k-1 collectives on the group while
  this rank waits in #k, which can never finish.
* **A message of another call** (``tags.py``) found waiting by ``MPI_Iprobe``: of this call number with
  another name, op, src/dst or dtype, or *stale*, of a call this rank finished without receiving it.
  A collective's receive that comes first takes it and raises at once (``watched.py``).
* **A call that takes too long** (``MINIDIST_WATCHDOG`` s, default :data:`DEFAULT_DEADLINE`): a rank
  stuck in a computation or a loop; named: the rank this one last waited for. ``MINIDIST_WATCHDOG=off``
  (or ``0``) stops the thread and every check here; tags stay on.
* **A rank that cannot be reached** (``heartbeat.py``): pinged after a second of waiting in a collective
  or a send or receive of the group's own (``p2p_wait``), it did not answer for ``MINIDIST_PEER_TIMEOUT``
  s (default 30): its node or link is down, or it is frozen. Named with its host.
* **Two ranks waiting for each other** in different calls, as their heartbeats tell (``waits.py``).

Why a thread, not a deadline in each wait (``MINIDIST_TIMEOUT``, ``watchdog.py``, whose polling costs
latency per message)? The collectives keep MPI's blocking calls and pay only :func:`enter`/:func:`leave`
(a few attribute stores); but the thread cannot raise in a main thread blocked in MPI: it ends the job.
Not covered: a ``recv`` from a rank that *left* (only collectives are numbered; use ``MINIDIST_TIMEOUT``),
and a rank that leaves while no other rank ever calls a collective again.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from typing import Any

from mpi4py import MPI

from minidist.distributed import world
from minidist.distributed.safety import departures, heartbeat, waits
from minidist.distributed.safety.tags import NAME_BITS, SEQ_WINDOW, describe, seq_offset, tags_supported
from minidist.distributed.safety.watchdog import abort_job, seconds_setting

WATCHDOG_ENV = "MINIDIST_WATCHDOG"
DEFAULT_DEADLINE = 300.0  # seconds one collective may wait; PyTorch's NCCL default is 600
TICK = 0.1  # seconds between two looks: the delay before a departure or a stray message is noticed
STALE_WINDOW = 1024  # a message at most this many calls old is stale; see _stray

_channels: list[weakref.ref] = []  # every collective channel of this process, in creation order
_thread: threading.Thread | None = None
_stop = threading.Event()


@functools.cache
def deadline_seconds() -> float | None:
    """``MINIDIST_WATCHDOG`` in seconds (default 300), or None for ``off``/``0``. Raises ``ValueError``."""
    return seconds_setting(WATCHDOG_ENV, DEFAULT_DEADLINE)


def watch(channel: Any) -> None:
    """Start tracking a new collective channel (called by ``Communicator.__init__``)."""
    # phase = (seq, outer, tag): the last call's number, the outermost running one's (None: none runs),
    # the running (or last) call's tag; one tuple, replaced whole: the thread never reads half an update.
    # No clock is read per call: the thread notes when it first saw a call running (`seen`, a tick late).
    channel.calls_started = 0
    channel.phase = (0, None, 0)
    channel.seen = (0, 0.0)  # (seq, time.monotonic() when the thread first saw it running)
    channel.peer = -1  # the rank the channel last waited for (set per receive in watched.py)
    channel.departed = {}  # group rank -> number of collectives it called before it left
    channel.dropped = set()  # group ranks that left by dropping the group (they receive on it no more)
    channel.p2p_wait, channel.p2p_kind = None, ""  # peers and kind of a waiting send/recv of the group's own
    channel.p2p_seen = (None, 0.0)  # (that p2p_wait, time.monotonic() when the thread first saw it)
    channel.use_tags = tags_supported()
    # Pings, pongs, departure notices travel apart: no collective's receive takes one. (One rank: no
    # peers, so no communicator spent on them; MPICH allows a process about 2,000.)
    channel.control = channel.mpi.Dup() if channel.size > 1 else channel.mpi
    heartbeat.setup(channel)
    _channels.append(weakref.ref(channel))


def enter(channel: Any, ident: int) -> tuple:
    """Mark the start of a collective with identity ``ident`` (``tags.identity``); return the old phase.

    Sets ``channel.tag_base``, which ``watched.py`` adds to every message tag of the call. Runs for every
    collective, as :func:`leave` does: a few attribute stores (docs/performance.md, "The checks that are
    on by default")."""
    seq = channel.calls_started = channel.calls_started + 1
    tag = ((seq % SEQ_WINDOW) << 16 | ident) if channel.use_tags else 0
    previous = channel.phase
    channel.phase = (seq, seq if previous[1] is None else previous[1], tag)
    channel.tag_base = tag
    return previous


def leave(channel: Any, previous: tuple) -> None:
    """Mark the end of the collective :func:`enter` started; ``previous`` is what it returned."""
    if previous[1] is None:  # the outermost call ended: nothing runs on this channel now
        channel.phase = (channel.calls_started, None, channel.tag_base)
        channel.tag_base = 0
    else:  # a collective called inside another (rare): the outer one runs on
        channel.phase = (channel.calls_started, previous[1], previous[2])
        channel.tag_base = previous[2]


def start() -> None:
    """Start the watchdog thread (``dist.init()``, more than one rank); idempotent, off if disabled."""
    global _thread
    heartbeat.peer_timeout()  # a malformed MINIDIST_PEER_TIMEOUT raises now, at start-up
    if _thread is None and deadline_seconds() is not None:
        _thread = threading.Thread(target=_run, name="minidist-watchdog", daemon=True)
        _thread.start()


def _run() -> None:
    while not _stop.wait(TICK) and not MPI.Is_finalized():  # (a program may finalize MPI itself)
        for channel in _live_channels():
            if problem := inspect_channel(channel, deadline_seconds()):
                abort_job(MPI.COMM_WORLD, problem + "\n")


def _live_channels() -> list[Any]:
    return [c for c in (ref() for ref in _channels) if c is not None and c.size > 1]


def inspect_channel(channel: Any, deadline: float | None, heartbeats: bool = True) -> str | None:
    """One look at ``channel``: the text of the problem found (see the module doc), or None.
    ``heartbeats=False`` (the last look at exit): answer pings, but send none."""
    seq, outer, tag = channel.phase  # read first: every later message is judged against it
    if channel.use_tags:
        heartbeat.answer(channel, lambda peer: waits.report(channel, peer, _live_channels()))
    for peer in range(channel.size):
        if peer == channel.rank:
            continue
        status = MPI.Status()
        departures.receive(channel, peer)
        if channel.use_tags and channel.mpi.Iprobe(source=peer, tag=MPI.ANY_TAG, status=status):
            if problem := _stray(channel, peer, status.Get_tag(), seq, outer, tag):
                return problem
    if outer is None:
        if heartbeats and channel.use_tags:
            return _p2p_heartbeat(channel, channel.p2p_wait)
        return None
    for peer, called in channel.departed.items():
        if called < seq:
            return (
                f"{_me(channel)}: {_them(channel, peer)} left the program (it exited) after calling "
                f"{called} collectives on this group, while this rank waits in {describe(tag, seq)}, which "
                f"it never called. Every rank must make the same collective calls: look for a `return`, "
                f"`break` or `sys.exit` that only some ranks take, or a loop that is shorter on rank {peer}."
            )
    now = time.monotonic()
    if channel.seen[0] != seq:
        channel.seen = (seq, now)
    if heartbeats and channel.use_tags:
        late, waited = heartbeat.overdue(channel, now - channel.seen[1], now)
        if late:
            return _unreachable(channel, late, waited, describe(tag, seq))
        if cycle := waits.cycle(channel, _live_channels()):
            return cycle
    if deadline is not None and time.monotonic() - channel.seen[1] > deadline:
        peer = channel.peer
        last = f"; it was last waiting for {_them(channel, peer)}" if peer >= 0 else ""
        return (
            f"{_me(channel)}: {describe(tag, seq)} has not finished after "
            f"{WATCHDOG_ENV}={deadline:g} s{last}. "
            "That rank (or one it waits for) is stuck in a long computation, waits in a collective on "
            "another group, or took a code path without this call. If a wait this long is legitimate "
            f"(rank 0 writing a large checkpoint), set {WATCHDOG_ENV} to more seconds, or to off."
        )
    return None


def _stray(channel: Any, peer: int, message_tag: int, seq: int, outer: int | None, tag: int) -> str | None:
    """The problem a waiting message from ``peer`` reveals, if any (see the module doc)."""
    if message_tag & NAME_BITS == 0:
        # Name code 0: a message sent on the channel outside any numbered collective (ring.py's
        # functions called directly, as the lessons and assignments do: tag_base is 0 then). It names
        # no call, so it cannot be judged; reading it as "call #0" aborted correct programs whenever
        # the watchdog looked while such a message was in flight.
        return None
    theirs = message_tag >> 16
    # How far the message's call lies before this rank's first unfinished call: 1 = the last one
    # finished. Numbers are modulo 4096, so "far behind" could also be "far ahead" (a root that runs
    # ahead through many broadcasts); only calls up to STALE_WINDOW behind count as finished.
    behind = -seq_offset(theirs, (seq + 1 if outer is None else outer) % SEQ_WINDOW)
    if 0 < behind <= STALE_WINDOW:  # stale
        return (
            f"{_me(channel)}: {_them(channel, peer)} sent this rank a message of its call "
            f"{describe(message_tag)} on this group, which this rank never received: this rank's call with "
            f"that number was different (its latest call: {describe(tag, seq)}). " + _ADVICE
        )
    if outer is not None and theirs == seq % SEQ_WINDOW and message_tag != tag:
        return (
            f"{_me(channel)}: {_them(channel, peer)} is in {describe(message_tag)} while this rank is in "
            f"{describe(tag, seq)} on the same group. " + _ADVICE
        )
    return None


def wrong_call(channel: Any, peer: int, message_tag: int) -> str:
    """The problem a message of another call, taken by a receive of the running collective, reveals."""
    seq, outer, tag = channel.phase
    return _stray(channel, peer, message_tag, seq, outer, tag) or (
        f"{_me(channel)}: {_them(channel, peer)} sent this rank a message of its call {describe(message_tag)}"
        f" while this rank waits in {describe(tag, seq)} for its message of that call. " + _ADVICE
    )


def _p2p_heartbeat(channel: Any, waiting: tuple[int, ...] | None) -> str | None:
    """Heartbeats while no collective runs: for the peers of a waiting send/recv (a pipeline stage's), or
    none (unanswered pings of a finished call are forgotten)."""
    if waiting is None:
        heartbeat.overdue(channel, None, 0.0)
        return None
    now = time.monotonic()
    if channel.p2p_seen[0] is not waiting:
        channel.p2p_seen = (waiting, now)
    late, waited = heartbeat.overdue(channel, now - channel.p2p_seen[1], now, waiting)
    ranks = " and ".join(f"rank {p}" for p in waiting)
    if late:
        return _unreachable(channel, late, waited, f"a send or receive with {ranks}")
    return waits.cycle(channel, _live_channels())


def host_of(channel: Any, peer: int) -> str:
    """The host name of group rank ``peer`` of ``channel`` (from ``dist.init()``), or "?" before init."""
    world_rank = channel.calls.world_ranks[peer]
    return world.hosts[world_rank] if world_rank < len(world.hosts) else "?"


def _unreachable(channel: Any, late: list[int], waited: float, call: str) -> str:
    names = ", ".join(f"{_them(channel, p)} (host {host_of(channel, p)})" for p in late)
    return (
        f"{_me(channel)}: {names} did not answer the watchdog's heartbeat for {waited:.0f} s "
        f"({heartbeat.PEER_TIMEOUT_ENV}={heartbeat.peer_timeout():g}) while this rank waits in {call}: "
        f"{'these ranks' if len(late) > 1 else 'that rank'} cannot be reached (a node is down or its network "
        "link is cut) or the process is frozen. "
        "A job launched by `minidist launch` restarts from the newest checkpoint."
    )


_ADVICE = (
    "Every rank of a group must call the same collectives in the same order, with the same src/dst, op "
    "and dtype; MINIDIST_DEBUG=1 shows where each rank made its call."
)


def _me(channel: Any) -> str:
    world = channel.calls.world_ranks
    if world == list(range(MPI.COMM_WORLD.Get_size())):
        return f"rank {channel.rank}"
    return f"rank {channel.rank} of the group of world ranks {world} (ranks named are group ranks)"


def _them(channel: Any, peer: int) -> str:
    world = channel.calls.world_ranks
    if world == list(range(MPI.COMM_WORLD.Get_size())):
        return f"rank {peer}"
    return f"rank {peer} (world rank {world[peer]})"


def running() -> bool:
    """True while the watchdog thread runs (from ``dist.init()`` until :func:`stop`)."""
    return _thread is not None


def stop() -> list[Any] | None:
    """Stop the watchdog thread (at exit; ``leaving.py``) and return the channels it watched, or None if
    it was not running (then nothing is to be announced)."""
    global _thread
    if _thread is None or MPI.Is_finalized():
        return None
    _stop.set()
    _thread.join(timeout=10)
    _thread = None
    return _live_channels()

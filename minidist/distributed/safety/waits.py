"""Wait cycles: two ranks that each wait for the other in a different call are named within seconds.

Both ranks live and answer heartbeats, no message of another call is in sight, yet neither moves: rank
0 ran out of batches and waits in a logging ``all_reduce`` on the world, rank 1 for it in DDP's gradient
all-reduce (DDP's own channel): ended only by ``MINIDIST_WATCHDOG``'s 300 s, unexplained. Or two ranks
each ``send`` 16 MiB to the other first: MPICH sends so large a message only once it is received, so
that hung for good. Now a pong (``heartbeat.py``) carries :func:`report`: the answering rank's wait, if
it waits for the pinging rank (a collective: number, identity, group; or a ``send``/``recv``), and its
age. The pinging rank, waiting for that peer too, judges the pair (:func:`cycle`): two waits that cannot
serve each other (collectives that are not the same call, a collective and a send or receive, two sends,
two receives), both :data:`CYCLE_AFTER` s old, end the job naming both. A process waiting in two calls
(threads) neither reports nor judges: its other thread may serve the peer. No cost per call. Not
covered: cycles of three ranks or more; a collective blocked in its own send (``peer`` is the rank it
last received from).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from minidist.distributed.safety.tags import describe

CYCLE_AFTER = 10.0  # seconds both waits must last: more than 1 GiB takes over a 1 Gbit/s link
KINDS = ("", "collective", "send", "recv", "sendrecv", "wait")  # a wait's kind, as a number in a pong
NONE = np.zeros(1, dtype=np.int64)  # the report of a rank that does not wait for the pinging one
_SENDS = "MPI sends a large message only once it is received: let one rank receive first, or use sendrecv."
_ORDER = (
    "Every rank must make the same calls in the same order: look for a rank whose data ran out early "
    "(DDP: call join() after the last batch) or that skipped or added a call."
)


def _wait(channel: Any, now: float) -> tuple | None:
    """``(kind, world ranks waited for, seq, tag, seconds, channel)`` of ``channel``'s wait, or None."""
    (seq, outer, tag), peer, seen = channel.phase, channel.peer, channel.seen  # each read once: they change
    world = channel.calls.world_ranks
    if outer is not None:
        since = seen[1] if seen[0] == seq else now
        return 1, [world[peer]] if peer >= 0 else [], seq, tag, now - since, channel
    kind, waiting, seen = channel.p2p_kind, channel.p2p_wait, channel.p2p_seen
    if waiting is not None:
        since = seen[1] if seen[0] is waiting else now
        return KINDS.index(kind), [world[p] for p in waiting], 0, 0, now - since, channel
    return None


def _only_wait(channels: list[Any], now: float) -> tuple | None:
    waits = [w for w in (_wait(c, now) for c in channels) if w is not None]
    return waits[0] if len(waits) == 1 else None


def report(channel: Any, peer: int, channels: list[Any]) -> np.ndarray:
    """The pong to ``peer`` of ``channel``: this rank's wait, if it waits for that peer (module doc)."""
    wait = _only_wait(channels, time.monotonic())
    if wait is None or channel.calls.world_ranks[peer] not in wait[1]:
        return NONE
    kind, _, seq, tag, seconds, where = wait
    return np.array([kind, seq, tag, seconds * 1000, where is channel, *where.calls.world_ranks], np.int64)


def cycle(channel: Any, channels: list[Any]) -> str | None:
    """The cycle this rank's wait on ``channel`` closes with a peer's reported wait, in words, or None."""
    mine = _only_wait(channels, time.monotonic())
    if mine is None or mine[5] is not channel or mine[4] < CYCLE_AFTER:
        return None
    world = channel.calls.world_ranks
    for peer, theirs in channel.reports.items():
        kind, seq, tag, millis, same = (int(x) for x in theirs[:5]) if len(theirs) > 5 else (0,) * 5
        if not kind or world[peer] not in mine[1] or millis < CYCLE_AFTER * 1000:
            continue
        if kind == mine[0] == 1 and same and (seq, tag) == mine[2:4]:
            continue  # the same collective: the problem is elsewhere (the deadline reports it)
        if kind != 1 and mine[0] != 1 and not (kind == mine[0] and KINDS[kind] in ("send", "recv")):
            continue  # a send and a receive (they match), or a sendrecv or batch: no verdict
        me, them = world[channel.rank], world[peer]
        group = "this group" if same else f"another group (world ranks {[int(r) for r in theirs[5:]]})"
        return (
            f"rank {me}: rank {them} has waited {millis / 1000:.0f} s for this rank in "
            f"{_what(kind, seq, tag, me, group)}, while this rank has waited {mine[4]:.0f} s for rank {them} "
            f"in {_what(mine[0], mine[2], mine[3], them, 'this group')}: neither can finish before the "
            f"other (a deadlock; ranks named by world rank). {_SENDS if kind == mine[0] == 2 else _ORDER}"
        )
    return None


def _what(kind: int, seq: int, tag: int, other: int, group: str) -> str:
    if kind == 1:
        return f"{describe(tag, seq)} on {group}"
    word = {"send": "a send to", "recv": "a receive from"}.get(KINDS[kind], f"a {KINDS[kind]} with")
    return f"{word} rank {other}"

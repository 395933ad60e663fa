"""Heartbeats: a peer that stopped answering (its node is down, its link cut) is found in bounded time.

When a node's link is cut mid-collective, nothing tells the ranks waiting for it: no process exits, no
TCP reset comes. UCX's keepalive notices the dead connection after 10-20 s, but MPICH installs no error
handler, so UCX only logs it (``error ... will not be handled since no error callback is installed``)
and the receive waits on. Measured on ``minidist_tools.cluster`` (2 nodes x 2 ranks, a 16 MiB all-reduce,
``ip link set <veth> down``): silence until ``MINIDIST_WATCHDOG``'s 300 s, which could not say why.

So once a collective has run :data:`PING_AFTER` s on a group, the watchdog thread *pings* each peer (tag
``tags.PING_TAG``, on ``channel.control``), one ping at a time, the next :data:`PING_AFTER` s after its
answer; during a public ``send``/``recv``/``sendrecv`` or ``p2p_batch.wait_all`` (a pipeline stage's),
the peers it waits for. Every rank's thread answers each ping within a tick with a *pong* saying what
this rank waits in (``waits.py``), whatever its main thread does (mpi4py releases the GIL inside MPI,
NumPy in large operations). A ping unanswered for ``MINIDIST_PEER_TIMEOUT`` s (default
:data:`DEFAULT_PEER_TIMEOUT`; ``off``/``0``: no heartbeats) means the peer cannot be reached (node down
or cut off, or the process frozen: ``SIGSTOP``, swapped out): ``liveness.py`` ends the job naming it and
its host, at most :data:`PING_AFTER` + the timeout + a tick + the abort grace (``MINIDIST_ABORT_GRACE``,
1 s) after the cut. Costs: no message while collectives finish within :data:`PING_AFTER`; per tick two
``MPI_Iprobe`` per group; in a long wait, one small message each way per peer per second. The idea is
TorchElastic's rendezvous keep-alive, kept inside the ranks because they themselves must stop waiting.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from minidist.distributed.safety.tags import PING_TAG, PONG_TAG
from minidist.distributed.safety.watchdog import seconds_setting

PEER_TIMEOUT_ENV = "MINIDIST_PEER_TIMEOUT"
DEFAULT_PEER_TIMEOUT = 30.0  # seconds: far above a tick late on a loaded machine, below TCP's minutes
PING_AFTER = 1.0  # seconds a collective runs before its peers are pinged, and between pings to a peer
_EMPTY = np.zeros(1, dtype=np.int64)  # the payload of a ping (nothing is read from it)


@functools.cache
def peer_timeout() -> float | None:
    """``MINIDIST_PEER_TIMEOUT`` in seconds (default 30), or None for ``off``/``0``. Raises ``ValueError``."""
    return seconds_setting(PEER_TIMEOUT_ENV, DEFAULT_PEER_TIMEOUT)


def setup(channel: Any) -> None:
    """Give a new collective channel its heartbeat bookkeeping (``liveness.watch``)."""
    channel.pinged = {}  # group rank -> time.monotonic() when the unanswered ping to it was sent
    channel.answered = {}  # group rank -> time.monotonic() of its last pong
    channel.heartbeat_sends = []  # requests of pings and pongs not yet complete
    channel.reports = {}  # group rank -> the wait its last pong reported (waits.py)


def answer(channel: Any, pong: Callable[[int], np.ndarray] | None) -> None:
    """Answer every ping on ``channel`` with ``pong(peer)`` (``waits.report``); take in every pong and the
    wait it reports. ``pong=None`` (this rank sent its departure notices): receive pings, answer none. The
    pinging peer has this rank's notice then and pings no more; a late pong could arrive after that
    peer's last look and stay unreceived at ``MPI_Finalize``."""
    status = MPI.Status()
    while channel.control.Iprobe(source=MPI.ANY_SOURCE, tag=PING_TAG, status=status):
        peer = status.Get_source()
        channel.control.Recv([np.empty(1, dtype=np.int64), MPI.INT64_T], source=peer, tag=PING_TAG)
        if pong is not None:
            channel.heartbeat_sends.append(channel.control.Isend([pong(peer), MPI.INT64_T], peer, PONG_TAG))
    while channel.control.Iprobe(source=MPI.ANY_SOURCE, tag=PONG_TAG, status=status):
        peer, report = status.Get_source(), np.empty(status.Get_count(MPI.INT64_T), dtype=np.int64)
        channel.control.Recv([report, MPI.INT64_T], source=peer, tag=PONG_TAG)
        channel.pinged.pop(peer, None)
        channel.answered[peer], channel.reports[peer] = time.monotonic(), report
    # A send to an unreachable peer never completes: it stays here, which is harmless.
    channel.heartbeat_sends = [r for r in channel.heartbeat_sends if not r.Test()]


def overdue(
    channel: Any, running_for: float | None, now: float, peers: tuple[int, ...] | None = None
) -> tuple[list[int], float]:
    """Ping the peers of ``channel`` (all, or ``peers``) as the module doc says; return the peers whose
    ping is overdue and how long the oldest has waited (``[]``, 0 if none). ``running_for``: seconds the
    current collective (or point-to-point wait) has run, or None when none runs: then unanswered pings
    and reported waits are forgotten (their pongs are taken in and ignored)."""
    timeout = peer_timeout()
    if timeout is None or running_for is None or running_for < PING_AFTER:
        if running_for is None:
            channel.pinged.clear()
            channel.reports.clear()
        return [], 0.0
    late, waited = [], 0.0
    for peer in range(channel.size) if peers is None else peers:
        if peer == channel.rank or peer in channel.departed:
            continue
        sent = channel.pinged.get(peer)
        if sent is None and now - channel.answered.get(peer, -float("inf")) >= PING_AFTER:
            channel.pinged[peer] = now
            channel.heartbeat_sends.append(channel.control.Isend([_EMPTY, MPI.INT64_T], peer, PING_TAG))
        elif sent is not None and now - sent > timeout:
            late.append(peer)
            waited = max(waited, now - sent)
    return late, waited

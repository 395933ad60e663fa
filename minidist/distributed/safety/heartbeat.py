"""Heartbeats: a peer that stopped answering (its node is down, its link cut) is found in bounded time.

Why the liveness watchdog needs them. When a node's network link is cut in the middle of a collective,
nothing tells the ranks that wait for it: no process exits, so no departure notice comes and no TCP
reset either (the packets are simply lost). UCX's TCP keepalive does notice the dead connection after
10-20 s, but MPICH installs no error handler, so UCX only logs it (``error ... will not be handled since
no error callback is installed``) and the receive waits forever. Measured on ``minidist_tools.cluster`` (2
nodes x 2 ranks, a 16 MiB all-reduce, ``ip link set <veth> down``): no output for 200 s, until the
watchdog's deadline (``MINIDIST_WATCHDOG``, 300 s by default), whose message could not say why.

So, while a collective has been running on a group for :data:`PING_AFTER` seconds, the watchdog thread
sends each peer of the group a *ping* (tag ``tags.PING_TAG``), one at a time per peer, again
:data:`PING_AFTER` seconds after each answer; while a public ``send``/``recv``/``sendrecv`` or
``p2p_batch.wait_all`` waits (as pipeline stages do), each peer it waits for. Every rank's watchdog
thread answers every ping it finds with a *pong*, on each tick, whatever its main thread is doing
(mpi4py releases the GIL inside MPI calls, and NumPy inside large operations). A ping unanswered for
``MINIDIST_PEER_TIMEOUT`` seconds (default :data:`DEFAULT_PEER_TIMEOUT`; ``off`` or ``0`` turns
heartbeats off) means the peer cannot be reached: its node is down or cut off, or the process is frozen
(``SIGSTOP``, swapped out). The watchdog (``liveness.py``) then ends the job naming that rank and its
host. The bound, from the moment of the cut: :data:`PING_AFTER` + ``MINIDIST_PEER_TIMEOUT`` + one tick +
the abort grace (``MINIDIST_ABORT_GRACE``, 1 s).

Costs: nothing while collectives finish within :data:`PING_AFTER` seconds (no message is sent); per
tick, two ``MPI_Iprobe`` calls per group; during a long collective, one 8-byte message each way per
peer per second. The idea is the keep-alive of TorchElastic's rendezvous (a node that stops renewing its
heartbeat is declared dead), kept inside the ranks because here the ranks themselves must stop waiting.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from minidist.distributed.safety.tags import PING_TAG, PONG_TAG
from minidist.distributed.safety.watchdog import seconds_setting

PEER_TIMEOUT_ENV = "MINIDIST_PEER_TIMEOUT"
DEFAULT_PEER_TIMEOUT = 30.0  # seconds: far above a tick late on a loaded machine, below TCP's minutes
PING_AFTER = 1.0  # seconds a collective runs before its peers are pinged, and between pings to a peer
_EMPTY = np.zeros(1, dtype=np.int64)  # the payload of pings and pongs (nothing is read from it)


@functools.cache
def peer_timeout() -> float | None:
    """``MINIDIST_PEER_TIMEOUT`` in seconds (default 30), or None for ``off``/``0``. Raises ``ValueError``."""
    return seconds_setting(PEER_TIMEOUT_ENV, DEFAULT_PEER_TIMEOUT)


def setup(channel: Any) -> None:
    """Give a new collective channel its heartbeat bookkeeping (``liveness.watch``)."""
    channel.pinged = {}  # group rank -> time.monotonic() when the unanswered ping to it was sent
    channel.answered = {}  # group rank -> time.monotonic() of its last pong
    channel.heartbeat_sends = []  # requests of pings and pongs not yet complete


def answer(channel: Any, reply: bool = True) -> None:
    """Answer every ping waiting on ``channel``, and take in every pong (each tick, and at exit).

    ``reply=False`` (after this rank sent its departure notices): receive pings without answering. The
    pinging peer has this rank's notice by then and pings it no more; a pong sent now could arrive after
    that peer's last look and stay unreceived at ``MPI_Finalize``.
    """
    status = MPI.Status()
    while channel.mpi.Iprobe(source=MPI.ANY_SOURCE, tag=PING_TAG, status=status):
        peer = status.Get_source()
        channel.mpi.Recv([np.empty(1, dtype=np.int64), MPI.INT64_T], source=peer, tag=PING_TAG)
        if reply:
            channel.heartbeat_sends.append(channel.mpi.Isend([_EMPTY, MPI.INT64_T], dest=peer, tag=PONG_TAG))
    while channel.mpi.Iprobe(source=MPI.ANY_SOURCE, tag=PONG_TAG, status=status):
        peer = status.Get_source()
        channel.mpi.Recv([np.empty(1, dtype=np.int64), MPI.INT64_T], source=peer, tag=PONG_TAG)
        channel.pinged.pop(peer, None)
        channel.answered[peer] = time.monotonic()
    # A send to an unreachable peer never completes: it stays here, which is harmless.
    channel.heartbeat_sends = [r for r in channel.heartbeat_sends if not r.Test()]


def overdue(
    channel: Any, running_for: float | None, now: float, peers: tuple[int, ...] | None = None
) -> tuple[list[int], float]:
    """Ping the peers of ``channel`` (all, or ``peers``) as the module doc says; return the peers whose
    ping is overdue and how long the oldest has waited (``[]`` and 0 if none).

    ``running_for``: seconds the current collective (or point-to-point wait) has been running, or None
    when none runs (then pings still unanswered are forgotten: their pongs are taken in and ignored).
    """
    timeout = peer_timeout()
    if timeout is None or running_for is None or running_for < PING_AFTER:
        if running_for is None:
            channel.pinged.clear()
        return [], 0.0
    late, waited = [], 0.0
    for peer in range(channel.size) if peers is None else peers:
        if peer == channel.rank or peer in channel.departed:
            continue
        sent = channel.pinged.get(peer)
        if sent is None and now - channel.answered.get(peer, -float("inf")) >= PING_AFTER:
            channel.pinged[peer] = now
            channel.heartbeat_sends.append(channel.mpi.Isend([_EMPTY, MPI.INT64_T], dest=peer, tag=PING_TAG))
        elif sent is not None and now - sent > timeout:
            late.append(peer)
            waited = max(waited, now - sent)
    return late, waited

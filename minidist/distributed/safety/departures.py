"""Departure notices: how a rank tells the members of its groups that it left, and hears that they did.

A rank leaves a group at interpreter exit, or earlier when Python collects a group it dropped. Either
way it sends every peer of the group a *departure notice* (tag ``tags.DEPARTURE_TAG``, on
``channel.control``; payload: how many collectives it called on the group, and whether it dropped the
group; nobody sends to a rank that dropped it: it never receives on it again). The liveness watchdog
(``liveness.py``) receives them every tick: a rank waiting in collective #k on a group whose peer
"called k-1" knows #k can never finish. At exit every rank also receives its peers' notices before MPI
is finalized (:func:`await_all`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from mpi4py import MPI

from minidist.distributed.safety import heartbeat
from minidist.distributed.safety.tags import DEPARTURE_TAG


def receive(channel: Any, peer: int) -> None:
    """Receive every departure notice ``peer`` has sent on ``channel`` so far into ``channel.departed``."""
    note = np.zeros(2, dtype=np.int64)
    while channel.control.Iprobe(source=peer, tag=DEPARTURE_TAG):
        channel.control.Recv([note, MPI.INT64_T], source=peer, tag=DEPARTURE_TAG)
        channel.departed[peer] = int(note[0])
        if note[1]:
            channel.dropped.add(peer)


def await_all(channels: list[Any], limit: float) -> None:
    """Receive the departure notice of every peer of ``channels`` (at most ``limit`` seconds). A notice
    still queued at ``MPI_Finalize`` is an unmatched message, which UCX over TCP reported as ``unexpected
    tag-receive descriptor ... was not matched`` (per notice, on every rank, at the end of every run
    across nodes) until this was done. Waiting costs nothing: MPICH's ``MPI_Finalize`` waits for every
    rank anyway, and each rank sends its notices on its way out. A peer still working learns from this
    rank's notice that it left (its watchdog ends the job if it then waits for this rank)."""
    end, pause = time.monotonic() + limit, 1e-4
    while True:
        missing = False
        for channel in channels:
            for peer in range(channel.size):
                if peer != channel.rank and peer not in channel.departed:
                    receive(channel, peer)
                    missing = missing or peer not in channel.departed
        if not missing or time.monotonic() > end:
            # A peer stops its heartbeats before it sends its notice, and MPI keeps one sender's messages
            # in order: once its notice is here, so is every ping or pong it sent. Take them in.
            for channel in channels:
                if channel.use_tags:
                    heartbeat.answer(channel, None)
            return
        time.sleep(pause)
        pause = min(2 * pause, 0.01)


def notices(channel: Any, dropped: bool = False) -> list[Any]:
    """Start sending every peer of ``channel`` (but those that dropped it: they never receive on it) how
    many collectives this rank called on it, and whether it dropped the group (``dropped``) or exits."""
    note = np.array([channel.calls_started, dropped], dtype=np.int64)
    peers = [p for p in range(channel.size) if p != channel.rank and p not in channel.dropped]
    return [channel.control.Isend([note, MPI.INT64_T], dest=peer, tag=DEPARTURE_TAG) for peer in peers]

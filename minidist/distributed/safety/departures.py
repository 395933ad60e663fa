"""Departure notices: how a rank tells the members of its groups that it left, and hears that they did.

A rank leaves a group at interpreter exit, or earlier when Python collects a group it dropped. Either
way it sends every peer of the group's channel a *departure notice* (tag ``tags.DEPARTURE_TAG``; payload:
how many collectives it called on the group, and whether it dropped the group). The liveness watchdog
(``liveness.py``) receives them on every tick: a rank waiting in collective #k on a group whose peer
"called k-1" knows #k can never finish.

At exit every rank also receives its peers' notices (:func:`await_all`) before MPI is finalized: a
message still unreceived at ``MPI_Finalize`` is reported by UCX over TCP as ``unexpected tag-receive
descriptor ... was not matched``, once per notice on every rank of every run across nodes, until this
was done. Nobody sends to a rank that dropped the group: it never receives on it again.
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
    while channel.mpi.Iprobe(source=peer, tag=DEPARTURE_TAG):
        channel.mpi.Recv([note, MPI.INT64_T], source=peer, tag=DEPARTURE_TAG)
        channel.departed[peer] = int(note[0])
        if note[1]:
            channel.dropped.add(peer)


def await_all(channels: list[Any], limit: float) -> None:
    """Receive the departure notice of every peer of ``channels`` (at most ``limit`` seconds).

    Every notice must be received by someone: one that is still in MPI's queue at ``MPI_Finalize`` is
    an unmatched message, which UCX over TCP reports as ``unexpected tag-receive descriptor ... was not
    matched`` (one warning per notice, on every rank, at the end of every run across nodes). Waiting
    here costs nothing: MPICH's ``MPI_Finalize`` waits for every rank anyway, and each rank sends its
    notices on its way out, before it finalizes. A peer that is still working when this rank leaves
    learns of it from this rank's notice (and its watchdog ends the job if it then waits for this
    rank); after ``limit`` seconds this rank stops waiting and finalizes as before.
    """
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
                    heartbeat.answer(channel, reply=False)
            return
        time.sleep(pause)
        pause = min(2 * pause, 0.01)


def notices(channel: Any, dropped: bool = False) -> list[Any]:
    """Start sending every peer of ``channel`` how many collectives this rank called on it, and whether
    it left by dropping the group (``dropped``: it will never receive on the group again) or is exiting."""
    note = np.array([channel.calls_started, dropped], dtype=np.int64)
    return [
        channel.mpi.Isend([note, MPI.INT64_T], dest=peer, tag=DEPARTURE_TAG)
        for peer in range(channel.size)
        # A peer that dropped the group would never receive the notice: nobody waits for it there.
        if peer != channel.rank and peer not in channel.dropped
    ]

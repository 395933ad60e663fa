"""Putting every rank's trace on rank 0's clock: Cristian's algorithm over a few ping-pongs.

Each rank's trace clock counts from its own ``trace.enable()``. Calling ``enable`` right after a barrier
lines the zeros up to within the barrier's exit skew, but a barrier leaves ranks at different moments
(on a network, by up to a message latency) and clocks of different machines drift apart. So before
merging timelines, estimate each rank's offset from rank 0 (Cristian 1989, "Probabilistic clock
synchronization", Distributed Computing 3(3)):

    rank r reads its clock t1, asks rank 0 for the time, gets T (rank 0's clock when it answered), and
    reads its clock t2 on arrival. Rank 0 answered at some instant between t1 and t2 of rank r's clock,
    so the offset theta = T - (t1 + t2) / 2 (rank 0's time minus rank r's) is off by at most
    (t2 - t1) / 2, half the round trip.

Repeating the exchange and keeping the shortest round trip gives the tightest bound (a round trip that
was delayed by the scheduler says little). On one machine round trips take microseconds; over TCP between
namespaces, tens of microseconds: far below the milliseconds a straggler costs. Offsets are measured once,
when called: clock drift since then (parts per million: ~1 ms per 1000 s between two machines) is not
corrected, which on one machine (one clock for all ranks) is exactly zero.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from minidist import trace
from minidist.distributed.comm import Communicator
from minidist.distributed.world import group_or_world
from minidist.trace import Event


class ClockOffset(NamedTuple):
    """Add ``offset`` (seconds) to this rank's trace times to get rank 0's; true within +- ``error``."""

    offset: float
    error: float


def cristian_offset(exchanges: Iterable[tuple[float, float, float]]) -> ClockOffset:
    """The offset estimate from ``(t1, T, t2)`` triples (client send, server time, client receive),
    from the exchange with the shortest round trip. Raises ``ValueError`` for no exchanges or t2 < t1."""
    exchanges = list(exchanges)
    if not exchanges:
        raise ValueError("cristian_offset needs at least one (t1, T, t2) exchange")
    t1, server, t2 = min(exchanges, key=lambda x: x[2] - x[0])
    if t2 < t1:
        raise ValueError(f"a reply arrived before its request was sent (t1={t1}, t2={t2}): not one clock")
    return ClockOffset(offset=server - (t1 + t2) / 2, error=(t2 - t1) / 2)


def clock_offsets(group: Communicator | None = None, exchanges: int = 8) -> list[ClockOffset]:
    """Every rank's :class:`ClockOffset` to the trace clock of rank 0 of ``group`` (collective).

    Rank 0 answers each other rank in turn, ``exchanges`` times (2 small messages each), on a duplicated
    communicator so nothing else in flight can match them; the ranks not yet served sleep. Every rank
    gets the whole list; rank 0's entry is (0, 0). Cost: ``2 * exchanges * (size - 1)`` latencies
    (milliseconds): call it outside the timed loop. Raises what MPI raises on a broken group.
    """
    comm = group_or_world(group).mpi.Dup()
    try:
        mine = ClockOffset(0.0, 0.0)
        buf = np.zeros(1)
        if comm.rank == 0:
            for peer in range(1, comm.size):
                comm.Send(buf, dest=peer)  # "your turn"
                for _ in range(exchanges):
                    comm.Recv(buf, source=peer)
                    buf[0] = trace.now()
                    comm.Send(buf, dest=peer)
        else:
            _sleep_until(comm.Irecv(buf, source=0))
            measured = []
            for _ in range(exchanges):
                t1 = trace.now()
                comm.Send(buf, dest=0)
                comm.Recv(buf, source=0)
                measured.append((t1, float(buf[0]), trace.now()))
            mine = cristian_offset(measured)
        return [ClockOffset(*o) for o in comm.allgather(tuple(mine))]
    finally:
        comm.Free()


def _sleep_until(request: MPI.Request) -> None:
    """Wait for ``request`` while sleeping: a blocking MPI wait spins on a core, and with more ranks than
    cores the ranks waiting for their turn would take the CPU from the two measuring (a round trip of
    milliseconds, and as large an error, measured with 4 ranks on 2 cores)."""
    while not request.Test():
        time.sleep(1e-4)


def align(events_per_rank: Sequence[Iterable[Event]], offsets: Sequence[ClockOffset]) -> list[list[Event]]:
    """Copies of every rank's spans with ``start``/``end`` moved onto rank 0's clock (``+ offset``)."""
    if len(offsets) != len(events_per_rank):
        raise ValueError(f"{len(events_per_rank)} ranks' events but {len(offsets)} clock offsets")
    return [
        [dict(e, start=e["start"] + o.offset, end=e["end"] + o.offset) for e in events]
        for events, o in zip(events_per_rank, offsets, strict=True)
    ]

"""Leaving: what a rank does when it leaves the program, or drops a group, so that nobody waits for it.

At interpreter exit (:func:`announce_departure`, an exit handler that ``safety.install`` registers) a
rank stops the liveness watchdog, looks once more for a stray message, sends every peer of every group
a departure notice (``departures.py``) and receives theirs before MPI is finalized
(:func:`receive_departures`). A group that Python collects earlier is announced as left at once
(:func:`announce_drop`).
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from minidist.distributed.safety import departures, liveness
from minidist.distributed.safety.watchdog import abort_job

_departing: list[Any] = []  # channels whose peers' notices are still to receive at exit


def announce_departure(wait: bool = True) -> None:
    """At interpreter exit: stop the thread, look once more for stray messages, tell every peer we left,
    and (``wait``) receive every peer's notice (:func:`receive_departures`). Runs once. ``safety.install``
    registers it after ``arrivals.free_records``, so it runs before that collective clean-up, which would
    wait for the others. In debug mode ``debug.check_at_exit`` calls it first with ``wait=False``, then
    its own exchange on the world (which a rank stuck in a collective must be able to join), then
    :func:`receive_departures`."""
    channels = liveness.stop()
    if channels is None:
        return
    for channel in channels:  # a stale message that arrived since the last tick
        if problem := liveness.inspect_channel(channel, None, heartbeats=False):
            abort_job(MPI.COMM_WORLD, problem + "\n")
    requests = [request for channel in channels for request in departures.notices(channel)]
    MPI.Request.Waitall(requests)  # small messages: sent eagerly, they need no receiver to complete
    _departing[:] = channels
    if wait:
        receive_departures()


def receive_departures() -> None:
    """Receive the peers' departure notices on the channels :func:`announce_departure` announced on."""
    channels, _departing[:] = list(_departing), []
    if channels:
        departures.await_all(channels, liveness.deadline_seconds() or liveness.DEFAULT_DEADLINE)


def announce_drop(channel: Any) -> None:
    """A channel garbage-collected before exit (``WatchedCommunicator.__del__``): tell its peers we left it.

    A rank whose group object is gone can never call a collective on it again: it left the group, as at
    exit. Without this, a rank that ``return``s early out of a function holding its sub-group (``dp =
    world.split(...)``) lost its notice once Python collected the group, and the ranks still waiting on
    that group hung until the deadline instead of a tick."""
    if not liveness.running() or MPI.Is_finalized() or getattr(channel, "size", 1) < 2:
        return
    try:
        MPI.Request.Waitall(departures.notices(channel, dropped=True))
    except MPI.Exception:  # (a comm the program freed itself): only the early notice is lost
        pass

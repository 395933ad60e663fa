"""The safety net of ``minidist.distributed``: no silent hang, and every rank raises the same error.

The mechanism (``comm.py``, ``collectives.py``, ``algorithms/``) runs plain MPI calls; these modules
watch it. Reading order: ``tags.py`` (every message of a collective names its call) -> ``liveness.py``
(on by default: a watchdog thread names a rank that left, a message of another call, a collective stuck
for ``MINIDIST_WATCHDOG`` seconds, and ends the job; ``heartbeat.py`` pings a peer that may be
unreachable, ``waits.py`` names two ranks waiting for each other, ``departures.py`` tells the others a
rank left) -> ``debug.py`` (``MINIDIST_DEBUG=1``: ranks compare each call, call site included) ->
``watchdog.py`` (``MINIDIST_TIMEOUT=seconds``: waits with a deadline; an uncaught exception aborts the
whole job) -> ``arrivals.py`` (which collective each rank entered last) -> ``traffic.py`` (each call's
bytes and spans, for the trace) -> ``agreement.py`` (how every layer above makes a mistake seen by one
rank an error on all). How a script then ends on such an error, printing it once:
``minidist_tools/report.py``. :func:`install` puts it around the mechanism once, through ``seam.py``,
when ``minidist.distributed`` is imported: every communicator becomes a ``WatchedCommunicator``
(``watched.py``), every public collective runs inside ``calls.py``'s wrapper, and ``init()`` starts the
abort-on-exception hook and the watchdog thread.
"""

from __future__ import annotations

import atexit

from minidist.distributed import seam
from minidist.distributed.comm import Communicator
from minidist.distributed.safety import arrivals, debug, leaving, liveness
from minidist.distributed.safety.calls import collective_call
from minidist.distributed.safety.watchdog import install_excepthook
from minidist.distributed.safety.watched import WatchedCommunicator


def install() -> None:
    """Install the safety net around the mechanism of ``minidist.distributed`` (``seam.py``), once, before
    any communicator exists (``minidist.distributed``'s ``__init__`` does)."""
    # Exit handlers run last-registered first: the debug-mode exchange at exit (which a rank stuck in a
    # collective must be able to join), then the departure notices, then the arrival records' clean-up,
    # which waits for the other ranks.
    atexit.register(arrivals.free_records)
    atexit.register(leaving.announce_departure)
    atexit.register(debug.check_at_exit)
    seam.install(
        WatchedCommunicator, _start, lambda fn, name, same: collective_call(name, same_shape=same)(fn)
    )


def _start(world: Communicator) -> None:
    """At ``init()``, with more than one rank: an uncaught exception on any rank aborts every rank
    (``watchdog.install_excepthook``), and the liveness watchdog thread starts (``liveness.start``)."""
    if world.size > 1:
        install_excepthook(world.mpi)
        liveness.start()

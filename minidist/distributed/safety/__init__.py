"""The safety net of ``minidist.distributed``: no silent hang, and every rank raises the same error.

The mechanism (``comm.py``, ``collectives.py``, ``algorithms/``) runs plain MPI calls; these modules
watch it. Reading order: ``tags.py`` (every message of a collective names its call) -> ``liveness.py``
(on by default: a watchdog thread names a rank that left, a message of another call, a collective stuck
for ``MINIDIST_WATCHDOG`` seconds, and ends the job; ``heartbeat.py`` pings a peer that may be
unreachable, ``departures.py`` tells the others a rank left) -> ``debug.py`` (``MINIDIST_DEBUG=1``: ranks
compare each collective call, call site (``call_site.py``) included, before running it) ->
``watchdog.py`` (``MINIDIST_TIMEOUT=seconds``: waits with a deadline; an uncaught exception aborts the
whole job) -> ``arrivals.py`` (which collective each rank entered last) -> ``traffic.py`` (the bytes
and spans of each call, for the trace) -> ``agreement.py`` (how every layer above makes a mistake seen
by one rank an error on all of them) -> ``report.py`` (``exit_with_error``: a script's fatal error
printed once, naming the ranks that raised it).
"""

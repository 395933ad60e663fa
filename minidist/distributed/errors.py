"""Exceptions for failures that only happen when several processes work together.

Misuse that one process can see on its own (a bad argument, a wrong dtype) raises the ordinary
``ValueError`` or ``TypeError``. The classes here are for problems that involve other ranks: a message
that does not fit, ranks that disagree about which collective they are in, a peer that never answers.
They all derive from :class:`DistributedError`, so ``except DistributedError`` catches every one of them.
"""

from __future__ import annotations


class DistributedError(RuntimeError):
    """Base class: something went wrong between ranks (e.g. a received message has the wrong length)."""


class CollectiveMismatchError(DistributedError):
    """Ranks of one group called collectives that do not match.

    For example one rank calls ``all_reduce`` while another calls ``broadcast``, or the ranks pass arrays
    of different lengths or dtypes; unchecked, wrong numbers or a hang. Raised on every rank of the
    group, with the same message, in debug mode (``MINIDIST_DEBUG=1``, ``debug.py``). By default, by a
    collective's receive that takes a message of another call (its tag names it: a different
    collective, ``src``/``dst``, ``op`` or dtype, ``safety/watched.py``); what no receive takes, the
    liveness watchdog (``safety/liveness.py``) reports, ending the job.
    """


class CollectiveTimeoutError(DistributedError):
    """A collective or point-to-point operation did not complete within the allowed time.

    Usually one rank crashed, or took a different code path and never joined the collective. Raised only
    when ``MINIDIST_TIMEOUT`` is set (see ``watchdog.py``); the message names the collective, its
    sequence number on the group, what this rank waited for and which ranks never arrived.
    """

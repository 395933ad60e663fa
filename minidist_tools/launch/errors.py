"""``LaunchError``: a launch that cannot go on (bad arguments, too few nodes, processes that will not die)."""

from __future__ import annotations


class LaunchError(RuntimeError):
    """The launcher cannot start or continue the job; the message says what is wrong and what to do."""

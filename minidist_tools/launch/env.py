"""What the launcher tells every rank, through environment variables, and how a script reads it.

The names follow TorchElastic's (``TORCHELASTIC_RESTART_COUNT``, ``TORCHELASTIC_MAX_RESTARTS``,
``TORCHELASTIC_RUN_ID``), with minidist's prefix:

* ``MINIDIST_RESTART_COUNT``: 0 on the first run, k after k restarts;
* ``MINIDIST_MAX_RESTARTS``: the ``--max-restarts`` the launcher was given;
* ``MINIDIST_LAUNCH_LOG``: the path of the launcher's JSON-lines log;
* ``MINIDIST_RUN_ID``: one id for the whole launch (every restart shares it). The launcher also uses it
  to find the job's processes: MPICH's ranks each lead a session of their own, so no process group
  holds them all, but every one of them inherits this variable (processes.py).

This module imports nothing but ``os``: the training scripts read it on every rank.
"""

from __future__ import annotations

import os

RESTART_COUNT = "MINIDIST_RESTART_COUNT"
MAX_RESTARTS = "MINIDIST_MAX_RESTARTS"
LAUNCH_LOG = "MINIDIST_LAUNCH_LOG"
RUN_ID = "MINIDIST_RUN_ID"


def restart_count() -> int:
    """``MINIDIST_RESTART_COUNT`` as an int: 0 when unset (not under the launcher, or its first run).

    Raises ``ValueError`` if it is set to something other than a non-negative integer.
    """
    value = os.environ.get(RESTART_COUNT, "").strip()
    if not value:
        return 0
    if not value.isdigit():
        raise ValueError(f"{RESTART_COUNT}={value!r} must be a non-negative integer (the launcher sets it)")
    return int(value)


def resume_requested(resume: bool, checkpoint_dir: str | None) -> bool:
    """Whether a training script should resume: ``--resume`` was given, or the launcher restarted the
    job (``MINIDIST_RESTART_COUNT`` > 0) and the script saves checkpoints in ``checkpoint_dir``.

    The one rule both examples use, so that a script needs no change to run under
    ``minidist launch``: a restart behaves as if ``--resume`` had been added. A first run
    (count 0) never resumes by itself: an old checkpoint folder must not silently continue a new run.
    """
    return resume or (restart_count() > 0 and checkpoint_dir is not None)

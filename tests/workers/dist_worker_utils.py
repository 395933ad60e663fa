"""Helpers for MPI worker scripts: stop the whole job when one rank fails.

If one rank raises and simply exits, the others can wait forever in their next collective, and the test
would only end at its timeout. ``run_worker`` prints the traceback and calls ``MPI_Abort``, which kills
every rank at once, so ``mpiexec`` exits non-zero right away with the error in its output.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mpi4py import MPI

import minidist.distributed as dist
from minidist.distributed.safety.watchdog import abort_job


def run_worker(main: Callable[..., None], *args: Any) -> None:
    """Call ``main(*args)``; on any exception print it (with this rank) and abort every rank with code 1.

    ``abort_job`` waits a grace period (``MINIDIST_ABORT_GRACE``, 1 s) before ``MPI_Abort``: aborting at
    once can kill ``mpiexec`` before it has forwarded the traceback, and the test would not see it.
    """
    try:
        main(*args)
    except BaseException:
        abort_job(MPI.COMM_WORLD, f"failed:\n{traceback.format_exc()}")  # abort_job prefixes the rank


def write_json(out_dir: str | Path, name: str, data: Any) -> None:
    """Write ``data`` as JSON to ``out_dir/name`` (each rank uses its own name)."""
    (Path(out_dir) / name).write_text(json.dumps(data, indent=1))


def report_misbehaviour(
    misbehave: Callable[[str, Any], Any], mode: str, out_dir: str, extra: Callable[[], dict] = dict
) -> None:
    """Run ``misbehave(mode, world)`` and write this rank's ``rank<r>.json``: its result, or the
    ``DistributedError`` it raised (type, message, seconds since the start, and ``extra()``), which is
    then raised again so the rank ends as it would without the report."""
    world = dist.init()
    start = time.monotonic()
    try:
        result = misbehave(mode, world)
    except dist.DistributedError as error:
        report = {"type": type(error).__name__, "message": str(error), **extra(),
                  "seconds": time.monotonic() - start}  # fmt: skip
        write_json(out_dir, f"rank{world.rank}.json", report)
        raise
    write_json(out_dir, f"rank{world.rank}.json", result)

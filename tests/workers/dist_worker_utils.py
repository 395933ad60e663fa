"""Helpers for MPI worker scripts: stop the whole job when one rank fails.

If one rank raises and simply exits, the others can wait forever in their next collective, and the test
would only end at its timeout. ``run_worker`` prints the traceback and calls ``MPI_Abort``, which kills
every rank at once, so ``mpiexec`` exits non-zero right away with the error in its output.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mpi4py import MPI


def run_worker(main: Callable[..., None], *args: Any) -> None:
    """Call ``main(*args)``; on any exception print it (with this rank) and abort every rank with code 1."""
    try:
        main(*args)
    except BaseException:
        print(f"rank {MPI.COMM_WORLD.Get_rank()} failed:", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        sys.stdout.flush()
        MPI.COMM_WORLD.Abort(1)


def write_json(out_dir: str | Path, name: str, data: Any) -> None:
    """Write ``data`` as JSON to ``out_dir/name`` (each rank uses its own name)."""
    (Path(out_dir) / name).write_text(json.dumps(data, indent=1))

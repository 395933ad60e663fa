"""A job in a long silent phase (an evaluation, a save): MPI up, then nothing printed for SECONDS.

Usage: ``mpiexec -n N python silent.py OUT [SECONDS]`` (default 300). Each rank joins a barrier, writes
``OUT/rank<r>.ready`` (its pid; written whole: a temporary name, then a rename) and sleeps; if it lives
that long it writes ``OUT/rank<r>.late``, as the unsupervised ranks of a killed launcher wrote into the
run's folder. A test waits for the ready files, then kills the launcher.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from mpi4py import MPI

out, seconds = Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 300.0
rank = MPI.COMM_WORLD.Get_rank()
MPI.COMM_WORLD.Barrier()  # every rank is up: from here on the job is silent
partial = out / f".rank{rank}.ready.tmp"
partial.write_text(str(os.getpid()))
partial.rename(out / f"rank{rank}.ready")
time.sleep(seconds)
(out / f"rank{rank}.late").write_text("still running after the launcher died\n")

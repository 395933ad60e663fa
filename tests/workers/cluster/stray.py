"""A rank that leaves a detached process behind, then fails or hangs (no MPI: the launch is what is tested).

    mpiexec ... python stray.py PID_DIR fail|hang

Each rank starts ``sleep 300`` in a session of its own (outside mpiexec's process group, so killing
that group misses it, as it would miss a rank's data-loader daemon), writes its own pid and the sleep's to
PID_DIR/rank{r}.pids, then exits with status 3 (``fail``) or sleeps (``hang``). The tests check that
every one of those processes is gone after the cluster's run ended.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

pid_dir, mode = Path(sys.argv[1]), sys.argv[2]
# Its own output elsewhere: a process holding the rank's stdout open keeps mpiexec waiting for its end.
quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
stray = subprocess.Popen(["sleep", "300"], start_new_session=True, **quiet)
rank = os.environ["PMI_RANK"]  # set by MPICH's launcher for every rank
# Whole or not at all: a test reading the folder never sees half a file (a name, then a rename).
(pid_dir / f".rank{rank}.tmp").write_text(f"{os.getpid()} {stray.pid}\n")
(pid_dir / f".rank{rank}.tmp").rename(pid_dir / f"rank{rank}.pids")
if mode == "fail":
    sys.exit(3)
time.sleep(300)

"""Whether Slurm and munge are installed, and installing them from the distribution's packages if not.

The programs come from Debian's ``slurm-wlm`` and ``munge`` packages (Slurm 22.05 on Debian 12);
``scripts/install_slurm.sh`` installs them with apt-get, as root, without starting the packages' own
services. ``up --scheduler slurm`` runs it when a program is missing, saying so first: installing
system packages is not something a tool should do silently.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from minidist_tools.cluster.errors import ClusterError

# The daemons and the commands the cluster and its tests use.
PROGRAMS = (
    "munged",
    "slurmctld",
    "slurmd",
    "srun",
    "sbatch",
    "salloc",
    "scontrol",
    "sinfo",
    "squeue",
    "nsenter",
)
INSTALL_SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "install_slurm.sh"


def missing() -> list[str]:
    """The programs of :data:`PROGRAMS` that are not on ``PATH``."""
    return [program for program in PROGRAMS if shutil.which(program) is None]


def install_hint() -> str:
    if INSTALL_SCRIPT.exists():
        return f"run `sudo {INSTALL_SCRIPT}`"
    return "install them as root: `apt-get install slurm-wlm munge`"


def ensure_installed(say: Callable[[str], None] = lambda text: print(text, file=sys.stderr)) -> None:
    """Install Slurm and munge when a program is missing (``say`` tells the user first); raise
    ``ClusterError`` if they cannot be installed."""
    absent = missing()
    if not absent:
        return
    if "nsenter" in absent:
        raise ClusterError("the `nsenter` program is missing: install util-linux")
    if not INSTALL_SCRIPT.exists():
        raise ClusterError(f"Slurm is not installed (missing: {', '.join(absent)}): {install_hint()}")
    say(f"Slurm is not installed (missing: {', '.join(absent)}): installing slurm-wlm and munge with "
        f"{INSTALL_SCRIPT} (apt-get, as root) ...")  # fmt: skip
    proc = subprocess.run(["sh", str(INSTALL_SCRIPT)], capture_output=True, text=True)
    still = missing()
    if proc.returncode != 0 or still:
        tail = "\n  ".join((proc.stdout + proc.stderr).strip().splitlines()[-6:])
        raise ClusterError(f"installing Slurm failed (exit {proc.returncode}, missing {still}):\n  {tail}")
    say("Slurm and munge are installed.")

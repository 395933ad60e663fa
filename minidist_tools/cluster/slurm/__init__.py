"""A real Slurm scheduler on a cluster in a box: ``minidist cluster up --scheduler slurm``.

The nodes are the cluster's network namespaces as ever; on top of them run the cluster's own munged,
a slurmctld in the host's namespace on the bridge's address, and one slurmd per node inside the node.
Then ``sbatch``, ``srun``, ``salloc``, ``sinfo`` and ``scontrol`` work as on a university's cluster,
once ``SLURM_CONF`` names the cluster's slurm.conf (``up`` and ``status`` print the line to type).

Files: config.py (the folder and slurm.conf), daemons.py (starting, waiting for and stopping the
daemons), packages.py (installing Slurm and munge when missing). ``Cluster`` (cluster.py) calls
:func:`start` at the end of ``up`` and :func:`stop` at the start of ``down``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minidist_tools.cluster.slurm import config, daemons, packages
from minidist_tools.cluster.slurm.daemons import client_env, node_states

__all__ = ["client_env", "node_states", "plan", "sinfo", "start", "stop"]
SCHEDULERS = ("none", "slurm")


def plan(record: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The Slurm part of a cluster's state (config.plan)."""
    return config.plan(record, folder)


def start(record: dict[str, Any], save: Callable[[], None]) -> None:
    """Install Slurm if missing, write slurm.conf, start the daemons and wait for idle nodes."""
    packages.ensure_installed()
    config.write(record)
    daemons.start(record, save)


def stop(slurm: dict[str, Any]) -> None:
    """Stop the daemons this cluster started, then remove its Slurm folder (logs included)."""
    daemons.stop(slurm)
    shutil.rmtree(slurm["folder"], ignore_errors=True)


def sinfo(slurm: dict[str, Any]) -> str:
    """``sinfo``'s node-oriented table for this cluster (or why there is none)."""
    env = {**os.environ, **client_env(slurm)}
    proc = subprocess.run(["sinfo", "-N", "-l"], capture_output=True, text=True, env=env)
    return (proc.stdout if proc.returncode == 0 else f"sinfo failed: {proc.stderr}").rstrip()

"""Elastic restarts over MPI: ``minidist launch -n 4 --max-restarts 3 -- python train.py ...``.

The launcher runs a training command under ``mpiexec``; when a rank or a node fails it ends every
remaining process of the job, checks which checkpoint is the newest that verifies, and starts the
command again (the script resumes itself from its ``--checkpoint-dir``: examples/train_mlp.py and
train_gpt.py do when ``MINIDIST_RESTART_COUNT`` > 0), up to ``--max-restarts`` times. On a cluster in a
box (``--cluster NAME --nodes MIN:MAX``) it continues on the nodes still alive. In Python::

    from minidist_tools.launch import launch
    train = ["python", "examples/train_mlp.py", "--checkpoint-dir", "ckpt", "--checkpoint-every", "40"]
    result = launch(train, n=4, max_restarts=3)
    result.returncode, result.restarts, result.events

Reading order: supervisor.py (the loop) -> job.py (one attempt, its output) -> processes.py (ending
every process of a job) -> reaper.py (ending it when the launcher itself is killed) -> lock.py (one
live job per checkpoint folder) -> checkpoints.py (progress, the newest checkpoint that verifies) ->
nodes.py (node health, the nodes of each attempt) -> events.py (the log) -> env.py (what the ranks are
told) -> __main__.py (the command line). After TorchElastic (``torchrun --max-restarts``, ``--nnodes
MIN:MAX``).

``launch`` and ``LaunchResult`` are imported on first use: the reaper (``python -m
minidist_tools.launch.reaper``) passes through this file and must start in a fraction of a second,
without the framework the supervisor imports (checkpoints.py reads manifests with it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from minidist_tools.launch.errors import LaunchError
from minidist_tools.launch.events import read_log

if TYPE_CHECKING:
    from minidist_tools.launch.supervisor import LaunchResult, launch

__all__ = ["LaunchError", "LaunchResult", "launch", "read_log"]


def __getattr__(name: str) -> Any:
    if name in ("LaunchResult", "launch"):
        from minidist_tools.launch import supervisor  # noqa: PLC0415  (the heavy part, on first use)

        return getattr(supervisor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

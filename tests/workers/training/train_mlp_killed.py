"""examples/train_mlp.py, with one rank SIGKILLed in the middle of training (a crashed node).

Usage: train_mlp_killed.py RANK:STEP [train_mlp.py arguments ...]

Runs the example's ``main`` unchanged, except that ``optim.SGD.step`` is wrapped: on rank RANK, the
call that would perform optimizer step STEP + 1 kills the process with SIGKILL instead (after that
step's backward, so the other ranks have already exchanged its gradients). Nothing is cleaned up,
flushed or committed, as with a real crash; the job then fails and the test resumes it with
``--resume``. The hook lives here rather than in the example, which stays free of test code.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train_mlp.py"


def load_example():
    sys.path.insert(0, str(EXAMPLE.parent))  # as `python examples/train_mlp.py` would: for train_mlp_args
    spec = importlib.util.spec_from_file_location("train_mlp", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def install_kill(rank: int, step: int) -> None:
    from mpi4py import MPI

    from minidist import optim

    if MPI.COMM_WORLD.Get_rank() != rank:
        return
    real_step = optim.SGD.step
    calls = [0]

    def step_or_die(self, *args, **kwargs):
        if calls[0] == step:
            os.kill(os.getpid(), signal.SIGKILL)
        calls[0] += 1
        return real_step(self, *args, **kwargs)

    optim.SGD.step = step_or_die


if __name__ == "__main__":
    where, *argv = sys.argv[1:]
    kill_rank, kill_step = map(int, where.split(":"))
    example = load_example()
    install_kill(kill_rank, kill_step)
    example.main(argv)

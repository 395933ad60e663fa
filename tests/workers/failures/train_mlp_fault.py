"""examples/train_mlp.py with one fault injected in the first attempt of a ``minidist launch`` run.

Usage: ``FAULT=KIND:RANK:STEP train_mlp_fault.py [train_mlp.py arguments ...]``, KIND one of

* ``step``: rank RANK SIGKILLs itself in optimizer step STEP + 1, after its backward (the other ranks
  have exchanged that step's gradients): a crash mid-step;
* ``save``: rank RANK SIGKILLs itself right after writing its shard of checkpoint STEP, before the
  checkpoint is committed: a crash during a save.
* ``hold``: rank RANK stops in optimizer step STEP + 1 (it sleeps; its watchdog thread still answers)
  after creating the file ``$FAULT_MARK``: the other ranks then wait in that step's collectives, and a
  test can cut a link mid-collective at a known moment instead of racing a fast run.

Only while ``MINIDIST_RESTART_COUNT`` is 0 (or unset): the launcher's restart then runs the example
unchanged. The example itself stays free of test code; ``training/train_mlp_killed.py`` lends the loader
and the mid-step kill.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from training.train_mlp_killed import install_kill, load_example


def install_save_kill(rank: int, step: int) -> None:
    from mpi4py import MPI

    from minidist.checkpoint import atomic

    if MPI.COMM_WORLD.Get_rank() != rank:
        return
    real_write, target = atomic.write_shard, atomic.step_dirname(step)

    def write_then_die(path, arrays):
        result = real_write(path, arrays)
        if target in path.parent.name:  # the shard is in the checkpoint's temporary folder
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    atomic.write_shard = write_then_die


def install_hold(rank: int, step: int) -> None:
    from mpi4py import MPI

    from minidist import optim

    if MPI.COMM_WORLD.Get_rank() != rank:
        return
    real_step, calls = optim.SGD.step, [0]

    def step_or_hold(self, *args, **kwargs):
        if calls[0] == step:
            Path(os.environ["FAULT_MARK"]).touch()
            time.sleep(600)  # the test cuts a link meanwhile; the launcher then ends this process
        calls[0] += 1
        return real_step(self, *args, **kwargs)

    optim.SGD.step = step_or_hold


if __name__ == "__main__":
    example = load_example()
    if os.environ.get("MINIDIST_RESTART_COUNT", "0") == "0":
        kind, rank, step = os.environ["FAULT"].split(":")
        {"step": install_kill, "save": install_save_kill, "hold": install_hold}[kind](int(rank), int(step))
    example.main(sys.argv[1:])

"""examples/train_mlp.py run several times in one launch: the example's ``main(argv)``, once per run.

Usage: ``mpiexec -n N python train_mlp_runs.py STEPS_JSON``. ``STEPS_JSON`` is a list of steps that every
rank does in order: ``{"argv": [...], "stdout": PATH}`` calls ``main(argv)`` with this rank's stdout
written to ``PATH.rank<r>`` (what ``mpiexec`` would have shown of that rank), and ``{"copy": [SRC, DST]}``
copies a checkpoint folder (rank 0, then a barrier), as a test does between two launches.

Starting N Python ranks that import minidist costs about as much as one of the tests' short trainings,
so ``tests/examples/test_train_mlp_example.py`` makes its runs together. ``main`` builds its mesh, data, model
and optimizer anew and seeds every generator from ``--seed``, so each run computes what it computes in a
launch of its own; an error ends the whole job (``run_worker``), with the run's arguments printed first.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from pathlib import Path

from dist_worker_utils import run_worker
from mpi4py import MPI
from train_mlp_killed import load_example  # this folder: the example loaded as `python train_mlp.py` would


def main(steps_path: str) -> None:
    example = load_example()
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    for step in json.loads(Path(steps_path).read_text()):
        if "copy" in step:
            if rank == 0:
                shutil.copytree(*step["copy"])
            world.Barrier()
            continue
        if rank == 0:
            print("train_mlp.py", " ".join(step["argv"]), file=sys.stderr, flush=True)  # names a failing run
        with open(f"{step['stdout']}.rank{rank}", "w") as out, contextlib.redirect_stdout(out):
            example.main(step["argv"])


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])

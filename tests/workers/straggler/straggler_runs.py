"""examples/train_mlp.py under ``--straggler-report``, several runs in one launch, each with its own
``MINIDIST_SLOW_RANK``: ``mpiexec -n 4 python straggler_runs.py RUNS_JSON OUT_FOLDER``.

``RUNS_JSON``: ``{name: {"argv": [...], "slow": "RANK:SECONDS" or ""}}``. For each run every rank sets the
variable, calls the example's ``main(argv)`` with its stdout in ``OUT/<name>.rank<r>``, and rank 0 records
the StragglerWarnings raised during the run in ``OUT/<name>.warnings.json`` (their messages). Starting 4
Python ranks costs as much as one of these runs, hence one launch for all (as train_mlp_runs.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings
from pathlib import Path

from dist_worker_utils import run_worker
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from train_mlp_killed import load_example  # noqa: E402  (the example as `python train_mlp.py` loads it)

from minidist_tools.straggler import StragglerWarning  # noqa: E402


def main(runs_path: str, out: str) -> None:
    example = load_example()
    rank = MPI.COMM_WORLD.Get_rank()
    for name, run in json.loads(Path(runs_path).read_text()).items():
        os.environ["MINIDIST_SLOW_RANK"] = run["slow"]
        with (
            open(f"{out}/{name}.rank{rank}", "w") as stdout,
            contextlib.redirect_stdout(stdout),
            warnings.catch_warnings(record=True) as caught,
        ):
            warnings.simplefilter("always", StragglerWarning)
            example.main(run["argv"])
        if rank == 0:
            found = [str(w.message) for w in caught if issubclass(w.category, StragglerWarning)]
            Path(f"{out}/{name}.warnings.json").write_text(json.dumps(found))


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])

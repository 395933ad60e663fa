"""Which ``mpiexec`` to run: the one answer every tool, the lessons, the tests and the grader share."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def mpiexec_path() -> str:
    """The ``mpiexec`` next to this Python (the ``mpich`` wheel puts it there), else the one on PATH.

    The one place that answers "which mpiexec?": the cluster and the launcher, the lessons, the test
    suite (``tests/helpers/mpi_utils.py``) and the assignment grader (``lessons/assignments/gradelib.py``)
    all call it. Imports no MPI.
    Raises ``RuntimeError`` if there is none, saying how to install one.
    """
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise RuntimeError(
            "mpiexec not found: install minidist with its dependencies (`pip install -e .` brings the "
            "mpich wheel, which puts mpiexec next to python)"
        )
    return found

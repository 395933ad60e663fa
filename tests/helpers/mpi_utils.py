"""Launch real MPI ranks from a test: ``mpiexec -n N python worker.py ...`` as a subprocess.

Every distributed test goes through :func:`run_mpi`, so a hang fails the test after ``timeout``
seconds instead of freezing the suite, and a crash on any rank shows every rank's output.
Workers write their results (npz / JSON) into a temp directory that the test passes as an argument
and reads back. They live in ``tests/workers/``, one folder per subsystem, which is also the path a
test gives :func:`run_mpi` (``run_mpi(2, "ddp/ddp_trace.py", ...)``):

* ``distributed/``: collectives, point-to-point batches, GPU staging, debug mode, timeouts
  (``minidist.distributed``);
* ``ddp/``, ``zero/``, ``tensor_parallel/``, ``pipeline/``, ``mesh/``: ``minidist.parallel``;
* ``checkpoint/``: ``minidist.checkpoint``;
* ``training/``: end-to-end runs (the GPU backend, ``examples/train_mlp.py`` with a killed rank).
* ``failures/``: faults injected into ``examples/train_mlp.py`` for the launcher's restarts, an
  all-reduce loop whose link a test cuts (tests/tools/launch/test_failures*.py), and a silent job
  whose launcher a test kills (tests/tools/launch/test_launcher_killed.py).

``tests/workers/`` itself holds the modules shared by several workers and tests: ``dist_worker_utils``
(run a rank's main, abort the job on an error, write results) and ``ddp_common``, ``zero_common``,
``tp_common``, ``pp_common`` (the models and data that a test and its worker both build). :func:`mpi_env`
puts ``tests/workers/`` on every rank's ``PYTHONPATH``, so a worker imports them by plain name from any
folder; the test files put it on ``sys.path`` themselves.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from minidist_tools.mpiexec import mpiexec_path  # the one mpiexec finder; imports no MPI

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
HELPERS = TESTS / "helpers"  # this module's folder: the helpers every test imports by plain name
WORKERS = TESTS / "workers"
BENCHMARKS = REPO / "benchmarks"


def mpi_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for ranks: one BLAS/OpenMP thread each so oversubscribed ranks don't fight for cores;
    the repository, ``tests/workers/`` (the shared worker modules) and ``tests/helpers/`` (the CuPy
    stand-in) on ``PYTHONPATH``."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    paths = [
        str(REPO),
        str(WORKERS),
        str(HELPERS),
        env.get("PYTHONPATH", ""),
    ]  # minidist, then the workers' modules
    env["PYTHONPATH"] = os.pathsep.join(paths).rstrip(os.pathsep)
    if extra:
        env.update(extra)
    return env


def worker_path(script: str | Path) -> Path:
    """``script`` itself if it exists or is absolute, else the worker ``tests/workers/<script>``."""
    path = Path(script)
    return path if path.is_absolute() or path.exists() else WORKERS / path


def run_mpi(
    n: int,
    script: str | Path,
    *args: str,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """Run ``mpiexec -n n python script *args``; return the finished process.

    ``script`` is a path, or a path relative to ``tests/workers`` (``"pipeline/pp_mesh.py"``). With
    ``check`` (default), a non-zero exit raises ``AssertionError`` showing stdout and stderr. A run
    longer than ``timeout`` seconds is killed (the whole process group, so no rank is left behind) and
    raises ``AssertionError`` naming the timeout.
    """
    cmd = [mpiexec_path(), "-n", str(n), sys.executable, str(worker_path(script)), *map(str, args)]
    return run_launch(cmd, timeout=timeout, env=mpi_env(env), check=check)


def run_launch(
    cmd: list[str],
    *,
    timeout: float,
    env: dict[str, str],
    check: bool,
    cleanup: Callable[[], object] | None = None,
) -> subprocess.CompletedProcess:
    """Run the launcher command ``cmd`` as :func:`run_mpi` describes. ``cleanup`` runs after a timeout or a
    failure, for ranks outside mpiexec's process group (``tests/helpers/cluster_utils.py``: the
    namespaces')."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group: on timeout we kill mpiexec and every rank
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        if cleanup is not None:
            cleanup()
        raise AssertionError(
            f"{' '.join(cmd)} did not finish within {timeout} s (hang?)\n--- stdout\n{out}\n--- stderr\n{err}"
        ) from None
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if proc.returncode != 0 and cleanup is not None:
        cleanup()
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited with {proc.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"
        )
    return result

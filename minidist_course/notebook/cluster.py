"""Real MPI ranks inside a Jupyter notebook: start and stop a cluster of ipyparallel MPI engines.

The lessons (``lessons/``) run code on several ranks interactively. A cell that starts with ``%%px``
runs on every engine; each engine is one rank of a single ``mpiexec -n N`` job, so inside ``%%px``
cells ``dist.init()`` sees a world of N ranks and collectives work as in a script::

    from minidist_course.notebook import start_cluster, stop_cluster
    rc = start_cluster(2)            # n engines = n MPI ranks; registers the %px / %%px magics
    %%px
    import minidist.distributed as dist
    print(dist.get_rank(), dist.get_world_size())
    stop_cluster()                   # or let the kernel's exit do it

In a script or a test use the context manager ``with mpi_cluster(2) as rc: ...``.

The engines are always stopped: by :func:`stop_cluster`, by the context manager even when its body
raises, when the Python process (the notebook's kernel) exits normally (``atexit``), and, if that
process is killed outright (``kill -9``, a crashed kernel), by a small *reaper* process that waits for
it to disappear and then kills the controller's and engines' process groups.

ipyparallel (Kerzel, Ragan-Kelley et al., https://ipyparallel.readthedocs.io) is imported only when a
cluster is started, so ``import minidist_course.notebook`` works without it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from minidist_tools.mpiexec import mpiexec_path

_INSTALL_HINT = 'the notebook helpers need ipyparallel: install them with `pip install -e ".[lessons]"`'

# Engines share the machine's cores: one BLAS/OpenMP thread each, as every launch in minidist does.
ENGINE_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

# The one running cluster of this process (a notebook has one kernel and wants one set of ranks).
_current: dict[str, Any] = {}

# The reaper: a tiny separate process that kills the cluster's process groups once `parent` is gone.
_REAPER = """
import os, signal, sys, time
parent, groups = int(sys.argv[1]), [int(g) for g in sys.argv[2:]]
while True:
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        break
    if os.getppid() != parent:  # re-parented: the kernel died
        break
    time.sleep(0.5)
for sig in (signal.SIGTERM, signal.SIGKILL):
    for g in groups:
        try:
            os.killpg(g, sig)
        except (ProcessLookupError, PermissionError):
            pass
    time.sleep(1.0)
"""


def _import_ipyparallel() -> Any:
    try:
        import ipyparallel
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(_INSTALL_HINT) from error
    return ipyparallel


def start_cluster(n: int = 2, *, timeout: float = 120.0, activate: bool = True) -> Any:
    """Start ``n`` ipyparallel engines as the ``n`` ranks of one ``mpiexec`` job; return the Client.

    ``rc[:]`` (a ``DirectView``) runs functions on all ranks; with ``activate`` the ``%px`` / ``%%px``
    magics are registered in IPython (blocking: a ``%%px`` cell returns when every rank has finished it
    and re-raises a rank's exception). If a cluster of ``n`` engines is already running in this process
    (a re-run cell), it is returned as is; one of another size is stopped first.

    Engines run in the current directory with one BLAS thread each. On a 2-core laptop ``n`` = 2..4
    starts in 2-5 s; ranks beyond the number of cores share them (MPICH oversubscribes freely).

    Raises:
        ValueError: ``n < 1``.
        ImportError: ipyparallel is missing (the message says how to install it).
        TimeoutError: the engines did not all register within ``timeout`` seconds (the cluster is
            stopped before raising).
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"start_cluster needs n >= 1 engines (MPI ranks), got {n!r}")
    if _current.get("n") == n:
        return _current["client"]
    stop_cluster()
    ipp = _import_ipyparallel()
    from traitlets.config import Config

    config = Config()
    config.MPIEngineSetLauncher.mpi_cmd = [mpiexec_path()]
    config.MPIEngineSetLauncher.environment = dict(ENGINE_ENV)
    # A private profile directory: connection files never touch ~/.ipython and vanish with the cluster.
    profile_dir = tempfile.mkdtemp(prefix="minidist-ipp-")
    cluster = ipp.Cluster(
        engines="mpi",
        n=n,
        config=config,
        profile_dir=profile_dir,
        log_level=logging.ERROR,  # engines stopped by a signal exit non-zero: not worth a warning
        shutdown_atexit=False,  # our own atexit hook below stops it (and removes the profile directory)
        # The controller registers an engine at its first heartbeat, and pings every 3 s by default:
        # n engines took 6 s to register of which ~4 s was waiting for a ping. Every 0.5 s (60 misses:
        # the default 30 s before a silent engine counts as dead) starts the ranks in ~2 s. Pings are
        # answered by a ZeroMQ thread, not Python, so a rank busy in a long cell still answers.
        controller_args=["--HeartMonitor.period=500", "--HeartMonitor.max_heartmonitor_misses=60"],
    )
    _current.update(n=n, cluster=cluster, profile_dir=profile_dir, client=None, reaper=None)
    try:
        cluster.start_cluster_sync(n=n)
        _current["reaper"] = _start_reaper(cluster)
        client = _current["client"] = cluster.connect_client_sync()
        client.wait_for_engines(n, timeout=timeout, interactive=False)  # no progress bar in the notebook
        if activate and _in_ipython():
            view = client[:]
            view.block = True  # a %%px cell returns when every rank is done, and raises a rank's error
            view.activate()
    except BaseException:
        stop_cluster()
        raise
    return client


def _in_ipython() -> bool:
    """True inside IPython / Jupyter, where the ``%px`` magics can be registered."""
    ipython = sys.modules.get("IPython")
    return ipython is not None and ipython.get_ipython() is not None


def _process_groups(cluster: Any) -> list[int]:
    """Process-group ids of the controller and of each engine set's ``mpiexec`` (each its own session)."""
    launchers = [cluster.controller, *cluster.engines.values()]
    return [int(launcher.pid) for launcher in launchers if getattr(launcher, "pid", None)]


def _start_reaper(cluster: Any) -> subprocess.Popen | None:
    groups = _process_groups(cluster)
    if not groups or os.name != "posix":
        return None  # pragma: no cover - Windows: rely on atexit
    return subprocess.Popen(
        [sys.executable, "-c", _REAPER, str(os.getpid()), *map(str, groups)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # Ctrl-C in the notebook must not kill the reaper
    )


def stop_cluster() -> None:
    """Stop the running cluster (engines and controller), if any; safe to call twice."""
    cluster = _current.get("cluster")
    client, reaper, profile_dir = _current.get("client"), _current.get("reaper"), _current.get("profile_dir")
    _current.clear()
    if cluster is None:
        return
    try:
        if client is not None:
            client.close()
        # Engines first, then the controller: ipyparallel's stop_cluster stops both at once, and engines
        # whose controller is already gone wait ~3 s before they exit (4 s in all, 0.8 s this way).
        cluster.stop_engines_sync()
        cluster.stop_controller_sync()
    finally:
        if reaper is not None:
            reaper.kill()
            reaper.wait()
        if profile_dir:
            shutil.rmtree(profile_dir, ignore_errors=True)


atexit.register(stop_cluster)


def cluster_pids() -> list[int]:
    """Process ids of the running cluster's controller and ``mpiexec`` launchers (empty if none).

    Tests use it to check that nothing is left behind.
    """
    cluster = _current.get("cluster")
    return _process_groups(cluster) if cluster is not None else []


@contextlib.contextmanager
def mpi_cluster(n: int = 2, *, timeout: float = 120.0, activate: bool = False) -> Iterator[Any]:
    """``with mpi_cluster(n) as rc:`` — a cluster of ``n`` MPI engines, stopped when the block ends.

    The engines are stopped even when the block raises. See :func:`start_cluster` for the arguments.
    """
    client = start_cluster(n, timeout=timeout, activate=activate)
    try:
        yield client
    finally:
        stop_cluster()

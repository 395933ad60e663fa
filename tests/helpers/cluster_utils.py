"""Tests on a cluster in a box (``minidist_tools.cluster``): a module-scoped cluster fixture and
``run_on_cluster``.

A test module that runs ranks on several nodes makes its cluster once (bringing one up takes well under
a second, but every module sharing one keeps the namespaces few)::

    from cluster_utils import cluster_fixture, run_on_cluster
    pytestmark = [pytest.mark.mpi, pytest.mark.cluster]
    cluster = cluster_fixture(nodes=4, ranks_per_node=2)        # the fixture named "cluster"

    def test_x(cluster, tmp_path):
        run_on_cluster(cluster, 4, "ddp/ddp_equivalence.py", tmp_path, ...)

Without root (or ``ip``/``tc``/``unshare``) every test using the fixture is skipped with the reason
``cluster_available()`` gives. ``run_on_cluster`` is :func:`mpi_utils.run_mpi` with the cluster's
launcher: the same environment (plus ``cluster.env()``: TCP between nodes), the same timeout and error
reports, and after a timeout or a failure every process in the namespaces is killed.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mpi_utils import mpi_env, run_launch, worker_path

from minidist_tools.cluster import Cluster, cluster_available


def skip_reason() -> str | None:
    """Why cluster tests cannot run here (``None`` if they can)."""
    ok, reason = cluster_available()
    return None if ok else f"no cluster in a box: {reason}"


def cluster_fixture(nodes: int, ranks_per_node: int, bandwidth: str | None = None) -> Any:
    """A module-scoped pytest fixture that brings up one cluster for the module and removes it after."""

    @pytest.fixture(scope="module")
    def cluster() -> Iterator[Cluster]:
        reason = skip_reason()
        if reason is not None:
            pytest.skip(reason)
        with Cluster.up(nodes=nodes, ranks_per_node=ranks_per_node, bandwidth=bandwidth) as made:
            yield made

    return cluster


def run_on_cluster(
    cluster: Cluster,
    n: int,
    script: str | Path,
    *args: Any,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """``mpiexec -n n python script *args`` on ``cluster`` (ranks in blocks of ``ranks_per_node`` per node);
    arguments and errors as :func:`mpi_utils.run_mpi`."""
    cmd = cluster.mpiexec_command(n) + [sys.executable, str(worker_path(script)), *map(str, args)]
    env = mpi_env({**cluster.env(), **(env or {})})
    return run_launch(cmd, timeout=timeout, env=env, check=check, cleanup=cluster.kill_processes)

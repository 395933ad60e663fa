"""Tests on a Slurm cluster in a box (``minidist cluster up --scheduler slurm``): the skip reason, a
module-scoped cluster, and submitting and waiting for jobs.

The Slurm tests need what the namespace cluster needs (root, ``ip``) and Slurm's programs; where these
are missing they are skipped with the reason (``scripts/install_slurm.sh`` installs Slurm as root).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_utils import skip_reason as cluster_skip_reason
from mpi_utils import REPO, mpi_env

from minidist_tools.cluster import Cluster, netns
from minidist_tools.cluster.slurm import node_states, packages

DONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


def skip_reason() -> str | None:
    """Why Slurm tests cannot run here (``None`` if they can)."""
    reason = cluster_skip_reason()
    if reason is not None:
        return reason
    missing = packages.missing()
    if missing:
        return f"Slurm is not installed (missing {', '.join(missing)}): {packages.install_hint()}"
    return None


def slurm_fixture(nodes: int, ranks_per_node: int) -> Any:
    """A module-scoped fixture: a Slurm cluster for the module, removed after it, checking that nothing
    of it is left (no daemon, namespace, link or file)."""

    @pytest.fixture(scope="module")
    def slurm_cluster() -> Iterator[Cluster]:
        reason = skip_reason()
        if reason is not None:
            pytest.skip(reason)
        with Cluster.up(nodes=nodes, ranks_per_node=ranks_per_node, scheduler="slurm") as made:
            record = dict(made._state)
            yield made
        assert leftovers(record) == []

    return slurm_cluster


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def leftovers(record: dict[str, Any]) -> list[str]:
    """Whatever of the cluster ``record`` (its state) is still on the machine."""
    found = [f"daemon {name} ({pid})" for name, pid in record["slurm"]["pids"].items() if alive(pid)]
    found += [f"namespace {n}" for n in record["nodes"] if n in netns.namespaces()]
    found += [f"link {i}" for i in [record["bridge"], *record["veths"]] if netns.link_exists(i)]
    found += [f"file {p}" for p in (record["slurm"]["folder"], record["launcher"]) if Path(p).exists()]
    return found


def slurm_env(cluster: Cluster, **extra: str) -> dict[str, str]:
    """The environment of a Slurm command on ``cluster``: the tests' (PYTHONPATH: the repository and the
    workers), its SLURM_CONF, and ``extra``."""
    return mpi_env({**cluster.env(), **cluster.slurm_env(), **extra})


def slurm(
    cluster: Cluster,
    *argv: str,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """Run a Slurm command (``srun ...``, ``salloc ...``, ``scontrol ...``) in the repository, with ``env``
    added to :func:`slurm_env`; with ``check``, raise with its output if it fails."""
    proc = subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=slurm_env(cluster, **(env or {})),
        timeout=timeout,
    )
    assert not check or proc.returncode == 0, (
        f"{' '.join(argv)} exited with {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    )
    return proc


def submit(cluster: Cluster, *argv: str, env: dict[str, str] | None = None) -> str:
    """``sbatch --parsable ARGV`` (the job inherits the environment, ``env`` included); the job id."""
    return slurm(cluster, "sbatch", "--parsable", *argv, env=env).stdout.strip().split(";")[0]


def job_state(cluster: Cluster, job: str) -> str:
    out = slurm(cluster, "scontrol", "show", "job", "-o", job).stdout
    return out.split("JobState=", 1)[1].split()[0]


def wait_for_job(cluster: Cluster, job: str, timeout: float = 120) -> str:
    """Wait until ``job`` has ended (polling: ``sbatch --wait`` polls every few seconds to tens of
    seconds); return its final state. On timeout the job is cancelled and the test fails."""
    deadline = time.monotonic() + timeout
    while (state := job_state(cluster, job)) not in DONE:
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job], env=slurm_env(cluster), check=False)
            pytest.fail(f"job {job} still {state} after {timeout} s")
        time.sleep(0.2)
    return state


def wait_for(condition: Any, what: str, cluster: Cluster, job: str, timeout: float = 120) -> None:
    """Wait until ``condition()`` holds while ``job`` runs; fail if the job ends first or on timeout."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline or job_state(cluster, job) in DONE:
            pytest.fail(f"{what} did not happen (job {job}: {job_state(cluster, job)}, {timeout} s at most)")
        time.sleep(0.1)


def wait_for_idle(cluster: Cluster, timeout: float = 60) -> None:
    """Wait until every node of ``cluster`` is idle (no job, not down)."""
    deadline = time.monotonic() + timeout
    while set((states := node_states(cluster._state)).values()) != {"idle"} or len(states) < len(
        cluster.nodes
    ):
        if time.monotonic() > deadline:
            pytest.fail(f"nodes not idle after {timeout} s: {states}")
        time.sleep(0.2)

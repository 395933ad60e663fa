"""``minidist cluster up --scheduler slurm``: up, status (sinfo), down, and nothing left behind, also
when starting Slurm fails halfway.

State files go to a folder of this module (``MINIDIST_CLUSTER_DIR``), as in test_cluster_cli.py.
Skipped with the reason where there is no root or no Slurm.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from mpi_utils import REPO, mpi_env
from slurm_utils import leftovers, skip_reason

from minidist_tools.cluster import Cluster, ClusterError, state
from minidist_tools.cluster.slurm import config

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.cluster,
    pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason())),
]


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    folder = tmp_path / "state"
    monkeypatch.setattr(state, "STATE_DIR", folder)
    monkeypatch.setenv("MINIDIST_CLUSTER_DIR", str(folder))
    return folder


def cli(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "minidist_tools.cluster", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=mpi_env(), timeout=120)


def test_up_status_down_leaves_no_daemon_namespace_link_or_file(state_dir):
    up = cli("up", "--scheduler", "slurm", "--nodes", "2", "--ranks-per-node", "2")
    assert up.returncode == 0, up.stderr
    name = re.search(r"^cluster (\w+):", up.stdout, re.MULTILINE).group(1)
    record = state.read(name)
    try:
        assert f"export SLURM_CONF={state_dir / f'{name}.slurm' / 'slurm.conf'}" in up.stdout
        assert set(record["slurm"]["pids"]) == {"munged", "slurmctld", f"slurmd {name}n0", f"slurmd {name}n1"}
        status = cli("status", "--name", name)
        for node in record["nodes"]:  # sinfo's table: each node idle, with its ranks as CPUs
            assert re.search(rf"^\s+{node}\s+1\s+box\*\s+idle\s+2\s", status.stdout, re.MULTILINE), (
                status.stdout
            )
    finally:
        down = cli("down", "--name", name)
    assert down.returncode == 0, down.stderr
    assert leftovers(record) == []
    assert list(state_dir.iterdir()) == []


def test_a_failed_slurm_start_stops_the_daemons_it_had_started(state_dir, monkeypatch):
    """slurmctld refuses a configuration with an unknown key: munged runs by then, and must be stopped."""
    broken = config.slurm_conf
    monkeypatch.setattr(config, "slurm_conf", lambda record: broken(record) + "NoSuchKey=1\n")
    written = []  # every state the cluster wrote: the last one names the daemons started
    write = state.write
    monkeypatch.setattr(
        state, "write", lambda record: (written.append(json.loads(json.dumps(record))), write(record))
    )
    with pytest.raises(ClusterError, match=r"could not start Slurm on cluster .*slurmctld exited"):
        Cluster.up(nodes=2, ranks_per_node=1, scheduler="slurm", name="slfail")
    assert set(written[-1]["slurm"]["pids"]) == {"munged", "slurmctld"}
    assert leftovers(written[-1]) == []
    assert list(state_dir.iterdir()) == []

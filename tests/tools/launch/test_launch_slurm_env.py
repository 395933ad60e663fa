"""The launcher reads a Slurm allocation from Slurm's variables (minidist_tools/launch/slurm.py), and
inside one takes its ranks from ``SLURM_NTASKS``; outside one ``-n`` stays required."""

from __future__ import annotations

import pytest

from minidist_tools.launch import slurm
from minidist_tools.launch.plan import check_arguments

BATCH_JOB = {
    "SLURM_JOB_ID": "42",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NTASKS": "8",
    "SLURM_RESTART_COUNT": "1",
}


def test_an_allocation_is_read_from_slurms_variables():
    inside = slurm.allocation(BATCH_JOB)
    assert inside == slurm.Allocation("42", "gpu[07-08]", 2, 8, 1)
    assert inside.describe() == "Slurm job 42: 2 node(s) gpu[07-08], 8 tasks, requeued 1 time(s)"
    assert slurm.allocation({}) is None
    nodes_only = slurm.allocation({"SLURM_JOB_ID": "7", "SLURM_NNODES": "3", "SLURM_NODELIST": "n[1-3]"})
    assert nodes_only == slurm.Allocation("7", "n[1-3]", 3, None, 0)


def test_inside_an_allocation_n_defaults_to_its_tasks(monkeypatch):
    cmd = ["python", "train.py"]
    for name in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="-n .* is required"):
        check_arguments(cmd, None, 3, None, None, 1.0, None)
    for name, value in BATCH_JOB.items():
        monkeypatch.setenv(name, value)
    assert check_arguments(cmd, None, 3, None, None, 1.0, None).n == 8
    assert check_arguments(cmd, 4, 3, None, None, 1.0, None).n == 4  # -n still wins

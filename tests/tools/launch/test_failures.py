"""A rank killed during a save, on one machine, under ``minidist launch``: the checkpoint being
written is never used, the restart resumes from the newest one that verifies, and training ends bit for
bit as an uninterrupted run (the same layout repeats the same floating-point operations).

The same on a cluster, with a cut link and a rank killed mid-step:
tests/tools/launch/test_failures_cluster.py; a rank killed mid-step on one machine:
tests/tools/launch/test_launch.py; kills at every phase of a save without a launcher (then ``--resume``):
tests/checkpoint/test_checkpoint_mpi.py.
"""

from __future__ import annotations

import pytest
from launch_utils import EXAMPLE, Launcher, assert_identical, final_checkpoint, leftovers
from mpi_utils import run_mpi, worker_path

from minidist.checkpoint import atomic

TRAIN = ["--epochs", "2", "--hidden", "32", "32", "--checkpoint-every", "4"]  # 22 steps on 2 ranks


@pytest.mark.mpi
def test_a_rank_killed_while_writing_its_shard_is_restarted_from_the_newest_verified_checkpoint(tmp_path):
    reference = tmp_path / "reference"
    uninterrupted = run_mpi(2, EXAMPLE, *TRAIN, "--checkpoint-dir", reference, timeout=120)

    ckpt = tmp_path / "ckpt"
    # Rank 1 SIGKILLs itself right after writing its shard of step 12 (tests/workers/failures/
    # train_mlp_fault.py), before rank 0 could commit it; steps 4 and 8 had verified.
    run = Launcher(
        ["-n", "2", "--max-restarts", "1", "--monitor-interval", "0.2"],
        ["python", str(worker_path("failures/train_mlp_fault.py")), *TRAIN, "--checkpoint-dir", str(ckpt)],
        tmp_path / "launch.log",
        env={"FAULT": "save:1:12"},
    )
    try:
        assert run.wait(180) == 0, run.output()
    finally:
        run.close()

    kinds = [e["event"] for e in run.events() if e["event"] not in ("checkpoint", "ranks")]
    assert kinds == ["start", "failure", "kill", "verify", "restart", "start", "done"], kinds
    verify = run.events("verify")[0]
    assert verify["step"] == 8 and verify["skipped"] == []  # the half-written step 12 was never a candidate
    assert f"resumed from {verify['path']}" in run.out_path.read_text()
    assert leftovers(run.run_id) == []

    step, got = final_checkpoint(ckpt)
    assert step == 22 and atomic.read_latest(ckpt) == atomic.step_dirname(22)
    assert_identical(got, final_checkpoint(reference)[1])
    accuracy = [x for x in uninterrupted.stdout.splitlines() if x.startswith("final test accuracy")]
    assert accuracy and accuracy[-1] in run.out_path.read_text()
    assert [p.name for p in ckpt.iterdir() if p.name.startswith(".tmp")] == []  # cleaned by the restart

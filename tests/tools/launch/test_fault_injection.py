"""``MINIDIST_FAULT``: a rank fails on purpose at a chosen step, and the launcher names it.

The grammar (minidist_tools/fault.py) is checked without MPI; then real ``mpiexec`` ranks under
``minidist launch``: rank 1 kills itself (SIGKILL) or exits with code 3 after a step, and the launcher's
``failure`` event names that rank with the pid its ``ranks`` event printed, and how it ended. Every wait
is on an event of the launcher's log or its exit, never a fixed sleep.
"""

from __future__ import annotations

import re

import pytest
from launch_utils import EXAMPLE, Launcher, leftovers

from minidist_tools.fault import Fault, FaultPlan, parse

TRAIN = ["--epochs", "2", "--hidden", "32", "32", "--checkpoint-every", "4"]  # 22 steps on 2 ranks


def test_the_grammar_names_an_action_a_rank_and_a_step():
    assert parse("") == []
    assert parse("kill:rank=2:step=80") == [Fault("kill", 2, 80)]
    assert parse("exit:rank=1:step=40:code=3, freeze:step=5:rank=0:attempt=1") == [
        Fault("exit", 1, 40, code=3),
        Fault("freeze", 0, 5, attempt=1),
    ]


@pytest.mark.parametrize(
    "value", ["kill", "kill:rank=2", "boom:rank=1:step=3", "kill:rank=x:step=3", "kill:rank=1:step=3:when=9",
              "kill:rank=-1:step=3", "kill:rank=1;step=3"],
)  # fmt: skip
def test_a_value_that_does_not_parse_is_an_error_naming_the_variable(value):
    with pytest.raises(ValueError, match=r"MINIDIST_FAULT=.*"):
        parse(value)


def test_a_fault_fires_only_on_its_rank_and_attempt(monkeypatch):
    monkeypatch.delenv("MINIDIST_RESTART_COUNT", raising=False)
    assert FaultPlan(2, "kill:rank=2:step=8").faults == [Fault("kill", 2, 8)]
    assert FaultPlan(1, "kill:rank=2:step=8").faults == []
    monkeypatch.setenv("MINIDIST_RESTART_COUNT", "1")  # the restarted job passes step 8 again: it runs on
    assert FaultPlan(2, "kill:rank=2:step=8").faults == []
    assert FaultPlan(2, "kill:rank=2:step=8:attempt=1").faults == [Fault("kill", 2, 8, attempt=1)]
    FaultPlan(2, "kill:rank=2:step=8").at_step(8)  # (not this attempt: returns)


@pytest.mark.mpi
def test_an_injected_kill_is_restarted_and_the_launcher_names_the_dead_rank(tmp_path):
    ckpt = tmp_path / "ckpt"
    run = Launcher(["-n", "2", "--max-restarts", "1", "--monitor-interval", "0.2"],
                   ["python", EXAMPLE, *TRAIN, "--checkpoint-dir", str(ckpt)], tmp_path / "launch.log",
                   env={"MINIDIST_FAULT": "kill:rank=1:step=8"})  # fmt: skip
    try:
        assert run.wait(180) == 0, run.output()
        pids = run.events("ranks")[0]["pids"]  # printed at the start: {"0": pid, "1": pid}
        failure = run.events("failure")[0]
        assert failure["dead_ranks"] == [1], failure
        # The dead rank's status is read from its zombie; if its parent reaped it first, it is only named.
        assert re.match(rf"rank 1 \(pid {pids['1']}\) (was killed by signal 9|ended first); mpiexec exited",
                        failure["detail"]), failure["detail"]  # fmt: skip
        assert f"rank 1: pid {pids['1']}" in run.err_path.read_text()
        assert run.events("verify")[0]["step"] == 8  # saved just before the fault fired
        assert "resumed from" in run.out_path.read_text()
        assert leftovers(run.run_id) == []
    finally:
        run.close()


@pytest.mark.mpi
def test_an_injected_exit_code_is_named_with_the_rank(tmp_path):
    command = ["python", EXAMPLE, *TRAIN, "--checkpoint-dir", str(tmp_path / "ckpt")]
    args = ["-n", "2", "--max-restarts", "0", "--monitor-interval", "0.2"]
    run = Launcher(
        args, command, tmp_path / "launch.log", env={"MINIDIST_FAULT": "exit:rank=1:step=3:code=3"}
    )
    try:
        assert run.wait(180) != 0, run.output()  # mpiexec's code: 3, or 9 when Hydra reports a rank it killed
        pids = run.events("ranks")[0]["pids"]
        detail = run.events("failure")[0]["detail"]
        assert re.match(rf"rank 1 \(pid {pids['1']}\) (exited with code 3|ended first)", detail), detail
        assert leftovers(run.run_id) == []
    finally:
        run.close()

"""``minidist launch``: restarts after a killed rank, giving up, clean stops, bad arguments.

The launcher runs as a real process over real ``mpiexec`` ranks (tests/helpers/launch_utils.py); a rank is
killed from outside with SIGKILL, as a crash or the kernel's OOM killer would, at a moment read from the
launcher's own log. Every test checks that no process of the run is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch_utils import (
    EXAMPLE,
    Launcher,
    assert_identical,
    checkpoint_tensors,
    final_checkpoint,
    leftovers,
)
from mpi_utils import REPO, mpi_env, run_mpi

from minidist_tools.launch import env as launch_env
from minidist_tools.launch import launch
from minidist_tools.launch.__main__ import main
from minidist_tools.launch.checkpoints import checkpoint_dir_of, newest_verified

# 3 epochs of 11 steps (1500 digits, global batch 128), a checkpoint every 4 steps: a kill after step 4
# leaves 29 steps, several seconds even on an idle machine, so it always lands mid-run.
TRAIN = ["--epochs", "3", "--hidden", "32", "32", "--checkpoint-every", "4"]


@pytest.fixture
def launcher(tmp_path):
    started: list[Launcher] = []

    def start(args: list[str], command: list[str], name: str = "launch", env: dict | None = None) -> Launcher:
        started.append(Launcher(args, command, tmp_path / f"{name}.log", env=env))
        return started[-1]

    yield start
    for one in started:
        one.close()


@pytest.mark.mpi
def test_a_killed_rank_is_restarted_and_training_ends_bit_identical(launcher, tmp_path):
    reference = tmp_path / "reference"
    uninterrupted = run_mpi(2, EXAMPLE, *TRAIN, "--checkpoint-dir", str(reference), timeout=120)

    ckpt = tmp_path / "ckpt"
    run = launcher(["-n", "2", "--max-restarts", "2", "--monitor-interval", "0.2"],
                   ["python", EXAMPLE, *TRAIN, "--checkpoint-dir", str(ckpt)])  # fmt: skip
    run.wait_for(lambda e: e["event"] == "checkpoint" and e["step"] >= 4, timeout=120)
    victim = run.ranks(2)[1]
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)  # cannot be caught: the rank flushes, saves and says nothing
    assert run.wait(180) == 0, run.output()

    kinds = [e["event"] for e in run.events() if e["event"] not in ("checkpoint", "ranks")]
    assert kinds == ["start", "failure", "kill", "verify", "restart", "start", "done"], kinds
    failure, kill, verify = run.events("failure")[0], run.events("kill")[0], run.events("verify")[0]
    assert failure["reason"] == "exit" and failure["returncode"] != 0
    # The launcher printed every rank's pid before the kill, and names the rank that died, not MPICH's pick.
    assert run.events("ranks")[0]["pids"]["1"] == victim
    assert failure["dead_ranks"] == [1], failure
    assert failure["detail"].startswith(f"rank 1 (pid {victim}) "), failure["detail"]
    # Bounded time from the rank's death to no process of the attempt left: MPICH ends the other ranks
    # within ~0.1 s, the launcher notices mpiexec's exit at once (it waits on it) and checks /proc.
    # Measured 0.3-0.6 s on 2 loaded cores; 10 s only catches a launcher that waits for a timeout.
    seconds = kill["time"] - killed_at
    print(f"kill -9 of rank 1 -> every process gone: {seconds:.2f} s")
    assert seconds < 10
    assert verify["step"] >= 4 and verify["skipped"] == []
    assert f"resumed from {verify['path']}" in run.out_path.read_text()
    assert leftovers(run.run_id) == []

    # The restart redid the steps after the checkpoint with the same float operations: the final weights
    # and momenta equal the uninterrupted run's bit for bit, and so does the accuracy it prints.
    step, got = final_checkpoint(ckpt)
    assert step == 33
    assert_identical(got, final_checkpoint(reference)[1])
    accuracy = [line for line in uninterrupted.stdout.splitlines() if line.startswith("final test accuracy")]
    assert accuracy and accuracy[-1] in run.out_path.read_text()

    # What a restart would resume from if the newest checkpoint were damaged: the one before it.
    newest = ckpt / (ckpt / "latest").read_text().strip()
    shard = sorted(newest.glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    found, skipped = newest_verified(ckpt)
    assert found is not None and found[0] < 33 and checkpoint_tensors(found[1])[0] == found[0]
    assert skipped[0][0] == str(newest) and "sha256" in skipped[0][1]


@pytest.mark.mpi
def test_restarts_run_out_and_the_launcher_gives_up(launcher, tmp_path):
    # Every attempt fails before it saves anything: each restart starts from scratch and still counts.
    # The ranks print the restart count the launcher gave them.
    script = "\n".join([  # one write per rank: the two ranks' lines cannot interleave
        "import os, sys",
        "count, most = os.environ['MINIDIST_RESTART_COUNT'], os.environ['MINIDIST_MAX_RESTARTS']",
        "os.write(1, f'attempt {count} of {most}\\n'.encode())",
        "sys.exit(3)",
    ])  # fmt: skip
    command = [sys.executable, "-c", script, "--checkpoint-dir", str(tmp_path / "none")]
    run = launcher(["-n", "2", "--max-restarts", "1", "--monitor-interval", "0.2"], command)
    assert run.wait(120) == 3  # the command's own exit code
    kinds = [e["event"] for e in run.events() if e["event"] != "ranks"]  # (ranks may end before found)
    assert kinds == ["start", "failure", "kill", "verify", "restart", "start", "failure", "kill", "give_up"]
    assert run.events("verify")[0]["step"] is None  # nothing saved: from scratch
    give_up = run.events("give_up")[0]
    assert give_up["restarts"] == 1 and "all 1 restart(s) used" in give_up["message"]
    out = run.out_path.read_text()
    assert out.count("attempt 0 of 1\n") == 2 and out.count("attempt 1 of 1\n") == 2  # 2 ranks per attempt
    assert "giving up: all 1 restart(s) used" in run.err_path.read_text()
    assert leftovers(run.run_id) == []


@pytest.mark.mpi
def test_a_silent_job_counts_as_hung(launcher):
    run = launcher(["-n", "2", "--max-restarts", "0", "--monitor-interval", "0.2", "--stall-timeout", "1"],
                   [sys.executable, "-c", "import time; time.sleep(120)"])  # fmt: skip
    assert run.wait(60) == 1  # killed by the launcher: no exit code of its own
    failure = run.events("failure")[0]
    assert failure["reason"] == "stall" and "--stall-timeout 1" in failure["detail"]
    assert leftovers(run.run_id) == []


@pytest.mark.mpi
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_stopping_the_launcher_ends_every_rank(launcher, signum, code):
    # Each rank says "ready" once it runs the command; the launcher passes that on to its stdout, so
    # the job is up and the launcher is watching it when the signal comes.
    ready = "import os, time; os.write(1, b'ready\\n'); time.sleep(300)"
    run = launcher(["-n", "2", "--monitor-interval", "0.2"], [sys.executable, "-c", ready],
                   env={"PYTHONFAULTHANDLER": "1"})  # fmt: skip
    run.wait_for_output("ready\n", count=2, timeout=120)
    stopped = time.monotonic()
    run.proc.send_signal(signum)  # Ctrl-C sends SIGINT to the launcher (the job has its own session)
    # It stops in 0.3-0.8 s (measured at load 3; SIGTERM to the job, which may take up to 2 s before
    # SIGKILL); a loaded CI machine once took past a fixed 30 s. The test waits for the exit itself; past
    # 300 s the launcher prints its threads' stacks (SIGABRT, PYTHONFAULTHANDLER); the test fails with them.
    assert run.wait(300) == code
    print(f"{signum.name} -> the launcher exited after {time.monotonic() - stopped:.2f} s")
    assert run.events()[-1]["event"] == "interrupted"
    assert leftovers(run.run_id) == []


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-n", "0", "--", "python", "x.py"], "-n must be at least 1"),
        (["-n", "two", "--", "python", "x.py"], "invalid int value"),
        (["-n", "2"], "no command to run"),
        (["-n", "2", "--"], "no command to run"),
        (["-n", "2", "--nodes", "3:2", "--cluster", "c", "--", "python"], "need 1 <= MIN <= MAX"),
        (["-n", "2", "--nodes", "two", "--", "python"], "must be MIN:MAX"),
        (["-n", "2", "--nodes", "1:2", "--", "python", "x.py"], "--nodes MIN:MAX needs --cluster NAME"),
        (["--", "python", "x.py"], "-n (the number of ranks) is required"),
        (["-n", "2", "--max-restarts", "-1", "--", "python"], "--max-restarts must be >= 0"),
        (["-n", "2", "--monitor-interval", "0", "--", "python"], "must be positive"),
    ],
)
def test_bad_arguments_are_refused_with_a_reason(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_python_api_checks_its_arguments_too(tmp_path):
    with pytest.raises(ValueError, match="--nodes MIN:MAX needs --cluster"):
        launch(["python", "x.py"], 2, nodes=(1, 2), log=tmp_path / "log")
    with pytest.raises(ValueError, match="need 1 <= MIN <= MAX"):
        launch(["python", "x.py"], 2, nodes=(0, 2), cluster="c", log=tmp_path / "log")
    with pytest.raises(ValueError, match="no command"):
        launch([], 2, log=tmp_path / "log")
    assert not (tmp_path / "log").exists()


def test_an_unknown_cluster_is_an_error(capsys):
    assert main(["--cluster", "nosuchcl", "--", "python", "x.py"]) == 1
    assert "nosuchcl" in capsys.readouterr().err


def test_a_restart_implies_resume_only_with_a_checkpoint_dir(monkeypatch):
    monkeypatch.delenv(launch_env.RESTART_COUNT, raising=False)
    assert not launch_env.resume_requested(False, "ckpt")  # a first run never resumes by itself
    assert launch_env.resume_requested(True, "ckpt")
    monkeypatch.setenv(launch_env.RESTART_COUNT, "0")
    assert not launch_env.resume_requested(False, "ckpt")
    monkeypatch.setenv(launch_env.RESTART_COUNT, "2")
    assert launch_env.resume_requested(False, "ckpt")
    assert not launch_env.resume_requested(False, None)  # nothing to resume from: start again
    monkeypatch.setenv(launch_env.RESTART_COUNT, "x")
    with pytest.raises(ValueError, match="MINIDIST_RESTART_COUNT='x'"):
        launch_env.restart_count()


def test_the_checkpoint_dir_is_read_from_the_command(tmp_path):
    assert checkpoint_dir_of(["python", "t.py", "--checkpoint-dir", "/a"]) == Path("/a")
    assert checkpoint_dir_of(["python", "t.py", "--checkpoint-dir=c"], cwd=tmp_path) == tmp_path / "c"
    assert checkpoint_dir_of(["python", "t.py", "--checkpoint-dir", "a", "--checkpoint-dir", "b"]).name == "b"
    assert checkpoint_dir_of(["python", "t.py"]) is None


def test_train_gpt_resumes_by_itself_after_a_restart(tmp_path):
    # train_gpt.py shares the rule (launch.env.resume_requested): a restart count > 0 is --resume, and
    # a damaged newest checkpoint is skipped for the one before it (load_latest(fallback=True)).
    gpt = [sys.executable, str(REPO / "examples" / "train_gpt.py"), "--n-layer", "1", "--n-embd", "16",
           "--n-head", "2", "--block-size", "16", "--batch-size", "4", "--eval-interval", "2",
           "--eval-iters", "1", "--sample-tokens", "0", "--checkpoint-dir", str(tmp_path)]  # fmt: skip

    def run(max_iters: int, restart: int) -> str:
        env = mpi_env({launch_env.RESTART_COUNT: str(restart)})
        argv = [*gpt, "--max-iters", str(max_iters)]
        result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    assert "resumed" not in run(4, restart=0)  # saves steps 2 and 4; a first run never resumes
    newest = tmp_path / "step_000000004"
    shard = sorted(newest.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-1] + b"\0")  # damaged: its sha256 no longer matches
    out = run(6, restart=1)
    assert "skipping a checkpoint that does not load" in out and "at step 2" in out

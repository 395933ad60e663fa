"""The launcher's own death ends its job, and one checkpoint folder has one live job at a time.

``kill -9`` of the launcher (the OOM killer, a batch system's hard kill) during a silent phase of a
4-rank job: its reaper (minidist_tools/launch/reaper.py) ends every process of the run, and a relaunch
on the same folder right after starts only once they are gone (lock.py). A second launch beside a live
one is refused, naming the holder. The lock's waiting and refusing without MPI: the last tests.

Every wait here is for an event (a file, a process's exit, a log line, the scan of /proc coming back
empty) under a generous overall timeout, so a loaded machine makes the tests slower, not red.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from launch_utils import Launcher, leftovers
from mpi_utils import mpi_env, worker_path

from minidist_tools.launch import LaunchError, launch, read_log
from minidist_tools.launch import lock as folder_lock
from minidist_tools.launch.__main__ import main

SILENT = str(worker_path("failures/silent.py"))
# A rank of the relaunch writes which processes of the old run it still sees (none, if the relaunch
# waited as it must). Inline: the ranks' Python need not import this worktree's minidist_tools.
SEES_OLD_RUN = """
import os, sys
needle = f"MINIDIST_RUN_ID={sys.argv[1]}\\0".encode()
seen = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if needle in open(f"/proc/{pid}/environ", "rb").read():
            seen.append(int(pid))
    except OSError:
        pass
if os.environ["PMI_RANK"] == "0":
    open(sys.argv[2], "w").write(repr(seen))
"""


def wait_until(condition, timeout: float, what: str, poll: float = 0.05):  # noqa: ANN001
    """Poll ``condition()`` until it is truthy (its value is returned); AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(poll)
    return value


def start_silent_job(tmp_path: Path, ckpt: Path, name: str = "launch") -> tuple[Launcher, str]:
    """A launcher over 4 ranks of silent.py, once every rank is in its silent phase; (launcher, run id)."""
    out = tmp_path / f"{name}-ranks"
    out.mkdir()
    run = Launcher(
        ["-n", "4", "--max-restarts", "0", "--monitor-interval", "0.2", "--checkpoint-dir", str(ckpt)],
        ["python", SILENT, str(out)],
        tmp_path / f"{name}.log",
    )
    wait_until(lambda: len(list(out.glob("rank*.ready"))) == 4 or run.proc.poll() is not None, 120,
               f"4 ranks ready:\n{run.output()}")  # fmt: skip
    assert run.proc.poll() is None, run.output()
    return run, run.run_id


@pytest.mark.mpi
def test_kill_9_of_the_launcher_ends_a_silent_job_and_a_relaunch_waits_for_it(tmp_path):
    ckpt = tmp_path / "ckpt"
    run, run_id = start_silent_job(tmp_path, ckpt)
    try:
        assert len(leftovers(run_id)) >= 6  # mpiexec, Hydra's proxy, 4 ranks
        killed_at = time.time()  # the clock of the log's "time" fields
        os.kill(run.proc.pid, signal.SIGKILL)  # nothing runs in the launcher after this: no handler

        # At once, as a requeued job would: a relaunch on the same folder, in this process.
        seen = tmp_path / "seen"
        relaunch_log = tmp_path / "relaunch.log"
        command = [sys.executable, "-c", SEES_OLD_RUN, run_id, str(seen)]
        result = launch(
            command, 2, max_restarts=0, checkpoint_dir=ckpt, log=relaunch_log, monitor_interval=0.2
        )

        # The old job: every process gone, ended by the reaper, which says so in the old run's log.
        wait_until(lambda: not leftovers(run_id), 60, f"run {run_id} ends: {leftovers(run_id)}")
        run.proc.wait(60)
        reaped = wait_until(lambda: run.events("reaped"), 30, f"a reaped event:\n{run.output()}")[0]
        gone_after = reaped["time"] - killed_at  # the reaper writes it once its scan finds none left
        print(f"kill -9 of the launcher -> every process of its job gone: {gone_after:.2f} s (reaper's "
              f"sweep {reaped['seconds']:.2f} s)")  # fmt: skip
        # Measured 0.03-0.05 s at load 3 (the reaper reads EOF at once; its sweep is the time).
        # Unsupervised, the silent ranks ran for their whole 300 s; 10 s only fails a reaper that
        # waits for something.
        assert gone_after < 10
        assert reaped["killed"] >= 6 and reaped["launcher_pid"] == run.proc.pid
        # ("ranks", the pids, is logged once the launcher has seen every rank: before the kill, or not)
        assert [e["event"] for e in run.events() if e["event"] != "ranks"] == ["start", "reaped"]
        assert not list((tmp_path / "launch-ranks").glob("*.late"))

        # The relaunch started only after the old job was gone: its rank saw none of the old processes,
        # and its start comes after the reaper's event (the reaper frees the folder after writing it).
        assert result.returncode == 0
        assert seen.read_text() == "[]"
        start = [e for e in read_log(relaunch_log) if e["event"] == "start"][0]
        assert start["time"] >= reaped["time"]
    finally:
        run.close()


@pytest.mark.mpi
def test_a_second_launch_on_a_live_jobs_folder_is_refused_naming_the_holder(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    run, run_id = start_silent_job(tmp_path, ckpt)
    try:
        second = tmp_path / "second.log"
        argv = ["-n", "2", "--log", str(second), "--checkpoint-dir", str(ckpt), "--", "python", SILENT, "x"]
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert f"checkpoint folder {ckpt} is in use by run {run_id}" in err
        assert f"pid {run.proc.pid}" in err and f"kill {run.proc.pid}" in err and "--checkpoint-dir" in err
        assert "waiting" not in err  # its launcher is alive: nothing to wait for
        assert not second.exists()  # nothing started, nothing logged
        assert len(rank_files := list((tmp_path / "launch-ranks").glob("rank*.ready"))) == 4, rank_files

        # The first launch goes on undisturbed, and a stop ends it as always.
        assert run.proc.poll() is None
        run.proc.send_signal(signal.SIGTERM)
        assert run.wait(120) == 143
        assert leftovers(run_id) == []
        assert "reaped" not in [e["event"] for e in run.events()]  # it ended its job itself
        # The folder is free again.
        folder_lock.acquire(ckpt, "next", wait=0).close()
    finally:
        run.close()


# ---- the lock alone (no MPI) ---------------------------------------------------------------------------
HOLDER = """
import sys
from pathlib import Path
from minidist_tools.launch import lock
held = lock.acquire(Path(sys.argv[1]), "oldrun")
if sys.argv[2] != "alive":
    held.record(pid=int(sys.argv[2]), reaper=4242)  # as if its launcher had died, its reaper holding on
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


@pytest.fixture
def holder(tmp_path):
    """Start a process that takes ``tmp_path/ckpt`` as run "oldrun"; ``dead=True``: its file names a
    launcher that is gone. Returns the process once it holds the folder; closing its stdin ends it."""
    started = []

    def start(dead: bool) -> subprocess.Popen:
        gone = subprocess.Popen(["true"])
        gone.wait()  # a pid that ran and is gone
        argv = [sys.executable, "-c", HOLDER, str(tmp_path / "ckpt"), str(gone.pid) if dead else "alive"]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=mpi_env())
        started.append(proc)
        assert proc.stdout.readline() == "held\n"
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_launch_waits_while_a_dead_launchers_reaper_holds_the_folder(tmp_path, holder):
    proc = holder(dead=True)
    waiting, said, got = threading.Event(), [], []

    def say(line: str) -> None:
        said.append(line)
        waiting.set()

    thread = threading.Thread(
        target=lambda: got.append(folder_lock.acquire(tmp_path / "ckpt", "new", wait=300, say=say))
    )
    thread.start()
    assert waiting.wait(60), "the launch never said it waits"
    assert "taken by run oldrun" in said[0] and "is gone: waiting up to 300 s" in said[0]
    proc.stdin.close()  # the old job is gone: the reaper lets go
    thread.join(60)
    assert not thread.is_alive() and got and got[0] is not None
    assert folder_lock.read_holder(tmp_path / "ckpt" / ".launch.lock")["run_id"] == "new"
    assert "is free after" in said[-1]
    got[0].close()


def test_a_folder_still_taken_after_the_wait_is_refused_with_what_to_do(tmp_path, holder):
    holder(dead=True)
    with pytest.raises(LaunchError) as error:
        folder_lock.acquire(tmp_path / "ckpt", "new", wait=0.2, say=lambda line: None)
    message = str(error.value)
    assert "still taken by run oldrun" in message and "its reaper (pid 4242)" in message
    assert "grep -l MINIDIST_RUN_ID=oldrun /proc/[0-9]*/environ" in message


def test_a_folder_whose_launcher_lives_is_refused_without_waiting_for_it(tmp_path, holder):
    proc = holder(dead=False)
    said = []
    with pytest.raises(LaunchError, match=rf"is in use by run oldrun \(minidist launch, pid {proc.pid}"):
        folder_lock.acquire(tmp_path / "ckpt", "new", wait=300, say=said.append)
    assert said == []  # it does not wait for a launcher that runs (beyond lock.ALIVE_GRACE)

"""Running ``minidist launch`` from a test, and watching it through its log.

``Launcher`` starts the launcher as a subprocess (its own session; stdout and stderr to files, so a long
run cannot fill a pipe) and reads its JSON-lines log while it runs, so a test can act at a moment of the
run ("when step 4 is saved, kill rank 1") and then check the events. After a test, ``Launcher.close``
kills whatever is left of the launcher and of its job (found by the run id, as the launcher itself does),
so a failing test leaves no process behind. ``kill_node`` makes a node of a cluster in a box dead the way a
machine that lost power is: its link goes down and its processes are gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from mpi_utils import REPO, mpi_env
from safetensors.numpy import load_file

from minidist_tools.launch import read_log
from minidist_tools.launch.processes import job_processes, kill_job, rank_pids

EXAMPLE = str(REPO / "examples" / "train_mlp.py")


class Launcher:
    """``minidist launch *args -- *command`` running in the background, logging to ``log``."""

    def __init__(
        self, args: list[str], command: list[str], log: Path, env: dict[str, str] | None = None
    ) -> None:
        self.log = log
        out = log.parent / f"{log.stem}.stdout"
        err = log.parent / f"{log.stem}.stderr"
        self.out_path, self.err_path = out, err
        argv = [sys.executable, "-m", "minidist_tools.launch", *args, "--log", str(log), "--", *command]
        with open(out, "w") as stdout, open(err, "w") as stderr:
            self.proc = subprocess.Popen(
                argv, stdout=stdout, stderr=stderr, env=mpi_env(env), cwd=REPO, start_new_session=True
            )

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [e for e in read_log(self.log) if kind is None or e["event"] == kind]

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        """The first logged event for which ``predicate`` holds, waiting up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events():
                if predicate(event):
                    return event
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"the launcher ended (exit {self.proc.returncode}) first:\n{self.output()}"
                )
            time.sleep(0.05)
        raise AssertionError(f"no such event within {timeout} s:\n{self.output()}")

    @property
    def run_id(self) -> str:
        return self.wait_for(lambda e: e["event"] == "start", 60)["run_id"]

    def ranks(self, n: int, restart: int = 0, timeout: float = 60) -> dict[int, int]:
        """``{rank: pid}`` of attempt ``restart``'s ranks, once all ``n`` of them are running."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = rank_pids(self.run_id, restart)
            if len(found) == n:
                return found
            time.sleep(0.05)
        raise AssertionError(f"{n} ranks of attempt {restart} never ran:\n{self.output()}")

    def wait_for_output(self, text: str, count: int = 1, timeout: float = 120) -> None:
        """Wait until the job's output (passed through the launcher's stdout) holds ``text`` ``count``
        times: a readiness line the ranks print."""
        deadline = time.monotonic() + timeout
        while self.out_path.read_text().count(text) < count:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"the launcher ended (exit {self.proc.returncode}) first:\n{self.output()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"{count} x {text!r} not printed within {timeout} s:\n{self.output()}")
            time.sleep(0.05)

    def wait(self, timeout: float) -> int:
        """The launcher's exit code. Past ``timeout`` it gets SIGABRT (with ``PYTHONFAULTHANDLER=1`` in
        its environment it then prints every thread's Python stack on stderr) and the test fails, showing
        where it was stuck."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            state = _process_state(self.proc.pid)
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            raise AssertionError(
                f"the launcher did not finish within {timeout} s ({state}):\n{self.output()}"
            ) from None

    def output(self) -> str:
        return f"--- stdout\n{self.out_path.read_text()}\n--- stderr\n{self.err_path.read_text()}"

    def close(self) -> None:
        """Kill what is left of the launcher and its job (after a failed test)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        started = self.events("start")
        if started:
            kill_job(started[0]["run_id"])


def _process_state(pid: int) -> str:
    """The kernel's word on ``pid``: its state and where it sleeps (for a test that timed out)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except FileNotFoundError:
        return "gone"
    wanted = ("State", "SigPnd", "ShdPnd", "SigBlk", "SigCgt", "Threads")
    return "; ".join(line for line in status if line.split(":")[0] in wanted) + f"; wchan {wchan}"


def leftovers(run_id: str) -> list[int]:
    """Processes of the run still alive (the launcher promises none)."""
    return sorted(job_processes(run_id))


def checkpoint_tensors(folder: Path) -> tuple[int, dict[str, np.ndarray]]:
    """(step, {key: global array}) of one checkpoint folder, read with safetensors straight from its files
    (independently of ``minidist.checkpoint.load``); tp shards are concatenated along their tp_dim."""
    manifest = json.loads((folder / "manifest.json").read_text())
    files: dict[str, dict[str, np.ndarray]] = {}
    tensors = {}
    for key, t in manifest["tensors"].items():
        pieces = [files.setdefault(s["file"], load_file(folder / s["file"]))[key] for s in t["shards"]]
        tensors[key] = pieces[0] if t["tp_dim"] is None else np.concatenate(pieces, axis=t["tp_dim"])
    return manifest["step"], tensors


def final_checkpoint(root: Path) -> tuple[int, dict[str, np.ndarray]]:
    """:func:`checkpoint_tensors` of the checkpoint ``root/latest`` names."""
    return checkpoint_tensors(root / (root / "latest").read_text().strip())


def assert_identical(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(expected)
    for key in expected:
        assert np.array_equal(got[key], expected[key]), key


def kill_node(cluster: Any, node: str) -> None:
    """Make ``node`` dead: switch its link off (nothing reaches it, nothing comes back: no TCP reset
    either), then SIGKILL every process in its namespace."""
    subprocess.run(["ip", "link", "set", cluster.links[node], "down"], check=True)
    from minidist_tools.cluster import netns

    netns.kill_processes([node])

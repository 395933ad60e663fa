"""The reaper: when the launcher dies, by any signal (SIGKILL too), its job dies with it within a second.

The launcher watches its job, but nothing watched the launcher. ``mpiexec`` runs in a session of its own
(so that Ctrl-C reaches the launcher first: job.py) and each MPICH rank leads one too, so a launcher
killed by a signal it cannot catch (``kill -9``, the kernel's OOM killer, a batch system's hard kill)
told nobody. Ranks that printed nothing (a long evaluation, a save) ran on unsupervised, wrote into the
run's folder 26 s later, and died only when ``mpiexec`` next wrote to the dead launcher's closed output
pipe (SIGPIPE); a relaunch on the same folder meanwhile ran beside them. A job that prints every step
died within 0.3 s, by that accident.

The mechanism is a **lifeline**, a pipe whose write end only the launcher holds::

    launcher --- write end ---> pipe --- read end ---> reaper (python -m minidist_tools.launch.reaper,
      "nodes n0 n1\\n"  before an attempt on a cluster          a session of its own)
      "done\\n"         after the launcher ended the job itself; then it closes the pipe and waits
                       for the reaper to exit
    launcher dies (any signal) -> the kernel closes its descriptors -> the reaper reads EOF without
      "done" -> processes.kill_job(run_id, namespaces=the last nodes) -> a "reaped" event in the log
      -> the reaper closes the checkpoint folder's lock (lock.py) and exits

The kernel closes every descriptor of a process that ends, whatever ended it, so the EOF always comes:
no polling, no timer, nothing the launcher must still do while it dies. Three details keep it true:

* only the launcher holds the write end: a copy inherited by ``mpiexec`` or a rank would keep the pipe
  open as long as the job lives. ``os.pipe`` makes descriptors that are not inherited, and the reaper
  is handed the read end alone (``pass_fds``);
* the reaper leads a session of its own, so a signal to the launcher's process group (Ctrl-C in the
  terminal, a batch system's ``kill`` of the group) does not take it down with the launcher;
* it is a program of its own, not a fork: ``launch()`` also runs inside a notebook or a test process,
  whose threads and open files a fork would copy. It imports processes.py and events.py only (the
  package's ``__init__`` imports the supervisor lazily), so it starts in a fraction of a second.

It also holds the checkpoint folder's lock (lock.py) beside the launcher, so the folder stays taken
until the job is gone: a relaunch on it waits for the reaper instead of running beside the dying job.

Why not ``PR_SET_PDEATHSIG`` on ``mpiexec`` (the kernel signals a child when its parent dies)? Tried:
SIGKILL to ``mpiexec`` does end Hydra's proxy and its ranks within 0.5 s. But a rank's own children (a
data-loader worker, anything started in a session of its own) would live on; the folder's lock would
be free before the ranks are gone; the signal follows the *thread* that started ``mpiexec``, not the
launcher process; and it must be set in ``preexec_fn``, which is unsafe in a process with threads (the
output pumps of job.py run while the next attempt starts). The reaper ends every process of the run,
as the launcher itself does (processes.py), and frees the folder only after.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from minidist_tools.launch.errors import LaunchError
from minidist_tools.launch.events import EventLog
from minidist_tools.launch.processes import kill_job

DONE = b"done"
NODES = b"nodes"
# Seconds the launcher waits for the reaper's exit: at once after "done"; after a sweep, under a second
# (kill_job gives up on processes stuck in the kernel after 10 s).
EXIT_WAIT = 30.0


# ---- the reaper's side: wait for EOF, then end the job -------------------------------------------------
def watch(lifeline: int) -> tuple[bool, list[str]]:
    """Read the lifeline until EOF. Returns ``(done, nodes)``: whether the launcher said "done" (it ended
    the job itself), and the nodes of the last attempt (a cluster's namespaces; [] on one machine)."""
    done, nodes, buffer = False, [], b""
    while chunk := os.read(lifeline, 4096):  # blocks until the launcher writes or dies
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for word, *rest in (line.split() for line in lines if line.strip()):
            if word == NODES:
                nodes = [name.decode() for name in rest]
            elif word == DONE:
                done = True
    return done, nodes


def reap(run_id: str, launcher_pid: int, nodes: list[str], log: EventLog) -> None:
    """The launcher died without ending its job: end every process of it and say so in the log."""
    try:
        killed, seconds = kill_job(run_id, namespaces=nodes)
    except LaunchError as error:  # processes that survive SIGKILL: say which, and free the folder anyway
        message = f"the launcher (pid {launcher_pid}) died; {error}"
        _write(log, "reaped", message, killed=None, error=str(error), launcher_pid=launcher_pid)
        return
    _write(
        log,
        "reaped",
        f"the launcher (pid {launcher_pid}) died without ending its job; the reaper killed every process "
        f"of it ({killed} signalled, {seconds:.2f} s)",
        killed=killed,
        seconds=round(seconds, 3),
        launcher_pid=launcher_pid,
    )


def _write(log: EventLog, event: str, message: str, **fields: object) -> None:
    try:
        log.write(event, message, **fields)
    except OSError:  # the launcher's stderr was a pipe to a reader that died with it: the file has it
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minidist_tools.launch.reaper")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--launcher-pid", type=int, required=True)
    parser.add_argument("--lifeline", type=int, required=True, help="the pipe's read end (a descriptor)")
    parser.add_argument("--log", required=True, help="the launcher's JSON-lines event log")
    parser.add_argument("--holds", type=int, default=None, help="the checkpoint folder's lock (a descriptor)")
    args = parser.parse_args(argv)
    done, nodes = watch(args.lifeline)
    if not done:
        reap(args.run_id, args.launcher_pid, nodes, EventLog(args.log, args.run_id))
    if args.holds is not None:
        os.close(args.holds)  # the folder is free: after the log says why, so a relaunch's start follows
    return 0


# ---- the launcher's side -------------------------------------------------------------------------------
class Lifeline:
    """Start the reaper for run ``run_id`` (events to ``log``; ``holds``: a descriptor it keeps open for
    as long as it lives, the folder's lock); then tell it the nodes of each attempt and, at the end,
    that the job is gone."""

    def __init__(self, run_id: str, log: str | os.PathLike, holds: int | None = None) -> None:
        read_end, self._write_end = os.pipe()  # neither is inherited by mpiexec (not inheritable)
        argv = [sys.executable, "-m", "minidist_tools.launch.reaper", "--run-id", run_id]
        argv += ["--launcher-pid", str(os.getpid()), "--lifeline", str(read_end), "--log", str(log)]
        argv += ["--holds", str(holds)] if holds is not None else []
        # This copy of minidist_tools, however the launcher found it (an editable install, PYTHONPATH).
        here = [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, here))}
        try:
            self.proc = subprocess.Popen(
                argv,
                pass_fds=[read_end] + ([holds] if holds is not None else []),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        except BaseException:
            os.close(self._write_end)
            raise
        finally:
            os.close(read_end)  # the reaper's now: EOF must depend on the write end alone

    def nodes(self, names: Iterable[str]) -> None:
        """The nodes (namespaces) of the attempt about to start: the reaper sweeps them too."""
        self._send(NODES + b"".join(b" " + name.encode() for name in names))

    def release(self, job_gone: bool) -> None:
        """The launcher is leaving: with ``job_gone`` (it checked that no process of the run is left) the
        reaper exits at once, else it ends what is left first. Waits for the reaper's exit, so that the
        folder's lock is free when ``launch()`` returns."""
        if job_gone:
            self._send(DONE)
        os.close(self._write_end)
        try:
            self.proc.wait(EXIT_WAIT)
        except subprocess.TimeoutExpired:  # it cannot end the job (processes stuck in the kernel)
            self.proc.kill()
            self.proc.wait()

    def _send(self, line: bytes) -> None:
        try:
            os.write(self._write_end, line + b"\n")
        except BrokenPipeError:  # the reaper was killed: the launcher itself still ends the job
            pass


if __name__ == "__main__":
    sys.exit(main())

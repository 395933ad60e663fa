"""One live job per checkpoint folder: an ``flock`` on ``<checkpoint dir>/.launch.lock`` while the job lives.

Two jobs writing one checkpoint folder ruin each other's checkpoints (and their ``latest`` pointer), and
a restart resumes from whichever saved last. So a launch takes the folder first: ``acquire`` locks the
file (``fcntl.flock``, exclusive) and writes who holds it, as JSON: the run id, the launcher's pid and
its start time (/proc/<pid>/stat: a reused pid does not pass for the launcher), the host, the command.
The lock belongs to the open file, which the launcher and its reaper (reaper.py) both hold: it is free
once both are gone. The launcher closes it on its way out, after it ended the job; when the launcher is
killed, the reaper closes it after it ended the job. The kernel drops a lock when its holders die, so
no stale lock survives a crash; the file itself stays (emptied by a launcher that ended normally;
after a crash its contents are only history).

A second launch on a taken folder:

* the holder's launcher is alive (on this host): refused (after ``ALIVE_GRACE`` = 2 s, in case it was
  killed a moment ago and is still dying), naming the run and the pid to stop;
* the launcher is gone, its reaper still ending the job (a relaunch right after a ``kill -9``): it
  waits, up to ``wait`` seconds (the reaper needs well under one), then starts;
* still taken after ``wait`` seconds (processes stuck in the kernel, or a holder on another host that
  shares the folder): refused, naming the run, its pids and how to find what is left.

A folder on a file system without ``flock`` (rare; some network mounts): a warning, and no lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from minidist_tools.launch.env import RUN_ID
from minidist_tools.launch.errors import LaunchError

LOCK_NAME = ".launch.lock"
WAIT = 10.0  # seconds a launch waits for a dead launcher's reaper to end the old job
# A launcher just sent SIGKILL still runs for a moment (until the kernel schedules its exit): a relaunch
# right after the kill refuses only a launcher that stays alive this long.
ALIVE_GRACE = 2.0
POLL = 0.05


class FolderLock:
    """The lock on one checkpoint folder, held through ``fd`` (hand it to the reaper to share it)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd = path, fd
        self.holder: dict[str, Any] = {}

    def record(self, **fields: Any) -> None:
        """Add ``fields`` to what the file says of the holder (read back by a launch that finds the folder
        taken): the run id and launcher at first, the reaper's pid once it runs."""
        self.holder.update(fields)
        data = json.dumps(self.holder).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data + b"\n", 0)

    def close(self) -> None:
        """Let go, after the job ended (the folder is free once the reaper, which shares the lock, has
        let go too: ``Lifeline.release`` waited for that). The file is emptied: nobody holds it."""
        if self.fd >= 0:
            os.ftruncate(self.fd, 0)
            os.close(self.fd)
            self.fd = -1


def acquire(
    folder: Path, run_id: str, argv: list[str] | None = None, wait: float = WAIT, say: Any = None
) -> FolderLock | None:
    """Take ``folder`` for run ``run_id`` (made if missing), waiting up to ``wait`` seconds for a job whose
    launcher died to be ended. ``say``: called with a line when it starts waiting (default: stderr).
    Raises ``LaunchError`` naming the holder when the folder stays taken. None: no locks on this file
    system (warned)."""
    say = say or (lambda line: print(f"[minidist launch] {line}", file=sys.stderr, flush=True))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    start, waiting, alive_since = time.monotonic(), False, None
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            holder = read_holder(path)
            alive = holder is not None and launcher_alive(holder) is True
            alive_since = (alive_since or time.monotonic()) if alive else None
            if alive and time.monotonic() - alive_since >= min(ALIVE_GRACE, wait):
                os.close(fd)
                raise LaunchError(_in_use(folder, holder)) from None
            if time.monotonic() - start >= wait:
                os.close(fd)
                raise LaunchError(_still_taken(folder, holder, wait)) from None
            if not waiting and holder is not None and not alive:
                whose = (
                    f"whose launcher (pid {holder.get('pid')}) is gone"
                    if launcher_alive(holder) is False
                    else f"from host {holder.get('host')}"
                )
                say(
                    f"{folder} is still taken by run {holder.get('run_id')}, {whose}: waiting up to "
                    f"{wait:g} s for its job to be ended"
                )
                waiting = True
            time.sleep(POLL)
        except OSError as error:  # ENOLCK, EINVAL: this file system keeps no locks
            os.close(fd)
            say(f"warning: cannot lock {path} ({error}): nothing stops a second launch on this folder")
            return None
    lock = FolderLock(path, fd)
    lock.record(
        run_id=run_id,
        pid=os.getpid(),
        started=_start_time(os.getpid()),
        host=socket.gethostname(),
        since=time.time(),
        argv=argv,
    )
    if waiting:
        say(f"{folder} is free after {time.monotonic() - start:.2f} s")
    return lock


def read_holder(path: Path) -> dict[str, Any] | None:
    """Who holds (or last held) the folder, from the lock file; None while it is being written."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def launcher_alive(holder: dict[str, Any]) -> bool | None:
    """Whether the holder's launcher runs: True or False on this host, None on another (unknown)."""
    if holder.get("host") != socket.gethostname():
        return None
    pid, started = holder.get("pid"), holder.get("started")
    return isinstance(pid, int) and started is not None and _start_time(pid) == started


def _start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot: with the pid, it names one process); None if it
    is not running (a zombie, dead but not yet reaped by its parent, counts as gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])  # state is field 3, starttime field 22


def _in_use(folder: Path, holder: dict[str, Any]) -> str:
    since = time.strftime("%H:%M:%S", time.localtime(holder.get("since", 0)))
    pid = holder.get("pid")
    return (
        f"checkpoint folder {folder} is in use by run {holder.get('run_id')} (minidist launch, pid {pid}, "
        f"since {since}): two jobs must not write one folder. Wait for it to end, stop it (`kill {pid}` "
        "ends its job first), or give this launch another --checkpoint-dir"
    )


def _still_taken(folder: Path, holder: dict[str, Any] | None, wait: float) -> str:
    if holder is None:
        return f"checkpoint folder {folder} is still locked after {wait:g} s by a launch that says nothing"
    run_id, pid, reaper = holder.get("run_id"), holder.get("pid"), holder.get("reaper")
    where = holder.get("host")
    if launcher_alive(holder) is None:
        return (
            f"checkpoint folder {folder} is in use by run {run_id} (minidist launch, pid {pid} on host "
            f"{where}) for {wait:g} s more: end that launch there, or give this one another --checkpoint-dir"
        )
    return (
        f"checkpoint folder {folder} is still taken by run {run_id} {wait:g} s after its launcher "
        f"(pid {pid}) died: its reaper (pid {reaper}) has not ended every process of the job. Look for "
        f"them with `grep -l {RUN_ID}={run_id} /proc/[0-9]*/environ` and end them, then launch again"
    )

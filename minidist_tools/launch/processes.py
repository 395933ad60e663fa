"""Ending a job completely: finding every process it started, killing them, and checking none is left.

Killing ``mpiexec`` is not enough. MPICH's Hydra starts a proxy (``hydra_pmi_proxy``) per host and the
proxy starts the ranks, and each of them calls ``setsid``: every rank leads a session and a process group
of its own, so ``killpg`` of mpiexec's group reaches none of them. What they all share is their
environment: Hydra hands mpiexec's environment to the proxies and from them to every rank, so the
launcher puts ``MINIDIST_RUN_ID=<id>`` there (env.py) and finds the job by reading
``/proc/<pid>/environ``, which lists the variables a process started with. That also finds a
rank's own children (a data-loader worker) and, on a cluster in a box, processes inside the network
namespaces: they have their own network, but the same process table.

``kill_job`` sends SIGKILL (after an optional SIGTERM grace period) until the scan finds nothing, and
returns how long that took: the launcher logs it, bounded by ``wait`` (then ``LaunchError``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable

from minidist_tools.launch.env import RESTART_COUNT, RUN_ID
from minidist_tools.launch.errors import LaunchError

POLL = 0.02  # seconds between two scans while waiting for killed processes to go


def _environ(pid: int) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:  # gone meanwhile, or a kernel thread
        return None
    pairs = (item.split(b"=", 1) for item in data.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def job_processes(run_id: str, restart: int | None = None) -> dict[int, dict[str, str]]:
    """``{pid: environment}`` of every live process started with ``MINIDIST_RUN_ID=run_id`` (of attempt
    ``restart`` only, if given). Zombies are left out: their environment is gone, and so are they."""
    needle = f"{RUN_ID}={run_id}\0".encode()
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle not in f.read():  # the cheap test first: most processes are not ours
                    continue
        except OSError:
            continue
        env = _environ(int(name))
        if env is not None and (restart is None or env.get(RESTART_COUNT) == str(restart)):
            found[int(name)] = env
    return found


def rank_pids(run_id: str, restart: int | None = None) -> dict[int, int]:
    """``{rank: pid}`` of the job's MPI ranks: the processes Hydra gave ``PMI_RANK`` (its rank number)."""
    ranks = {}
    for pid, env in job_processes(run_id, restart).items():
        if env.get("PMI_RANK", "").isdigit():
            ranks.setdefault(int(env["PMI_RANK"]), pid)  # a rank's child inherits PMI_RANK: keep the oldest
    return ranks


def _signal(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def kill_job(
    run_id: str,
    mpiexec: subprocess.Popen | None = None,
    grace: float = 0.0,
    wait: float = 10.0,
    namespaces: Iterable[str] = (),
) -> tuple[int, float]:
    """End every process of the run: ``mpiexec`` (our child, reaped here), all processes carrying the
    run id and, on a cluster, every process in ``namespaces``. Returns ``(signalled, seconds)``: how
    many processes were signalled and how long until none was left.

    ``grace`` > 0 sends SIGTERM first and waits up to that long (a clean Ctrl-C); then SIGKILL, which a
    process cannot ignore, is repeated until the scan finds nothing. Raises ``LaunchError`` naming the
    survivors if some are still there after ``wait`` seconds (a process stuck in the kernel, "D" state).
    """
    start = time.monotonic()
    signalled: set[int] = set()
    if grace > 0:
        targets = set(job_processes(run_id)) | (
            {mpiexec.pid} if mpiexec and mpiexec.poll() is None else set()
        )
        _signal(targets, signal.SIGTERM)
        signalled |= targets
        while time.monotonic() - start < grace and job_processes(run_id):
            time.sleep(POLL)
    deadline = time.monotonic() + wait
    while True:
        if mpiexec is not None and mpiexec.poll() is None:
            _signal([mpiexec.pid], signal.SIGKILL)
            signalled.add(mpiexec.pid)
        left = set(job_processes(run_id)) | _namespace_pids(namespaces)
        if not left and (mpiexec is None or mpiexec.poll() is not None):
            return len(signalled), time.monotonic() - start
        if time.monotonic() > deadline:
            raise LaunchError(
                f"processes {sorted(left)} of run {run_id} survive SIGKILL after {wait:g} s (stuck in the "
                "kernel?); end them by hand before restarting"
            )
        _signal(left, signal.SIGKILL)
        signalled |= left
        time.sleep(POLL)


def _namespace_pids(namespaces: Iterable[str]) -> set[int]:
    names = list(namespaces)
    if not names:
        return set()
    from minidist_tools.cluster import netns  # noqa: PLC0415  (only on a cluster: needs `ip`)

    return {pid for node in names for pid in netns.pids(node) if pid != os.getpid()}

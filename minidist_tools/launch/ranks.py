"""Which rank is which process, and which rank ended first and how: the launcher names the dead rank.

The ranks are not the launcher's children (mpiexec -> Hydra's proxy -> rank), so it cannot ``waitpid``
them, and MPICH's own report is no help: after rank 2 exits with code 3, Hydra kills the other ranks
and its banner names whichever process it saw last ("PID 2259 ... EXIT CODE: 9", rank 3, which Hydra
killed). So the launcher watches the ranks itself:

* **who**: ``processes.rank_pids`` finds each rank's pid (its ``PMI_RANK``) as soon as the ranks exist;
  the launcher prints them, ``rank 2: pid 30449`` (``on node md0n1`` on a cluster, where Hydra places
  ranks in blocks of ``ranks_per_node`` on the attempt's nodes, in order);
* **first**: one ``pidfd`` per rank (``os.pidfd_open``, Linux 5.3+; a process need not be our child to
  have one) becomes readable the moment that rank exits, before Hydra has even noticed, so a thread
  blocked on them sees the first rank to go before the ones Hydra kills next (without pidfds: a scan of
  ``/proc`` every 10 ms, which can miss which went first when they go within 10 ms);
* **how**: the dead rank stays a zombie until its parent (the proxy) reaps it, and ``/proc/<pid>/stat``
  keeps its wait status meanwhile; the thread reads it at once. If the proxy was faster (1 time in 6
  here, at load 3 on 2 cores), the launcher names the rank without its status: ``rank 2 (pid 30449)
  ended first``. (Hydra's ``-print-all-exitcodes`` would give every status, but prints its line after
  every run, a good one too, and cannot tell the rank that died from those it killed with SIGKILL.)
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable

from minidist_tools.launch import processes

POLL = 0.01  # seconds between two scans while waiting for the ranks to appear (and without pidfds)


class RankWatch:
    """Find the ``n`` ranks of attempt ``restart`` of run ``run_id``, report them, watch which dies first.

    ``report(pids)`` is called (from the watching thread) once all ``n`` ranks are found. ``alive()``
    says whether the job still runs (the thread stops looking for ranks when it does not).
    """

    def __init__(self, run_id: str, restart: int, n: int, alive: Callable[[], bool],
                 report: Callable[[dict[int, int]], None]) -> None:  # fmt: skip
        self.run_id, self.restart, self.n, self.alive, self.report = run_id, restart, n, alive, report
        self.pids: dict[int, int] = {}
        self.first: dict[int, int | None] = {}  # {rank: wait status, None if unknown} of the first to go
        self.done = threading.Event()
        threading.Thread(target=self._run, daemon=True, name="minidist-launch-ranks").start()

    def _run(self) -> None:
        try:
            while self.alive() and len(self.pids) < self.n:
                self.pids = processes.rank_pids(self.run_id, self.restart)
                if len(self.pids) < self.n:
                    time.sleep(POLL)
            if len(self.pids) == self.n:
                self.report(dict(self.pids))
                self._watch()
        finally:
            self.done.set()

    def _watch(self) -> None:
        fds: dict[int, int] = {}
        try:
            for rank, pid in self.pids.items():
                fds[os.pidfd_open(pid)] = rank
        except (AttributeError, OSError):  # no pidfds here (or a rank is gone already): scan /proc
            for fd in fds:
                os.close(fd)
            fds = {}
        try:
            if fds:
                poller = select.poll()
                for fd in fds:
                    poller.register(fd, select.POLLIN)
                ready = [fds[fd] for fd, _ in poller.poll()]
            else:
                ready = []
                while not ready:
                    ready = [
                        r for r, pid in self.pids.items() if _status(pid) is not None or not _exists(pid)
                    ]
                    time.sleep(0 if ready else POLL)
            self.first = {rank: _status(self.pids[rank]) for rank in ready}
        finally:
            for fd in fds:
                os.close(fd)

    def dead(self, wait: float = 1.0) -> dict[int, int | None]:
        """``{rank: wait status or None}`` of the rank(s) that ended first; {} if the ranks were not all
        found (the job failed while starting). Waits up to ``wait`` seconds for the watching thread."""
        self.done.wait(wait)
        return dict(self.first)


def describe(rank: int, pid: int, node: str | None, status: int | None, alone: bool = True) -> str:
    """``rank 2 (pid 30449, node md0n1) was killed by signal 9`` / ``exited with code 3`` / ``ended
    first`` (status unknown; ``ended`` when ``alone`` is False: several ranks went at once)."""
    where = f"rank {rank} (pid {pid}" + (f", node {node})" if node else ")")
    if status is None:
        return f"{where} ended" + (" first" if alone else "")
    if status & 0x7F:
        return f"{where} was killed by signal {status & 0x7F}"
    return f"{where} exited with code {status >> 8}"


def _status(pid: int) -> int | None:
    """The wait status of ``pid`` while it is a zombie (its parent has not reaped it), else None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[-1]) if fields[0] == "Z" and len(fields) >= 50 else None


def _exists(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")

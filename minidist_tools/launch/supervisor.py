"""The supervisor loop: run the job, watch it, and after a failure end it, check the checkpoints, restart.

::

    attempt 0 --start--> watch (every --monitor-interval) --exit 0--> done
                           |  mpiexec exited non-zero (a rank failed: MPICH ends the others),
                           |  no output for --stall-timeout s, or a node's link went down
                           v
                         failure -> kill every process of the run (processes.py) -> verify checkpoints
                           -> restart k+1 (MINIDIST_RESTART_COUNT=k+1: the script resumes itself)
                           ... until --max-restarts are used -> give_up

The same loop as TorchElastic's agent (``torchrun --max-restarts``: all workers are stopped and started
again, "the elastic agent restarts the whole worker group"), over MPI. The launcher never tells the
ranks where to resume from: the checkpoint is the contract. It only checks the folder, for the log.

Around the loop, ``launch`` takes the checkpoint folder for this run (lock.py: one live job per folder)
and starts the reaper (reaper.py), which ends the job if the launcher itself is killed outright.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minidist_tools.cluster import Cluster
from minidist_tools.cluster.launch import sigterm_raises
from minidist_tools.launch import checkpoints, env, lock, nodes, processes, ranks, reaper, slurm
from minidist_tools.launch.errors import LaunchError
from minidist_tools.launch.events import EventLog
from minidist_tools.launch.job import Job
from minidist_tools.launch.plan import check_arguments
from minidist_tools.mpiexec import mpiexec_path

INTERRUPT_GRACE = 2.0  # seconds between SIGTERM and SIGKILL when the launcher itself is stopped


@dataclass
class LaunchResult:
    """How a launch ended: the exit code (the command's on success), restarts made, the events logged."""

    returncode: int
    restarts: int
    events: list[dict[str, Any]] = field(default_factory=list)


def launch(
    cmd: Sequence[str],
    n: int | None,
    max_restarts: int = 3,
    nodes: str | tuple[int, int] | None = None,
    cluster: str | Cluster | None = None,
    log: str | os.PathLike | None = None,
    *,
    monitor_interval: float = 1.0,
    stall_timeout: float | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    cwd: str | os.PathLike | None = None,
) -> LaunchResult:
    """Run ``cmd`` on ``n`` MPI ranks and restart it after a failure, up to ``max_restarts`` times.

    ``cluster`` (a name or a ``Cluster``): run on its nodes, ``ranks_per_node`` ranks each; ``n`` (a
    multiple of that, default: as many nodes as ``nodes`` allows) sets how many nodes the job uses.
    ``nodes``: ``"MIN:MAX"`` or ``(MIN, MAX)``: after a node dies, continue on the healthy nodes if at
    least MIN remain (the world shrinks; the script reshards the checkpoint). Without it the node count
    is fixed (a spare node may still replace a dead one). ``log``: the JSON-lines event log (default
    ``<checkpoint dir>/launch.log``, else ``./launch.log``). ``monitor_interval``: seconds between two
    looks at the job (exit, output, checkpoints, node links). ``stall_timeout``: seconds without any
    output after which a running job counts as hung (default: off). ``checkpoint_dir``: where the job
    saves (default: the command's ``--checkpoint-dir``). ``cwd``: the job's working directory.

    Every rank gets ``MINIDIST_RESTART_COUNT``, ``MINIDIST_MAX_RESTARTS``, ``MINIDIST_LAUNCH_LOG`` and
    ``MINIDIST_RUN_ID`` (env.py). Returns a :class:`LaunchResult`: returncode 0 on success, else the
    last failure's exit code (1 if it had none, e.g. killed for a stall). Raises ``ValueError`` for bad
    arguments (no command, n < 1, MIN > MAX, ``nodes`` without ``cluster``...), ``LaunchError`` if the
    cluster does not exist or another launch's job still uses the checkpoint folder (lock.py);
    ``KeyboardInterrupt`` / ``SystemExit(143)`` (SIGTERM) after ending the job. If this process is
    killed outright (SIGKILL, the OOM killer), its reaper ends the job within a second (reaper.py).
    """
    plan = check_arguments(list(cmd), n, max_restarts, nodes, cluster, monitor_interval, stall_timeout)
    run_id = uuid.uuid4().hex[:12]
    ckpt = (
        Path(checkpoint_dir) if checkpoint_dir is not None else checkpoints.checkpoint_dir_of(list(cmd), cwd)
    )
    if ckpt is not None and not ckpt.is_absolute():
        ckpt = Path(cwd or ".") / ckpt
    log_path = Path(log) if log is not None else (ckpt or Path(cwd or ".")) / "launch.log"
    # One live job per folder (lock.py): LaunchError if another launch's job still writes to it.
    folder = None if ckpt is None else lock.acquire(ckpt.absolute(), run_id, list(cmd))
    try:
        events = EventLog(log_path.absolute(), run_id)
        # If this process dies by a signal it cannot catch, the reaper ends the job (reaper.py).
        lifeline = reaper.Lifeline(run_id, events.path, holds=None if folder is None else folder.fd)
        if folder is not None:
            folder.record(reaper=lifeline.proc.pid)
        if (inside := slurm.allocation()) is not None and plan.cluster is None:
            events.write(
                "slurm",
                f"inside {inside.describe()}: mpiexec runs the ranks on its nodes, restarts stay in it",
                job_id=inside.job_id, nodelist=inside.nodelist, num_nodes=inside.num_nodes,
                ntasks=inside.ntasks, slurm_restart_count=inside.restart_count,
            )  # fmt: skip
        supervisor = _Supervisor(
            list(cmd), plan, max_restarts, events, ckpt, monitor_interval, stall_timeout, cwd, lifeline
        )
        try:
            with sigterm_raises():  # SIGTERM -> SystemExit, so the job is ended as for Ctrl-C
                return supervisor.run()
        finally:  # every way out ended the job; "done" only if a last look agrees
            lifeline.release(job_gone=not processes.job_processes(run_id))
    finally:
        if folder is not None:
            folder.close()


class _Supervisor:
    def __init__(self, cmd, plan, max_restarts, events, ckpt, interval, stall_timeout, cwd, lifeline) -> None:  # noqa: ANN001
        self.cmd, self.plan, self.max_restarts, self.events = cmd, plan, max_restarts, events
        self.lifeline = lifeline
        self.ckpt, self.interval, self.stall_timeout, self.cwd = ckpt, interval, stall_timeout, cwd
        self.job: Job | None = None
        self.ranks: ranks.RankWatch | None = None  # the current attempt's ranks (ranks.py)
        self.used: list[str] = []  # the cluster nodes of the current attempt
        self.newest_step = None if ckpt is None else checkpoints.newest_committed(ckpt)

    def run(self) -> LaunchResult:
        restart = 0
        try:
            while True:
                failure = self.attempt(restart)
                if failure is None:
                    # mpiexec ended its ranks; a process one of them left running (a daemon child) must
                    # not outlive the job either.
                    strays, _ = processes.kill_job(self.events.run_id, self.job.proc, namespaces=self.used)
                    self.events.write(
                        "done",
                        f"the command succeeded after {restart} restart(s)"
                        + (f"; {strays} process(es) it left behind were killed" if strays else ""),
                        returncode=0,
                        restarts=restart,
                        strays=strays,
                    )
                    return LaunchResult(0, restart, self.events.events)
                code = self.end_job(failure)
                if restart >= self.max_restarts:
                    return self.give_up(
                        code, f"all {self.max_restarts} restart(s) used (--max-restarts)", restart
                    )
                self.verify()
                restart += 1
                self.events.write("restart", f"restart {restart} of {self.max_restarts}", restart=restart)
        except LaunchError as error:  # too few nodes, processes that will not die
            self.end_quietly()
            return self.give_up(1, str(error), restart)
        except BaseException as interrupt:  # Ctrl-C, SIGTERM (SystemExit), a bug: no rank outlives us
            self.end_quietly(grace=INTERRUPT_GRACE)
            self.events.write(
                "interrupted", f"stopped ({type(interrupt).__name__}); every process of the job ended"
            )
            raise

    # ---- one attempt ----------------------------------------------------------------------------------
    def attempt(self, restart: int) -> dict[str, Any] | None:
        """Start attempt ``restart`` and watch it; None if it succeeded, else the failure event."""
        prefix, n, where = [mpiexec_path(), "-n", str(self.plan.n)], self.plan.n, "this machine"
        if (inside := slurm.allocation()) is not None:  # mpiexec starts the ranks on its nodes (srun)
            where = f"the nodes of Slurm job {inside.job_id} ({inside.nodelist})"
        if self.plan.cluster is not None:
            c = self.plan.cluster
            wanted, minimum = self.plan.n // c.ranks_per_node, self.plan.node_range[0]
            self.used, problems = nodes.choose_nodes(c, wanted, minimum)  # LaunchError: too few
            n, where = len(self.used) * c.ranks_per_node, nodes.describe(self.used, c.ranks_per_node)
            prefix = c.mpiexec_command(n, nodes=self.used)
            self.lifeline.nodes(self.used)  # the reaper's sweep covers the namespaces of this attempt
            if problems:
                self.events.write(
                    "nodes", "left out: " + "; ".join(f"{k}: {v}" for k, v in problems.items()), dead=problems
                )
        note = ""
        if restart == 0 and self.newest_step is not None:  # an earlier run's: a restart would resume it
            note = (
                f" (note: {self.ckpt} already holds step {self.newest_step[0]}; if this run fails before "
                "its first save, the restart resumes from that checkpoint: use a fresh folder for a new run)"
            )
        self.events.write(
            "start",
            f"attempt {restart}: {n} ranks on {where}: {' '.join(self.cmd)}{note}",
            restart=restart,
            n=n,
            nodes=self.used or None,
            argv=prefix + self.cmd,
        )
        self.job = Job(prefix + self.cmd, self.job_env(restart), self.cwd)
        self.ranks = ranks.RankWatch(
            self.events.run_id, restart, n, lambda: self.job.proc.poll() is None, self.report_ranks
        )
        failure = self.watch()
        if failure is None:
            self.job.finish_output()  # the job's last lines before the launcher's "done"
            self.note_progress()  # the final checkpoint, saved just before the end
        return failure

    def job_env(self, restart: int) -> dict[str, str]:
        extra = {
            env.RESTART_COUNT: str(restart),
            env.MAX_RESTARTS: str(self.max_restarts),
            env.LAUNCH_LOG: str(self.events.path),
            env.RUN_ID: self.events.run_id,
            # `python` in the command means this Python (its environment has minidist), on every node.
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        }
        cluster_env = self.plan.cluster.env() if self.plan.cluster is not None else {}
        return {**os.environ, **cluster_env, **extra}

    def watch(self) -> dict[str, Any] | None:
        """Look at the job every interval until it ends or fails; the failure's fields, or None."""
        job = self.job
        while True:
            code = job.wait(self.interval)  # returns at once when the job ends
            after = f"after {job.elapsed():.1f} s"
            if code == 0:
                return None
            if code is not None:
                job.finish_output(timeout=1.0)  # the ranks' last lines come before the launcher's
                dead = self.ranks.dead()
                named = [
                    ranks.describe(r, self.ranks.pids[r], self.node_of(r), s, len(dead) == 1)
                    for r, s in sorted(dead.items())
                ]
                why = (" and ".join(named) or "a rank failed") + f"; mpiexec exited with code {code} {after}"
                return _failure("exit", why, job, returncode=code, dead_ranks=sorted(dead))
            self.note_progress()
            if self.stall_timeout is not None and job.silent_for() > self.stall_timeout:
                why = (
                    f"no output for {job.silent_for():.1f} s (--stall-timeout {self.stall_timeout:g}) {after}"
                )
                return _failure("stall", why + ": the job stopped making progress", job)
            dead = {} if self.plan.cluster is None else nodes.link_problems(self.plan.cluster, self.used)
            if dead:
                why = "; ".join(f"node {node} is dead: {problem}" for node, problem in dead.items())
                return _failure("node", f"{why} ({after})", job, dead=dead)

    def node_of(self, rank: int) -> str | None:
        """The cluster node of ``rank`` (Hydra fills nodes in order, ``ranks_per_node`` each), else None."""
        if self.plan.cluster is None or not self.used:
            return None
        return self.used[(rank // self.plan.cluster.ranks_per_node) % len(self.used)]

    def report_ranks(self, pids: dict[int, int]) -> None:
        """Print every rank's pid (and node) once all are running: what ``kill -9`` needs (ranks.py)."""
        where = {rank: self.node_of(rank) for rank in pids}
        listed = ", ".join(
            f"rank {r}: pid {p}" + (f" on {where[r]}" if where[r] else "") for r, p in sorted(pids.items())
        )
        self.events.write(
            "ranks", listed, pids={str(r): p for r, p in pids.items()}, nodes=where if self.used else None
        )

    def note_progress(self) -> None:
        newest = None if self.ckpt is None else checkpoints.newest_committed(self.ckpt)
        if newest is not None and newest != self.newest_step:
            self.newest_step = newest
            self.events.write(
                "checkpoint",
                f"checkpoint committed: step {newest[0]} ({newest[1]})",
                step=newest[0],
                path=str(newest[1]),
            )

    # ---- after a failure ------------------------------------------------------------------------------
    def end_job(self, failure: dict[str, Any]) -> int:
        """Log the failure, kill every process of the run; returns the exit code to report if we give up."""
        self.events.write(
            "failure", f"failure: {failure['detail']}", **failure, output_tail=self.job.output_tail()
        )
        killed, seconds = processes.kill_job(self.events.run_id, self.job.proc, namespaces=self.used)
        self.job.finish_output()  # at once: nothing holds the pipes any more
        self.events.write(
            "kill",
            f"every process of the job is gone ({killed} signalled, {seconds:.2f} s)",
            killed=killed,
            seconds=round(seconds, 3),
        )
        code = failure["returncode"]
        return code if isinstance(code, int) and code > 0 else 1

    def verify(self) -> None:
        if self.ckpt is None:
            self.events.write(
                "verify",
                "no checkpoint folder (no --checkpoint-dir): restarting from scratch",
                path=None,
                step=None,
                skipped=[],
            )
            return
        found, skipped = checkpoints.newest_verified(self.ckpt)
        for folder, problem in skipped:
            print(f"[minidist launch] skipping {folder}: {problem}", file=sys.stderr)
        where = f"step {found[0]} ({found[1]})" if found else "none verifies: restarting from scratch"
        self.events.write(
            "verify",
            f"newest checkpoint that verifies: {where}",
            path=found and str(found[1]),
            step=found and found[0],
            skipped=[list(s) for s in skipped],
        )

    def give_up(self, code: int, why: str, restarts: int) -> LaunchResult:
        self.events.write(
            "give_up", f"giving up: {why}; exit code {code}", returncode=code, restarts=restarts, detail=why
        )
        return LaunchResult(code, restarts, self.events.events)

    def end_quietly(self, grace: float = 0.0) -> None:
        """End whatever of the run is left (after an interrupt or an error), as cleanly as possible."""
        proc = self.job.proc if self.job is not None else None
        try:
            processes.kill_job(self.events.run_id, proc, grace=grace, namespaces=self.used)
        except LaunchError as error:
            print(f"[minidist launch] {error}", file=sys.stderr)


def _failure(
    reason: str, detail: str, job: Job, returncode: int | None = None, **fields: Any
) -> dict[str, Any]:
    return {
        "reason": reason,
        "returncode": returncode,
        "seconds": round(job.elapsed(), 3),
        "detail": detail,
        **fields,
    }

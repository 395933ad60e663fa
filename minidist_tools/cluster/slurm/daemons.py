"""Starting and stopping a Slurm cluster's daemons: munged, slurmctld, and one slurmd per node.

Each daemon runs in the foreground of a process this module starts (``-F``/``-D``), so the pid it is
given is the daemon's own: ``unshare`` and ``nsenter`` do not fork when they only enter or make a
network or UTS namespace, they ``exec``. The pids go into the cluster's state file as each daemon
starts, and ``stop`` ends exactly those processes, never a daemon by name (another cluster's, or the
machine's own, may run beside them).

* munged: the cluster's own, with a key made for it and its socket in the cluster's folder (slurm.conf's
  ``AuthInfo=socket=...``), so a machine's own munge, if any, is neither needed nor touched.
* slurmctld: in the host's network namespace (it listens on the bridge's address), under a hostname of
  its own (``unshare --uts``): slurmctld checks that it runs on the host slurm.conf names.
* slurmd: inside its node's network namespace, under the node's hostname. ``nsenter --net`` rather than
  ``ip netns exec``: the latter remounts ``/sys`` for the namespace, which hides ``/sys/fs/cgroup``,
  and slurmd 22.05 then refuses to start ("No filesystem mounted on /sys/fs/cgroup").
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minidist_tools.cluster.errors import ClusterError
from minidist_tools.cluster.slurm import config

READY_TIMEOUT = 60.0  # seconds for the controller to answer and every node to be idle (a loaded host)


def client_env(slurm: dict[str, Any]) -> dict[str, str]:
    """The environment a Slurm command needs to talk to this cluster: where its slurm.conf is."""
    return {"SLURM_CONF": str(config.conf_path(slurm))}


def _spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> int:
    """Start a daemon in a session of its own (a Ctrl-C at the terminal is not for it), its output
    appended to ``log``; return its pid."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    return proc.pid


def start(record: dict[str, Any], save: Callable[[], None]) -> None:
    """Start munged, slurmctld and every slurmd of ``record`` and wait until every node is idle.

    ``save`` is called after each start, with the new pid in ``record["slurm"]["pids"]``: a failure
    later in ``up`` then finds it. Raises ``ClusterError`` with the end of the daemon's log when one
    does not come up."""
    slurm = record["slurm"]
    folder, pids = Path(slurm["folder"]), slurm["pids"]
    env = client_env(slurm)

    key = folder / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))  # a key for this cluster alone
    key.chmod(0o400)
    # --force: munged wants every folder above its socket to be searchable by all users; a test's
    # private temporary folder is not. Only root talks to this munged, so that check protects nothing.
    munged = [
        "munged", "--foreground", "--force", f"--socket={config.munge_socket(slurm)}",
        f"--key-file={key}", f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log",
        f"--seed-file={folder}/munged.seed",
    ]  # fmt: skip
    pids["munged"] = _spawn(munged, folder / "munged.out")
    save()
    _wait_for(lambda: config.munge_socket(slurm).exists(), "munged's socket", folder / "munged.log", pids)

    conf = str(config.conf_path(slurm))
    ctl = f"hostname {slurm['controller']}; exec slurmctld -D -i -f {conf}"
    pids["slurmctld"] = _spawn(["unshare", "--uts", "sh", "-c", ctl], folder / "slurmctld.out", env)
    save()
    _wait_for(lambda: _ping(env), "slurmctld to answer", folder / "slurmctld.log", pids)

    for node in record["nodes"]:
        daemon = f"hostname {node}; exec slurmd -D -f {conf} -N {node}"
        argv = ["nsenter", f"--net=/var/run/netns/{node}", "unshare", "--uts", "sh", "-c", daemon]
        pids[f"slurmd {node}"] = _spawn(argv, folder / f"slurmd.{node}.out", env)
        save()
    _wait_for(lambda: _all_idle(record, env), "every node to be idle", folder / "slurmctld.log", pids)


def _ping(env: dict[str, str]) -> bool:
    proc = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, env={**os.environ, **env})
    return proc.returncode == 0 and "UP" in proc.stdout


def node_states(record: dict[str, Any]) -> dict[str, str]:
    """``{node: state}`` as slurmctld sees them (``idle``, ``alloc``, ``down*``, ``drained``, ...)."""
    env = {**os.environ, **client_env(record["slurm"])}
    proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise ClusterError(f"sinfo failed: {proc.stderr.strip()}")
    return dict(line.split(maxsplit=1) for line in proc.stdout.splitlines() if line.strip())


def _all_idle(record: dict[str, Any], env: dict[str, str]) -> bool:
    try:
        states = node_states(record)
    except ClusterError:
        return False
    return all(states.get(node) == "idle" for node in record["nodes"])


def _wait_for(ready: Callable[[], bool], what: str, log: Path, pids: dict[str, int]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while not ready():
        dead = [name for name, pid in pids.items() if not _alive(pid)]
        if dead or time.monotonic() > deadline:
            why = f"{', '.join(dead)} exited" if dead else f"not after {READY_TIMEOUT:g} s"
            tail = log.read_text(errors="replace").splitlines()[-5:] if log.exists() else []
            raise ClusterError(f"waiting for {what}: {why}; the end of {log}:\n  " + "\n  ".join(tail))
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs; reaps it when it is a dead child of this process (no zombie is left)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:  # not our child (the CLI's `up` started it): look at /proc
        pass
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def stop(slurm: dict[str, Any], wait: float = 10.0) -> None:
    """End every daemon recorded in ``slurm["pids"]``: SIGTERM (slurmd and slurmctld save their state
    and exit), SIGKILL after ``wait`` seconds. Raises ``ClusterError`` if one survives that too.

    A recorded pid is only signalled while it still runs the program it was started as, so a pid the
    kernel has given to another process since is left alone."""
    pids = slurm["pids"]
    mine = {name: pid for name, pid in pids.items() if _alive(pid) and _runs(pid, name.split()[0])}
    for sig, grace in ((signal.SIGTERM, wait), (signal.SIGKILL, 2.0)):
        for pid in mine.values():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while any(_alive(pid) for pid in mine.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        mine = {name: pid for name, pid in mine.items() if _alive(pid)}
        if not mine:
            return
    raise ClusterError(f"Slurm daemons {mine} survive SIGKILL")


def _runs(pid: int, program: str) -> bool:
    """Whether process ``pid`` runs ``program`` (or still the ``unshare``/``nsenter``/``sh`` before it)."""
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except FileNotFoundError:
        return False
    return name in (program, "unshare", "nsenter", "sh")

"""Running one MPI job across the nodes: the launcher script, the mpiexec command line, the environment,
and a run that never leaves a process behind.

MPICH's launcher (Hydra) starts one proxy per host, which then starts that host's ranks. On real machines
it reaches a host with ``ssh HOST COMMAND``; ``-launcher rsh -launcher-exec SCRIPT`` makes it call
``SCRIPT HOST COMMAND`` instead, and our script runs the command inside the namespace named HOST, with
that name as its hostname (a private UTS namespace, unshare(1)): ranks of one node then see one host, as
on a real machine. ``-localhost`` is the address the proxies call back to (the bridge's).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from minidist_tools.cluster import netns
from minidist_tools.mpiexec import mpiexec_path

# Hydra passes the proxy's command line as ONE argument, so it is run by a shell.
LAUNCHER_SCRIPT = """#!/bin/sh
# minidist_tools.cluster's launcher-exec for MPICH Hydra: run "$2" in network namespace "$1" with hostname
# "$1".
host=$1; shift
exec ip netns exec "$host" unshare --uts sh -c "hostname $host; $*"
"""


def write_launcher(path: Path) -> None:
    path.write_text(LAUNCHER_SCRIPT)
    path.chmod(0o755)


def mpiexec_command(
    launcher: Path, nodes: list[str], ranks_per_node: int, bridge_ip: str, n: int
) -> list[str]:
    """``mpiexec`` with every option that places ``n`` ranks on the nodes, in blocks of ``ranks_per_node``
    (ranks 0..R-1 on the first node, ...); past ``len(nodes) * ranks_per_node`` Hydra starts over."""
    hosts = ",".join(f"{node}:{ranks_per_node}" for node in nodes)
    return [
        mpiexec_path(),
        *("-launcher", "rsh", "-launcher-exec", str(launcher)),
        *("-hosts", hosts, "-localhost", bridge_ip, "-n", str(n)),
    ]


def run_env() -> dict[str, str]:
    """What a run adds to the environment (Hydra hands mpiexec's environment to every rank).

    ``UCX_TLS=tcp,self``: UCX (MPICH's network layer) would otherwise use shared memory between the
    nodes, which share one kernel; TCP makes the bytes cross the links. One BLAS/OpenMP thread per rank, as
    every launch in minidist. This Python's directory first on ``PATH``: ``run -- python ...`` then means
    this environment's Python on every node.
    """
    return {
        "UCX_TLS": "tcp,self",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PATH": python_first(os.environ.get("PATH", "")),
    }


def python_first(path: str) -> str:
    """``path`` (a ``PATH`` value) with this Python's directory in front, where ``python`` is found first."""
    here = str(Path(sys.executable).parent)
    entries = path.split(os.pathsep) if path else []
    return os.pathsep.join([here, *(e for e in entries if e != here)])


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Inside the block, SIGTERM raises ``SystemExit`` (as Ctrl-C raises ``KeyboardInterrupt``), so
    ``finally`` and ``with`` clean-ups run. Only the main thread can set handlers; elsewhere a no-op."""
    try:
        previous = signal.signal(signal.SIGTERM, _raise_exit)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run(
    argv: list[str],
    nodes: list[str],
    env: Mapping[str, str],
    timeout: float | None,
    capture: bool,
    cwd: str | None = None,
) -> subprocess.CompletedProcess:
    """Run ``argv`` (an mpiexec command line); if it fails, times out or is interrupted, kill every process
    in ``nodes`` so that no rank outlives it. Raises ``subprocess.TimeoutExpired`` (with the output so
    far) after ``timeout`` seconds."""
    pipe = subprocess.PIPE if capture else None
    proc = subprocess.Popen(
        argv, stdout=pipe, stderr=pipe, text=True, env=dict(env), cwd=cwd, start_new_session=True
    )
    try:
        with sigterm_raises():
            out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc, nodes)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(argv, timeout, out, err) from None
    except BaseException:  # Ctrl-C, SIGTERM, anything: the ranks must not outlive us
        _kill(proc, nodes)
        proc.communicate()
        raise
    if proc.returncode != 0:
        netns.kill_processes(nodes)  # ranks a crashed mpiexec left behind
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _kill(proc: subprocess.Popen, nodes: list[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # mpiexec and what it forked on this side
    except ProcessLookupError:
        pass
    netns.kill_processes(nodes)  # whatever runs inside the namespaces, whatever its process group

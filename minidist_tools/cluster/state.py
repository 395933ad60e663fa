"""Where clusters are written down: one JSON file per cluster, a lock, and the choice of a free subnet.

Every cluster lives in ``/run/minidist/cluster/<name>.json`` (``/run`` is a tmpfs: a reboot, which also
removes every namespace, forgets them). The file is written *before* anything is made and removed
*after* everything is gone, so a cluster whose ``up`` or ``down`` was interrupted can always be found and
removed (``down --all``).

Addresses come from 198.18.0.0/15, the range reserved for network benchmarks (RFC 2544 section C.2.2):
cluster ``K`` gets 198.18.K.0/24, its bridge 198.18.K.1 and node ``i`` 198.18.K.(10+i). Several test
processes (and people) make clusters at the same time, so choosing K and claiming it (writing the state
file) happen under one file lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from minidist_tools.cluster.errors import ClusterError

# MINIDIST_CLUSTER_DIR: another folder for the state files (the CLI tests use one of their own, so that
# their `down --all` cannot touch anybody else's cluster). The lock stays the machine's one lock: subnets
# and interface names are shared by every folder.
STATE_DIR = Path(os.environ.get("MINIDIST_CLUSTER_DIR", "/run/minidist/cluster"))
LOCK = Path("/run/minidist/cluster.lock")
SUBNETS = range(256)  # 198.18.K.0/24: the lower half (198.18.0.0/16) of the benchmarking range

# Short names: interface names hold at most 15 characters (IFNAMSIZ - 1) and the longest one made
# from a name is "<name>n<node>h" (the host side of a node's veth).
NAME_PATTERN = re.compile(r"[a-z][a-z0-9]{0,7}")


def state_path(name: str) -> Path:
    return STATE_DIR / f"{name}.json"


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Hold the cluster lock (an exclusive ``flock`` on ``LOCK``), waiting for it if needed.
    ``ClusterError`` if the state folder or the lock cannot be made (see :func:`_writable`)."""
    with _writable(STATE_DIR):
        STATE_DIR.mkdir(parents=True, exist_ok=True)
    with _writable(LOCK.parent):
        LOCK.parent.mkdir(parents=True, exist_ok=True)
        lock = open(LOCK, "w")  # noqa: SIM115  (closed below; opening it is what may fail)
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read(name: str) -> dict[str, Any]:
    """The state of cluster ``name``; ``ClusterError`` if there is none."""
    try:
        return json.loads(state_path(name).read_text())
    except FileNotFoundError:
        known = names()
        hint = f"known clusters: {', '.join(known)}" if known else "no cluster is up"
        raise ClusterError(
            f"no cluster named {name!r} ({hint}); start one with `minidist cluster up`"
        ) from None


def write(state: dict[str, Any]) -> None:
    """Write a state file atomically (a reader never sees half of one)."""
    path = state_path(state["name"])
    tmp = path.with_suffix(".tmp")
    with _writable(STATE_DIR):
        tmp.write_text(json.dumps(state, indent=1) + "\n")
        os.replace(tmp, path)


@contextlib.contextmanager
def _writable(folder: Path) -> Iterator[None]:
    """Turn an ``OSError`` (a file where a folder should be, a read-only file system, a full disk) into a
    ``ClusterError`` naming the folder: the CLI then exits 2 with a message instead of a traceback, and
    ``up`` has made nothing yet (the state file is written before the first namespace)."""
    try:
        yield
    except OSError as error:
        raise ClusterError(
            f"cannot write the cluster state folder {folder}: {error.strerror or error}; set "
            "MINIDIST_CLUSTER_DIR to a writable folder (default /run/minidist/cluster, as root)"
        ) from None


def remove(name: str) -> None:
    state_path(name).unlink(missing_ok=True)


def names() -> list[str]:
    """The names of every cluster with a state file, sorted."""
    if not STATE_DIR.is_dir():
        return []
    return sorted(p.stem for p in STATE_DIR.glob("*.json"))


def subnets_in_use() -> set[int]:
    """K of every 198.18.K.0/24 claimed by a state file or carried by an interface of this namespace."""
    used = set()
    for name in names():
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError, KeyError):
            used.add(int(json.loads(state_path(name).read_text())["subnet"]))
    addresses = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    used.update(int(k) for k in re.findall(r"inet 198\.18\.(\d+)\.\d+", addresses))
    return used


def choose_subnet(pinned: int | None, clash: Callable[[int], bool] | None = None) -> int:
    """``pinned`` if it is free, else the first free K for which ``clash(K)`` is false; ``ClusterError``
    if none is.

    Call under :func:`locked`: the answer holds only until another process claims a subnet."""
    used = subnets_in_use()
    if pinned is not None:
        if pinned not in SUBNETS:
            raise ClusterError(f"subnet={pinned} is outside 0..255 (the cluster gets 198.18.<subnet>.0/24)")
        if pinned in used:
            raise ClusterError(
                f"subnet 198.18.{pinned}.0/24 is in use (a cluster or an interface has it): "
                "choose another or leave subnet unset to get a free one"
            )
        return pinned
    for k in SUBNETS:
        if k not in used and not (clash is not None and clash(k)):
            return k
    raise ClusterError("every subnet 198.18.0-255.0/24 is in use: remove clusters with `down --all`")

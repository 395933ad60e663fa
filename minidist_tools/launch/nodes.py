"""Node health on a cluster in a box, and the choice of nodes for each attempt.

A node is **dead** when its network namespace is gone, when its link is down (the host side of its veth
pair is not ``up``: ``down`` if that side was switched off, ``lowerlayerdown`` if the node's own
``eth0`` was), or when a TCP connection from inside the node to the bridge does not open within
``PROBE_TIMEOUT`` seconds. A dead node is what a machine that lost power or its network looks like
to the others: nobody can reach its ranks and no error ever comes back from them, so MPI's TCP
connections just wait. The launcher therefore checks the nodes itself:

* every ``--monitor-interval`` while the job runs, :func:`link_problems`: a look at ``/sys`` and at
  ``ip netns list``, no process started, so it is cheap enough for every tick;
* before each attempt, :func:`choose_nodes` adds the TCP probe (``bash``'s ``/dev/tcp`` run in the
  namespace, to a port the launcher listens on at the bridge address): the path MPI's own connections
  will take must work end to end before mpiexec is asked to use it.

Nodes are used in the cluster's order; a dead node is skipped and a spare (a node beyond the ones the
job needs) takes its place, so the world shrinks only when too few nodes are left.
"""

from __future__ import annotations

import shlex
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from minidist_tools.cluster import netns
from minidist_tools.launch.errors import LaunchError

PROBE_TIMEOUT = 3.0  # seconds a probe's connection may take; generous: the host may be loaded


def link_problems(cluster: Any, nodes: list[str]) -> dict[str, str]:
    """``{node: what is wrong}`` for each of ``nodes`` whose namespace is gone or whose link is not up."""
    problems = {}
    existing = netns.namespaces()
    for node in nodes:
        state = Path("/sys/class/net", cluster.links[node], "operstate")
        if node not in existing:
            problems[node] = "its network namespace is gone"
        elif not state.exists():
            problems[node] = "its link is gone"
        elif (operstate := state.read_text().strip()) != "up":
            problems[node] = f"its link is {operstate}"
    return problems


def probe(cluster: Any, nodes: list[str], timeout: float = PROBE_TIMEOUT) -> dict[str, str]:
    """``{node: what is wrong}`` for each node from which a TCP connection to the bridge address fails.

    All probes run at once; a probe that has not connected after ``timeout`` seconds is killed.
    """
    problems: dict[str, str] = {}
    with socket.create_server((cluster.bridge_ip, 0), backlog=len(nodes) + 8) as server:
        port = server.getsockname()[1]
        connect = f"exec 3<>/dev/tcp/{cluster.bridge_ip}/{port}"  # bash opens a TCP connection, and exits
        probes = {
            node: subprocess.Popen(
                ["ip", "netns", "exec", node, "bash", "-c", connect],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for node in nodes
        }
        deadline = time.monotonic() + timeout
        for node, proc in probes.items():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                problems[node] = f"no TCP connection to {cluster.bridge_ip} within {timeout:g} s"
                continue
            if proc.returncode != 0:
                problems[node] = (
                    f"TCP probe failed: {proc.stderr.read().strip() or f'exit {proc.returncode}'}"
                )
            proc.stderr.close()
    return problems


def choose_nodes(cluster: Any, wanted: int, min_nodes: int) -> tuple[list[str], dict[str, str]]:
    """The first ``wanted`` healthy nodes of ``cluster`` (fewer if fewer are healthy), and the problems
    of the others. Raises ``LaunchError`` if fewer than ``min_nodes`` are healthy."""
    problems = link_problems(cluster, cluster.nodes)
    problems.update(probe(cluster, [n for n in cluster.nodes if n not in problems]))
    live = [node for node in cluster.nodes if node not in problems]
    if len(live) < min_nodes:
        dead = "; ".join(f"{node}: {why}" for node, why in problems.items())
        raise LaunchError(
            f"only {len(live)} of cluster {cluster.name!r}'s {len(cluster.nodes)} nodes are healthy, fewer "
            f"than the minimum of {min_nodes} (--nodes MIN:MAX); dead: {dead}"
        )
    return live[:wanted], problems


def describe(nodes: list[str], ranks_per_node: int) -> str:
    """``"n0, n1 (2 ranks each)"``, for the log's human lines."""
    return (
        f"{', '.join(shlex.quote(n) for n in nodes)} ({ranks_per_node} rank{'s' * (ranks_per_node > 1)} each)"
    )

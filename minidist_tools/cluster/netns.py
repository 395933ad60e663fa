"""The network of a cluster in a box: a Linux bridge, and per node a namespace joined to it by a veth pair.

::

    host namespace                      namespace <name>n0 (hostname <name>n0)
      bridge <name>-br 198.18.K.1  ---  <name>n0h ==veth== eth0 198.18.K.10
                                   ---  <name>n1h ==veth== eth0 198.18.K.11   (namespace <name>n1)

A network namespace has its own interfaces, addresses and routes (ip-netns(8)); processes in two
namespaces can only talk through the veth links, like machines through their network cards. The host
side of each veth is a port of the bridge (a software Ethernet switch), which also carries the bridge
address that mpiexec listens on. Everything else (files, processes, shared memory) stays shared, which is
why the launcher also gives each node's processes their own hostname (see launch.py).

Every function here runs ``ip``; the ones that remove things accept that the thing is already gone, so
tearing down a half-made cluster works.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from minidist_tools.cluster.errors import ClusterError


def ip(*args: str, netns: str | None = None, missing_ok: bool = False) -> str:
    """Run ``ip ARGS`` (inside ``netns`` if given); return stdout. Raises ``ClusterError`` with ip's message,
    except, with ``missing_ok``, when the object is already gone."""
    return command(["ip", *args], netns=netns, missing_ok=missing_ok)


def command(argv: list[str], netns: str | None = None, missing_ok: bool = False) -> str:
    if netns is not None:
        argv = ["ip", "netns", "exec", netns, *argv]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        message = proc.stderr.strip()
        gone = (
            "Cannot find device",
            "No such device",
            "No such file",
            "does not exist",
            "Cannot open network namespace",
        )
        if missing_ok and any(text in message for text in gone):
            return ""
        raise ClusterError(f"`{' '.join(argv)}` failed: {message}")
    return proc.stdout


def namespaces() -> set[str]:
    """Names of every network namespace (``ip netns list``)."""
    return {line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()}


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def make_bridge(bridge: str, address: str) -> None:
    """The switch all nodes plug into, with ``address`` (CIDR) for the launcher's side.

    The bridge gets a MAC address of its own (:func:`bridge_mac`). Without one, Linux gives a bridge the
    lowest MAC of its ports and changes it when that port goes: a node's death would move mpiexec's
    address to another MAC while the other nodes' neighbour (ARP) caches still hold the old one, and
    their TCP to mpiexec would fail for tens of seconds, until the cache entries expire.
    """
    ip("link", "add", bridge, "address", bridge_mac(address), "type", "bridge")
    ip("addr", "add", address, "dev", bridge)
    ip("link", "set", bridge, "up")


def bridge_mac(address: str) -> str:
    """A MAC for the bridge with IPv4 ``address`` (CIDR): ``02:6d:64`` (locally administered, "md") then
    the address's last three bytes, so that the bridges of two clusters never share one."""
    octets = [int(part) for part in address.split("/")[0].split(".")]
    return "02:6d:64:" + ":".join(f"{o:02x}" for o in octets[1:])


def make_node(node: str, veth: str, bridge: str, address: str) -> None:
    """Namespace ``node`` with ``eth0`` at ``address`` (CIDR), its peer ``veth`` on ``bridge``."""
    ip("netns", "add", node)
    ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", node)
    ip("link", "set", veth, "master", bridge)
    ip("link", "set", veth, "up")
    ip("addr", "add", address, "dev", "eth0", netns=node)
    ip("link", "set", "eth0", "up", netns=node)
    ip("link", "set", "lo", "up", netns=node)  # MPI's and Python's own sockets to localhost


def pids(node: str) -> list[int]:
    """Every process whose network namespace is ``node`` (``ip netns pids``)."""
    if node not in namespaces():
        return []
    return [int(p) for p in ip("netns", "pids", node, missing_ok=True).split()]


def kill_processes(nodes: list[str], wait: float = 10.0) -> int:
    """SIGKILL every process in the ``nodes`` namespaces until none is left (a dying launcher may fork);
    return how many were killed. ``ClusterError`` if some survive ``wait`` seconds."""
    killed, deadline = 0, time.monotonic() + wait
    while True:
        alive = [pid for node in nodes for pid in pids(node) if pid != os.getpid()]
        if not alive:
            return killed
        if time.monotonic() > deadline:
            raise ClusterError(f"processes {alive} in namespaces {nodes} survive SIGKILL")
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def remove_node(node: str, veth: str) -> None:
    """Delete a node's namespace and veth pair (either may already be gone)."""
    ip("netns", "del", node, missing_ok=True)
    if link_exists(veth):  # deleting the namespace usually took the pair with it
        ip("link", "del", veth, missing_ok=True)


def remove_bridge(bridge: str) -> None:
    if link_exists(bridge):
        ip("link", "del", bridge, missing_ok=True)


def link_counters(veth: str) -> tuple[int, int]:
    """``(rx_bytes, tx_bytes)`` of the host side of a node's link: rx is what the node sent, tx what it
    received."""
    stats = Path("/sys/class/net", veth, "statistics")
    try:
        return int((stats / "rx_bytes").read_text()), int((stats / "tx_bytes").read_text())
    except OSError:  # gone (FileNotFoundError), or being deleted right now (EINVAL)
        raise ClusterError(f"link {veth} is gone: its node or the cluster was taken down") from None

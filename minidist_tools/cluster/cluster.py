"""``Cluster``: several "machines" on one Linux host, each a network namespace, linked over real TCP.

::

    with Cluster.up(nodes=2, ranks_per_node=2, bandwidth="1gbit") as c:
        proc = c.run(["python", "examples/train_mlp.py"], timeout=300)
        print(c.link_bytes())        # {node: (rx_bytes, tx_bytes)} of each node's link

Leaving the ``with`` block (also on an exception, Ctrl-C or SIGTERM) removes everything ``up`` made.
Without ``with`` the cluster stays until :meth:`Cluster.down` (the CLI's ``up`` works that way);
:meth:`Cluster.load` finds it again by name. The network is built in netns.py, shaped in shaping.py,
recorded in state.py and used by launch.py. With ``scheduler="slurm"`` the nodes also run a real Slurm
(slurm/: munged, slurmctld, a slurmd per node), for ``sbatch``, ``srun`` and ``salloc``.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from minidist_tools.cluster import launch, netns, shaping, slurm, state
from minidist_tools.cluster.errors import ClusterError, cluster_available

MAX_NODES = 64  # addresses 198.18.K.10 ... .73; far more namespaces than one host's cores can feed


class Cluster:
    """A cluster of network namespaces described by its state file; make one with :meth:`up`."""

    def __init__(self, record: dict[str, Any]) -> None:
        self._state = record
        self._sigterm: Any = None  # launch.sigterm_raises() while inside a with-block

    # ---- making, finding and removing -------------------------------------------------------------
    @classmethod
    def up(
        cls,
        nodes: int = 2,
        ranks_per_node: int = 2,
        bandwidth: str | None = None,
        name: str | None = None,
        subnet: int | None = None,
        scheduler: str | None = None,
    ) -> Cluster:
        """Make ``nodes`` namespaces on one bridge, each link shaped to ``bandwidth`` (a tc rate such as
        ``"1gbit"``; ``None`` or ``"none"``: unshaped).

        ``name``: at most 8 lowercase letters and digits, starting with a letter; ``None`` picks
        ``md<subnet>``, which no other cluster has. ``subnet``: K of 198.18.K.0/24 (0..255); ``None``
        picks the first free one. ``scheduler="slurm"``: also start Slurm on the nodes (installing it
        from the distribution's packages when missing; slurm/). Raises ``ClusterError`` for bad
        arguments, a taken name or subnet, missing privileges, or a failed step (after removing what
        was made).
        """
        for value, what in ((nodes, "nodes"), (ranks_per_node, "ranks_per_node")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ClusterError(f"{what} must be a positive integer, got {value!r}")
        if nodes > MAX_NODES:
            raise ClusterError(f"nodes={nodes} is more than {MAX_NODES}, the most one cluster holds")
        if name is not None and not state.NAME_PATTERN.fullmatch(name):
            raise ClusterError(
                f"cluster name {name!r} must be 1-8 lowercase letters or digits starting with a letter "
                "(interface names made from it must fit Linux's 15 characters)"
            )
        if scheduler not in (None, *slurm.SCHEDULERS):
            raise ClusterError(f"scheduler {scheduler!r} is not one of {', '.join(slurm.SCHEDULERS)}")
        rate = shaping.parse_rate(bandwidth)
        ok, reason = cluster_available()
        if not ok:
            raise ClusterError(reason)
        # Under the lock from choosing the subnet until the bridge carries its address: another process
        # (with this or another state folder) then sees the subnet taken either way.
        with state.locked():
            # A default name md<K> whose namespaces or links exist (left by hand or by a crash that
            # lost the state file) makes that K unusable, not the whole call.
            clash = None if name is not None else (lambda k: bool(_taken(_plan(f"md{k}", k, nodes, 1, None))))
            k = state.choose_subnet(subnet, clash)
            name = name if name is not None else f"md{k}"
            record = _plan(name, k, nodes, ranks_per_node, rate)
            _check_free(record)
            if scheduler == "slurm":  # in the state file from the start: `down` then finds its daemons
                record["slurm"] = slurm.plan(record, state.STATE_DIR / f"{name}.slurm")
            state.write(record)  # first: whatever follows can be found and removed
            cluster = cls(record)
            try:
                launch.write_launcher(cluster.launcher)
                netns.make_bridge(record["bridge"], f"{record['bridge_ip']}/24")
                for node, veth, address in zip(record["nodes"], record["veths"], record["addresses"]):
                    netns.make_node(node, veth, record["bridge"], f"{address}/24")
                    shaping.shape(node, veth, rate)
            except BaseException as error:  # also Ctrl-C: never leave half a cluster
                cluster.down()
                if isinstance(error, ClusterError):
                    raise ClusterError(f"could not bring up cluster {name!r}: {error}") from None
                raise
        if "slurm" in record:  # after the lock: waiting for the daemons must not hold up other clusters
            try:
                slurm.start(record, lambda: state.write(record))
            except BaseException as error:
                cluster.down()
                if isinstance(error, ClusterError):
                    raise ClusterError(f"could not start Slurm on cluster {name!r}: {error}") from None
                raise
        record["status"] = "up"
        state.write(record)
        return cluster

    @classmethod
    def load(cls, name: str) -> Cluster:
        """The cluster ``name`` made earlier (by this or another process); ``ClusterError`` if none."""
        return cls(state.read(name))

    @staticmethod
    def names() -> list[str]:
        """Names of every cluster that has a state file."""
        return state.names()

    def down(self) -> None:
        """Kill every process in the namespaces, delete namespaces, links, bridge and state file.
        Idempotent, and works on a half-made or half-removed cluster."""
        record = self._state
        errors = []

        def attempt(step, *args):  # keep going after a failure: remove all that can be removed
            try:
                step(*args)
            except ClusterError as error:
                errors.append(str(error))

        if record.get("slurm"):  # first: slurmctld and munged run outside the namespaces
            attempt(slurm.stop, record["slurm"])
        attempt(netns.kill_processes, record["nodes"])
        for node, veth in zip(record["nodes"], record["veths"]):
            attempt(netns.remove_node, node, veth)
        attempt(netns.remove_bridge, record["bridge"])
        self.launcher.unlink(missing_ok=True)
        if errors:
            raise ClusterError(
                f"cluster {self.name!r} was not fully removed: {'; '.join(errors)}; its state file stays, "
                "so that `minidist cluster down --all` can try again"
            )
        state.remove(self.name)

    def __enter__(self) -> Cluster:
        # down() also when the interpreter exits without leaving the block (sys.exit in a thread, ...)
        # and when SIGTERM arrives (it then raises SystemExit, which leaves the block).
        atexit.register(self.down)
        self._sigterm = launch.sigterm_raises()
        self._sigterm.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.down()
        finally:
            atexit.unregister(self.down)
            self._sigterm.__exit__(None, None, None)

    # ---- what it is -------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._state["name"]

    @property
    def nodes(self) -> list[str]:
        """Namespace names, which are also the hostnames inside: ``["<name>n0", "<name>n1", ...]``."""
        return list(self._state["nodes"])

    @property
    def addresses(self) -> list[str]:
        """IPv4 address of each node's ``eth0``."""
        return list(self._state["addresses"])

    @property
    def scheduler(self) -> str:
        """``"slurm"`` when Slurm runs on the nodes, else ``"none"``."""
        return "slurm" if self._state.get("slurm") else "none"

    def slurm_env(self) -> dict[str, str]:
        """``{"SLURM_CONF": ...}``: what sbatch, srun, sinfo... need to use this cluster's Slurm."""
        if not self._state.get("slurm"):
            raise ClusterError(f"cluster {self.name!r} runs no Slurm: make it with scheduler='slurm'")
        return slurm.client_env(self._state["slurm"])

    @property
    def ranks_per_node(self) -> int:
        return self._state["ranks_per_node"]

    @property
    def world_size(self) -> int:
        return len(self._state["nodes"]) * self.ranks_per_node

    @property
    def bandwidth(self) -> int | None:
        """Link rate in bits per second, ``None`` when unshaped."""
        return self._state["bandwidth_bps"]

    @property
    def bridge_ip(self) -> str:
        """The bridge's address: mpiexec's side of every node's link."""
        return self._state["bridge_ip"]

    @property
    def links(self) -> dict[str, str]:
        """``{node: name of the host side of its veth link}`` (``/sys/class/net/<name>`` on the host)."""
        return dict(zip(self._state["nodes"], self._state["veths"]))

    @property
    def launcher(self) -> Path:
        """The launcher script mpiexec calls (launch.py), beside the state file."""
        return Path(self._state.get("launcher") or state.STATE_DIR / f"{self.name}.launch")

    # ---- using it ---------------------------------------------------------------------------------
    def mpiexec_command(self, n: int | None = None, nodes: list[str] | None = None) -> list[str]:
        """The ``mpiexec ... -n n`` prefix of a command run on the cluster (``n`` defaults to world_size);
        ranks fill the nodes in blocks of ``ranks_per_node``. ``nodes``: only these of the cluster's
        nodes, in this order (``minidist_tools.launch`` leaves out a dead one); ``n`` then defaults to
        ``len(nodes) * ranks_per_node``."""
        nodes = self.nodes if nodes is None else list(nodes)
        unknown = sorted(set(nodes) - set(self.nodes))
        if unknown or not nodes:
            raise ClusterError(
                f"nodes {unknown or nodes} are not nodes of cluster {self.name!r}: {self.nodes}"
            )
        n = len(nodes) * self.ranks_per_node if n is None else n
        if n < 1:
            raise ClusterError(f"n must be at least 1, got {n}")
        return launch.mpiexec_command(self.launcher, nodes, self.ranks_per_node, self._state["bridge_ip"], n)

    def env(self) -> dict[str, str]:
        """Environment additions for a run (see ``launch.run_env``: UCX_TLS=tcp,self, one thread, PATH)."""
        return launch.run_env()

    def run(
        self,
        command: list[str],
        timeout: float | None = 300,
        env: Mapping[str, str] | None = None,
        capture: bool = True,
        n: int | None = None,
        cwd: str | None = None,
    ) -> subprocess.CompletedProcess:
        """Run ``command`` on ``n`` ranks (default world_size) across the nodes, in ``cwd`` (default: the
        current directory, which every node sees). ``env``: more environment variables, over
        ``os.environ`` and :meth:`env`. Returns the finished process (stdout/stderr captured as text when
        ``capture``). When it fails, times out or is interrupted, every process in the namespaces is
        killed (all of them: also those of another run on this cluster at the same time); a timeout
        raises ``subprocess.TimeoutExpired`` after that. ``ClusterError`` for an empty command or a
        cluster whose namespaces are gone."""
        if not command:
            raise ClusterError("run needs a command, e.g. ['python', 'examples/train_mlp.py']")
        if not self._alive():
            raise ClusterError(
                f"cluster {self.name!r} is not up (its namespaces are gone): `down` it and start a new one"
            )
        full_env = {**os.environ, **self.env(), **(env or {})}
        # `python` is this environment's even when `env` is a whole environment with its own PATH
        full_env["PATH"] = launch.python_first(full_env.get("PATH", ""))
        argv = self.mpiexec_command(n) + list(command)
        return launch.run(argv, self.nodes, full_env, timeout, capture, cwd)

    def kill_processes(self) -> int:
        """SIGKILL every process in the cluster's namespaces; return how many."""
        return netns.kill_processes(self.nodes)

    def link_bytes(self) -> dict[str, tuple[int, int]]:
        """``{node: (rx_bytes, tx_bytes)}`` counted on the host side of each node's link since ``up``:
        rx = bytes the node sent, tx = bytes it received."""
        return {node: netns.link_counters(veth) for node, veth in zip(self.nodes, self._state["veths"])}

    def set_bandwidth(self, bandwidth: str | None) -> None:
        """Shape both directions of every node's link to ``bandwidth`` (tc rate), or unshape (``None``)."""
        rate = shaping.parse_rate(bandwidth)
        for node, veth in zip(self.nodes, self._state["veths"]):
            shaping.shape(node, veth, rate)
        self._state["bandwidth_bps"] = rate
        state.write(self._state)

    def status(self) -> str:
        """A human-readable report: nodes, addresses, ranks per node, shaping, link byte counters."""
        rate, ranks = self.bandwidth, f"{self.ranks_per_node} rank{'s' * (self.ranks_per_node > 1)}"
        lines = [
            f"cluster {self.name}: {len(self.nodes)} nodes x {ranks} = {self.world_size} ranks, "
            f"{'up' if self._alive() else 'BROKEN (namespaces missing)'}",
            f"  bridge {self._state['bridge']} {self._state['bridge_ip']}/24 (mpiexec's side)",
            f"  links  {'unshaped' if rate is None else f'{rate / 1e6:g} Mbit/s each way (tc tbf)'}",
        ]
        for node, veth, address in zip(self.nodes, self._state["veths"], self.addresses):
            try:
                rx, tx = netns.link_counters(veth)
                counters = f"sent {rx:,} B, received {tx:,} B"
            except ClusterError:
                counters = "link missing"
            lines.append(f"  node   {node} {address} ({ranks}): {counters}")
        if self._state.get("slurm"):
            lines.append(
                f"  slurm  export SLURM_CONF={self.slurm_env()['SLURM_CONF']}  (then sbatch, srun, sinfo)"
            )
            lines += ["  " + line for line in slurm.sinfo(self._state["slurm"]).splitlines()]
        return "\n".join(lines)

    def _alive(self) -> bool:
        return set(self.nodes) <= netns.namespaces()

    def __repr__(self) -> str:
        return f"Cluster(name={self.name!r}, nodes={len(self.nodes)}, ranks_per_node={self.ranks_per_node})"


def _plan(name: str, k: int, nodes: int, ranks_per_node: int, rate: int | None) -> dict[str, Any]:
    node_names = [f"{name}n{i}" for i in range(nodes)]
    return {
        "name": name,
        "subnet": k,
        "status": "creating",
        "nodes": node_names,
        "veths": [f"{node}h" for node in node_names],  # host side; the node side is eth0
        "addresses": [f"198.18.{k}.{10 + i}" for i in range(nodes)],
        "bridge": f"{name}-br",
        "bridge_ip": f"198.18.{k}.1",
        "ranks_per_node": ranks_per_node,
        "bandwidth_bps": rate,
        "python": sys.executable,  # which environment made it (for people reading the file)
        "launcher": str(state.STATE_DIR / f"{name}.launch"),
    }


def _taken(record: dict[str, Any]) -> list[str]:
    """The namespaces and interfaces of ``record`` that exist already."""
    taken = [n for n in record["nodes"] if n in netns.namespaces()]
    return taken + [i for i in [record["bridge"], *record["veths"]] if netns.link_exists(i)]


def _check_free(record: dict[str, Any]) -> None:
    if state.state_path(record["name"]).exists():
        raise ClusterError(
            f"a cluster named {record['name']!r} exists: choose another name, or remove it with "
            f"`minidist cluster down --name {record['name']}`"
        )
    taken = _taken(record)
    if taken:
        raise ClusterError(f"names of cluster {record['name']!r} are taken by {taken}: choose another name")

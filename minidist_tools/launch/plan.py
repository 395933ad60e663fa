"""The launcher's arguments, checked before anything starts: each mistake gets a message saying what to give.

On a cluster the unit is the node: ``ranks_per_node`` ranks on each. ``-n`` (a multiple of it) fixes how
many nodes the job uses (default: as many as ``--nodes``' MAX allows); ``--nodes MIN:MAX`` lets it go on
with fewer after a node dies, down to MIN. Without ``--nodes`` the count is fixed (MIN = MAX = n /
ranks_per_node), but a spare node of the cluster may still take a dead one's place.
"""

from __future__ import annotations

from dataclasses import dataclass

from minidist_tools.cluster import Cluster, ClusterError
from minidist_tools.launch import slurm
from minidist_tools.launch.errors import LaunchError


@dataclass
class Plan:
    """What to run where, checked: ``n`` ranks in the first attempt; on a cluster (MIN, MAX) nodes."""

    n: int  # ranks of the first attempt
    node_range: tuple[int, int] | None  # (MIN, MAX) on a cluster
    cluster: Cluster | None


def check_arguments(cmd, n, max_restarts, node_range, cluster, interval, stall_timeout) -> Plan:  # noqa: ANN001
    """Check the arguments (``ValueError`` saying what to give instead) and load the cluster."""
    if not cmd or not all(isinstance(a, str) for a in cmd):
        raise ValueError("no command to run: give one after `--`, e.g. -- python examples/train_mlp.py")
    for value, what in ((n, "-n"), (max_restarts, "--max-restarts")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{what} must be an integer, got {value!r}")
    if n is not None and n < 1:
        raise ValueError(f"-n must be at least 1 rank, got {n}")
    if max_restarts < 0:
        raise ValueError(f"--max-restarts must be >= 0, got {max_restarts}")
    if not interval > 0 or (stall_timeout is not None and not stall_timeout > 0):
        raise ValueError("--monitor-interval and --stall-timeout must be positive numbers of seconds")
    if node_range is not None:
        text = node_range if isinstance(node_range, str) else ":".join(map(str, node_range))  # (MIN, MAX)
        node_range = parse_node_range(text)
    if node_range is not None and cluster is None:
        raise ValueError("--nodes MIN:MAX needs --cluster NAME: on one machine there are no nodes to lose")
    if cluster is None:
        inside = slurm.allocation()
        if n is None and inside is not None and inside.ntasks is not None:
            return Plan(inside.ntasks, None, None)  # one rank per task of the Slurm allocation
        if n is None:
            raise ValueError(
                "-n (the number of ranks) is required without --cluster (inside a Slurm allocation "
                "it defaults to SLURM_NTASKS, which this one does not set)"
            )
        return Plan(n, None, None)
    try:
        c = cluster if isinstance(cluster, Cluster) else Cluster.load(cluster)
    except ClusterError as error:
        raise LaunchError(f"{error} (make one with `minidist cluster up`)") from None
    r, total = c.ranks_per_node, len(c.nodes)
    if n is not None and n % r:
        raise ValueError(f"-n {n} is not a multiple of cluster {c.name!r}'s {r} ranks per node")
    low, high = node_range if node_range is not None else (1, total)
    wanted = n // r if n is not None else min(high, total)
    low = low if node_range is not None else wanted  # no --nodes: the node count is fixed
    if not low <= wanted <= high or wanted > total:
        raise ValueError(
            f"-n {wanted * r} means {wanted} nodes of {r} ranks, outside --nodes {low}:{high} or more than "
            f"cluster {c.name!r}'s {total} nodes"
        )
    return Plan(wanted * r, (low, high), c)


def parse_node_range(text: str) -> tuple[int, int]:
    """``"MIN:MAX"`` (or ``"N"``, meaning N:N) as ``(MIN, MAX)``; ``ValueError`` unless 1 <= MIN <= MAX."""
    parts = text.split(":")
    if len(parts) not in (1, 2) or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"--nodes {text!r} must be MIN:MAX, e.g. --nodes 1:4")
    low, high = int(parts[0]), int(parts[-1])
    if low < 1 or low > high:
        raise ValueError(f"--nodes {text}: need 1 <= MIN <= MAX, got MIN={low}, MAX={high}")
    return low, high

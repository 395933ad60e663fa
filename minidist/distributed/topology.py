"""Which ranks share a machine (a *node*): the layout that node-aware collectives and placement need.

On one machine every message goes through shared memory; between machines it crosses a network link
that is one to two orders of magnitude slower (tens of GB/s against 0.1-10 Gbit/s here). Algorithms
that know which ranks share a node can keep most traffic inside it: the hierarchical all-reduce
(``hierarchical.py``) and ``ProcessMesh``, which keeps tensor-parallel groups on one node
(``minidist/parallel/mesh.py``). :func:`node_layout` tells them, for any group:

* ``node_of_rank[g]``: the node index of group rank ``g``; nodes are numbered ``0 .. nodes-1`` in the
  order in which they first appear in the group's rank order (so group rank 0 is on node 0);
* ``local_rank``/``local_size``: this rank's position among the group's ranks on its node;
* ``node_group``: those ranks, as a Communicator (ordered by group rank);
* ``leader_group``: one rank per node (the one with ``local_rank`` 0), ordered by node index; None on
  the other ranks.

**How nodes are found.** MPI knows which processes can share memory: ``MPI_Comm_split_type`` with
``MPI_COMM_TYPE_SHARED`` (MPI 3.0, §6.4.2) splits a communicator into one piece per shared-memory
node. Each piece names itself by its lowest group rank, and one all-gather of those names over the
group numbers the nodes. (The host names are gathered too, for messages: ``layout.hostnames``.)

**Simulated nodes, for teaching and testing on one machine.** With ``MINIDIST_RANKS_PER_NODE=R`` in
the environment, consecutive blocks of ``R`` world ranks count as separate nodes (world ranks
``0..R-1`` are node 0, ``R..2R-1`` node 1, ...; the last node may be shorter when ``R`` does not divide
the world size). Nodes found by MPI are split further, never merged: a simulated node never spans
two real ones. ``mpiexec`` places ranks in blocks the same way (``-hosts a:R,b:R``, and Slurm's block
distribution), so a run on a real cluster with R ranks per node gives the same layout as the
simulation (``tests/distributed/test_topology.py`` checks this on a cluster of network namespaces).

The layout is computed once per group (collectively, by every rank of the group at the same point)
and cached on the Communicator: later calls cost an attribute look-up.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

from mpi4py import MPI

from minidist.distributed import world
from minidist.distributed.comm import Communicator
from minidist.distributed.world import group_or_world

RANKS_PER_NODE_ENV = "MINIDIST_RANKS_PER_NODE"


@dataclass(frozen=True)
class NodeLayout:
    """How one group's ranks sit on nodes, seen from this rank (see the module docstring).

    ``node_of_rank``: tuple of ``group.size`` ints, the node index of each group rank. ``nodes``: the
    number of nodes the group spans. ``local_rank``/``local_size``: this rank's index among the group's
    ranks on its node, and their number. ``node_group``: a Communicator of those ranks (the group itself
    when the group is on one node). ``leader_group``: a Communicator of the ``local_rank == 0`` ranks,
    rank ``i`` in it being node ``i``'s leader; None on non-leaders. ``hostnames``: the processor name
    of every group rank (for messages). ``spans_nodes``: ``nodes > 1``.
    """

    node_of_rank: tuple[int, ...]
    local_rank: int
    local_size: int
    node_group: Communicator = field(repr=False)
    leader_group: Communicator | None = field(repr=False)
    hostnames: tuple[str, ...] = field(repr=False)

    @property
    def nodes(self) -> int:
        return max(self.node_of_rank) + 1

    @property
    def spans_nodes(self) -> bool:
        return self.nodes > 1


def simulated_ranks_per_node() -> int | None:
    """``MINIDIST_RANKS_PER_NODE`` as an int, or None when unset or empty.

    Raises ``ValueError`` (naming the variable and the value) unless it is an integer >= 1.
    """
    text = os.environ.get(RANKS_PER_NODE_ENV, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(
            f"{RANKS_PER_NODE_ENV}={text!r} must be a whole number >= 1 (the number of consecutive "
            f"world ranks that count as one node), or unset to use the real nodes"
        )
    return value


def node_layout(group: Communicator | None = None) -> NodeLayout:
    """The :class:`NodeLayout` of ``group`` (default: the world); computed once, then cached.

    Collective over ``group`` the first time (every rank must call it at the same point); it then makes
    one ``MPI_Comm_split_type`` (and a min-reduce inside each piece), one all-gather over the group and
    up to two splits (``node_group``, ``leader_group``).
    Raises ``ValueError`` on every rank if ``MINIDIST_RANKS_PER_NODE`` is malformed on any rank or
    differs between ranks (it would describe two different clusters).
    """
    group = group_or_world(group)
    cached = group._node_layout
    if cached is not None:
        return cached
    layout = _compute(group)
    group._node_layout = layout
    return layout


def has_hierarchy(layout: NodeLayout) -> bool:
    """True if the group spans several nodes and at least one node holds more than one of its ranks.

    Otherwise (one node, or one rank per node) ``algorithm="hierarchical"`` runs the flat algorithm
    ``tuning.py`` picks for the group: the three steps of ``algorithms/hierarchical.py`` would only
    add messages.
    """
    return 1 < layout.nodes < len(layout.node_of_rank)


@functools.cache  # asked by every all_reduce(algorithm="auto"); the answer never changes in a run
def world_spans_nodes() -> bool:
    """True if the world's ranks sit on more than one node, real or simulated.

    ``algorithm="auto"`` asks this first: when it is False no group spans nodes, and no layout needs
    computing. Uses what :func:`~minidist.distributed.world.init` found (no communication).
    """
    world.init()
    rpn = simulated_ranks_per_node()
    world_size = world.get_world_size()
    return world.node_count() > 1 or (rpn is not None and rpn < world_size)


def _compute(group: Communicator) -> NodeLayout:
    mpi = group.mpi
    # 1. The real nodes: one piece per shared-memory domain, named by its lowest group rank.
    shared = mpi.Split_type(MPI.COMM_TYPE_SHARED, key=group.rank)
    real_node = shared.allreduce(group.rank, op=MPI.MIN)
    shared.Free()
    # 2. The simulated ones: blocks of R world ranks. Read and checked on every rank, then agreed on,
    # so a bad or uneven setting raises the same error everywhere instead of hanging a split below.
    try:
        rpn, problem = simulated_ranks_per_node(), ""
    except ValueError as error:
        rpn, problem = None, str(error)
    world_rank = MPI.COMM_WORLD.Get_rank()
    block = world_rank // rpn if rpn else 0
    gathered = mpi.allgather((real_node, block, rpn, problem, MPI.Get_processor_name()))
    problems = sorted({p for *_, p, _ in gathered if p})
    if problems:
        raise ValueError(problems[0])
    settings = sorted({str(r) for _, _, r, _, _ in gathered})
    if len(settings) > 1:
        raise ValueError(
            f"{RANKS_PER_NODE_ENV} differs between ranks ({', '.join(settings)}; 'None' = unset); "
            "set it to the same value for every rank, e.g. in the environment of mpiexec"
        )
    # 3. Number the nodes in order of first appearance, so group rank 0 is on node 0.
    numbers: dict[tuple[int, int], int] = {}
    node_of_rank = tuple(numbers.setdefault((real, blk), len(numbers)) for real, blk, *_ in gathered)
    mine = node_of_rank[group.rank]
    peers = [g for g, n in enumerate(node_of_rank) if n == mine]
    local_rank = peers.index(group.rank)
    # 4. The two communicators of the hierarchy. On one node the node group is the group itself.
    base = group.name or "group"
    if len(numbers) == 1:
        node_group = group
    else:
        node_group = group.split(color=mine, key=group.rank, name=f"{base}.node")
    leader_group = group.split(color=0 if local_rank == 0 else None, key=mine, name=f"{base}.leaders")
    return NodeLayout(
        node_of_rank=node_of_rank,
        local_rank=local_rank,
        local_size=len(peers),
        node_group=node_group,  # type: ignore[arg-type]  # never None: every rank has a color
        leader_group=leader_group,
        hostnames=tuple(str(h) for *_, h in gathered),
    )

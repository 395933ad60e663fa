"""``ProcessMesh``: the world's ranks laid out as a dp x tp x pp x cp grid, with one communicator per axis.

3-D parallelism (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", SC 2021, §3) gives every rank three coordinates: which data-parallel replica
(``dp_rank``), which tensor-parallel shard (``tp_rank``) and which pipeline stage (``pp_rank``) it
holds. Context parallelism adds a fourth, ``cp_rank``: which part of the *sequence* the rank holds
(ring attention, Liu et al. 2023; ``minidist/parallel/context_parallel/``). Each axis gets its own
communicator: the ranks that differ *only* in that coordinate.

**Rank order** (Megatron-LM's default, "tp-cp-dp-pp"): tp varies fastest, then cp, then dp, then pp::

    rank = pp_rank * (dp * cp * tp) + dp_rank * (cp * tp) + cp_rank * tp + tp_rank

With ``cp = 1`` (the default) this is the 3-D order ``pp_rank * (dp * tp) + dp_rank * tp + tp_rank``.
Why tp fastest: tensor parallelism all-reduces activations in every layer's forward and backward,
the most frequent and latency-sensitive traffic. MPI launchers place consecutive ranks on the same
machine, so with ``tp <= GPUs per node`` a tp group never leaves its node (fast NVLink / shared
memory). cp comes next: ring attention passes key/value blocks in every attention layer, less often
than tp's all-reduces but far more than dp (once per step) and pp (point-to-point, small).

Example, ``ProcessMesh(dp=2, tp=2, pp=1, cp=2)`` on 8 ranks (``str(mesh)`` draws it)::

    ProcessMesh(dp=2, tp=2, pp=1, cp=2): 8 ranks, rank = pp_rank*8 + dp_rank*4 + cp_rank*2 + tp_rank
                 tp0 tp1
      dp0 cp0      0   1
      dp0 cp1      2   3
      dp1 cp0      4   5
      dp1 cp1      6   7

the tp groups are {0,1} {2,3} {4,5} {6,7}, the cp groups {0,2} {1,3} {4,6} {5,7}, the dp groups
{0,4} {1,5} {2,6} {3,7}. The cp ranks of one dp replica hold the same weights and see different
tokens, so for the weights they are data-parallel too: gradients are averaged over ``dp_cp_group``,
the ``dp * cp`` ranks with the same (tp, pp) coordinates, here {0,2,4,6} and {1,3,5,7}.
With ``ProcessMesh(dp=2, tp=2, pp=2)`` (cp = 1) the tp groups are {0,1} {2,3} {4,5} {6,7}, the dp
groups {0,2} {1,3} {4,6} {5,7}, the pp groups {0,4} {1,5} {2,6} {3,7}.

**Nodes.** The mesh knows which ranks share a machine (``minidist.distributed.topology``: MPI's
shared-memory split, or ``MINIDIST_RANKS_PER_NODE`` to simulate nodes): ``mesh.nodes`` and
``mesh.node_of_rank``. The rank order above already keeps each tp group inside a node whenever ``tp``
divides the number of ranks per node ``R`` and the launcher places ranks in blocks of ``R`` (mpiexec's
``-hosts a:R,b:R``, Slurm's block distribution): a tp group is ``tp`` consecutive ranks starting at a
multiple of ``tp``, and a block of ``R`` ranks starting at a multiple of ``R`` holds ``R / tp`` whole tp
groups. Likewise a cp group (stride ``tp``, ``cp`` members) stays inside a node when ``tp * cp`` divides
``R``. When a tp group does span nodes (``tp`` larger than ``R``, or not dividing it, or a launcher that
places ranks round-robin), the mesh still works, but every layer's all-reduce crosses the network: the
first rank of each such tp group warns with a :class:`PlacementWarning` naming the group, its nodes and
what to change.
"""

from __future__ import annotations

import operator
import warnings
from typing import Any

from minidist.distributed.comm import Communicator
from minidist.distributed.safety.agreement import agree
from minidist.distributed.topology import node_layout, world_spans_nodes
from minidist.distributed.world import group_or_world

AXES = ("dp", "tp", "pp", "cp")


class PlacementWarning(UserWarning):
    """A ``ProcessMesh`` layout puts a tensor-parallel group on more than one node (see the module
    docstring): correct, but each layer's all-reduce crosses the network."""


def mesh_coords4(rank: int, dp: int, tp: int, pp: int, cp: int = 1) -> tuple[int, int, int, int]:
    """``(dp_rank, tp_rank, pp_rank, cp_rank)`` of ``rank`` in a dp x tp x pp x cp mesh (tp fastest,
    then cp, dp, pp)."""
    del pp  # the slowest axis needs no modulus; kept in the signature for symmetry with mesh_rank
    return (rank // (cp * tp)) % dp, rank % tp, rank // (dp * cp * tp), (rank // tp) % cp


def mesh_coords(rank: int, dp: int, tp: int, pp: int, cp: int = 1) -> tuple[int, int, int]:
    """``(dp_rank, tp_rank, pp_rank)`` of ``rank`` (as ``ProcessMesh.coords``); :func:`mesh_coords4`
    adds ``cp_rank``."""
    return mesh_coords4(rank, dp, tp, pp, cp)[:3]


def mesh_rank(
    dp_rank: int, tp_rank: int, pp_rank: int, dp: int, tp: int, cp_rank: int = 0, cp: int = 1
) -> int:
    """The world rank at coordinates ``(dp_rank, tp_rank, pp_rank, cp_rank)``: the inverse of
    :func:`mesh_coords4` (``cp_rank`` and ``cp`` are keyword-friendly additions; 0 and 1 by default)."""
    return pp_rank * (dp * cp * tp) + dp_rank * (cp * tp) + cp_rank * tp + tp_rank


def draw_grid(dp: int, tp: int, pp: int, cp: int = 1) -> str:
    """A text picture of the mesh: one table per pipeline stage, one row per (dp, cp) pair (cp within
    dp), tp columns of world ranks."""
    world = dp * tp * pp * cp
    width = len(str(world - 1)) + 3
    if cp == 1:
        title = (
            f"ProcessMesh(dp={dp}, tp={tp}, pp={pp}): {world} ranks, rank = pp_rank*{dp * tp} + dp_rank*{tp}"
        )
    else:
        title = (
            f"ProcessMesh(dp={dp}, tp={tp}, pp={pp}, cp={cp}): {world} ranks, "
            f"rank = pp_rank*{dp * cp * tp} + dp_rank*{cp * tp} + cp_rank*{tp}"
        )
    lines = [title + " + tp_rank"]
    label_width = 8 if cp == 1 else 12
    header = " " * label_width + "".join(f"tp{t}".rjust(width) for t in range(tp))
    for s in range(pp):
        lines.append(f"pp stage {s}:" if pp > 1 else "")
        lines.append(header)
        for d in range(dp):
            for c in range(cp):
                ranks = "".join(str(mesh_rank(d, t, s, dp, tp, c, cp)).rjust(width) for t in range(tp))
                label = f"  dp{d}" if cp == 1 else f"  dp{d} cp{c}"
                lines.append(label.ljust(label_width) + ranks)
    return "\n".join(line for line in lines if line)


class ProcessMesh:
    """The ranks of ``comm`` arranged as a dp x tp x pp x cp grid (the module docstring gives the order).

    Collective: every rank of ``comm`` (default: the world) must construct it together, with the same
    sizes. Attributes: ``dp``, ``tp``, ``pp``, ``cp``, ``world_size``, ``rank``, ``dp_rank``,
    ``tp_rank``, ``pp_rank``, ``cp_rank``, ``coords`` = ``(dp_rank, tp_rank, pp_rank)`` (kept 3-D for
    the code written before cp), ``coords4`` = ``(dp_rank, tp_rank, pp_rank, cp_rank)``, and the
    communicators ``world``, ``dp_group`` (the ``dp`` ranks holding the same shard of the same stage
    and the same part of the sequence), ``tp_group`` (the ``tp`` ranks sharing one layer's weights,
    rank i in it = ``tp_rank`` i), ``pp_group`` (the ``pp`` stages of one model replica, rank i =
    stage i), ``cp_group`` (the ``cp`` ranks splitting one sequence, rank i = ``cp_rank`` i: ring
    attention's ring) and ``dp_cp_group`` (the ``dp * cp`` ranks holding the same weights, rank
    ``dp_rank * cp + cp_rank`` in it: average gradients over this one when cp > 1), each carrying
    its axis as ``name`` (``"tp"``, ``"dp"``, ``"pp"``, ``"cp"``, ``"dp_cp"``: how traces label their
    bytes). ``nodes``: the number of nodes ``comm`` spans; ``node_of_rank``: tuple of ``world_size``
    node indices, one per rank of ``comm`` (``minidist.distributed.topology``). ``str(mesh)`` draws
    the grid.

    Warns ``PlacementWarning`` (on the first rank of each tp group that spans nodes).

    Raises (on every rank: the sizes are compared across ranks before anything can fail):
        TypeError: a size is not an int (NumPy integers are accepted; bools are not).
        ValueError: a size is < 1, the ranks passed different sizes, or ``dp * tp * pp * cp`` differs
            from the world size (the message names the sizes, their product and the world size).
    """

    def __init__(
        self, dp: int = 1, tp: int = 1, pp: int = 1, cp: int = 1, comm: Communicator | None = None
    ) -> None:
        world = group_or_world(comm)
        # Agree before raising: a rank with bad or different sizes must not leave the others waiting in
        # the splits below. NumPy integers count as ints (normalised to Python ints); anything else
        # travels as its repr, so the error can show it.
        sizes = {"dp": _as_int(dp), "tp": _as_int(tp), "pp": _as_int(pp), "cp": _as_int(cp)}
        agree(
            sizes,
            _size_error(sizes),
            world,
            what="ProcessMesh",
            fix="every rank must pass the same dp, tp and pp (and cp)",
        )
        dp, tp, pp, cp = (sizes[k] for k in AXES)
        if dp * tp * pp * cp != world.size:  # the same sizes on every rank now: all raise alike
            names, values = (
                ("dp*tp*pp", f"{dp}*{tp}*{pp}") if cp == 1 else ("dp*tp*pp*cp", f"{dp}*{tp}*{pp}*{cp}")
            )
            raise ValueError(
                f"ProcessMesh: {names} = {values} = {dp * tp * pp * cp} but the world has {world.size} "
                f"ranks; choose sizes whose product is {world.size}, or launch {dp * tp * pp * cp} ranks"
            )
        self.dp, self.tp, self.pp, self.cp = dp, tp, pp, cp
        self.world = world
        self.world_size = world.size
        self.rank = world.rank
        self.coords4 = mesh_coords4(world.rank, dp, tp, pp, cp)
        self.dp_rank, self.tp_rank, self.pp_rank, self.cp_rank = self.coords4
        self.coords = self.coords4[:3]
        # One split per axis: ranks with equal "other" coordinates share a color; the key orders the
        # group by the axis's own coordinate, so rank i of tp_group is tp_rank i (and so on). The splits
        # run in the same order on every rank (each is collective over the world).
        d, t, p, c = self.coords4
        self.tp_group = world.split(color=(p * dp + d) * cp + c, key=t, name="tp")
        self.dp_group = world.split(color=(p * cp + c) * tp + t, key=d, name="dp")
        self.pp_group = world.split(color=(d * cp + c) * tp + t, key=p, name="pp")
        self.cp_group = world.split(color=(p * dp + d) * tp + t, key=c, name="cp")
        # Its own communicator even when cp = 1 (the same ranks as dp_group): DDP's communication
        # thread may work on one while the training loop uses the other, and a communicator serves one
        # thread at a time.
        self.dp_cp_group = world.split(color=p * tp + t, key=d * cp + c, name="dp_cp")
        # Which ranks share a node: without nodes (the usual single machine) no communication at all.
        if world_spans_nodes():
            layout = node_layout(world)
            self.node_of_rank, hostnames = layout.node_of_rank, layout.hostnames
        else:
            self.node_of_rank, hostnames = (0,) * world.size, ()
        self.nodes = max(self.node_of_rank) + 1
        if self.nodes > 1 and t == 0:  # the first rank of each tp group speaks for it
            self._warn_if_tp_spans_nodes(hostnames)

    def _warn_if_tp_spans_nodes(self, hostnames: tuple[str, ...]) -> None:
        """Warn (:class:`PlacementWarning`) if this rank's tp group has ranks on more than one node."""
        members = [self.rank_of(self.dp_rank, t, self.pp_rank, self.cp_rank) for t in range(self.tp)]
        nodes = sorted({self.node_of_rank[r] for r in members})
        if len(nodes) == 1:
            return
        per_node = [self.node_of_rank.count(n) for n in range(self.nodes)]
        fits = min(per_node)
        hosts = [hostnames[self.node_of_rank.index(n)] for n in nodes] if hostnames else []
        named = len(set(hosts)) == len(nodes)  # simulated nodes (MINIDIST_RANKS_PER_NODE) share a host name
        where = ", ".join(
            f"node {n}" + (f" ({host})" if named else "") for n, host in zip(nodes, hosts or nodes)
        )
        warnings.warn(
            f"{self!r}: tp group of world ranks {members} spans {where}, so every layer's tensor-parallel "
            f"all-reduce crosses the network. The nodes hold {per_node} ranks; choose tp dividing "
            f"{fits} (e.g. tp={_largest_divisor_at_most(fits, self.tp)}) and move the rest to dp or pp, "
            "or launch more ranks per node, in blocks (mpiexec -hosts a:R,b:R)",
            PlacementWarning,
            stacklevel=3,
        )

    def rank_of(self, dp_rank: int, tp_rank: int, pp_rank: int, cp_rank: int = 0) -> int:
        """The world rank at the given coordinates. Raises ``ValueError`` for a coordinate out of range."""
        coords, sizes = (dp_rank, tp_rank, pp_rank, cp_rank), (self.dp, self.tp, self.pp, self.cp)
        for name, value, size in zip(AXES, coords, sizes):
            if not 0 <= value < size:
                raise ValueError(f"{name}_rank must be in [0, {size}), got {value}")
        return mesh_rank(dp_rank, tp_rank, pp_rank, self.dp, self.tp, cp_rank, self.cp)

    def __repr__(self) -> str:
        if self.cp == 1:
            return f"ProcessMesh(dp={self.dp}, tp={self.tp}, pp={self.pp}; rank {self.rank} at {self.coords})"
        return (
            f"ProcessMesh(dp={self.dp}, tp={self.tp}, pp={self.pp}, cp={self.cp}; rank {self.rank} at "
            f"(dp, tp, pp, cp) = {self.coords4})"
        )

    def __str__(self) -> str:
        return draw_grid(self.dp, self.tp, self.pp, self.cp)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_int(value: Any) -> Any:
    """``value`` as a Python int if it is an integer (an int or NumPy integer, not a bool), else its repr."""
    if isinstance(value, bool):  # True == 1 would silently pass as a size
        return repr(value)
    try:
        return operator.index(value)  # int, np.int64, ...; np.bool_ and floats raise TypeError
    except TypeError:
        return repr(value)


def _size_error(sizes: dict[str, Any]) -> Exception | None:
    """What is wrong with this rank's sizes on their own (as an exception to raise), or None."""
    for name, value in sizes.items():
        if not _is_int(value):
            return TypeError(f"ProcessMesh: {name} must be an int, got {value}")
        if value < 1:
            return ValueError(f"ProcessMesh: {name} must be >= 1, got {name}={value}")
    return None


def _largest_divisor_at_most(n: int, limit: int) -> int:
    """The largest divisor of ``n`` that is ``<= limit`` (a tp size that fits ``n`` ranks per node)."""
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)

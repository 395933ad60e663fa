"""``ProcessMesh``: the world's ranks laid out as a dp x tp x pp grid, with one communicator per axis.

3-D parallelism (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", SC 2021, §3) gives every rank three coordinates: which data-parallel replica
(``dp_rank``), which tensor-parallel shard (``tp_rank``) and which pipeline stage (``pp_rank``) it
holds. Each axis gets its own communicator: the ranks that differ *only* in that coordinate.

**Rank order** (Megatron-LM's default): tp varies fastest, then dp, then pp::

    rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank

Why tp fastest: tensor parallelism all-reduces activations in every layer's forward and backward,
the most frequent and latency-sensitive traffic of the three. MPI launchers place consecutive ranks
on the same machine, so with ``tp <= GPUs per node`` a tp group never leaves its node (fast NVLink /
shared memory), while dp (once per step) and pp (point-to-point, small) cross the network.

Example, ``ProcessMesh(dp=2, tp=2, pp=2)`` on 8 ranks: the tp groups are {0,1} {2,3} {4,5} {6,7},
the dp groups {0,2} {1,3} {4,6} {5,7}, the pp groups {0,4} {1,5} {2,6} {3,7}.
"""

from __future__ import annotations

import operator
from typing import Any

from minidist.distributed.agreement import agree
from minidist.distributed.comm import Communicator, group_or_world

AXES = ("dp", "tp", "pp")


def mesh_coords(rank: int, dp: int, tp: int, pp: int) -> tuple[int, int, int]:
    """``(dp_rank, tp_rank, pp_rank)`` of ``rank`` in a dp x tp x pp mesh (tp fastest, pp slowest)."""
    del pp  # the slowest axis needs no modulus; kept in the signature for symmetry with mesh_rank
    return (rank // tp) % dp, rank % tp, rank // (dp * tp)


def mesh_rank(dp_rank: int, tp_rank: int, pp_rank: int, dp: int, tp: int) -> int:
    """The world rank at coordinates ``(dp_rank, tp_rank, pp_rank)``: the inverse of :func:`mesh_coords`."""
    return pp_rank * (dp * tp) + dp_rank * tp + tp_rank


def draw_grid(dp: int, tp: int, pp: int) -> str:
    """A text picture of the mesh: one table per pipeline stage, dp rows by tp columns of world ranks."""
    width = len(str(dp * tp * pp - 1)) + 3
    lines = [
        f"ProcessMesh(dp={dp}, tp={tp}, pp={pp}): {dp * tp * pp} ranks, "
        f"rank = pp_rank*{dp * tp} + dp_rank*{tp} + tp_rank",
    ]
    header = " " * 8 + "".join(f"tp{t}".rjust(width) for t in range(tp))
    for s in range(pp):
        lines.append(f"pp stage {s}:" if pp > 1 else "")
        lines.append(header)
        for d in range(dp):
            ranks = "".join(str(mesh_rank(d, t, s, dp, tp)).rjust(width) for t in range(tp))
            lines.append(f"  dp{d}".ljust(8) + ranks)
    return "\n".join(line for line in lines if line)


class ProcessMesh:
    """The ranks of ``comm`` arranged as a dp x tp x pp grid (see the module docstring for the order).

    Collective: every rank of ``comm`` (default: the world) must construct it together, with the same
    sizes. Attributes: ``dp``, ``tp``, ``pp``, ``world_size``, ``rank``, ``dp_rank``, ``tp_rank``,
    ``pp_rank``, ``coords`` = ``(dp_rank, tp_rank, pp_rank)``, and the communicators ``world``,
    ``dp_group`` (the ``dp`` ranks holding the same shard of the same stage), ``tp_group`` (the ``tp``
    ranks sharing one layer's weights, rank i in it = ``tp_rank`` i) and ``pp_group`` (the ``pp`` stages
    of one model replica, rank i = stage i). ``str(mesh)`` draws the grid.

    Raises (on every rank: the sizes are compared across ranks before anything can fail):
        TypeError: a size is not an int (NumPy integers are accepted; bools are not).
        ValueError: a size is < 1, the ranks passed different sizes, or ``dp * tp * pp`` differs from
            the world size (the message names all four numbers).
    """

    def __init__(self, dp: int = 1, tp: int = 1, pp: int = 1, comm: Communicator | None = None) -> None:
        world = group_or_world(comm)
        # Agree before raising: a rank with bad or different sizes must not leave the others waiting in
        # the splits below. NumPy integers count as ints (normalised to Python ints); anything else
        # travels as its repr, so the error can show it.
        sizes = {"dp": _as_int(dp), "tp": _as_int(tp), "pp": _as_int(pp)}
        agree(
            sizes,
            _size_error(sizes),
            world,
            what="ProcessMesh",
            fix="every rank must pass the same dp, tp and pp",
        )
        dp, tp, pp = (sizes[k] for k in AXES)
        if dp * tp * pp != world.size:  # the same sizes on every rank now: all raise alike
            raise ValueError(
                f"ProcessMesh: dp*tp*pp = {dp}*{tp}*{pp} = {dp * tp * pp} but the world has {world.size} "
                f"ranks; choose sizes whose product is {world.size}, or launch {dp * tp * pp} ranks"
            )
        self.dp, self.tp, self.pp = dp, tp, pp
        self.world = world
        self.world_size = world.size
        self.rank = world.rank
        self.dp_rank, self.tp_rank, self.pp_rank = mesh_coords(world.rank, dp, tp, pp)
        self.coords = (self.dp_rank, self.tp_rank, self.pp_rank)
        # One split per axis: ranks with equal "other" coordinates share a color; the key orders the
        # group by the axis's own coordinate, so rank i of tp_group is tp_rank i (and so on).
        d, t, p = self.coords
        self.tp_group = world.split(color=p * dp + d, key=t)
        self.dp_group = world.split(color=p * tp + t, key=d)
        self.pp_group = world.split(color=d * tp + t, key=p)

    def rank_of(self, dp_rank: int, tp_rank: int, pp_rank: int) -> int:
        """The world rank at the given coordinates. Raises ``ValueError`` for a coordinate out of range."""
        for name, value, size in zip(AXES, (dp_rank, tp_rank, pp_rank), (self.dp, self.tp, self.pp)):
            if not 0 <= value < size:
                raise ValueError(f"{name}_rank must be in [0, {size}), got {value}")
        return mesh_rank(dp_rank, tp_rank, pp_rank, self.dp, self.tp)

    def __repr__(self) -> str:
        return f"ProcessMesh(dp={self.dp}, tp={self.tp}, pp={self.pp}; rank {self.rank} at {self.coords})"

    def __str__(self) -> str:
        return draw_grid(self.dp, self.tp, self.pp)


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

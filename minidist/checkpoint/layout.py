"""Who holds what: the mesh coordinates of this rank, global tensor names, and who writes each shard.

Every tensor is identified by its *global* name (the name in the full, unpartitioned model), its
global shape, dtype and ``tp_dim`` (the conventions of ``minidist.parallel``): a parameter with
``tp_dim = d`` is the ``tp_rank``-th of ``tp`` equal slices of the global tensor along axis ``d``;
``tp_dim = None`` means replicated. Wrappers are looked through: ``DistributedDataParallel.module``
and ``PipelineParallel.stage_module`` (whose names are already global).

Data-parallel replicas hold identical copies, and replicated (``tp_dim = None``) tensors are also
identical across the tensor-parallel group. Each distinct shard is therefore written once, by one of
the ranks that hold it, chosen so that every rank writes about the same number of bytes (greedy
largest-first balancing). All ranks of a pipeline stage compute the same assignment locally, since
they hold the same names and shapes: no communication is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minidist.nn.module import Module, Parameter


@dataclass(frozen=True)
class Layout:
    """This rank's place in the run: world rank and size, mesh sizes and coordinates."""

    rank: int
    world_size: int
    dp: int
    tp: int
    pp: int
    dp_rank: int
    tp_rank: int
    pp_rank: int

    def describe(self) -> dict[str, int]:
        """The mesh sizes as the manifest records them."""
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "world_size": self.world_size}


def layout_of(mesh: Any, comm: Any) -> Layout:
    """The ``Layout`` from a ``ProcessMesh``, or pure data parallelism over ``comm`` when mesh is None."""
    rank, size = comm.rank, comm.size
    if mesh is None:
        return Layout(rank, size, size, 1, 1, rank, 0, 0)
    if int(mesh.world_size) != size:
        raise ValueError(
            f"the mesh has {mesh.world_size} ranks but the world has {size}; pass the run's mesh"
        )
    return Layout(
        rank, size, int(mesh.dp), int(mesh.tp), int(mesh.pp), int(mesh.dp_rank), int(mesh.tp_rank),
        int(mesh.pp_rank),
    )  # fmt: skip


def unwrap(model: Any) -> Module:
    """The module whose ``named_parameters()`` give global names (looks through DDP and pipelines)."""
    while True:
        if hasattr(model, "stage_module"):  # PipelineParallel: this rank's stage, global names
            model = model.stage_module
        elif type(model).__name__ == "DistributedDataParallel" and hasattr(model, "module"):
            model = model.module
        else:
            break
    if not isinstance(model, Module):
        raise TypeError(f"checkpoint needs a minidist Module, got a {type(model).__name__}")
    return model


def tp_dim_of(p: Parameter) -> int | None:
    """The axis along which ``p`` is split over the tp group, or None if replicated (``tp_dim``)."""
    return getattr(p, "tp_dim", None)


def global_shape(shape: tuple[int, ...], tp_dim: int | None, tp: int) -> list[int]:
    """The shape of the full tensor whose ``tp_rank``-th slice along ``tp_dim`` has ``shape``."""
    out = list(shape)
    if tp_dim is not None:
        out[tp_dim] *= tp
    return out


def assign_writers(
    items: list[tuple[str, int, int | None]], layout: Layout
) -> dict[tuple[str, int | None], int]:
    """Choose which world rank writes each distinct shard of this pipeline stage.

    Args:
        items: ``(key, nbytes, tp_dim)`` for every tensor this rank holds; the same list on every rank
            of the stage (names and local shapes agree across dp and tp).

    Returns:
        ``{(key, tp_rank or None): world rank}``: a tp-sharded tensor has one shard per tp rank, each
        written by a dp replica at that tp rank; a replicated one is written by any rank of the stage.
    """
    L = layout
    stage_ranks = [(L.pp_rank * L.dp + d) * L.tp + t for d in range(L.dp) for t in range(L.tp)]
    load = dict.fromkeys(stage_ranks, 0)
    shards: list[tuple[int, str, int | None]] = []
    for key, nbytes, tp_dim in items:
        if tp_dim is None:
            shards.append((nbytes, key, None))
        else:
            shards.extend((nbytes, key, t) for t in range(L.tp))
    writers = {}
    for nbytes, key, t in sorted(shards, key=lambda s: (-s[0], s[1], -1 if s[2] is None else s[2])):
        candidates = stage_ranks if t is None else [r for r in stage_ranks if r % L.tp == t]
        chosen = min(candidates, key=lambda r: (load[r], r))
        load[chosen] += nbytes
        writers[(key, t)] = chosen
    return writers

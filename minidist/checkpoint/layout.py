"""Who holds what: this rank's mesh coordinates, global tensor names, who writes and who reads each shard.

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

Resharding, on load (the second half of this file): a tensor saved with ``tp_dim = d`` at
tensor-parallel size ``T`` is stored as ``T`` shards whose concatenation along ``d`` is the global
tensor (Megatron-LM's column/row split, Shoeybi et al. 2019, §3). A rank now at tensor-parallel size
``T'`` with ``tp_dim = d'`` needs slice ``tp_rank`` of ``T'`` equal slices along ``d'``. If nothing
changed (``d' = d``, ``T' = T``) that is just its old shard, read as is (the bit-exact path);
otherwise the global tensor is assembled and sliced. Data-parallel and pipeline changes need no
arithmetic at all: replicas are copies, and a stage simply reads the global names it now owns. Every
path copies values, so a resharded model holds the very same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from minidist.checkpoint.errors import CheckpointError
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


# --- resharding: this rank's piece of a global tensor, from the shards another layout saved ------
def needed_shards(entry: dict[str, Any], tp: int, tp_rank: int, tp_dim: int | None) -> list[dict[str, Any]]:
    """The shard records (``{"file", "tp_rank", "shape"}``) this rank must read for ``entry``."""
    # BEGIN SOLUTION A6.1: only this rank's own shard if the split is unchanged, else every shard
    shards = entry["shards"]
    if tp_dim is not None and entry["tp_dim"] == tp_dim and len(shards) == tp:
        return [shards[tp_rank]]
    return shards
    # END SOLUTION


def local_piece(
    key: str, entry: dict[str, Any], arrays: list[np.ndarray], tp: int, tp_rank: int, tp_dim: int | None
) -> np.ndarray:
    """This rank's array of ``entry`` from the arrays of :func:`needed_shards` (same order).

    Raises ``CheckpointError`` if the global tensor cannot be cut into ``tp`` equal slices along
    ``tp_dim`` (the model's tensor-parallel size does not divide that dimension).
    """
    # BEGIN SOLUTION A6.1: assemble along the saved tp_dim, check, slice along this model's tp_dim
    if len(arrays) == 1 and len(entry["shards"]) > 1:  # the fast path: our own shard, unchanged
        return arrays[0]
    # One shard is the whole tensor already (no copy); several are concatenated along the saved tp_dim.
    full = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=entry["tp_dim"])
    if list(full.shape) != list(entry["global_shape"]):
        raise CheckpointError(
            f"tensor {key!r}: its shards assemble to shape {list(full.shape)} but the manifest says "
            f"{entry['global_shape']} (corrupt manifest?)"
        )
    if tp_dim is None:
        return full
    if full.shape[tp_dim] % tp:
        raise CheckpointError(
            f"tensor {key!r} of global shape {list(full.shape)} cannot be split into {tp} equal "
            f"tensor-parallel slices along axis {tp_dim}; choose a tp size that divides {full.shape[tp_dim]}"
        )
    return np.split(full, tp, axis=tp_dim)[tp_rank]
    # END SOLUTION

"""Who holds what: this rank's mesh coordinates, global tensor names, who writes and who reads each shard.

Every tensor is identified by its *global* name (the name in the full, unpartitioned model), its
global shape, dtype, ``tp_dim`` and ``tp_stride`` (``nn.Parameter``): a parameter with ``tp_dim = d``
is the ``tp_rank``-th of ``tp`` pieces of the full tensor along axis ``d``, cut by THE rule of
``parallel/tensor_parallel/split.py`` (even; uneven as ``numpy.array_split``, the first pieces one
longer; or strided: piece ``tp_rank`` of each of ``tp_stride`` equal blocks, attention's [q; k; v]).
``tp_dim = None`` means replicated. Wrappers are looked through: ``DistributedDataParallel.module``
and ``PipelineParallel.stage_module`` (whose names are already global).

Data-parallel and context-parallel replicas hold identical copies (a cp rank holds the whole weights
of its shard, like a dp replica: only the sequence is split), and replicated (``tp_dim = None``)
tensors are also identical across the tensor-parallel group. Each distinct shard is therefore written
once, by one of the ranks that hold it, chosen so that every rank writes about the same number of
bytes (greedy largest-first balancing). All ranks of a pipeline stage compute the same assignment
from the same sizes (``save`` all-gathers each rank's piece sizes first: uneven pieces differ in size
between tp ranks). A tied copy (``is_tied_copy``: the output head's copy of the token embedding on
the last pipeline stage) is not written at all: the original, saved under the same name, is it.

Resharding, on load (the second half of this file): a tensor saved with ``tp_dim = d`` at
tensor-parallel size ``T`` is stored as ``T`` pieces, which are put back where split.py took them
from to give the full tensor (a plain concatenation along ``d`` unless strided; Megatron-LM's
column/row split, Shoeybi et al. 2019, §3). A rank now at tensor-parallel size ``T'`` with
``tp_dim = d'`` and stride ``s'`` needs split.py's piece ``tp_rank`` of ``T'`` along ``d'``. If
nothing changed (same axis, size and stride) that is just its old shard, read as is (the bit-exact
path); otherwise the full tensor is assembled and cut. Data-parallel, context-parallel and pipeline
changes need no arithmetic at all: replicas are copies, and a stage simply reads the global names it
now owns. Every path copies values, so a resharded model holds the very same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from minidist.checkpoint.errors import CheckpointError
from minidist.nn.module import Module, Parameter

# split.py (the rule that cuts tp pieces) is imported inside piece_shape and local_piece, not here:
# importing minidist.parallel imports its layers and with them MPI, and importing this package must
# not (``minidist checkpoint info`` runs without MPI). It is no import cycle: parallel never imports us.


@dataclass(frozen=True)
class Layout:
    """This rank's place in the run: world rank and size, mesh sizes and coordinates.

    ``cp``/``cp_rank``: context parallelism (1/0 for a mesh without it). World ranks follow the
    mesh's order, tp fastest, then cp, then dp, then pp (``ProcessMesh``).
    """

    rank: int
    world_size: int
    dp: int
    tp: int
    pp: int
    dp_rank: int
    tp_rank: int
    pp_rank: int
    cp: int = 1
    cp_rank: int = 0

    def describe(self) -> dict[str, int]:
        """The mesh sizes as the manifest records them."""
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "cp": self.cp, "world_size": self.world_size}

    def stage_ranks(self) -> list[int]:
        """The world ranks of this rank's pipeline stage (all dp x cp x tp of them), in order."""
        per_stage = self.dp * self.cp * self.tp
        return list(range(self.pp_rank * per_stage, (self.pp_rank + 1) * per_stage))


def layout_of(mesh: Any, comm: Any) -> Layout:
    """The ``Layout`` from a ``ProcessMesh``, or pure data parallelism over ``comm`` when mesh is None."""
    rank, size = comm.rank, comm.size
    if mesh is None:
        return Layout(rank, size, size, 1, 1, rank, 0, 0)
    if int(mesh.world_size) != size:
        raise ValueError(
            f"the mesh has {mesh.world_size} ranks but the world has {size}; pass the run's mesh"
        )
    # getattr: a mesh without context parallelism (cp) is one with cp = 1.
    return Layout(
        rank, size, int(mesh.dp), int(mesh.tp), int(mesh.pp), int(mesh.dp_rank), int(mesh.tp_rank),
        int(mesh.pp_rank), int(getattr(mesh, "cp", 1)), int(getattr(mesh, "cp_rank", 0)),
    )  # fmt: skip


# Wrappers whose ``module`` holds the parameters under their global names (by class name: importing
# minidist.parallel would start MPI). FSDP's hold no values between steps: save and load use fsdp_state.py.
_WRAPPERS = ("DataParallelNaive", "DistributedDataParallel", "FullyShardedDataParallel")


def unwrap(model: Any) -> Module:
    """The module whose ``named_parameters()`` give global names (looks through DDP, FSDP and pipelines)."""
    while True:
        if hasattr(model, "stage_module"):  # PipelineParallel: this rank's stage, global names
            model = model.stage_module
        elif type(model).__name__ in _WRAPPERS and hasattr(model, "module"):
            model = model.module
        else:
            break
    if not isinstance(model, Module):
        raise TypeError(f"checkpoint needs a minidist Module, got a {type(model).__name__}")
    return model


def tp_dim_of(p: Parameter) -> int | None:
    """The axis along which ``p`` is split over the tp group, or None if replicated (``tp_dim``)."""
    return getattr(p, "tp_dim", None)


def tp_stride_of(p: Parameter) -> int:
    """The number of equal blocks whose pieces ``p`` holds along ``tp_dim`` (``tp_stride``, default 1)."""
    return int(getattr(p, "tp_stride", 1))


def piece_shape(
    full_shape: list[int], tp_dim: int | None, tp: int, tp_rank: int, stride: int = 1
) -> list[int]:
    """The shape of tp rank ``tp_rank``'s piece of a full tensor of ``full_shape`` (split.py's rule).

    Raises ``ValueError`` if the axis cannot be cut into ``stride`` equal blocks.
    """
    from minidist.parallel.tensor_parallel.split import shard_rows  # noqa: PLC0415  (no MPI: see the imports)

    out = list(full_shape)
    if tp_dim is not None:
        out[tp_dim] = len(shard_rows(out[tp_dim], tp, tp_rank, stride))
    return out


def assign_writers(
    items: list[tuple[str, Any, int | None]], layout: Layout
) -> dict[tuple[str, int | None], int]:
    """Choose which world rank writes each distinct shard of this pipeline stage.

    Args:
        items: ``(key, nbytes, tp_dim)`` for every tensor this rank holds; the same list on every rank
            of the stage. ``nbytes`` is one int, or for a tp-sharded tensor a list of ``tp`` ints,
            each piece's (uneven pieces differ in size: ``save`` gathers them first).

    Returns:
        ``{(key, tp_rank or None): world rank}``: a tp-sharded tensor has one shard per tp rank, each
        written by a dp or cp replica at that tp rank; a replicated one by any rank of the stage.
    """
    L = layout
    stage_ranks = L.stage_ranks()
    load = dict.fromkeys(stage_ranks, 0)
    shards: list[tuple[int, str, int | None]] = []
    for key, nbytes, tp_dim in items:
        if tp_dim is None:
            shards.append((int(nbytes), key, None))
        else:
            sizes = nbytes if isinstance(nbytes, (list, tuple)) else [nbytes] * L.tp
            shards.extend((int(sizes[t]), key, t) for t in range(L.tp))
    writers = {}
    for nbytes, key, t in sorted(shards, key=lambda s: (-s[0], s[1], -1 if s[2] is None else s[2])):
        candidates = stage_ranks if t is None else [r for r in stage_ranks if r % L.tp == t]
        chosen = min(candidates, key=lambda r: (load[r], r))
        load[chosen] += nbytes
        writers[(key, t)] = chosen
    return writers


# --- resharding: this rank's piece of a global tensor, from the shards another layout saved ------
def needed_shards(
    entry: dict[str, Any], tp: int, tp_rank: int, tp_dim: int | None, stride: int = 1
) -> list[dict[str, Any]]:
    """The shard records (``{"file", "tp_rank", "shape"}``) this rank must read for ``entry``."""
    # BEGIN SOLUTION A6.1: only this rank's own shard if the split is unchanged, else every shard
    shards = entry["shards"]
    if tp_dim is not None and entry["tp_dim"] == tp_dim and len(shards) == tp:
        if entry.get("tp_stride", 1) == stride:
            return [shards[tp_rank]]
    return shards
    # END SOLUTION


def local_piece(
    key: str, entry: dict[str, Any], arrays: list[np.ndarray], tp: int, tp_rank: int, tp_dim: int | None,
    stride: int = 1,
) -> np.ndarray:  # fmt: skip
    """This rank's array of ``entry`` from the arrays of :func:`needed_shards` (same order).

    The saved pieces are put back where split.py took them from (``shard_index`` with the saved
    ``tp_dim``, piece count and ``tp_stride``), then this rank's piece is cut out with this model's
    ``tp_dim`` and ``stride``; uneven pieces follow numpy.array_split's rule. Raises
    ``CheckpointError`` if the pieces do not assemble to ``global_shape`` (a corrupt manifest) or the
    axis cannot be cut into ``stride`` equal blocks.
    """
    from minidist.parallel.tensor_parallel.split import shard_index  # noqa: PLC0415  (no MPI: see the imports)

    # BEGIN SOLUTION A6.1: assemble with the saved split, check, cut with this model's split
    if len(arrays) == 1 and len(entry["shards"]) > 1:  # the fast path: our own shard, unchanged
        return arrays[0]
    shape, saved_dim = tuple(entry["global_shape"]), entry["tp_dim"]
    try:
        if len(arrays) == 1:  # one shard is the whole tensor already (no copy)
            full = arrays[0]
            if full.shape != shape:
                raise ValueError(f"one shard of shape {list(full.shape)}")
        else:  # each saved piece goes back where split.py cut it from
            full = np.empty(shape, dtype=arrays[0].dtype)
            for t, a in enumerate(arrays):
                where = shard_index(shape, saved_dim, len(arrays), t, entry.get("tp_stride", 1))
                if full[where].shape != a.shape:
                    raise ValueError(f"piece {t} is {list(a.shape)}, not {list(full[where].shape)}")
                full[where] = a
    except ValueError as err:
        raise CheckpointError(
            f"tensor {key!r}: its shards do not assemble to the shape {list(shape)} that the manifest "
            f"says ({err}; corrupt manifest?)"
        ) from None
    if tp_dim is None:
        return full
    try:
        return full[shard_index(shape, tp_dim, tp, tp_rank, stride)]
    except ValueError as err:
        raise CheckpointError(
            f"tensor {key!r} of global shape {list(shape)} cannot be cut into {tp} tensor-parallel "
            f"pieces along axis {tp_dim} with tp_stride {stride} ({err})"
        ) from None
    # END SOLUTION

"""Resharding: this rank's piece of a global tensor, from the shards another layout saved.

A tensor saved with ``tp_dim = d`` at tensor-parallel size ``T`` is stored as ``T`` shards whose
concatenation along ``d`` is the global tensor (Megatron-LM's column/row split, Shoeybi et al. 2019,
§3). A rank now at tensor-parallel size ``T'`` with ``tp_dim = d'`` needs slice ``tp_rank`` of ``T'``
equal slices along ``d'``. If nothing changed (``d' = d``, ``T' = T``) that is just its old shard, read
as is (the bit-exact path); otherwise the global tensor is assembled and sliced. Data-parallel and
pipeline changes need no arithmetic at all: replicas are copies, and a stage simply reads the global
names it now owns. Every path copies values, so a resharded model holds the very same numbers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist.checkpoint.errors import CheckpointError


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

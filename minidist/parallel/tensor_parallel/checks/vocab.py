"""The checks of ``VocabParallelEmbedding`` (``../vocab_parallel.py``): its arguments at construction and
its token ids on every forward, each agreed over the tensor-parallel group.

* :func:`embedding` and :func:`table`: the checks of the constructor and of ``from_weight``, for
  ``seam.agreed_arguments`` (sizes, a vocabulary no smaller than the group, ``padding_idx``);
* :func:`agreed_ids`: the decorator of ``forward``. The ids are checked against the *global* vocabulary
  with one small all-reduce, so that a bad id raises the same ``IndexError`` on every rank and no rank
  waits in a collective that the others left; the same all-reduce compares the ranks' sums of ids,
  a cheap test that every rank of the group was given the same batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist.autograd import Tensor
from minidist.backend import array_module
from minidist.distributed.comm import Communicator
from minidist.distributed.safety.agreement import agree as agree_errors
from minidist.parallel.tensor_parallel.checks.arguments import (
    agree,
    describe_dtype,
    positive_int,
    resolve_group,
)


def embedding(
    num_embeddings: Any, embedding_dim: Any, group: Any, dtype: Any, padding_idx: Any
) -> dict[str, Any]:
    """The check of ``VocabParallelEmbedding(num_embeddings, embedding_dim, group, dtype, padding_idx)``."""
    group, error = resolve_group("VocabParallelEmbedding", group)
    sizes: tuple[Any, ...] = (num_embeddings, embedding_dim)
    try:
        if error is not None:
            raise error
        sizes = (
            positive_int("VocabParallelEmbedding", "num_embeddings", num_embeddings),
            positive_int("VocabParallelEmbedding", "embedding_dim", embedding_dim),
        )
        padding_idx = check_vocab(sizes[0], group, padding_idx)
    except (TypeError, ValueError) as e:
        error = e
    arguments = {"num_embeddings": sizes[0], "embedding_dim": sizes[1], "padding_idx": padding_idx}
    agree(group, "VocabParallelEmbedding", {**arguments, "dtype": describe_dtype(dtype)}, error)
    return {**arguments, "group": group, "dtype": dtype}


def table(weight: Any, group: Any, padding_idx: Any) -> dict[str, Any]:
    """The check of ``VocabParallelEmbedding.from_weight(weight, group, padding_idx)``: ``weight`` comes
    back as the full table's array (a Tensor's ``.data``; a nested list as a host array)."""
    group, error = resolve_group("VocabParallelEmbedding.from_weight", group)
    full = weight.data if isinstance(weight, Tensor) else weight
    full = full if hasattr(full, "shape") else np.asarray(full)  # a nested list: a host array
    shape = tuple(int(n) for n in full.shape)
    try:
        if error is not None:
            raise error
        if len(shape) != 2 or min(shape) < 1:
            raise ValueError(
                f"VocabParallelEmbedding.from_weight: weight must be 2-D (num_embeddings, embedding_dim) "
                f"with both sizes >= 1, got shape {shape}"
            )
        padding_idx = check_vocab(shape[0], group, padding_idx)
    except (TypeError, ValueError) as e:
        error = e
    arguments = {"shape": list(shape), "padding_idx": padding_idx, "dtype": describe_dtype(full.dtype)}
    agree(group, "VocabParallelEmbedding.from_weight", arguments, error)
    return {"weight": full, "group": group, "padding_idx": padding_idx}


def check_vocab(vocab: int, group: Communicator, padding_idx: int | None) -> int | None:
    """Raise ``ValueError`` if a rank of ``group`` would own no row or ``padding_idx`` is outside
    [-V, V); return ``padding_idx`` as an int in [0, V) (or None)."""
    if vocab < group.size:
        raise ValueError(
            f"VocabParallelEmbedding: num_embeddings={vocab} is smaller than the tensor-parallel group "
            f"size {group.size}, so a rank would own no row; use a smaller tp or a larger vocabulary"
        )
    if padding_idx is None:
        return None
    if isinstance(padding_idx, bool) or not isinstance(padding_idx, (int, np.integer)):
        raise TypeError(f"VocabParallelEmbedding: padding_idx must be an int or None, got {padding_idx!r}")
    if not -vocab <= padding_idx < vocab:
        raise ValueError(
            f"VocabParallelEmbedding: padding_idx must be within num_embeddings ({vocab}), got {padding_idx}"
        )
    return int(padding_idx) % vocab


def agreed_ids(forward: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """Decorate ``VocabParallelEmbedding.forward(input)``: the body runs with ``ids``, ``input`` as an
    array on the table's device, once every rank of the group knows that every rank's ids are integers
    in [0, V) and the same (collective: one all-reduce of five int64). Raises on every rank:
    ``RuntimeError`` for ids that are not integers (as ``F.embedding``), ``IndexError`` for ids outside
    [0, V), ``ValueError`` for ranks whose ids differ (detected by their sums)."""

    @functools.wraps(forward)
    def checked(layer: Any, input: Any) -> Any:
        xp = array_module(layer.weight.data)
        ids = xp.asarray(input.data if isinstance(input, Tensor) else input)  # on the table's device
        error = None
        if ids.dtype.kind not in "iu":
            error = RuntimeError(
                "VocabParallelEmbedding: expected integer token ids (Long or Int, as F.embedding), got "
                f"{ids.dtype}; pass e.g. ids.astype(np.int64)"
            )
        low, high = (int(ids.min()), int(ids.max())) if ids.size and error is None else (0, -1)
        total = int(ids.sum()) if ids.size and error is None else 0
        if layer.group.size > 1:  # the group's range, error flag and ids' sum: one all-reduce (max)
            facts = np.array([high, -low, error is not None, total, -total], dtype=np.int64)
            high, neg_low, failed, total, neg_total = dist.all_reduce(facts, op="max", group=layer.group)
            low, high = -int(neg_low), int(high)
            if failed:  # a rank got ids that are not integers: every rank raises its error
                agree_errors(None, error, layer.group, label="tensor-parallel group")
        elif error is not None:
            raise error
        else:
            neg_total = -total
        if low < 0 or high >= layer.num_embeddings:
            raise IndexError(
                f"index out of range in self: VocabParallelEmbedding ids must lie in [0, "
                f"{layer.num_embeddings}) (num_embeddings), got values from {low} to {high} on the "
                f"ranks of the tensor-parallel group"
            )
        if total != -neg_total:  # a cheap test that every rank has the same ids (another batch fails it)
            raise ValueError(
                f"VocabParallelEmbedding: the ranks of the tensor-parallel group passed different ids (their "
                f"sums range from {-int(neg_total)} to {int(total)}); every rank of the group needs the same "
                "ids: take the batch by dp/cp rank, not by tp rank"
            )
        return forward(layer, ids)

    return checked

"""Which tokens of a sequence each context-parallel rank holds: THE rule, used by every cp piece.

Context parallelism cuts the *sequence* axis (axis 1 of (B, T) token ids and of (B, T, C) activations)
over the ``cp`` ranks of a group; every rank runs the whole model on its T / cp tokens, and only
attention needs the others' tokens (``ring_attention.py``). Two layouts:

* ``"contiguous"``: rank r holds positions ``[r T/cp, (r+1) T/cp)``. Simple, but under a causal mask
  badly balanced: a query attends only to keys at or before it, so rank 0's queries see only their own
  block of keys while rank cp-1's see all cp blocks: rank cp-1 does cp times the attention work of
  rank 0, and the others wait for it.
* ``"balanced"`` (the default; Megatron-LM's context parallelism, also called "zigzag"): the sequence
  is cut into ``2 cp`` equal chunks and rank r holds chunk r and chunk ``2cp-1-r``, an early one and
  its mirror image at the end. Every rank then holds the same number of (query, key) pairs that the
  causal mask keeps: a query at position p sees p + 1 keys, and chunks r and 2cp-1-r together hold
  ``c (T + 1) = T (T + 1) / (2 cp)`` of them (chunk length ``c = T / (2 cp)``), a cp-th of all.
  E.g. cp = 2, T = 8: rank 0 holds positions 0,1,6,7 and rank 1 holds 2,3,4,5; both see 18 pairs
  (1+2+7+8 and 3+4+5+6), where the contiguous layout gives 10 and 26.

A rank holds its chunks in increasing position order, concatenated along the sequence axis. What
depends on a token's place in the sequence must use its global position, not its local index: the
position embedding (``wpe`` looks up :func:`context_parallel_positions`) and the causal mask
(``ring_attention.py``). Helpers:
:func:`context_parallel_chunks` (the global ranges), :func:`context_parallel_positions` (one position per
local token), :func:`split_for_context_parallel` (rank r's tokens of an array) and
:func:`gather_from_context_parallel` (the inverse, from every rank's piece; for tests and generation).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist.backend import array_module
from minidist.distributed.comm import Communicator

LAYOUTS = ("balanced", "contiguous")


def context_parallel_chunks(
    seq_len: int, cp: int, rank: int, layout: str = "balanced"
) -> list[tuple[int, int]]:
    """The global ``[start, stop)`` ranges of the sequence that cp ``rank`` holds, in increasing order.

    ``"balanced"``: ``[(r c, (r+1) c), ((2cp-1-r) c, (2cp-r) c)]`` with ``c = seq_len / (2 cp)``;
    ``"contiguous"``: ``[(r T/cp, (r+1) T/cp)]``. With cp = 1 both cover the whole sequence in order.

    Raises:
        TypeError: a size or rank is not an int.
        ValueError: ``cp < 1``, ``rank`` outside ``[0, cp)``, an unknown ``layout``, or ``seq_len`` not
            divisible by ``2 cp`` (balanced) or ``cp`` (contiguous): the message says what to choose.
    """
    seq_len, cp, rank = (_int(v, name) for v, name in ((seq_len, "seq_len"), (cp, "cp"), (rank, "rank")))
    if cp < 1:
        raise ValueError(f"context parallelism: cp must be >= 1, got cp={cp}")
    if not 0 <= rank < cp:
        raise ValueError(f"context parallelism: rank must be in [0, {cp}), got {rank}")
    if layout not in LAYOUTS:
        raise ValueError(f"context parallelism: layout must be one of {LAYOUTS}, got {layout!r}")
    pieces = 2 * cp if layout == "balanced" else cp
    if seq_len % pieces:
        raise ValueError(
            f"context parallelism: a sequence of {seq_len} tokens cannot be cut into {pieces} equal chunks "
            f"(the {layout} layout over cp={cp} ranks needs a multiple of {pieces}); choose a sequence "
            f"length (block_size) divisible by {pieces}"
        )
    c = seq_len // pieces
    if layout == "contiguous":
        return [(rank * c, (rank + 1) * c)]
    mirror = 2 * cp - 1 - rank
    return [(rank * c, (rank + 1) * c), (mirror * c, (mirror + 1) * c)]


def context_parallel_positions(seq_len: int, cp: int, rank: int, layout: str = "balanced") -> np.ndarray:
    """The global positions (int64, length ``seq_len / cp``) of cp ``rank``'s tokens, in local order.

    Raises as :func:`context_parallel_chunks`.
    """
    return np.concatenate([np.arange(a, b) for a, b in context_parallel_chunks(seq_len, cp, rank, layout)])


def split_for_context_parallel(
    array: Any, cp: int, rank: int, axis: int = 1, layout: str = "balanced"
) -> Any:
    """cp ``rank``'s tokens of ``array`` along ``axis`` (default 1: (B, T) ids or targets, (B, T, C)).

    Returns a new array of ``array``'s module (NumPy or CuPy) with ``T / cp`` along ``axis``.
    Raises ``IndexError`` for an axis out of range, else as :func:`context_parallel_chunks` (T is
    ``array.shape[axis]``).
    """
    axis = _axis(axis, np.ndim(array))
    xp = array_module(array)
    chunks = context_parallel_chunks(array.shape[axis], cp, rank, layout)
    return xp.concatenate([_take(array, a, b, axis) for a, b in chunks], axis=axis)


def gather_from_context_parallel(pieces: Sequence[Any], axis: int = 1, layout: str = "balanced") -> Any:
    """The full array from every cp rank's piece (``pieces[r]`` = rank r's, as
    :func:`split_for_context_parallel` cut it): the inverse of the split.

    Communication-free: to assemble a tensor held across ranks, all-gather the pieces first
    (:func:`all_gather_from_context_parallel`). Raises ``ValueError`` for no pieces or pieces of
    different shapes, ``IndexError`` for an axis out of range.
    """
    if len(pieces) == 0:
        raise ValueError("gather_from_context_parallel: got no pieces; pass one array per cp rank")
    shapes = {tuple(p.shape) for p in pieces}
    if len(shapes) != 1:
        raise ValueError(
            f"gather_from_context_parallel: the pieces have different shapes {sorted(shapes)}; every cp "
            "rank holds the same number of tokens"
        )
    axis = _axis(axis, np.ndim(pieces[0]))
    cp, local = len(pieces), pieces[0].shape[axis]
    placed = []  # (global start, the piece's part that begins there)
    for rank, piece in enumerate(pieces):
        offset = 0
        for a, b in context_parallel_chunks(local * cp, cp, rank, layout):
            placed.append((a, _take(piece, offset, offset + b - a, axis)))
            offset += b - a
    placed.sort(key=lambda item: item[0])
    return array_module(pieces[0]).concatenate([part for _, part in placed], axis=axis)


def all_gather_from_context_parallel(
    x: Any, group: Communicator, axis: int = 1, layout: str = "balanced"
) -> Any:
    """Collective over the cp ``group``: every rank's piece ``x`` all-gathered and reassembled into the
    full sequence (:func:`gather_from_context_parallel`), on every rank. ``x``: a NumPy or CuPy array."""
    xp = array_module(x)
    if group.size == 1:
        return x.copy()
    flat = dist.all_gather(xp.ascontiguousarray(x), group=group)  # rank-major: [x_0 | x_1 | ...]
    return gather_from_context_parallel(list(flat.reshape(group.size, *x.shape)), axis=axis, layout=layout)


def _take(array: Any, start: int, stop: int, axis: int) -> Any:
    index = [slice(None)] * array.ndim
    index[axis] = slice(start, stop)
    return array[tuple(index)]


def _axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{-ndim}, {ndim - 1}], but got {axis})"
        )
    return axis % ndim


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"context parallelism: {name} must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"context parallelism: {name} must be an int, got {value!r}") from None

"""Which piece of a full tensor a tensor-parallel rank holds: the one split rule every module shares.

A sharded parameter (``tp_dim`` set, see ``nn.Parameter``) is rank r's piece of a *full* tensor along
axis ``tp_dim``. Three cases, from the simplest:

* **Even split** (``n`` divisible by the group size ``p``): rank r holds rows ``[r n/p, (r+1) n/p)``.
  Megatron-LM's column and row split (Shoeybi et al. 2019, §3).
* **Uneven split** (``n`` not divisible by ``p``, e.g. a 65-character vocabulary over 2 ranks): the
  first ``n % p`` ranks hold one row more, the rule of ``numpy.array_split`` (33 + 32 rows). Megatron
  pads the vocabulary with unused rows instead; we keep the exact size, so the model on ``p`` ranks is
  the very model of one process (no extra softmax entries) and a checkpoint's full shape never depends
  on ``p``.
* **Strided split** (``tp_stride = s > 1``): the axis is ``s`` equal blocks side by side and each block
  is split as above; rank r holds piece r of every block, concatenated in block order. Attention's
  ``c_attn`` weight is [q; k; v] (3 blocks of C rows): with stride 3 a rank holds its heads' q, k and v
  rows, so ``(B, T, 3, heads, hs)`` reshapes work on every rank as on one (Megatron's ``stride``
  argument of its weight initialisation).

``shard_bounds`` and ``shard_index`` are used by the layers that cut a full weight into pieces and by
checkpoints that put the pieces back together on another layout, so the two can never disagree.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def shard_bounds(n: int, parts: int, index: int) -> tuple[int, int]:
    """``(start, stop)`` of piece ``index`` of ``parts`` pieces of a length-``n`` axis (array_split rule).

    The first ``n % parts`` pieces are one longer: ``shard_bounds(65, 2, 0) == (0, 33)``,
    ``shard_bounds(65, 2, 1) == (33, 65)``. Raises ``ValueError`` for ``parts < 1`` or an index outside
    ``[0, parts)``.
    """
    if parts < 1 or not 0 <= index < parts:
        raise ValueError(f"shard_bounds: need 0 <= index < parts, got index={index}, parts={parts}")
    base, extra = divmod(n, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def shard_rows(n: int, parts: int, index: int, stride: int = 1) -> np.ndarray:
    """The positions along a length-``n`` axis that piece ``index`` holds, in order (int64 array).

    With ``stride`` s the axis is s equal blocks of ``n / s`` and the piece is piece ``index`` of each
    block (module docstring). Raises ``ValueError`` if ``n`` is not divisible by ``stride``.
    """
    if stride < 1 or n % stride:
        raise ValueError(f"shard_rows: an axis of {n} cannot be cut into {stride} equal blocks")
    block = n // stride
    start, stop = shard_bounds(block, parts, index)
    return np.concatenate([np.arange(b * block + start, b * block + stop) for b in range(stride)])


def shard_index(
    shape: tuple[int, ...], tp_dim: int, parts: int, index: int, stride: int = 1
) -> tuple[Any, ...]:
    """An index that takes piece ``index`` of a full array of ``shape`` along ``tp_dim``.

    ``full[shard_index(...)]`` is the piece (a basic slice, so a view, when ``stride == 1``).
    """
    where: list[Any] = [slice(None)] * len(shape)
    if stride == 1:
        where[tp_dim] = slice(*shard_bounds(shape[tp_dim], parts, index))
    else:
        where[tp_dim] = shard_rows(shape[tp_dim], parts, index, stride)
    return tuple(where)

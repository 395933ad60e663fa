"""PowerSGD: send a rank-``r`` approximation of each gradient matrix instead of the matrix.

Vogels, Karimireddy & Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
Optimization", NeurIPS 2019. Algorithm 1 (one step of subspace iteration, all-reduce friendly): for a
gradient matrix ``M`` (``n x m``, this rank's) and a shared ``Q`` (``m x r``),

1. ``P = M Q``, all-reduced (summed) over the ranks (``n r`` numbers instead of ``n m``);
2. ``P`` orthogonalised (Gram-Schmidt: its columns become orthonormal, spanning the same space);
3. ``Q = M^T P``, all-reduced (``m r`` numbers);
4. the average gradient is approximated by ``P Q^T / world_size``, the same on every rank.

Because both all-reduces are sums of linear maps of the ranks' ``M``, the result is the projection
``P P^T mean(M)`` of the *average* gradient onto a subspace: compression commutes with averaging,
which is what lets PowerSGD use all-reduce where other compressors need all-gather.
Algorithm 2 adds **error feedback**: what compression dropped on this rank, ``(M + e) - P Q^T/n``, is
remembered in ``e`` and added to the next step's gradient, so nothing is lost, only delayed (without it
training with so coarse an approximation diverges or stalls; their §3). **Warm start** reuses the last
``Q`` instead of a fresh random one, so that the single power-iteration step per training step
converges over steps to the gradient's top-``r`` subspace (their §3, "reuse of previous steps").

As PyTorch's ``powerSGD_hook`` (its names, defaults except ``start_powerSGD_iter``, and these rules):
the first ``start_powerSGD_iter`` steps use a plain all-reduce (compressing the first, large and
fast-changing gradients hurts accuracy most); a tensor of one dimension (biases, LayerNorm), or one where
``(n + m) r * min_compression_rate >= n m`` (compression would not pay), is all-reduced uncompressed,
together in one flat array; a tensor of more than two dimensions is viewed as ``shape[0] x rest``.
A bucket's initial ``Q`` is drawn from ``numpy.random.default_rng(s)`` with ``s =
state.rng.randint(1_000_000_000)``, one draw per bucket, so every rank draws the same ``Q``.
Differences from PyTorch: the hook is synchronous (``default.py``); ``start_powerSGD_iter`` may be
0 or 1 (PyTorch needs 2 because its DDP rebuilds buckets after the first step; ours never does); a column
of all zeros stays zero in the orthogonalisation instead of becoming NaN.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.parallel.comm_hooks.bucket import GradBucket, all_reduce


class PowerSGDState:
    """PowerSGD's hyperparameters and its memory across steps (PyTorch's ``PowerSGDState``).

    Args:
        process_group: None (DDP's group) or DDP's group itself; the hook communicates on
            ``bucket.group``, DDP's private copy of it.
        matrix_approximation_rank: ``r``, the rank of the approximation (1, 2, 4: larger is more
            accurate and sends ``r`` times more).
        start_powerSGD_iter: steps of plain all-reduce before compression starts (>= 0).
        min_compression_rate: compress an ``n x m`` matrix only if ``n m > (n + m) r`` times this (> 0).
        use_error_feedback: keep the compression error and add it to the next step's gradient.
        warm_start: start each step's power iteration from the previous step's ``Q``.
        orthogonalization_epsilon: added to each column's norm before dividing (>= 0).
        random_seed: seed of ``rng`` (``numpy.random.RandomState``) that draws the initial ``Q``\\ s.

    Memory: per bucket, an error array as large as the bucket (with error feedback) and the ``Q``\\ s
    (``m r`` per compressed matrix, with warm start). ``iter`` counts the steps seen so far (a step ends
    with the bucket for which ``bucket.is_last()``).

    Raises ``TypeError``/``ValueError`` for an argument of the wrong type or out of range.
    """

    def __init__(
        self,
        process_group: dist.Communicator | None = None,
        matrix_approximation_rank: int = 1,
        start_powerSGD_iter: int = 10,  # noqa: N803  (PyTorch's name)
        min_compression_rate: float = 2,
        use_error_feedback: bool = True,
        warm_start: bool = True,
        orthogonalization_epsilon: float = 0.0,
        random_seed: int = 0,
    ) -> None:
        if process_group is not None and not isinstance(process_group, dist.Communicator):
            got = type(process_group).__name__
            raise TypeError(f"process_group must be None or a Communicator, got {got}")
        _check_int("matrix_approximation_rank", matrix_approximation_rank, 1)
        _check_int("start_powerSGD_iter", start_powerSGD_iter, 0)
        _check_int("random_seed", random_seed, 0, 2**32 - 1)
        for name, value in [("min_compression_rate", min_compression_rate),
                            ("orthogonalization_epsilon", orthogonalization_epsilon)]:  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
                raise TypeError(f"{name} must be a finite number, got {value!r}")
        if not min_compression_rate > 0:
            raise ValueError(f"min_compression_rate must be > 0, got {min_compression_rate}")
        if orthogonalization_epsilon < 0:
            raise ValueError(f"orthogonalization_epsilon must be >= 0, got {orthogonalization_epsilon}")
        for name, value in [("use_error_feedback", use_error_feedback), ("warm_start", warm_start)]:
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False, got {value!r}")
        self.process_group = process_group
        self.matrix_approximation_rank = matrix_approximation_rank
        self.start_powerSGD_iter = start_powerSGD_iter
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback = use_error_feedback
        self.warm_start = warm_start
        self.orthogonalization_epsilon = orthogonalization_epsilon
        self.random_seed = random_seed
        self.rng = np.random.RandomState(random_seed)
        self.iter = 0
        self.error_dict: dict[int, Any] = {}  # bucket index -> this rank's compression error
        self.q_memory_dict: dict[int, Any] = {}  # bucket index -> the flat Qs of its matrices

    def hyperparameters(self) -> dict[str, Any]:
        """The arguments that every rank must pass alike (``register_comm_hook`` compares them)."""
        names = ("matrix_approximation_rank", "start_powerSGD_iter", "min_compression_rate",
                 "use_error_feedback", "warm_start", "orthogonalization_epsilon", "random_seed")  # fmt: skip
        return {name: getattr(self, name) for name in names}

    def maybe_increase_iter(self, bucket: GradBucket) -> None:
        """Count a step when its last bucket has been communicated."""
        if bucket.is_last():
            self.iter += 1


def powerSGD_hook(state: PowerSGDState, bucket: GradBucket) -> Any:  # noqa: N802  (PyTorch's name)
    """Average the bucket over the group, compressing its matrices to rank ``r`` (module docstring).

    Returns ``bucket.buffer()`` (synchronous: the averaged approximation, written in place). Before step
    ``state.start_powerSGD_iter`` it is a plain all-reduce. Afterwards per bucket: one all-reduce of the
    uncompressed tensors (if any), one of all ``P``\\ s, one of all ``Q``\\ s; payload
    ``sum (n + m) r`` instead of ``sum n m`` elements for the compressed matrices.
    """
    buffer = bucket.buffer()
    if state.iter < state.start_powerSGD_iter:
        all_reduce(buffer, bucket, op="avg")
        state.maybe_increase_iter(bucket)
        return buffer
    index, xp = bucket.index(), backend.array_module(buffer)
    if state.use_error_feedback:
        if index in state.error_dict:
            buffer += state.error_dict[index]  # Algorithm 2: add what compression dropped last step
        local = buffer.copy()
    matrices, rest = _split(bucket, state)

    if rest:  # the tensors compression would not pay for: one all-reduce of all of them
        flat = xp.concatenate([buffer[o : o + s] for o, s in rest])
        all_reduce(flat, bucket, op="avg")
        offset = 0
        for o, s in rest:
            buffer[o : o + s] = flat[offset : offset + s]
            offset += s

    if matrices:
        ps, p_views = _flat_views(xp, buffer.dtype, [(m.shape[0], r) for m, r in matrices])
        qs, q_views = _initial_qs(state, index, xp, buffer.dtype, [(m.shape[1], r) for m, r in matrices])
        for (m, _), p, q in zip(matrices, p_views, q_views):
            xp.matmul(m, q, out=p)  # P = M Q
        all_reduce(ps, bucket, op="sum")
        for p in p_views:
            orthogonalize(p, state.orthogonalization_epsilon)
        for (m, _), p, q in zip(matrices, p_views, q_views):
            xp.matmul(m.T, p, out=q)  # Q = M^T P
        all_reduce(qs, bucket, op="sum")
        for (m, _), p, q in zip(matrices, p_views, q_views):
            m[...] = p @ q.T / bucket.group.size  # the average's approximation, into the bucket
        if state.warm_start:
            state.q_memory_dict[index] = qs

    if state.use_error_feedback:
        state.error_dict[index] = local - buffer
    state.maybe_increase_iter(bucket)
    return buffer


def orthogonalize(p: Any, epsilon: float = 0.0) -> None:
    """Gram-Schmidt in place: the columns of ``p`` (``n x r``) become orthonormal, in order.

    Column ``j`` is divided by its norm (plus ``epsilon``), then removed from every later column. A
    column of zeros (a zero gradient) stays zero instead of becoming NaN. Classical Gram-Schmidt loses
    orthogonality for nearly dependent columns; for the small ``r`` used here that is harmless, as the
    PowerSGD paper notes (their §3).
    """
    xp = backend.array_module(p)
    for j in range(p.shape[1]):
        col = p[:, j]
        norm = float(xp.linalg.norm(col)) + epsilon
        if norm > 0:
            col /= norm
        if j + 1 < p.shape[1]:
            rest = p[:, j + 1 :]
            rest -= xp.outer(col, col @ rest)


def should_compress(rows: int, cols: int, rank: int, min_compression_rate: float) -> bool:
    """Whether a ``rows x cols`` matrix sends at least ``min_compression_rate`` times fewer elements as
    rank-``rank`` factors ``P`` and ``Q`` (``(rows + cols) rank``) than as itself (``rows cols``)."""
    return (rows + cols) * rank * min_compression_rate < rows * cols


def _split(bucket: GradBucket, state: PowerSGDState) -> tuple[list[tuple[Any, int]], list[tuple[int, int]]]:
    """The bucket's gradients: ``(matrix view, r)`` to compress, ``(offset, size)`` to send as they are."""
    matrices, rest = [], []
    for offset, grad in bucket.pieces():
        if grad.ndim >= 2:
            m = grad.reshape(grad.shape[0], -1)  # a view: the buffer is contiguous
            r = min(m.shape[0], m.shape[1], state.matrix_approximation_rank)
            if should_compress(m.shape[0], m.shape[1], r, state.min_compression_rate):
                matrices.append((m, r))
                continue
        rest.append((offset, grad.size))
    return matrices, rest


def _flat_views(xp: Any, dtype: Any, shapes: list[tuple[int, int]]) -> tuple[Any, list[Any]]:
    """One flat array, and a view of it per shape: the matrices travel in one all-reduce."""
    flat = xp.empty(sum(a * b for a, b in shapes), dtype=dtype)
    return flat, _views(flat, shapes)


def _views(flat: Any, shapes: list[tuple[int, int]]) -> list[Any]:
    views, offset = [], 0
    for a, b in shapes:
        views.append(flat[offset : offset + a * b].reshape(a, b))
        offset += a * b
    return views


def _initial_qs(state: PowerSGDState, index: int, xp: Any, dtype: Any, shapes: list[tuple[int, int]]):
    """Last step's ``Q``\\ s (warm start), or new standard normal ones drawn alike on every rank."""
    if state.warm_start and index in state.q_memory_dict:
        flat = state.q_memory_dict[index]
        return flat, _views(flat, shapes)
    generator = np.random.default_rng(state.rng.randint(1_000_000_000))
    total = sum(a * b for a, b in shapes)
    flat = xp.asarray(generator.standard_normal(total).astype(dtype))
    return flat, _views(flat, shapes)


def _check_int(name: str, value: Any, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in {low}..{high}"
        raise ValueError(f"{name} must be {bounds}, got {value}")

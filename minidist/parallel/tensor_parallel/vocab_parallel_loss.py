"""The cross-entropy of vocabulary-sharded logits, without gathering them (Shoeybi et al. 2019, §3).

With the output head split over the vocabulary (``vocab_parallel.py``), rank r of a tensor-parallel
group holds the logits of its slice ``[start, stop)`` of the vocabulary, (B, T, V_r). Gathering them
for ``F.cross_entropy`` would move B T V numbers per step and keep the whole (B, T, V) on every rank.
The loss needs much less: per token, the largest logit (for a stable softmax), the sum of the
exponentials and the target's logit, each a sum or a max over the ranks' slices. So three all-reduces
of B T numbers replace the gather (Megatron-LM fuses the output GEMM with the cross-entropy so that
only per-token scalars travel, §3), and the backward needs no communication at all:
each rank's gradient is its own slice of softmax - onehot.

Reading order: :func:`vocab_parallel_cross_entropy` (checks, then the Function), then
:class:`VocabParallelCrossEntropy` (the three all-reduces forward, the local backward).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist.autograd import Function, Tensor
from minidist.backend import array_module
from minidist.distributed.comm import Communicator, group_or_world
from minidist.parallel.tensor_parallel.mappings import tag_shard


class VocabParallelCrossEntropy(Function):
    """Cross-entropy of logits split over the vocabulary (Shoeybi et al. 2019, §3), forward and backward.

    Rank r holds z_n[v] for its vocabulary slice v in [start, stop) of every token n (N tokens), the
    targets t_n (global ids) everywhere. With three all-reduces over the group (max, then two sums):

        m_n = max over ranks of max_v z_n[v]            (stability: every e^(z - m) <= 1)
        S_n = sum over ranks of sum_v e^(z_n[v] - m_n)  (the softmax's denominator, / e^m_n)
        y_n = sum over ranks of z_n[t_n - start] if the rank owns t_n, else 0   (the target's logit)
        loss_n = log S_n + m_n - y_n  = -log softmax(z_n)[t_n]

    reduced by ``reduction`` ("mean": sum / N, "sum", "none": the (...) losses). Backward needs no
    communication: the softmax shard p_n[v] = e^(z_n[v] - m_n) / S_n is this rank's part of the
    softmax, and

        dL/dz_n[v] = g_n (p_n[v] - [v == t_n - start])     (g_n = dL/dloss_n, or dL/dL / N for "mean")

    where the one-hot term appears only on the rank that owns t_n. ``start`` (this rank's first
    vocabulary id) is found by :func:`vocab_parallel_cross_entropy`, which also checks the inputs.
    """

    saved_inputs = ()  # backward reads only its own e^(z - m) and S, not the logits
    returns_new_arrays = True  # the logits' gradient is a fresh array

    def forward(self, logits, targets=None, group=None, start=0, reduction="mean"):
        xp = array_module(logits)
        z = logits.reshape(-1, logits.shape[-1])  # (N, V_r)
        t = targets.reshape(-1)  # (N,) global ids
        self.shape, self.reduction = logits.shape, reduction
        # Leaves: p = e^(z - m) (N, V_r) with m the max over all ranks, s = S (N,), local = t - start,
        # rows = the tokens whose target this rank holds, loss (N,) the per-token losses.
        # BEGIN SOLUTION A9.1: the loss from this rank's logits: max, exp-sum and target-logit all-reduces
        m = dist.all_reduce(z.max(axis=1), op="max", group=group)  # (N,): the largest logit of all ranks
        p = z - m[:, None]
        xp.exp(p, out=p)  # e^(z - m) <= 1: no overflow
        s = dist.all_reduce(p.sum(axis=1), op="sum", group=group)  # (N,): S_n
        local = t - start
        owned = (local >= 0) & (local < z.shape[1])  # the targets this rank's slice holds
        rows = xp.nonzero(owned)[0]
        y = xp.zeros_like(m)
        y[rows] = z[rows, local[rows]]
        dist.all_reduce(y, op="sum", group=group)  # (N,): z_n[t_n], from the rank that owns it
        loss = xp.log(s) + m - y
        # END SOLUTION
        # kept for backward: e^(z - m) and S (softmax = their ratio, formed in backward's one pass)
        self.exps, self.sums, self.rows, self.cols = p, s, rows, local[rows]
        self.scale = 1.0 / len(loss) if reduction == "mean" else 1.0
        return loss.reshape(targets.shape) if reduction == "none" else loss.sum() * self.scale

    def backward(self, grad):
        xp = array_module(grad)
        g = grad.reshape(-1) if self.reduction == "none" else grad * self.scale
        g = xp.broadcast_to(g, self.sums.shape)  # (N,): g_n = dL/dloss_n
        # Leaves d = dL/dz (N, V_r), a new array, from self.exps, self.sums, self.rows, self.cols and g.
        # BEGIN SOLUTION A9.1: dL/dz = g (softmax shard - onehot of the owned targets); no communication
        d = self.exps * (g / self.sums)[:, None]  # g_n p_n[v], a new array (N, V_r)
        d[self.rows, self.cols] -= g[self.rows]  # the one-hot term, on the owner of t_n only
        # END SOLUTION
        return (d.reshape(self.shape),)


def vocab_parallel_cross_entropy(
    logits: Tensor, targets: Any, group: Communicator | None = None, reduction: str = "mean"
) -> Tensor:
    """``F.cross_entropy`` of vocabulary-sharded logits, without gathering them (Shoeybi et al. 2019, §3).

    ``logits`` (..., V_r): this rank's vocabulary slice (ranks hold consecutive slices in rank order,
    e.g. ``shard_bounds(V, p, rank)``; any sizes >= 1), float. ``targets`` (...): global token ids in
    [0, V), an integer array or Tensor, the same on every rank. Returns the loss, the same on every
    rank, of the logits' dtype: a scalar for ``reduction="mean"`` (over the N = prod(...) tokens) or
    "sum", the (...) per-token losses for "none". Equal (up to the order of float sums) to
    ``F.cross_entropy`` of the gathered (N, V) logits; its gradient is this rank's slice of that one's.

    Collective over ``group`` (default: the world): one all-reduce of p + 4 int64 (the ranks' slice
    sizes, the target count and range), then three of N numbers (:class:`VocabParallelCrossEntropy`).

    Raises ``ValueError`` for an unknown ``reduction``, scalar logits, targets whose shape is not the
    logits' leading shape, or an empty batch with "mean"; ``TypeError`` for targets that are not
    integers (as ``F.cross_entropy``); these depend only on this rank's arguments, the same on every
    rank. On every rank of the group at once: ``IndexError`` if any target leaves [0, V) (torch's
    class), ``ValueError`` if a rank has no vocabulary slice (V_r = 0) or the ranks disagree on N.
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(
            f"vocab_parallel_cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}"
        )
    group = group_or_world(group)
    xp = array_module(logits.data)
    t = xp.asarray(targets.data if isinstance(targets, Tensor) else targets)
    if logits.ndim < 1:
        raise ValueError("vocab_parallel_cross_entropy expects logits of shape (..., V_r), got a scalar")
    if t.dtype.kind not in "iu":
        raise TypeError(
            f"vocab_parallel_cross_entropy expects integer class indices as targets, got dtype {t.dtype}"
        )
    if t.shape != tuple(logits.shape[:-1]):
        raise ValueError(
            f"vocab_parallel_cross_entropy: targets have shape {tuple(t.shape)}, expected the logits' "
            f"leading shape {tuple(logits.shape[:-1])}"
        )
    if t.size == 0 and reduction == "mean":
        raise ValueError("vocab_parallel_cross_entropy: the mean over an empty batch is undefined")
    start = _vocab_start(group, logits.shape[-1], t)
    loss = VocabParallelCrossEntropy.apply(logits, targets=t, group=group, start=start, reduction=reduction)
    return tag_shard(loss, None)  # computed from a shard, but the same on every rank


def _vocab_start(group: Communicator, width: int, targets: Any) -> int:
    """This rank's first vocabulary id (the sum of the lower ranks' slice widths), after checking, on
    every rank alike, that every rank has a slice, the same number of targets, and targets in [0, V)."""
    # One max all-reduce of p + 4 int64: slot r holds rank r's width (the others 0, so the max fills
    # every slot); then n and -n (equal maxima iff every rank has n targets) and the targets' range.
    p, n = group.size, targets.size
    low, high = (int(targets.min()), int(targets.max())) if n else (0, -1)
    facts = np.zeros(p + 4, dtype=np.int64)
    facts[group.rank] = width
    facts[p:] = (n, -n, high, -low)
    if p > 1:
        dist.all_reduce(facts, op="max", group=group)
    widths, (most, neg_fewest, high, neg_low) = facts[:p], facts[p:]
    if (widths < 1).any():
        empty = [str(r) for r in np.nonzero(widths < 1)[0]]
        raise ValueError(
            f"vocab_parallel_cross_entropy: the logits of rank{'s' * (len(empty) > 1)} {', '.join(empty)} "
            "of the tensor-parallel group have no vocabulary entry (last axis 0); every rank needs a "
            "slice: use a tp <= V"
        )
    if most != -neg_fewest:
        raise ValueError(
            f"vocab_parallel_cross_entropy: the ranks of the tensor-parallel group passed different numbers "
            f"of targets ({-neg_fewest} to {most}); pass the same targets on every rank"
        )
    vocab = int(widths.sum())
    if -neg_low < 0 or high >= vocab:
        bad = high if high >= vocab else -neg_low
        raise IndexError(
            f"Target {bad} is out of bounds: vocab_parallel_cross_entropy targets must lie in [0, {vocab}) "
            f"(the vocabulary of the {group.size} ranks), got values from {-neg_low} to {high}"
        )
    return int(widths[: group.rank].sum())

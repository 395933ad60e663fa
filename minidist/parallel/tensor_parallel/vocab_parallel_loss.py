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
from minidist.distributed.comm import Communicator
from minidist.distributed.safety.agreement import agree
from minidist.distributed.world import group_or_world
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
        loss = xp.log(s) + (m - y)  # m - y first: exact for close values, so large logits keep log S
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

    Collective over ``group`` (default: the world): one all-reduce of p + 9 int64 (the ranks' slice
    sizes, the target count, range and sum, an error flag, the reduction), then three of N numbers
    (:class:`VocabParallelCrossEntropy`).

    Raises, on every rank of the group at once (a mistake on one rank alone included; then the message
    starts with "rank R of the tensor-parallel group"): ``ValueError`` for an unknown ``reduction``,
    ranks that passed different reductions, scalar logits, targets whose shape is not the logits'
    leading shape, an empty batch with "mean", a rank with no vocabulary slice (V_r = 0), ranks that
    disagree on N or pass targets of different sums; ``TypeError`` for targets that are not integers
    (as ``F.cross_entropy``); ``IndexError`` if any target leaves [0, V) (torch's class).
    """
    group = group_or_world(group)
    xp = array_module(logits.data)
    t = xp.asarray(targets.data if isinstance(targets, Tensor) else targets)
    error = _local_error(logits, t, reduction)  # raised in _vocab_start, on every rank of the group
    width = logits.shape[-1] if logits.ndim else 0  # (a scalar is an error already)
    start = _vocab_start(group, width, t, reduction, error)
    loss = VocabParallelCrossEntropy.apply(logits, targets=t, group=group, start=start, reduction=reduction)
    return tag_shard(loss, None)  # computed from a shard, but the same on every rank


REDUCTIONS = ("mean", "sum", "none")


def _local_error(logits: Tensor, t: Any, reduction: str) -> Exception | None:
    """What is wrong with this rank's own arguments, or None (raised on every rank by _vocab_start)."""
    if reduction not in REDUCTIONS:
        return ValueError(
            f"vocab_parallel_cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}"
        )
    if logits.ndim < 1:
        return ValueError("vocab_parallel_cross_entropy expects logits of shape (..., V_r), got a scalar")
    if t.dtype.kind not in "iu":
        return TypeError(
            f"vocab_parallel_cross_entropy expects integer class indices as targets, got dtype {t.dtype}"
        )
    if t.shape != tuple(logits.shape[:-1]):
        return ValueError(
            f"vocab_parallel_cross_entropy: targets have shape {tuple(t.shape)}, expected the logits' "
            f"leading shape {tuple(logits.shape[:-1])}"
        )
    if t.size == 0 and reduction == "mean":
        return ValueError("vocab_parallel_cross_entropy: the mean over an empty batch is undefined")
    return None


def _vocab_start(
    group: Communicator, width: int, targets: Any, reduction: str, error: Exception | None
) -> int:
    """This rank's first vocabulary id (the sum of the lower ranks' slice widths), after checking, on
    every rank alike, that no rank has an ``error`` of its own arguments, the ranks agree on the
    reduction, every rank has a slice, the same number of targets, targets in [0, V) and of the same
    sum (a cheap test that the targets are the same: it catches a rank given another batch)."""
    # One max all-reduce of p + 9 int64: slot r holds rank r's width (the others 0, so the max fills
    # every slot); then n and -n (equal maxima iff every rank has n targets), the targets' range, an
    # error flag, the reduction's index and its negative (equal maxima iff every rank passed it), and
    # the targets' sum and its negative (likewise).
    # A rank whose own arguments are wrong still takes part, so the others do not wait for it.
    p, n = group.size, 0 if error is not None else targets.size
    low, high = (int(targets.min()), int(targets.max())) if n else (0, -1)
    red = REDUCTIONS.index(reduction) if reduction in REDUCTIONS else -1
    total = int(targets.sum()) if n else 0
    facts = np.zeros(p + 9, dtype=np.int64)
    facts[group.rank] = width
    facts[p:] = (n, -n, high, -low, error is not None, red, -red, total, -total)
    if p > 1:
        dist.all_reduce(facts, op="max", group=group)
    widths, (most, neg_fewest, high, neg_low, failed, red, neg_red, total, neg_total) = facts[:p], facts[p:]
    if failed or red != -neg_red:  # the slow path: every rank raises the same error (agreement.py)
        agree({"reduction": reduction}, error, group, what="vocab_parallel_cross_entropy",
              label="tensor-parallel group", fix="pass the same reduction on every rank")  # fmt: skip
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
    if total != -neg_total:
        raise ValueError(
            "vocab_parallel_cross_entropy: the ranks of the tensor-parallel group passed different targets "
            f"(their sums range from {-neg_total} to {total}); every rank of the group needs the same "
            "targets (and the logits of the same tokens): take the batch by dp/cp rank, not by tp rank"
        )
    return int(widths[: group.rank].sum())

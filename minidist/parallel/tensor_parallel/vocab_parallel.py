"""The vocabulary split over a tensor-parallel group: the embedding table and the loss, never gathered.

A GPT's token embedding ``wte`` (V, C) and its output head (V rows too, often the same tensor) are
the two largest matrices of a small-width model, and the logits (B, T, V) its largest activation.
Megatron-LM (Shoeybi et al. 2019, §3, the input and output embeddings) splits both over the
vocabulary: rank r of a group of p holds the rows ``[start, stop) = shard_bounds(V, p, r)`` (``split.py``:
65 characters over 2 ranks are 33 + 32 rows; no padding) and computes only its logits (B, T, V_r).

* :class:`VocabParallelEmbedding`: every rank looks up the token ids it owns and writes zero rows
  for the others; summing the ranks' partial results (the g operator) gives every rank the full
  embedding. Each rank's table gets gradient only from the ids it owns.
* :func:`vocab_parallel_cross_entropy`: the loss from vocabulary-sharded logits without gathering
  them. Gathering would move B T V numbers per step; the loss needs only three numbers per token from
  each rank: its largest logit (for a stable softmax), its sum of exponentials and, on the rank that
  owns the target, the target's logit: three all-reduces of B T numbers. It lives in
  ``vocab_parallel_loss.py`` (re-exported here).

Both check the token ids against the *global* vocabulary with one small all-reduce, so that a bad id
raises the same ``IndexError`` on every rank and no rank waits in a collective that the others left.
"""

from __future__ import annotations

from typing import Any

from minidist import random
from minidist.autograd import DEFAULT_DTYPE, Tensor
from minidist.backend import array_module
from minidist.distributed.comm import Communicator
from minidist.nn.module import Module, Parameter
from minidist.ops.embedding import Embedding
from minidist.parallel.agreed import agreed_arguments
from minidist.parallel.tensor_parallel import checks
from minidist.parallel.tensor_parallel.mappings import reduce_from_tensor_parallel_region, tag_shard
from minidist.parallel.tensor_parallel.split import shard_bounds
from minidist.parallel.tensor_parallel.vocab_parallel_loss import (  # the loss: its own file, same topic
    VocabParallelCrossEntropy,
    vocab_parallel_cross_entropy,
)

__all__ = [
    "VocabParallelEmbedding",
    "VocabShardLookup",
    "VocabParallelCrossEntropy",
    "vocab_parallel_cross_entropy",
]


class VocabShardLookup(Embedding):
    """y_n = W_r[i_n - start] if this rank owns i_n (start <= i_n < stop), else 0;  y is i.shape + (C,).

    dL/dW_r[v] = sum over the owned n with i_n - start = v of dL/dy_n. The op is the embedding op
    (``ops/embedding.py``, its scatter-add reused) on ids shifted by ``start`` with the foreign ones
    sent to row 0; zeroing those rows forward and their incoming gradient backward keeps row 0 from
    collecting the gradient of tokens another rank owns.
    """

    def forward(self, weight, indices=None, owned=None, padding_idx=None):
        out = super().forward(weight, indices=indices, padding_idx=padding_idx)
        self.foreign = None if bool(owned.all()) else ~owned  # tp = 1 (or one rank's ids only): no masking
        if self.foreign is not None:
            out[self.foreign] = 0  # a fresh array from take(): writing it costs only the foreign rows
        return out

    def backward(self, grad):
        if self.foreign is not None:
            grad = grad.copy()  # not in place: the incoming gradient may be shared with another op
            grad[self.foreign] = 0
        return super().backward(grad)


class VocabParallelEmbedding(Module):
    """An ``nn.Embedding`` (V, C) whose rows are split over a tensor-parallel group (Shoeybi et al. 2019, §3).

    This rank holds ``weight`` (V_r, C) = rows ``[vocab_start, vocab_end) = shard_bounds(V, p, rank)``
    of the full table (``tp_dim = 0``, ``tp_group = group``; uneven splits follow ``numpy.array_split``:
    V = 65 over p = 2 is 33 + 32). Input: integer token ids of any shape (..., e.g. (B, T)), the same on
    every rank of the group. Output (..., C): ``self.reduce(partial, group)`` of this rank's partial
    lookup (its ids' rows, zeros for the others). ``reduce`` defaults to
    ``reduce_from_tensor_parallel_region`` (all-reduce: the full embedding on every rank); it is an
    attribute, replaceable by any ``f(x, group)``, e.g. a reduce-scatter over the sequence axis under
    sequence parallelism.

    Initialisation equals one process's: every rank draws the *full* table from minidist's generator
    exactly as ``nn.Embedding`` does (N(0, 1), the row ``padding_idx`` zeroed), after adopting the
    group's first rank's generator state (``random.share_generator``), and keeps its rows. So tp = p and
    tp = 1 start from the same table. :meth:`from_weight` cuts the piece from an existing full table instead.

    Collective: every rank of ``group`` must build it with the same arguments (compared at
    construction, one small all-gather) and call ``forward`` with the same ids (one small all-reduce
    checks their range, then ``reduce``).

    Raises (at construction, on every rank of the group): ``TypeError`` for sizes that are not ints or
    a ``group`` that is not a Communicator, ``ValueError`` for a size < 1, ``num_embeddings`` smaller
    than the group (a rank would own no row), ``padding_idx`` outside [-V, V), or ranks that passed
    different arguments. In ``forward``, on every rank if any rank's ids are wrong: ``RuntimeError``
    for ids that are not integers (as ``F.embedding``), ``IndexError`` for ids outside [0, V),
    ``ValueError`` for ranks whose ids differ (detected by their sums: one more int64 in the range check).
    """

    @agreed_arguments(checks.embedding)  # sizes, padding_idx, the vocabulary split: agreed
    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        group: Communicator | None = None,
        dtype: Any = DEFAULT_DTYPE,
        padding_idx: int | None = None,
    ) -> None:
        super().__init__()
        # the full table, drawn as nn.Embedding draws it (same generator, same order)
        values = random.generator().standard_normal((num_embeddings, embedding_dim)).astype(dtype)
        if padding_idx is not None:
            values[padding_idx] = 0
        self._keep_rows(values, group, padding_idx)

    @classmethod
    @agreed_arguments(checks.table)  # the table's shape and padding_idx, agreed
    def from_weight(
        cls, weight: Any, group: Communicator | None = None, padding_idx: int | None = None
    ) -> VocabParallelEmbedding:
        """The layer holding this rank's rows of ``weight``, an existing full table (V, C) (an array or
        Tensor, the same on every rank: a parallel model cut from a single-process one). The rows are
        copied; ``weight`` is not changed (its ``padding_idx`` row is not zeroed, as torch's
        ``Embedding.from_pretrained``). Collective (the shapes are compared, as at construction).

        Raises on every rank: ``ValueError`` for a ``weight`` that is not 2-D, V smaller than the group,
        a bad ``padding_idx`` or ranks with other shapes; ``TypeError`` for a bad ``group``.
        """
        layer = cls.__new__(cls)
        Module.__init__(layer)
        layer._keep_rows(weight, group, padding_idx)  # weight: the full table's array (checks.table)
        return layer

    def _keep_rows(self, full: Any, group: Communicator, padding_idx: int | None) -> None:
        """Keep rows ``shard_bounds(V, p, rank)`` of ``full`` (V, C) as this rank's sharded ``weight``."""
        self.group = group
        self.num_embeddings, self.embedding_dim = int(full.shape[0]), int(full.shape[1])
        self.padding_idx = padding_idx  # global, as nn.Embedding's
        self.vocab_start, self.vocab_end = shard_bounds(self.num_embeddings, group.size, group.rank)
        owned = padding_idx is not None and self.vocab_start <= padding_idx < self.vocab_end
        self.local_padding_idx = padding_idx - self.vocab_start if owned else None
        weight = Parameter(full[self.vocab_start : self.vocab_end].copy())  # a copy: the full table is freed
        weight.tp_dim, weight.tp_group = 0, group
        self.weight = tag_shard(weight, group)  # lookups are partial until reduce
        self.reduce = reduce_from_tensor_parallel_region

    @checks.agreed_ids  # ids: the input, integers in [0, V) on the table's device, alike on every rank
    def forward(self, ids: Any) -> Tensor:
        xp = array_module(self.weight.data)
        owned = (ids >= self.vocab_start) & (ids < self.vocab_end)
        local = xp.where(owned, ids - self.vocab_start, 0)  # foreign ids: row 0, zeroed by the op
        partial = VocabShardLookup.apply(
            self.weight, indices=local, owned=owned, padding_idx=self.local_padding_idx
        )
        return self.reduce(partial, self.group)

    def extra_repr(self) -> str:
        padding = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return (
            f"{self.num_embeddings}, {self.embedding_dim}{padding}, rows [{self.vocab_start}, "
            f"{self.vocab_end}) on rank {self.group.rank} of {self.group.size}"
        )

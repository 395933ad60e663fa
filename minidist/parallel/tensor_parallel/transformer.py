"""The GPT transformer block split over a tensor-parallel group (Shoeybi et al. 2019, §3, Fig. 3).

Each parallel module is cut from the full single-process one (``minidist.models.gpt.transformer``'s
``CausalSelfAttention``, ``FeedForward``, ``Block``), which every rank built from the same seed: the
parallel model starts as exactly the one-process model, and its parameter names are the same
(``c_attn``, ``c_proj``, ``c_fc``, ``ln_1``, ``ln_2``, ``attn``, ``mlp``).

* **Attention** (Fig. 3b): the heads are split. ``c_attn`` (3C, C) is column parallel with stride 3
  (``split.py``): rank r holds the q, k and v rows of its ``n_head / t`` heads, so it attends with
  whole heads and nothing crosses ranks until ``c_proj`` (C, C), row parallel, sums the heads' partial
  projections. ``n_head`` not divisible by t is an error on every rank.
* **MLP** (Fig. 3a): ``c_fc`` (4C, C) column parallel, GELU on the shard, ``c_proj`` (C, 4C) row parallel.

So a block costs two all-reduces forward (g after each ``c_proj``) and two backward (f before each
column layer). With ``sequence_parallel`` (Korthikanti et al. 2022, §4.2.2, ``sequence_parallel.py``)
the residual stream between them is (B, T / t, C), this rank's positions: the LayerNorms, dropouts and
residual adds run on 1/t of the tokens, each column layer all-gathers the positions first and each
row layer reduce-scatters them (the same bytes as the all-reduce). The LayerNorm parameters and the
row layers' biases then see only this rank's tokens: they are flagged ``sequence_parallel`` and their
gradients must be summed over the group after backward (``allreduce_sequence_parallel_grads``).

Dropout follows Megatron-LM: on the attention weights (sharded by head) and, under sequence
parallelism, on the residual stream (sharded by position) every rank draws its own mask from the RNG
tracker (``random.py``); on replicated activations (the residual stream without sequence parallelism)
every rank draws the same mask from the default generator. Dropout does this by itself from
``Tensor.sharded_over`` (``ops/dropout.py``).
"""

from __future__ import annotations

from typing import Any

from minidist.autograd import Tensor
from minidist.distributed.comm import Communicator
from minidist.nn import functional as F
from minidist.nn.module import Module
from minidist.parallel.agreed import agreed_arguments
from minidist.parallel.context_parallel import ring_attention
from minidist.parallel.tensor_parallel import checks
from minidist.parallel.tensor_parallel.cut import replicate
from minidist.parallel.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear


class ParallelCausalSelfAttention(Module):
    """Causal self-attention with its heads split over ``group``, cut from a full ``CausalSelfAttention``.

    Input and output (B, T, C), the same on every rank; with ``sequence_parallel`` (B, T / t, C), this
    rank's positions. Inside, this rank computes ``n_head / t`` heads: q, k, v (B, n_head / t, T, hs).
    ``context_parallel_group`` (set by the parallel GPT under context parallelism) replaces the local
    attention by ring attention over that group.

    Collective over ``group`` (one small agreement). Raises on every rank ``ValueError`` if ``n_head``
    is not divisible by the group size, ``TypeError`` for a bad group; in forward, ``ValueError`` from
    the sequence-parallel mappings if T is not divisible by the group size.
    """

    context_parallel_group: Communicator | None = None

    @agreed_arguments(checks.attention)  # n_head divisible by the group size, agreed
    def __init__(self, attn: Any, group: Communicator | None = None, sequence_parallel: bool = False) -> None:
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.n_embd, self.n_head, self.dropout_p = attn.n_embd, attn.n_head, attn.dropout_p
        self.n_head_per_partition = attn.n_head // group.size
        with checks.already_agreed():
            self.c_attn = ColumnParallelLinear.from_linear(attn.c_attn, group, 3, sequence_parallel)
            self.c_proj = RowParallelLinear.from_linear(attn.c_proj, group, sequence_parallel)
        self.resid_dropout = replicate(attn.resid_dropout, group)

    def forward(self, x: Tensor) -> Tensor:
        qkv = self.c_attn(x)  # (B, T, 3 C / t): this rank's heads' [q; k; v] (stride 3)
        B, T = qkv.shape[0], qkv.shape[1]
        heads, hs = self.n_head_per_partition, self.n_embd // self.n_head
        qkv = qkv.reshape(B, T, 3, heads, hs).permute(2, 0, 3, 1, 4)  # as CausalSelfAttention, on fewer heads
        q, k, v = qkv[0], qkv[1], qkv[2]
        p = self.dropout_p if self.training else 0.0
        if self.context_parallel_group is not None:
            # the sequence is split over cp too: K/V blocks go round the cp ring (Liu et al. 2023)
            y = ring_attention(q, k, v, self.context_parallel_group, is_causal=True, dropout_p=p)
        else:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, heads * hs)  # this rank's heads side by side: (B, T, C / t)
        return self.resid_dropout(self.c_proj(y))  # c_proj sums the ranks' heads (g or g-bar)

    def extra_repr(self) -> str:
        return (
            f"n_embd={self.n_embd}, n_head={self.n_head} ({self.n_head_per_partition} per rank), "
            f"dropout={self.dropout_p}, sequence_parallel={self.sequence_parallel}"
        )


class ParallelFeedForward(Module):
    """The GPT MLP (``c_fc``, GELU, ``c_proj``, dropout) split column then row over ``group``.

    Cut from a full ``FeedForward``. Input and output (B, T, C) on every rank, or (B, T / t, C) with
    ``sequence_parallel``; the hidden activations (B, T, 4C / t) are this rank's features. Collective
    over ``group``; raises on every rank ``ValueError`` if 4C is not divisible by the group size.
    """

    def __init__(self, mlp: Any, group: Communicator | None = None, sequence_parallel: bool = False) -> None:
        super().__init__()
        self.c_fc = ColumnParallelLinear.from_linear(mlp.c_fc, group, 1, sequence_parallel)
        self.gelu = replicate(mlp.gelu, group)
        self.c_proj = RowParallelLinear.from_linear(mlp.c_proj, group, sequence_parallel)
        self.dropout = replicate(mlp.dropout, group)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class ParallelBlock(Module):
    """A pre-norm GPT block, x + attn(ln_1(x)) then + mlp(ln_2(x)), split over ``group``.

    Cut from a full ``Block`` (module docstring). Input and output (B, T, C), the same on every rank,
    or with ``sequence_parallel`` (B, T / t, C), this rank's contiguous slice of the positions; then
    the gradients of the parameters flagged ``sequence_parallel`` (``ln_1``, ``ln_2``, both ``c_proj``
    biases) must be summed over ``group`` after backward (``allreduce_sequence_parallel_grads``).

    Collective over ``group`` (one small agreement for the whole block). Raises on every rank
    ``ValueError`` if ``n_head`` is not divisible by the group size (message lists the tp that work),
    ``TypeError`` for a bad group; in forward, ``ValueError`` on every rank if T is not divisible by
    the group size under sequence parallelism.
    """

    @agreed_arguments(checks.block)  # one agreement for the whole block
    def __init__(
        self, block: Any, group: Communicator | None = None, sequence_parallel: bool = False
    ) -> None:
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        with checks.already_agreed():  # one collective for the block, not one per layer
            self.ln_1 = replicate(block.ln_1, group, sequence_parallel)
            self.attn = ParallelCausalSelfAttention(block.attn, group, sequence_parallel)
            self.ln_2 = replicate(block.ln_2, group, sequence_parallel)
            self.mlp = ParallelFeedForward(block.mlp, group, sequence_parallel)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))

    def extra_repr(self) -> str:
        return f"tp={self.group.size}, sequence_parallel={self.sequence_parallel}"

"""The transformer block of a GPT: causal multi-head self-attention and a feed-forward network, each
behind a LayerNorm and added back to the residual stream ("pre-norm").

One block, for x of shape (B, T, C) (batch, time, channels = ``n_embd``)::

    x = x + attn(ln_1(x))          attention: every position mixes the positions before it
    x = x + mlp(ln_2(x))           feed-forward: every position on its own, width 4C then back to C

The transformer is Vaswani et al. 2017 ("Attention is all you need", §3); the LayerNorm *before* each
sublayer (instead of after, as in the 2017 paper) is GPT-2's change (Radford et al. 2019, §2.3), which
keeps the residual stream an unnormalised sum and trains more stably without warm-up tricks.

Why ``c_attn`` computes q, k and v in one Linear: three (C, C) products become one (C, 3C) product,
which is one larger matrix multiplication (faster on small widths) and one op in the graph instead of
three. The names (``c_attn``, ``c_proj``, ``c_fc``, ``ln_1``, ...) are GPT-2's, so that a reader can
compare state dicts with other GPT implementations.
"""

from __future__ import annotations

from typing import Any

from minidist.autograd import Tensor
from minidist.nn import functional as F
from minidist.nn.layers import GELU, Dropout, LayerNorm, Linear
from minidist.nn.module import Module


class CausalSelfAttention(Module):
    """Multi-head causal self-attention (Vaswani et al. 2017, §3.2.2), input and output (B, T, C).

    Each of ``n_head`` heads attends with queries, keys and values of width hs = C / n_head; position t
    sees positions 0..t only (the causal mask of a language model: it must not see the token it
    predicts). The heads' outputs are concatenated and projected back to C by ``c_proj``.

    Shapes: x (B, T, C) -> q, k, v each (B, n_head, T, hs) -> attention (B, n_head, T, hs)
    -> (B, T, C) -> c_proj -> dropout -> (B, T, C).

    Raises ``ValueError`` if ``n_embd`` is not divisible by ``n_head``, or for an input whose last
    dimension is not ``n_embd``.
    """

    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0, bias: bool = True, dtype: Any = None):
        super().__init__()
        if n_head < 1 or n_embd % n_head != 0:
            raise ValueError(
                f"CausalSelfAttention: n_embd={n_embd} must be a positive multiple of n_head={n_head} "
                "(each head gets n_embd / n_head channels); change one of them"
            )
        self.n_embd, self.n_head, self.dropout_p = n_embd, n_head, dropout
        kw = {} if dtype is None else {"dtype": dtype}
        self.c_attn = Linear(n_embd, 3 * n_embd, bias=bias, **kw)  # q, k, v in one product (see module doc)
        self.c_proj = Linear(n_embd, n_embd, bias=bias, **kw)
        self.resid_dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        if C != self.n_embd:
            raise ValueError(f"CausalSelfAttention: expected input (B, T, {self.n_embd}), got {x.shape}")
        hs = C // self.n_head
        qkv = self.c_attn(x)  # (B, T, 3C)
        # (B, T, 3C) -> (B, T, 3, n_head, hs) -> (3, B, n_head, T, hs): one permute for all three, then
        # q, k, v are views along the first axis.
        qkv = qkv.reshape(B, T, 3, self.n_head, hs).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        p = self.dropout_p if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)  # (B, n_head, T, hs)
        y = y.transpose(1, 2).reshape(B, T, C)  # heads side by side again: concat(head_1..head_h)
        return self.resid_dropout(self.c_proj(y))

    def extra_repr(self) -> str:
        return f"n_embd={self.n_embd}, n_head={self.n_head}, dropout={self.dropout_p}"


class FeedForward(Module):
    """The position-wise feed-forward network (Vaswani et al. 2017, §3.3) with exact GELU (GPT-2's):
    Linear(C, 4C) -> GELU -> Linear(4C, C) -> dropout. Input and output (B, T, C)."""

    def __init__(self, n_embd: int, dropout: float = 0.0, bias: bool = True, dtype: Any = None):
        super().__init__()
        kw = {} if dtype is None else {"dtype": dtype}
        self.c_fc = Linear(n_embd, 4 * n_embd, bias=bias, **kw)
        self.gelu = GELU()
        self.c_proj = Linear(4 * n_embd, n_embd, bias=bias, **kw)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(Module):
    """One pre-norm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x)); (B, T, C) -> (B, T, C).

    ``bias=False`` drops the biases of the Linear layers and the LayerNorms (a little faster, and as
    good in practice for GPT training). See the module docstring for the structure and its sources.
    """

    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0, bias: bool = True, dtype: Any = None):
        super().__init__()
        kw = {} if dtype is None else {"dtype": dtype}
        self.ln_1 = LayerNorm(n_embd, bias=bias, **kw)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias, dtype)
        self.ln_2 = LayerNorm(n_embd, bias=bias, **kw)
        self.mlp = FeedForward(n_embd, dropout, bias, dtype)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))

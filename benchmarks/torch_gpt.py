"""The same GPT as ``minidist.models.GPT``, written in PyTorch: the reference of benchmarks/gpt.py and an
optional oracle of tests/models/test_gpt.py (PyTorch is never a dependency of minidist itself).

Same architecture, parameter names and shapes (so ``load_minidist`` copies a minidist model's weights in
and the two compute the same numbers): token + position embedding, pre-norm blocks of causal multi-head
attention and a GELU MLP, a final LayerNorm and a head tied to the token embedding. Written for this
benchmark from the papers (Vaswani et al. 2017; Radford et al. 2019), with torch's built-in
``scaled_dot_product_attention`` as a PyTorch user would write it.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


class TorchBlock(nn.Module):
    """x + attn(ln_1(x)), then + mlp(ln_2(x)), for x (B, T, C)."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.attn_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.mlp_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.drop = nn.Dropout(dropout)

    def attn(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.drop(self.attn_proj(y.transpose(1, 2).reshape(B, T, C)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.drop(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)))))


class TorchGPT(nn.Module):
    """Token ids (B, T) -> logits (B, T, vocab_size); the head is the token embedding (tied)."""

    def __init__(
        self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int,
        dropout: float = 0.0, bias: bool = True,
    ) -> None:  # fmt: skip
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([TorchBlock(n_embd, n_head, dropout, bias) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        for name, p in self.named_parameters():  # GPT-2's initialisation, as minidist's GPT
            if name.endswith("proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))
            elif "ln_" in name:
                nn.init.ones_(p) if name.endswith("weight") else nn.init.zeros_(p)
            elif name.endswith("weight"):
                nn.init.normal_(p, 0.0, 0.02)
            else:
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)  # on the ids' device (a GPU too)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


# minidist's parameter names -> this model's (the blocks' submodules are flattened here).
_RENAMES = {"attn.c_attn": "c_attn", "attn.c_proj": "attn_proj", "mlp.c_fc": "c_fc", "mlp.c_proj": "mlp_proj"}


def torch_name(minidist_name: str) -> str:
    """The name in TorchGPT of a parameter of minidist's GPT (``h.0.attn.c_proj.weight`` ->
    ``h.0.attn_proj.weight``)."""
    for ours, theirs in _RENAMES.items():
        minidist_name = minidist_name.replace(f".{ours}.", f".{theirs}.")
    return minidist_name


def load_minidist(model: TorchGPT, named_arrays: dict) -> None:
    """Copy ``{minidist name: array}`` (e.g. ``{n: p.numpy() for n, p in gpt.named_parameters()}``) into
    ``model``, in place; raises ``KeyError`` for a name either side lacks."""
    params = dict(model.named_parameters())
    if set(map(torch_name, named_arrays)) != set(params):
        raise KeyError(f"names differ: {sorted(set(map(torch_name, named_arrays)) ^ set(params))}")
    with torch.no_grad():
        for name, array in named_arrays.items():
            params[torch_name(name)].copy_(torch.as_tensor(array))

"""The GPT as a chain of layers, for pipeline parallelism (``GPT.pipeline_layers()``).

A pipeline cuts an ``nn.Sequential`` into stages (``minidist.parallel.pipeline``). A GPT is a chain
already, embedding -> block 0 .. block L-1 -> head; this module gives its two ends a layer each:

* :class:`GPTEmbedding`: token ids (B, T) -> ``drop(wte(ids) + wpe(0 .. T-1))`` (B, T, C);
* :class:`GPTHead`: (B, T, C) -> ``ln_f`` -> the output projection -> logits (B, T, vocab_size).

The layers *share* the GPT's modules (nothing is copied): training the Sequential on one process
trains the GPT, and its output is exactly ``GPT.forward``'s logits, because ``GPT.forward`` calls the
same two functions (:func:`embed_tokens`, :func:`output_logits`) in the same order.

**Names.** A layer's ``pipeline_name`` says where its parameters sit in the GPT: ``""`` for both ends
(their parameters are at the model's root: ``wte.weight``, ``ln_f.bias``) and ``"h.3"`` for block 3.
Pipeline stages name parameters by it (``pipeline/partition.py``), so a stage's ``state_dict`` has
GPT's names and checkpoints move between the GPT and any pipeline layout.

**The tied head.** With ``tie_weights`` the head reads the token table through a small holder module
(:class:`WeightHolder`) named ``wte`` whose ``weight`` *is* the embedding's Parameter: on one process
a single Parameter used twice, whose gradient sums both uses (as in ``GPT.forward``). When the
embedding and the head land on different pipeline stages, ``PipelineParallel`` gives the head's stage
a copy of it, swapped into the holder only, never into the GPT (``pipeline/tied.py``).

**One design for every layout.** ``ParallelGPT.pipeline_layers()`` (tensor, sequence and context
parallelism) uses subclasses of these two layers (``parallel_layers.py``): the same holders, names
and ``pipeline_name``, so the same tied-copy machinery keeps a tp rank's vocabulary shard of ``wte``
equal on the first and the last stage; only ``forward`` adds the collectives.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist.autograd import Tensor
from minidist.nn import functional as F
from minidist.nn.layers import Dropout, Embedding, LayerNorm
from minidist.nn.module import Module, Parameter


def embed_tokens(idx: Any, wte: Module, wpe: Module, drop: Module, block_size: int) -> Tensor:
    """``drop(wte(idx) + wpe(0 .. T-1))``: (B, T, C) for token ids ``idx`` (B, T), an integer array or Tensor.

    Raises ``ValueError`` for ids that are not (B, T) or a sequence longer than ``block_size``;
    ``IndexError`` (from the lookup) for an id outside [0, vocab_size).
    """
    idx = idx.data if isinstance(idx, Tensor) else idx
    if idx.ndim != 2:  # (else a shape unpacking deep inside attention fails)
        raise ValueError(f"GPT: token ids must be (batch, length), got shape {idx.shape}; use ids[None]")
    T = idx.shape[-1]
    if T > block_size:
        raise ValueError(
            f"GPT: a sequence of {T} tokens is longer than block_size={block_size}; "
            "crop it to the last block_size tokens (generate() does) or build a model with a larger one"
        )
    return drop(wte(idx) + wpe(np.arange(T)))  # (B, T, C) + (T, C) broadcasts over the batch


def output_logits(x: Tensor, ln_f: Module, weight: Tensor) -> Tensor:
    """Logits ``ln_f(x) @ weight^T``: (B, T, C) -> (B, T, V) for an output weight (V, C)."""
    return F.linear(ln_f(x), weight)


class GPTEmbedding(Module):
    """The first pipeline layer: token ids (B, T) -> activations (B, T, C); errors: :func:`embed_tokens`.

    Holds the GPT's ``wte``, ``wpe`` and ``drop`` (the same objects); ``pipeline_name = ""``.
    """

    def __init__(self, wte: Module, wpe: Embedding, drop: Dropout, block_size: int) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop
        self.block_size = block_size
        self.pipeline_name = ""

    def forward(self, idx: Any) -> Tensor:
        return embed_tokens(idx, self.wte, self.wpe, self.drop, self.block_size)


class WeightHolder(Module):
    """Holds one Parameter, ``weight``: the tied head's token table (a Parameter of another module), or
    a parallel model's slice of an untied head's rows (``ParallelGPT``)."""

    def __init__(self, weight: Parameter) -> None:
        super().__init__()
        self.weight = weight


class GPTHead(Module):
    """The last pipeline layer: activations (B, T, C) -> logits (B, T, vocab_size).

    ``ln_f`` then the output projection: by ``lm_head`` (a Linear without bias, or any module with a
    (V, C) ``weight``) if given, else by the token table ``wte.weight`` (weight tying; the holder
    :class:`WeightHolder`, registered as ``wte``, so the parameter's name is ``wte.weight``).
    ``pipeline_name = ""``.
    """

    def __init__(self, ln_f: LayerNorm, wte: Module, lm_head: Module | None = None) -> None:
        super().__init__()
        self.ln_f = ln_f
        if lm_head is None:
            self.wte = WeightHolder(wte.weight)
        else:
            self.lm_head = lm_head
        self.pipeline_name = ""

    def forward(self, x: Tensor) -> Tensor:
        head = self.lm_head if "lm_head" in self._modules else self.wte
        return output_logits(x, self.ln_f, head.weight)

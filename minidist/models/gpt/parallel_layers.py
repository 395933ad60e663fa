"""The two ends of ``ParallelGPT`` as layers: the embedding (ids in) and the head (logits out).

``ParallelGPT.forward`` is ``head(h(embedding(idx)))`` with these two layers, and
``ParallelGPT.pipeline_layers()`` hands the same kind of layers to a pipeline, so both compute the
same thing. They are ``GPT.pipeline_layers()``'s two layers (``pipeline.py``) with the
collectives added: each holds the model's own modules (nothing is copied), ``pipeline_name = ""``
(their parameters sit at the model's root: ``wte.weight``, ``ln_f.bias``, as in ``GPT``), and the
tied head holds ``wte.weight`` (this tp rank's vocabulary rows) the same way, so ``PipelineParallel``
gives the last stage a copy of this rank's shard (``is_tied_copy``) and sums its gradient with the
first stage's over the tied group, exactly as for the one-process GPT.

Where a rank's tokens sit in the sequence is the :class:`SequenceLayout`: under context parallelism
this rank holds the balanced split's positions (``context_parallel_positions``); under sequence
parallelism the residual stream holds only this tp rank's contiguous slice of those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from minidist.autograd import Tensor
from minidist.distributed.comm import Communicator
from minidist.models.gpt.pipeline import GPTEmbedding, GPTHead
from minidist.nn import functional as F
from minidist.nn.module import Module
from minidist.parallel.context_parallel import context_parallel_positions
from minidist.parallel.tensor_parallel import (
    copy_to_tensor_parallel_region,
    gather_from_sequence_parallel_region,
)


@dataclass(frozen=True)
class SequenceLayout:
    """Which tokens of the sequence this rank's activations hold (module docstring)."""

    tp_group: Communicator
    sequence_parallel: bool
    cp: int
    cp_rank: int
    block_size: int

    def positions(self, local_length: int) -> np.ndarray:
        """Global positions of this rank's residual stream for ``local_length`` = T / cp tokens per row.

        Raises ``ValueError`` for a sequence longer than ``block_size``, T not divisible by 2 cp
        (context parallelism) or T / cp not divisible by tp (sequence parallelism).
        """
        length, tp = local_length * self.cp, self.tp_group.size
        if length > self.block_size:
            raise ValueError(
                f"ParallelGPT: a sequence of {length} tokens is longer than block_size={self.block_size}; "
                "crop it to the last block_size tokens or build a model with a larger one"
            )
        positions = (
            np.arange(length) if self.cp == 1 else context_parallel_positions(length, self.cp, self.cp_rank)
        )
        if not self.sequence_parallel:
            return positions
        if local_length % tp:
            raise ValueError(
                f"ParallelGPT: under sequence parallelism each tp rank holds T / tp of the {local_length} "
                f"tokens per row of this rank, and {local_length} is not divisible by tp={tp}; use a "
                "sequence length divisible by tp (times 2 cp with context parallelism)"
            )
        width = local_length // tp
        return positions[self.tp_group.rank * width : (self.tp_group.rank + 1) * width]


class ParallelGPTEmbedding(GPTEmbedding):
    """Token ids (B, T_local) -> ``drop(wte(ids) + wpe(positions))``: (B, T_local, C), or under
    sequence parallelism (B, T_local / tp, C) (``wte.reduce`` is then a reduce-scatter).

    ``GPTEmbedding`` with a vocabulary-parallel ``wte`` and this rank's positions (the same modules,
    names and ``pipeline_name``). Raises ``ValueError`` for ids that are not (B, T_local) and as
    :meth:`SequenceLayout.positions`.
    """

    def __init__(self, wte: Module, wpe: Module, drop: Module, layout: SequenceLayout) -> None:
        super().__init__(wte, wpe, drop, layout.block_size)
        self.layout = layout

    def forward(self, idx: Any) -> Tensor:
        idx = idx.data if isinstance(idx, Tensor) else idx
        if idx.ndim != 2:
            raise ValueError(f"ParallelGPT: token ids must be (batch, length), got shape {idx.shape}")
        positions = self.layout.positions(idx.shape[1])  # checked before the embedding's collectives
        return self.drop(self.wte(idx) + self.wpe(positions))


class ParallelGPTHead(GPTHead):
    """(B, T_local, C) (or this rank's positions under sequence parallelism) -> ``ln_f`` -> logits
    (B, T_local, V_r) for this tp rank's vocabulary rows of the output weight (``lm_head`` if given, else
    the tied ``wte``, held as in ``GPTHead``, so a pipeline's tied copy is this rank's shard). Before the
    product every rank needs every position: f (identity forward, all-reduce backward) or, under
    sequence parallelism, the all-gather g (reduce-scatter backward).
    """

    def __init__(self, ln_f: Module, wte: Module, lm_head: Module | None, layout: SequenceLayout) -> None:
        super().__init__(ln_f, wte, lm_head)
        self.layout = layout

    def forward(self, x: Tensor) -> Tensor:
        x, group = self.ln_f(x), self.layout.tp_group
        if self.layout.sequence_parallel:
            x = gather_from_sequence_parallel_region(x, group)
        else:
            x = copy_to_tensor_parallel_region(x, group)
        head = self.lm_head if "lm_head" in self._modules else self.wte
        return F.linear(x, head.weight)  # (B, T_local, V_r): never gathered

"""``GPT``: a decoder-only transformer language model (Radford et al. 2018, 2019), built from minidist ops.

Token ids (B, T) -> token embedding + position embedding -> dropout -> n_layer ``Block``s -> final
LayerNorm -> a linear "head" to ``vocab_size`` logits (B, T, vocab_size): at every position, scores for
the next token. Training minimises the cross-entropy of those scores against the ids shifted by one.

**Weight tying** (Press & Wolf 2017; used by GPT-2): the head's weight *is* the token embedding table
(vocab_size, n_embd): the same parameter reads a token in and writes it out, so its gradient is the sum
of both uses. It saves vocab_size x n_embd parameters and trains at least as well.

**Initialisation** in GPT-2's style (Radford et al. 2019, §2.3, and the released code's constants):
every Linear weight and both embeddings from N(0, 0.02^2), biases 0, LayerNorm gain 1 and shift 0, and the
projections that write into the residual stream (``attn.c_proj``, ``mlp.c_proj``) from N(0, (0.02 /
sqrt(2 n_layer))^2): the residual stream is a sum of 2 n_layer such writes, so this keeps its variance at
initialisation independent of depth. Draws come from minidist's seeded generator in parameter order, so
``md.manual_seed(s)`` gives the same model on every rank and every layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from minidist import backend, random
from minidist.autograd import DEFAULT_DTYPE, Tensor, no_grad
from minidist.models.gpt.pipeline import GPTEmbedding, GPTHead, embed_tokens, output_logits
from minidist.models.gpt.transformer import Block
from minidist.nn.layers import Dropout, Embedding, LayerNorm, Linear, Sequential
from minidist.nn.module import Module


@dataclass
class GPTConfig:
    """The size of a GPT. Defaults: the small character-level model of ``examples/train_gpt.py``.

    Attributes:
        vocab_size: number of token ids (default 65, nanoGPT's character set; the bundled Shakespeare has 63).
        block_size: the context length T, the longest sequence the model reads (position embeddings).
        n_layer, n_head, n_embd: blocks, attention heads per block, width C (divisible by n_head).
        dropout: probability for every dropout layer (0 disables them).
        bias: biases in the Linear layers and LayerNorms.
        tie_weights: the head reuses the token embedding's weight (see the module docstring).
        dtype: parameter dtype (float32; float64 for the equivalence tests).
    """

    vocab_size: int = 65
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True
    tie_weights: bool = True
    dtype: Any = DEFAULT_DTYPE

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):  # 5.5 or "5" failed later
                raise TypeError(f"GPTConfig: {name} must be an int, got {value!r} ({type(value).__name__})")
            if value < 1:
                raise ValueError(f"GPTConfig: {name} must be a positive integer, got {getattr(self, name)}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"GPTConfig: n_embd={self.n_embd} must be divisible by n_head={self.n_head} "
                "(each head gets n_embd / n_head channels)"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig: dropout must be in [0, 1), got {self.dropout}")


class GPT(Module):
    """A GPT language model; ``forward(idx)`` maps token ids (B, T) to logits (B, T, vocab_size).

    Parameter names are GPT-2's: ``wte.weight`` (vocab, C), ``wpe.weight`` (block_size, C),
    ``h.<i>.ln_1/attn.c_attn/attn.c_proj/ln_2/mlp.c_fc/mlp.c_proj.{weight,bias}``, ``ln_f.weight/bias``,
    and ``lm_head.weight`` only without weight tying.

    Raises ``ValueError`` for ids that are not (B, T) or a sequence longer than ``block_size``, and
    ``IndexError`` for a token id outside [0, vocab_size).
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = c = config
        self.wte = Embedding(c.vocab_size, c.n_embd, dtype=c.dtype)
        self.wpe = Embedding(c.block_size, c.n_embd, dtype=c.dtype)
        self.drop = Dropout(c.dropout)
        self.h = Sequential(
            *[Block(c.n_embd, c.n_head, c.dropout, c.bias, c.dtype) for _ in range(c.n_layer)]
        )
        self.ln_f = LayerNorm(c.n_embd, bias=c.bias, dtype=c.dtype)
        self.lm_head = None if c.tie_weights else Linear(c.n_embd, c.vocab_size, bias=False, dtype=c.dtype)
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2's initialisation (module docstring), drawn in ``named_parameters`` order."""
        gen = random.generator()
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)

        def normal(std: float, p: Tensor) -> Any:
            # Drawn on the host (the same numbers on CPU and GPU), then copied to the backend: CuPy does
            # not take a host array through p.data[...] = (it raises ValueError).
            return backend.asarray(gen.normal(0.0, std, size=p.shape), dtype=p.dtype)

        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                p.data[...] = normal(residual_std, p)
            elif name.startswith("ln_") or ".ln_" in name:
                p.data[...] = 1.0 if name.endswith("weight") else 0.0
            elif name.endswith("weight"):  # Linear weights and both embeddings
                p.data[...] = normal(0.02, p)
            else:  # Linear biases
                p.data[...] = 0.0

    def forward(self, idx: Any) -> Tensor:
        """Logits (B, T, vocab_size) for token ids ``idx`` (B, T), an integer array or Tensor."""
        x = embed_tokens(idx, self.wte, self.wpe, self.drop, self.config.block_size)  # (B, T, C)
        head = self.wte.weight if self.lm_head is None else self.lm_head.weight
        return output_logits(self.h(x), self.ln_f, head)  # (B, T, vocab_size)

    def pipeline_layers(self) -> Sequential:
        """This GPT as an ``nn.Sequential`` of ``n_layer + 2`` layers, for ``PipelineParallel``.

        ``[GPTEmbedding (wte, wpe, drop), h.0, ..., h.<L-1>, GPTHead (ln_f and the output projection)]``,
        sharing this model's modules (``pipeline.py``): token ids (B, T) in, logits (B, T, vocab_size)
        out, exactly ``forward``'s. Each layer's ``pipeline_name`` ("" for the ends, "h.<i>" for block i)
        makes a pipeline stage name its parameters as this model does (``wte.weight``, ``h.3.ln_1.bias``).
        With weight tying the head uses ``wte.weight`` too; ``PipelineParallel`` keeps the two stages'
        copies equal when the ends land on different stages (``minidist/parallel/pipeline/tied.py``).
        """
        for i, block in enumerate(self.h):
            block.pipeline_name = f"h.{i}"
        embedding = GPTEmbedding(self.wte, self.wpe, self.drop, self.config.block_size)
        return Sequential(embedding, *self.h, GPTHead(self.ln_f, self.wte, self.lm_head))

    def num_parameters(self) -> int:
        """Number of distinct parameters (a tied head is counted once). For bias=True and tying:
        V C + T C + L (12 C^2 + 13 C) + 2 C (V vocab, T block_size, L layers, C width)."""
        return sum(p.data.size for p in self.parameters())

    def flops_per_token(self) -> int:
        """Matmul FLOPs to train on one token (forward + backward = 3 x forward), counting one
        multiply-add as 2 FLOPs: per layer 24 C^2 (q, k, v, output and MLP products) + 4 T C (scores and
        weighted sum, the full T x T square as in PaLM's appendix B, Chowdhery et al. 2022), plus the
        head's 2 C V. Elementwise work (softmax, LayerNorm, GELU) is not counted, by convention."""
        c = self.config
        forward = c.n_layer * (24 * c.n_embd**2 + 4 * c.block_size * c.n_embd) + 2 * c.n_embd * c.vocab_size
        return 3 * forward

    def generate(
        self,
        idx: Any,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: np.random.Generator | None = None,
    ) -> np.ndarray:
        """Continue each row of ``idx`` (B, T) by ``max_new_tokens`` sampled tokens; returns (B, T + new).

        At each step the model reads the last ``block_size`` tokens, divides the last position's logits by
        ``temperature`` (< 1 sharper, > 1 flatter), keeps only the ``top_k`` largest (if given), and
        samples from the softmax. Runs in eval mode (no dropout) without recording a graph, and restores
        the previous mode. ``generator`` (a NumPy Generator) draws the samples; by default minidist's
        own, which advances it (pass your own to leave the training stream untouched).

        Raises ``ValueError`` for temperature <= 0 (or NaN), top_k < 1, max_new_tokens < 0 or an empty
        prompt (the first new token is predicted from the prompt's last one).
        """
        if not temperature > 0:  # (also NaN, which compares false both ways and would sample token 0)
            raise ValueError(
                f"generate: temperature must be > 0, got {temperature} (use a small value, e.g. 0.01)"
            )
        if top_k is not None and top_k < 1:
            raise ValueError(f"generate: top_k must be >= 1 or None, got {top_k}")
        if max_new_tokens < 0:
            raise ValueError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
        gen = generator if generator is not None else random.generator()
        out = np.array(idx.data if isinstance(idx, Tensor) else idx, dtype=np.int64, ndmin=2)
        if out.shape[-1] == 0:
            raise ValueError("generate: the prompt is empty; give at least one token id, e.g. a newline's")
        was_training = self.training
        self.eval()
        try:
            with no_grad():
                for _ in range(max_new_tokens):
                    logits = backend.to_numpy(self(out[:, -self.config.block_size :]).data[:, -1, :])
                    out = np.concatenate(
                        [out, _sample(logits.astype(np.float64), temperature, top_k, gen)], 1
                    )
        finally:
            self.train(was_training)
        return out


def _sample(
    logits: np.ndarray, temperature: float, top_k: int | None, gen: np.random.Generator
) -> np.ndarray:
    """One token id per row of ``logits`` (B, V), drawn from softmax(logits / temperature) restricted to
    the top_k largest; returns (B, 1). Inverse-CDF sampling with one uniform draw per row."""
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = np.partition(logits, -top_k, axis=-1)[:, -top_k, None]  # the k-th largest per row
        logits = np.where(logits < kth, -np.inf, logits)
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))  # shifted: exp cannot overflow
    cdf = np.cumsum(p, axis=-1)
    u = gen.random((logits.shape[0], 1)) * cdf[:, -1:]
    return np.minimum((cdf < u).sum(axis=-1, keepdims=True), logits.shape[-1] - 1).astype(np.int64)

"""The model, data and budget of the memory tests (tests/memory/test_memory.py and tests/workers/memory/).

The demonstration: a GPT whose training step needs more than ``BUDGET`` bytes on one rank
(``memory.OutOfMemoryError``) trains under the same per-rank budget on 4 ranks with FSDP (ZeRO-3),
because each rank then holds a quarter of the parameters, gradients and AdamW state, one or two
gathered blocks at a time, and a quarter of the batch's activations (and, under FSDP's recomputation,
only each block's input between forward and backward).
"""

from __future__ import annotations

import numpy as np

import minidist as md
from minidist import nn, optim
from minidist.models.gpt.model import GPT, GPTConfig

SEED = 3
# Wide and shallow: parameters and optimizer state dominate one rank's memory, as in the models FSDP is for.
CONFIG = dict(vocab_size=65, block_size=16, n_layer=3, n_head=2, n_embd=96)
BATCH, STEPS, LR = 8, 3, 1e-2
BUDGET = "4MiB"


def make_gpt() -> GPT:
    md.manual_seed(SEED)
    return GPT(GPTConfig(**CONFIG))


def batches() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(SEED)
    shape = (STEPS, BATCH, CONFIG["block_size"])
    idx, targets = rng.integers(0, CONFIG["vocab_size"], shape), rng.integers(0, CONFIG["vocab_size"], shape)
    return list(zip(idx, targets))


def train(model, optimizer, rank: int = 0, size: int = 1) -> list[float]:
    """STEPS AdamW steps; rank ``rank`` of ``size`` takes its equal rows of each global batch (the mean
    loss over a share; FSDP averages the gradients, so this is the global mean's gradient)."""
    losses = []
    for idx, targets in batches():
        rows = slice(rank * BATCH // size, (rank + 1) * BATCH // size)
        logits = model(idx[rows])
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, CONFIG["vocab_size"]), targets[rows].reshape(-1)
        )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def adamw(params) -> optim.AdamW:
    return optim.AdamW(params, lr=LR, weight_decay=0.0)

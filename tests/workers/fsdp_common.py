"""The problems the FSDP tests train: shared by the MPI workers and the single-process reference.

Two models, float64 (so 1 and N ranks differ only by the order of floating-point sums):

* the ZeRO tests' MLP (``zero_common.make_model``: 284 elements in three Linear layers), wrapped per
  Linear (three units, no root) or as one unit (``wrap=None``);
* a tiny GPT (2 blocks, width 16, tied embeddings), wrapped per ``Block``: the root then holds the
  tied ``wte.weight``, ``wpe`` and ``ln_f``.

``train`` runs the same loop for both: every rank takes its ``numpy.array_split`` share of each global
batch and scales its *summed* loss by N / batch, so the group average of the gradients is the gradient
of the global-batch mean, whatever the shares' sizes (N=3 included).
"""

from __future__ import annotations

import contextlib

import numpy as np
import zero_common as zc

import minidist as md
from minidist import nn, optim
from minidist.models import GPT, GPTConfig

SEED, STEPS, BATCH = 3, 4, 12
GPT_CONFIG = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, dropout=0.0)
CLIP = 0.05  # small enough that every step clips (the GPT's gradient norm is ~0.5): clipping is tested


def make_mlp(seed: int, dtype=np.float64) -> nn.Sequential:
    return zc.make_model(seed, dtype)[0]


def make_tied(seed: int, dtype=np.float64) -> nn.Sequential:
    """Three Linear layers whose first two share one (6, 6) weight: with ``wrap=(nn.Linear,)`` the
    shared weight belongs to two units, so FSDP puts it in the root (units.py)."""
    md.manual_seed(seed)
    first, second = nn.Linear(6, 6, dtype=dtype), nn.Linear(6, 6, dtype=dtype)
    second.weight = first.weight
    return nn.Sequential(first, nn.Tanh(), second, nn.Tanh(), nn.Linear(6, 4, dtype=dtype))


def make(kind: str, seed: int, dtype=np.float64) -> nn.Module:
    return {"mlp": make_mlp, "tied": make_tied, "gpt": make_gpt}[kind](seed, dtype)


def batches(kind: str) -> list[tuple[np.ndarray, np.ndarray]]:
    return gpt_batches() if kind == "gpt" else mlp_batches()


def make_gpt(seed: int, dtype=np.float64) -> GPT:
    md.manual_seed(seed)
    return GPT(GPTConfig(**GPT_CONFIG, dtype=dtype))


def mlp_batches(seed: int = SEED) -> list[tuple[np.ndarray, np.ndarray]]:
    x, y = zc.make_data(seed)
    return [zc.global_batch(x, y, step, BATCH) for step in range(STEPS)]


def gpt_batches(seed: int = SEED) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed + 5)
    T, V = GPT_CONFIG["block_size"], GPT_CONFIG["vocab_size"]
    ids = rng.integers(0, V, size=(STEPS, BATCH, T + 1))
    return [(b[:, :-1], b[:, 1:]) for b in ids]


def decay_groups(params) -> list[dict]:
    """train_gpt's split: weight decay on matrices only."""
    params = list(params)
    return [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]


OPTIMIZERS = {
    "sgd": lambda groups: optim.SGD(groups, lr=0.1, momentum=0.9),
    "adamw": lambda groups: optim.AdamW(groups, lr=0.01),
}


def train(model, optimizer, batches, clip=None, rank: int = 0, size: int = 1, accum: int = 1) -> list[float]:
    """Train on ``batches``; ``clip()`` (if given) runs between backward and step; with ``accum`` > 1
    this rank's share is split into micro-batches, all but the last backward under ``model.no_sync()``.
    Returns the norms that ``clip`` returned (empty without clipping)."""
    norms = []
    for xb, yb in batches:
        mine = np.array_split(np.arange(len(xb)), size)[rank]
        optimizer.zero_grad()
        for k, part in enumerate(np.array_split(mine, accum)):
            x = xb[part] if xb.dtype.kind == "i" else md.tensor(xb[part], dtype=np.float64)
            logits = model(x)
            logits = logits.reshape(-1, logits.shape[-1])
            targets = yb[part].reshape(-1)
            loss = nn.functional.cross_entropy(logits, targets, reduction="sum") * (size / len(xb))
            with model.no_sync() if k < accum - 1 else contextlib.nullcontext():
                loss.backward()
        if clip is not None:
            norms.append(float(clip()))
        optimizer.step()
    return norms

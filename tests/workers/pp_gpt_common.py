"""The GPT problem of the pipeline tests (tests/models/test_pipeline_gpt.py and pipeline/pp_gpt.py): a tiny
float64 GPT, its token data, its loss and optimizer, and the single-process reference they must match."""

from __future__ import annotations

import numpy as np

import minidist as md
from minidist import optim
from minidist.models import GPT, GPTConfig
from minidist.nn import functional as F
from minidist.nn.utils import clip_grad_norm_

V, T, BATCH, STEPS = 65, 8, 8, 3  # BATCH divisible by dp * m for dp in {1, 2}, m in {1, 2, 4}
MAX_NORM = 0.5  # every step's gradient is clipped (its norm is larger): the norm must be the GPT's


def build(seed: int, n_layer: int = 2, tie: bool = True, n_embd: int = 16) -> GPT:
    """The GPT every rank (and the reference) builds from ``seed``: width 16, 2 heads, context T."""
    md.manual_seed(seed)
    sizes = dict(vocab_size=V, block_size=T, n_layer=n_layer, n_head=2, n_embd=n_embd)
    return GPT(GPTConfig(**sizes, tie_weights=tie, dtype=np.float64))


def data(seed: int, n: int = 24) -> tuple[np.ndarray, np.ndarray]:
    """``n`` windows of ids (n, T) and their next-token targets (n, T), int64."""
    tokens = np.random.default_rng(seed + 1000).integers(0, V, size=(n, T + 1))
    return tokens[:, :-1], tokens[:, 1:]


def global_batch(ids: np.ndarray, targets: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
    rows = (np.arange(BATCH) + step * BATCH) % len(ids)
    return ids[rows], targets[rows]


def loss_fn(logits: md.Tensor, targets: np.ndarray) -> md.Tensor:
    """Mean cross-entropy of logits (b, T, V) against targets (b, T), over all b T positions."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_optimizer(params) -> optim.AdamW:
    return optim.AdamW(params, lr=1e-2, weight_decay=0.1)


def single_process(
    seed: int, n_layer: int = 2, tie: bool = True, freeze: tuple[str, ...] = (), accumulate: int = 1
) -> tuple[dict, list, list, np.ndarray]:
    """The reference: the GPT on one process, the whole batch, ``STEPS`` AdamW steps after clipping the
    gradient norm to ``MAX_NORM``. Returns its parameters, its losses, its gradient norms and its logits
    on all windows after training (``predict``'s answer). ``freeze``: names of parameters that do not
    train (``requires_grad = False``: no gradient, so AdamW's weight decay leaves them alone too).
    ``accumulate``: each step's batch in that many consecutive parts, one backward each, their gradients
    accumulated (PyTorch's semantics; the loss recorded is the parts' mean)."""
    gpt = build(seed, n_layer, tie)
    for name, p in gpt.named_parameters():
        p.requires_grad = name not in freeze
    opt = make_optimizer(gpt.parameters())
    ids, targets = data(seed)
    losses, norms = [], []
    for step in range(STEPS):
        xb, yb = global_batch(ids, targets, step)
        opt.zero_grad()
        parts = []
        for rows in np.array_split(np.arange(len(xb)), accumulate):
            loss = loss_fn(gpt(xb[rows]), yb[rows])
            loss.backward()
            parts.append(loss.item())
        norms.append(clip_grad_norm_(gpt.parameters(), MAX_NORM))
        opt.step()
        losses.append(float(np.mean(parts)))
    return gpt.state_dict(), losses, norms, gpt(ids).numpy()

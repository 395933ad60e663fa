"""Shared by the parallel-transformer MPI workers and their tests: the full models and their inputs.

A block config (a dict drawn by hypothesis in the test) names the width, heads, batch, sequence length,
bias and seed. The worker cuts a ``ParallelBlock`` out of the full ``Block`` built here on every rank;
the test runs the full block in one process and cuts its results with ``split.py`` to compare.
"""

from __future__ import annotations

import numpy as np

import minidist as md
from minidist.models.gpt.transformer import Block

F64 = np.float64


def full_block(cfg: dict) -> Block:
    """The single-process block a config describes, drawn from the config's seed (float64)."""
    md.manual_seed(cfg["seed"])
    block = Block(cfg["n_embd"], cfg["n_head"], cfg.get("dropout", 0.0), cfg["bias"], F64)
    # LayerNorm starts at gain 1, shift 0: perturb it, so that a wrong LayerNorm gradient shows
    rng = np.random.default_rng(cfg["seed"] + 2)
    for name, p in block.named_parameters():
        if "ln_" in name:
            p.data[...] += 0.1 * rng.standard_normal(p.shape)
    return block


def block_inputs(cfg: dict) -> tuple[np.ndarray, np.ndarray]:
    """The full input x (B, T, C) and upstream gradient w (B, T, C) of a block config."""
    rng = np.random.default_rng(cfg["seed"] + 1)
    shape = (cfg["batch"], cfg["T"], cfg["n_embd"])
    return rng.standard_normal(shape), rng.standard_normal(shape)


def run_module(module, x: np.ndarray, w: np.ndarray) -> dict[str, np.ndarray]:
    """y = module(x); backward of sum(y * w). Returns y, x.grad, every parameter and its gradient by name."""
    xt = md.tensor(np.ascontiguousarray(x), dtype=F64, requires_grad=True)
    y = module(xt)
    (y * md.tensor(np.ascontiguousarray(w), dtype=F64)).sum().backward()
    out = {"y": y.numpy(), "x.grad": xt.grad.copy()}
    for name, p in module.named_parameters():
        out[name], out[f"{name}.grad"] = p.numpy(), p.grad.copy()
    return out


# --- the whole GPT: a few AdamW steps on one global batch ---------------------------------------------
STEPS, LR, WEIGHT_DECAY = 3, 1e-2, 0.1


def gpt_config(cfg: dict):
    """The GPTConfig a test config describes (float64)."""
    from minidist.models import GPTConfig

    keys = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "dropout", "bias", "tie_weights")
    return GPTConfig(**{k: cfg[k] for k in keys if k in cfg}, dtype=F64)


def gpt_batch(cfg: dict) -> tuple[np.ndarray, np.ndarray]:
    """The global batch: token ids and next-token targets (B, T), the same on every rank."""
    rng = np.random.default_rng(cfg["seed"] + 3)
    ids = rng.integers(0, cfg["vocab_size"], (cfg["batch"], cfg["T"] + 1))
    return ids[:, :-1], ids[:, 1:]


def train_full_gpt(cfg: dict) -> dict[str, np.ndarray]:
    """The one-process reference: losses, first-step gradients and parameters after STEPS AdamW steps."""
    from minidist import optim
    from minidist.models import GPT
    from minidist.nn import functional as F

    md.manual_seed(cfg["seed"])
    model = GPT(gpt_config(cfg))
    opt = optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    idx, targets = gpt_batch(cfg)
    out: dict[str, np.ndarray] = {}
    losses = []
    for step in range(STEPS):
        logits = model(idx)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        losses.append(float(loss.numpy()))
        if step == 0:
            out.update({f"grad/{n}": p.grad.copy() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    out.update({f"param/{n}": p.numpy() for n, p in model.named_parameters()})
    out["losses"] = np.array(losses)
    return out

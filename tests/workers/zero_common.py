"""The problem the ZeRO tests train: shared by the MPI workers and the single-process reference.

Besides a small MLP the optimizer gets two extra parameters, placed last in the flat vector (so the
last rank owns them):

* ``penalised`` (5 elements) enters the loss through ``PENALTY * sum(penalised**2)``, which the MPI
  workers add on rank 0 only (scaled by N): the other ranks have no gradient for it, the case where
  ZeRO must count a missing local gradient as zero;
* ``unused`` (3 elements) never gets a gradient: like a plain optimizer, ZeRO must leave it alone
  (no weight decay, no momentum).
"""

from __future__ import annotations

import numpy as np

import minidist as md
from minidist import nn, optim

# (optimizer_class, kwargs) by name: SGD with momentum and weight decay (K = 1 buffer per element),
# AdamW (K = 2 buffers per element).
OPTIMIZERS = {
    "sgd": (optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=1e-3)),
    "adamw": (optim.AdamW, dict(lr=0.01, weight_decay=1e-2)),
}
STATE_BUFFERS = {"sgd": 1, "adamw": 2}  # optimizer-state arrays per parameter element
CONFIGS = [(1, "sgd"), (1, "adamw"), (2, "sgd"), (2, "adamw")]  # (stage, optimizer)
PENALTY = 0.05


def make_data(seed: int, n_samples: int = 64, n_in: int = 6, n_classes: int = 4):
    rng = np.random.default_rng(seed + 1000)
    return rng.standard_normal((n_samples, n_in)), rng.integers(0, n_classes, n_samples)


def make_model(seed: int, dtype) -> tuple[nn.Sequential, dict[str, nn.Parameter]]:
    """The MLP (284 elements) and the two extra parameters; P = 292 elements in all."""
    md.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(6, 16, dtype=dtype), nn.Tanh(), nn.Linear(16, 8, dtype=dtype), nn.GELU(),
        nn.Linear(8, 4, dtype=dtype),
    )  # fmt: skip
    rng = np.random.default_rng(seed + 2000)
    extra = {
        "penalised": nn.Parameter(rng.standard_normal(5).astype(dtype)),
        "unused": nn.Parameter(rng.standard_normal(3).astype(dtype)),
    }
    return model, extra


def all_params(model: nn.Sequential, extra: dict[str, nn.Parameter]) -> list[nn.Parameter]:
    return [*model.parameters(), extra["penalised"], extra["unused"]]


def snapshot(model: nn.Sequential, extra: dict[str, nn.Parameter]) -> dict[str, np.ndarray]:
    """Every parameter by name, as host copies."""
    out = {k: np.array(v) for k, v in model.state_dict().items()}
    out.update({k: p.numpy() for k, p in extra.items()})
    return out


def penalty(extra: dict[str, nn.Parameter]):
    p = extra["penalised"]
    return (p * p).sum() * PENALTY


def global_batch(x: np.ndarray, y: np.ndarray, step: int, batch: int):
    """The step-th global batch (wrapping around the data)."""
    idx = (np.arange(batch) + step * batch) % len(x)
    return x[idx], y[idx]


# -- Parameter groups, clipping, a schedule and gradient accumulation: the GPT recipe on the MLP -----
GROUP_STEPS, MICROBATCHES, GROUP_BATCH = 6, 2, 12  # 6 optimizer steps, each 2 microbatches of 6 samples
GROUP_KWARGS = dict(lr=0.02)  # AdamW; the groups set weight_decay (and the second its own lr)
# The gradient norms of this run lie between 0.28 and 0.46: 0.35 clips some steps and not others.
MAX_NORM = 0.35


def grouped(model: nn.Sequential) -> list[dict]:
    """nanoGPT's two AdamW groups: matrices decay, biases (and norms) do not."""
    params = list(model.parameters())
    return [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0, "lr": 0.01},
    ]


def schedule(opt):
    return optim.lr_scheduler.cosine_with_warmup(
        opt, warmup_steps=2, total_steps=GROUP_STEPS, start_factor=0.1
    )


def train_grouped(
    model, opt, scheduler, clip, x, y, steps, first_step=0, rank=0, world_size=1, dtype=np.float64
):
    """``steps`` steps of: MICROBATCHES backward passes (this rank's share of each microbatch), ``clip``
    (returns the norm), ``opt.step()``, ``scheduler.step()``. Each rank's loss is its *sum* scaled by
    world_size / BATCH, so the average over ranks is the global-batch mean (any share sizes).
    Returns ``(local loss sums, norms, lrs)`` per step."""
    sums, norms, lrs = [], [], []
    for step in range(first_step, first_step + steps):
        xb, yb = global_batch(x, y, step, GROUP_BATCH)
        opt.zero_grad()
        total = 0.0
        for micro in np.array_split(np.arange(GROUP_BATCH), MICROBATCHES):
            mine = np.array_split(micro, world_size)[rank]
            local = nn.functional.cross_entropy(
                model(md.tensor(xb[mine], dtype=dtype)), yb[mine], reduction="sum"
            )
            (local * (world_size / GROUP_BATCH)).backward()
            total += local.item()
        norms.append(clip())
        lrs.append([g["lr"] for g in opt.param_groups])
        opt.step()
        scheduler.step()
        sums.append(total)
    return sums, norms, lrs

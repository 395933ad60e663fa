"""The problem the pipeline tests train: shared by the MPI workers and the single-process reference."""

from __future__ import annotations

import numpy as np

import minidist as md
from minidist import nn, optim

BATCH = 48  # divisible by dp * m for dp in {1, 2} and m in {1, 3, 4, 8}


def make_model(seed: int, width: int = 16, dtype=np.float64) -> nn.Sequential:
    """Seven layers (four Linear), so that it splits into up to 7 stages.

    A large ``width`` makes the activations sent between stages bigger than MPI's eager limit, so
    that sends really wait for their receives (the case the schedules' deadlock rule is about).
    """
    md.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(6, width, dtype=dtype), nn.Tanh(), nn.Linear(width, width, dtype=dtype), nn.GELU(),
        nn.Linear(width, width, dtype=dtype), nn.Tanh(), nn.Linear(width, 4, dtype=dtype),
    )  # fmt: skip


DEEP_WIDTHS = (6, 16, 12, 16, 10, 14, 8, 12, 4)  # 8 Linear layers; different widths per boundary


def make_deep_model(seed: int, dtype=np.float64) -> nn.Sequential:
    """Fifteen layers (eight Linear of different widths, Tanh between): enough for p * v = 8 chunks, and
    the activations crossing different chunk boundaries have different shapes."""
    md.manual_seed(seed)
    layers: list[nn.Module] = []
    for k, (a, b) in enumerate(zip(DEEP_WIDTHS, DEEP_WIDTHS[1:])):
        layers += [nn.Linear(a, b, dtype=dtype)] + ([nn.Tanh()] if k < len(DEEP_WIDTHS) - 2 else [])
    return nn.Sequential(*layers)


def build(seed: int, width: int = 16, model: str = "mlp") -> nn.Sequential:
    """The model a config names: ``"mlp"`` (:func:`make_model`) or ``"deep"`` (:func:`make_deep_model`)."""
    return make_deep_model(seed) if model == "deep" else make_model(seed, width)


def make_data(seed: int, n_samples: int = 96) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed + 1000)
    return rng.standard_normal((n_samples, 6)), rng.integers(0, 4, n_samples)


def make_optimizer(name: str, params):
    if name == "sgd":
        return optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)
    return optim.AdamW(params, lr=0.01)


def global_batch(
    x: np.ndarray, y: np.ndarray, step: int, batch: int = BATCH
) -> tuple[np.ndarray, np.ndarray]:
    idx = (np.arange(batch) + step * batch) % len(x)
    return x[idx], y[idx]


def single_process(
    seed: int, steps: int, opt_name: str, width: int = 16, batch: int = BATCH, model: str = "mlp"
) -> tuple[dict, list[float], np.ndarray]:
    """The reference: the whole model, the whole batch, one process. Returns the parameters, the losses
    and the trained model's outputs on all samples (what ``PipelineParallel.predict`` must give)."""
    x, y = make_data(seed)
    model = build(seed, width, model)
    opt = make_optimizer(opt_name, model.parameters())
    losses = []
    for step in range(steps):
        xb, yb = global_batch(x, y, step, batch)
        loss = nn.functional.cross_entropy(model(md.tensor(xb, dtype=np.float64)), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model.state_dict(), losses, model(md.tensor(x, dtype=np.float64)).numpy()

"""The toy model of the resharding checkpoint tests: split tensors of every kind, no transformer.

Each parameter is rank ``tp_rank``'s piece (split.py) of a full tensor drawn from a seed, so a test
knows the full tensor that every layout's pieces must be cut from:

* ``emb.weight`` (7, 3), ``tp_dim`` 0: an uneven "vocabulary" (7 rows: 4 + 3 on tp 2, 2+2+2+1 on 4);
* ``attn.weight`` (12, 5) and ``attn.bias`` (12,), ``tp_dim`` 0, ``tp_stride`` 3: [q; k; v] blocks of
  4 rows, each split over tp (uneven on tp 3: 2 + 1 + 1 rows of each block);
* ``proj.weight`` (5, 6), ``tp_dim`` 1: row parallel, 6 columns (2+2+1+1 on tp 4);
* ``proj.bias`` (5,): replicated.

One AdamW step with the full gradient's pieces is elementwise, so every layout's parameters and
moments after it are the pieces of one process's (``full_after_step``).
"""

from __future__ import annotations

import numpy as np

from minidist import nn, optim
from minidist.parallel.tensor_parallel.split import shard_index

SPLITS = {  # name: (full shape, tp_dim, tp_stride)
    "emb.weight": ((7, 3), 0, 1),
    "attn.weight": ((12, 5), 0, 3),
    "attn.bias": ((12,), 0, 3),
    "proj.weight": ((5, 6), 1, 1),
    "proj.bias": ((5,), None, 1),
}


def full_tensors(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape) for name, (shape, _, _) in SPLITS.items()}


def piece(name: str, full: np.ndarray, tp: int, tp_rank: int) -> np.ndarray:
    """Rank ``tp_rank``'s piece of ``full`` (tensor ``name``), by split.py's rule."""
    shape, dim, stride = SPLITS[name]
    return full if dim is None else full[shard_index(shape, dim, tp, tp_rank, stride)]


class Holder(nn.Module):
    def __init__(self, **params: nn.Parameter) -> None:
        super().__init__()
        for k, p in params.items():
            setattr(self, k, p)


def build(tp: int, tp_rank: int, names=tuple(SPLITS), zero: bool = False) -> nn.Module:
    """The model of tp rank ``tp_rank`` of ``tp`` (zeros with ``zero``: a model to load into)."""
    full = full_tensors(0)
    model, parts = Holder(), {}
    for name in names:
        _, dim, stride = SPLITS[name]
        p = nn.Parameter(piece(name, full[name], tp, tp_rank).copy())
        if zero:
            p.data[...] = 0
        p.tp_dim, p.tp_stride = dim, stride
        parts.setdefault(name.split(".")[0], {})[name.split(".")[1]] = p
    for module, params in parts.items():
        setattr(model, module, Holder(**params))
    return model


def adamw(model: nn.Module) -> optim.AdamW:
    return optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.01)


def step(model: nn.Module, opt: optim.AdamW, tp: int, tp_rank: int) -> None:
    """One AdamW step with this rank's pieces of the full gradients (seed 1)."""
    grads = full_tensors(1)
    for name, p in model.named_parameters():
        p.grad = piece(name, grads[name], tp, tp_rank).copy()
    opt.step()


def full_after_step() -> dict[str, np.ndarray]:
    """``{name, name/exp_avg, name/exp_avg_sq}``: the full tensors after one step on one process."""
    model = build(1, 0)
    opt = adamw(model)
    step(model, opt, 1, 0)
    out = {}
    for i, (name, p) in enumerate(model.named_parameters()):
        out[name] = p.data.copy()
        for k in ("exp_avg", "exp_avg_sq"):
            out[f"{name}/{k}"] = opt.state[i][k].copy()
    return out


def dump(model: nn.Module, opt: optim.AdamW) -> dict[str, np.ndarray]:
    """This rank's parameters and moments, keyed as ``full_after_step``'s, and the ``step`` counters."""
    out = {}
    for i, (name, p) in enumerate(model.named_parameters()):
        out[name] = p.data.copy()
        for k in ("exp_avg", "exp_avg_sq", "step"):
            out[f"{name}/{k}"] = np.asarray(opt.state[i][k]).copy()
    return out

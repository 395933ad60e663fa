"""MPI worker (4 ranks): FSDP checkpoints saved and loaded on FSDP-N, DDP, ZeRO and one process.

Usage: ``mpiexec -n 4 python ckpt_fsdp.py CKPT OUT``. One launch runs every layout on sub-groups of the
4 ranks (``world.split`` + ``ProcessMesh(comm=...)``); each run trains the same tiny float64 GPT (tied
embeddings, every ``Block`` an FSDP unit, the rest in the root unit) with AdamW on the same global batch
per step, and rank 0 of the group writes ``OUT/<name>.npz``: the full parameters.

1. ``one_s4``: one process, 4 steps (the reference);
2. ``f4``: FSDP over 4 ranks, 2 steps, save ``CKPT/f4`` (step 2), 2 more steps: ``f4_s4``;
3. ``f2``: FSDP over ranks 0-1, 2 steps, ``async_save`` ``CKPT/f2``, 2 more: ``f2_s4``; a fresh FSDP-2
   (other initial weights) ``load_latest``\\ s it and trains 2 steps: ``f2_resumed_s4`` (bit-identical);
4. ``<kind>_from_f4``: FSDP-2, DDP-2, ZeRO-2 and one process load ``CKPT/f4``, save it again under their
   own layout (``CKPT/<kind>_from_f4``: must hold the same tensors) and train 2 steps: ``..._s4``;
5. ``d2``: DDP over ranks 0-1, 2 steps, save ``CKPT/d2``, 2 more: ``d2_s4``; FSDP-4 loads ``CKPT/d2``
   and trains 2 steps: ``f4_from_d2_s4``;
6. ``OUT/info.json``: the norms of ``tp_clip.clip_grad_norm_`` and of FSDP's own (equal without tp);
   the error every rank raises, saving and loading, for an optimizer built over the model's parameters
   instead of FSDP's shard tensors (the load changes nothing).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from dist_worker_utils import run_worker

import minidist as md
import minidist.distributed as dist
from minidist import checkpoint, optim
from minidist.models import GPT, GPTConfig
from minidist.models.gpt.transformer import Block
from minidist.nn import functional as F
from minidist.parallel import (
    DistributedDataParallel,
    FullyShardedDataParallel,
    ProcessMesh,
    ZeroRedundancyOptimizer,
)
from minidist.parallel.fsdp import tp_clip

CONFIG = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8, dtype="float64")
ROWS, LR = 4, 0.05  # global batch rows (1, 2 or 4 ranks take equal shares); AdamW's learning rate


def build(kind: str, mesh: ProcessMesh, seed: int = 0) -> SimpleNamespace:
    """The GPT from ``seed`` wrapped for ``kind`` ("one", "ddp", "zero", "fsdp") on ``mesh``'s dp group,
    with AdamW: weight decay on the matrices only (the split of examples/train_gpt.py)."""
    md.manual_seed(seed)
    gpt = GPT(CONFIG)
    params = list(gpt.parameters())  # (before FSDP shards them: their shapes decide the groups)
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    model, group = gpt, mesh.dp_group
    if kind == "fsdp":
        model = FullyShardedDataParallel(gpt, group=group, wrap=(Block,))
        opt = optim.AdamW(model.shard_param_groups(groups), lr=LR)
    elif kind == "zero":
        opt = ZeroRedundancyOptimizer(groups, optim.AdamW, group=group, lr=LR)
    else:
        model = DistributedDataParallel(gpt, group=group) if kind == "ddp" else gpt
        opt = optim.AdamW(groups, lr=LR)
    return SimpleNamespace(kind=kind, mesh=mesh, gpt=gpt, model=model, opt=opt, step=0)


def train(run: SimpleNamespace, steps: int) -> None:
    """``steps`` AdamW steps; step s uses the global batch of seed s, this dp rank its rows."""
    for _ in range(steps):
        rng = np.random.default_rng(run.step)
        x, y = (rng.integers(0, CONFIG.vocab_size, (ROWS, CONFIG.block_size)) for _ in range(2))
        share = ROWS // run.mesh.dp
        rows = slice(run.mesh.dp_rank * share, (run.mesh.dp_rank + 1) * share)
        logits = run.model(x[rows])
        F.cross_entropy(logits.reshape(-1, CONFIG.vocab_size), y[rows].reshape(-1)).backward()
        run.opt.step()
        run.opt.zero_grad()
        run.step += 1


def dump(run: SimpleNamespace, out: Path, name: str) -> None:
    """Rank 0 of the group writes the full parameters (FSDP gathers them: collective)."""
    if run.kind == "fsdp":
        full = {n: np.asarray(getattr(a, "data", a)) for n, a in run.model.state_dict().items()}
    else:
        full = {n: p.data.copy() for n, p in run.gpt.named_parameters()}
    if run.mesh.world.rank == 0:
        np.savez(out / f"{name}.npz", **full)


def main() -> None:
    ckpt, out = Path(sys.argv[1]), Path(sys.argv[2])
    world = dist.init()
    info = {}

    def on(n: int) -> ProcessMesh | None:
        comm = world.split(color=0 if world.rank < n else None)  # collective over the world
        return None if comm is None else ProcessMesh(dp=n, comm=comm)

    if (mesh := on(1)) is not None:  # 1. the reference
        one = build("one", mesh)
        train(one, 4)
        dump(one, out, "one_s4")

    f4 = build("fsdp", on(4))  # 2.
    train(f4, 2)
    checkpoint.save(ckpt / "f4", f4.model, f4.opt, step=2, mesh=f4.mesh)
    train(f4, 2)
    dump(f4, out, "f4_s4")

    if (mesh := on(2)) is not None:  # 3. same layout: async save, load_latest, bit-identical
        f2 = build("fsdp", mesh)
        train(f2, 2)
        checkpoint.save(ckpt / "f2", f2.model, f2.opt, step=2, mesh=mesh, async_save=True).wait()
        train(f2, 2)
        dump(f2, out, "f2_s4")
        resumed = build("fsdp", mesh, seed=1)
        resumed.step = checkpoint.load_latest(ckpt / "f2", resumed.model, resumed.opt, mesh=mesh)["step"]
        train(resumed, 2)
        dump(resumed, out, "f2_resumed_s4")

    for kind, n in (("fsdp", 2), ("ddp", 2), ("zero", 2), ("one", 1)):  # 4. FSDP-4 -> other layouts
        if (mesh := on(n)) is not None:
            run = build(kind, mesh, seed=1)
            run.step = checkpoint.load(ckpt / "f4", run.model, run.opt, mesh=mesh)["step"]
            checkpoint.save(ckpt / f"{kind}_from_f4", run.model, run.opt, step=run.step, mesh=mesh)
            train(run, 2)
            dump(run, out, f"{kind}_from_f4_s4")

    if (mesh := on(2)) is not None:  # 5. DDP-2 -> FSDP-4
        d2 = build("ddp", mesh)
        train(d2, 2)
        checkpoint.save(ckpt / "d2", d2.model, d2.opt, step=2, mesh=mesh)
        train(d2, 2)
        dump(d2, out, "d2_s4")
    f4 = build("fsdp", on(4), seed=1)
    f4.step = checkpoint.load(ckpt / "d2", f4.model, f4.opt, mesh=f4.mesh)["step"]
    train(f4, 2)
    dump(f4, out, "f4_from_d2_s4")

    # tp_clip without tensor parallelism is FSDP's own clip_grad_norm_ (2-norm and max-norm, one backward)
    x = np.random.default_rng(9).integers(0, CONFIG.vocab_size, (1, CONFIG.block_size))
    F.cross_entropy(f4.model(x).reshape(-1, CONFIG.vocab_size), x.reshape(-1)).backward()
    for p in (2.0, float("inf")):
        ours = tp_clip.clip_grad_norm_(f4.model, 1e9, norm_type=p)  # (1e9: nothing is scaled)
        info[f"clip_{p}_{world.rank}"] = [ours, f4.model.clip_grad_norm_(1e9, norm_type=p)]
    f4.opt.zero_grad()

    # 6. An optimizer over the model's own parameters: FSDP steps shard tensors, so the optimizer refuses
    # them at once; one over another model's tensors gets as far as the checkpoint. Every rank raises.
    try:
        optim.AdamW(f4.gpt.parameters(), lr=LR)
        info[f"wrong_build_{world.rank}"] = None
    except ValueError as err:
        info[f"wrong_build_{world.rank}"] = str(err)
    md.manual_seed(5)
    wrong = optim.AdamW(GPT(CONFIG).parameters(), lr=LR)
    try:
        checkpoint.save(ckpt / "wrong", f4.model, wrong, step=2, mesh=f4.mesh)
        info[f"wrong_{world.rank}"] = None
    except checkpoint.CheckpointError as err:
        info[f"wrong_{world.rank}"] = str(err)
    before = f4.model.state_dict()
    try:  # loading checks the optimizer before it changes anything
        checkpoint.load(ckpt / "f4", f4.model, wrong, mesh=f4.mesh)
        info[f"wrong_load_{world.rank}"] = None
    except ValueError as err:
        info[f"wrong_load_{world.rank}"] = str(err)
    after = f4.model.state_dict()
    info[f"unchanged_{world.rank}"] = all(np.array_equal(before[n], after[n]) for n in before)
    everyone = dist.all_gather_json(info, world)
    if world.rank == 0:
        (out / "info.json").write_text(json.dumps({k: v for part in everyone for k, v in part.items()}))


if __name__ == "__main__":
    run_worker(main)

"""MPI worker (4 ranks): checkpoints of uneven, strided and tied tensors saved on one tp, loaded on others.

Usage: ``mpiexec -n 4 python ckpt_reshard.py CKPT OUT``. One launch runs every layout on sub-groups
of the 4 ranks (``ProcessMesh(comm=...)``), each step writing ``OUT/<step>_r<rank of the group>.npz``
with that rank's parameters and AdamW moments (``reshard_common.dump``):

1. ``save_tp2``: ranks 0-1, tp 2: build, one AdamW step, save ``CKPT/a``; ``load_tp2``: the same
   layout loads it into a zeroed model (bit-exact, generators restored);
2. ``load_tp4`` (ranks 0-3), ``load_tp3`` (0-2, which then saves ``CKPT/b``), ``load_tp1`` (rank 0);
3. ``back_tp2``: ranks 0-1 load ``CKPT/b`` (saved on tp 3) on tp 2 again;
4. ``tied``: ranks 0-1 as 2 pipeline stages; stage 1 holds a tied copy of ``emb.weight`` (and
   ``proj.bias``); one step, save ``CKPT/c``, zero both stages, load: ``tied_r<stage>.npz``;
5. ``load_cp2``: ranks 0-1 as cp = 2 save ``CKPT/d`` and load it back; ``from_cp2_tp2``: tp 2 loads it;
6. ``wrong_save``/``wrong_load`` (in ``info.json``): the errors for pieces that split.py did not cut;
7. ``zero_to_tp3``: all 4 ranks as dp 2 x tp 2 with ZeRO save ``CKPT/f``; ranks 0-2 load it on tp 3.

``OUT/info.json``: each load's ``resharded`` and ``rng_restored``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import reshard_common as R
from dist_worker_utils import run_worker

import minidist.distributed as dist
from minidist import checkpoint, nn, optim
from minidist.parallel import ProcessMesh, ZeroRedundancyOptimizer


def main() -> None:
    ckpt, out = Path(sys.argv[1]), Path(sys.argv[2])
    world = dist.init()
    info = {}

    def on(n: int, tp: int = 1, pp: int = 1):
        comm = world.split(color=0 if world.rank < n else None)  # collective over the world
        return None if comm is None else ProcessMesh(tp=tp, pp=pp, comm=comm)

    def load(name: str, n: int, folder: Path, save_to: Path | None = None) -> None:
        mesh = on(n, tp=n)
        if mesh is None:
            return
        model = R.build(n, mesh.tp_rank, zero=True)
        opt = R.adamw(model)
        got = checkpoint.load(folder, model, opt, mesh=mesh)
        info[name] = {"resharded": got["resharded"], "rng_restored": got["rng_restored"]}
        np.savez(out / f"{name}_r{mesh.tp_rank}.npz", **R.dump(model, opt))
        if save_to is not None:
            checkpoint.save(save_to, model, opt, step=1, mesh=mesh)

    mesh = on(2, tp=2)
    if mesh is not None:
        model = R.build(2, mesh.tp_rank)
        opt = R.adamw(model)
        R.step(model, opt, 2, mesh.tp_rank)
        checkpoint.save(ckpt / "a", model, opt, step=1, mesh=mesh)
        np.savez(out / f"save_tp2_r{mesh.tp_rank}.npz", **R.dump(model, opt))
    load("load_tp2", 2, ckpt / "a")
    load("load_tp4", 4, ckpt / "a")
    load("load_tp3", 3, ckpt / "a", save_to=ckpt / "b")
    load("load_tp1", 1, ckpt / "a")
    load("back_tp2", 2, ckpt / "b")
    tied(on(2, pp=2), ckpt / "c", out)
    context_parallel(world.split(color=0 if world.rank < 2 else None), ckpt / "d", out, info)
    load("from_cp2_tp2", 2, ckpt / "d")
    wrong_pieces(on(2, tp=2), ckpt, info)
    zero = ProcessMesh(dp=2, tp=2)  # ZeRO over dp: its state is gathered, then saved like AdamW's
    model = R.build(2, zero.tp_rank)
    opt = ZeroRedundancyOptimizer(
        model.parameters(), optim.AdamW, group=zero.dp_group, lr=0.1, weight_decay=0.01
    )
    R.step(model, opt, 2, zero.tp_rank)
    checkpoint.save(ckpt / "f", model, opt, step=1, mesh=zero)
    load("zero_to_tp3", 3, ckpt / "f")
    if world.rank == 0:
        (out / "info.json").write_text(json.dumps(info))


def tied(mesh: ProcessMesh | None, folder: Path, out: Path) -> None:
    """Stage 0 holds ``emb.weight``; stage 1 its tied copy (``is_tied_copy``) and ``proj.bias``."""
    if mesh is None:
        return
    last = mesh.pp_rank == 1
    model = R.build(1, 0, names=("emb.weight", "proj.bias") if last else ("emb.weight",))
    if last:
        model.emb.weight.is_tied_copy = True
    opt = R.adamw(model)
    R.step(model, opt, 1, 0)  # the same gradient on both copies (the summed one, in a real pipeline)
    checkpoint.save(folder, model, opt, step=1, mesh=mesh)
    for p in model.parameters():
        p.data[...] = 0
    fresh = R.adamw(model)
    checkpoint.load(folder, model, fresh, mesh=mesh)
    np.savez(out / f"tied_r{mesh.pp_rank}.npz", **R.dump(model, fresh))


def context_parallel(comm, folder: Path, out: Path, info: dict) -> None:
    """Ranks 0-1 as the 2 context-parallel ranks of one replica (cp = 2): save ``CKPT/d``, load it back.

    The mesh is a stand-in with just the attributes the checkpoint reads; both cp ranks hold the whole
    (tp 1) model, like dp replicas.
    """
    if comm is None:
        return
    mesh = SimpleNamespace(
        world=comm, world_size=2, dp=1, tp=1, pp=1, cp=2, dp_rank=0, tp_rank=0, pp_rank=0, cp_rank=comm.rank
    )
    model = R.build(1, 0)
    opt = R.adamw(model)
    R.step(model, opt, 1, 0)
    checkpoint.save(folder, model, opt, step=1, mesh=mesh)
    fresh = R.build(1, 0, zero=True)
    fresh_opt = R.adamw(fresh)
    got = checkpoint.load(folder, fresh, fresh_opt, mesh=mesh)
    info["load_cp2"] = {"resharded": got["resharded"], "rng_restored": got["rng_restored"]}
    np.savez(out / f"load_cp2_r{comm.rank}.npz", **R.dump(fresh, fresh_opt))


def wrong_pieces(mesh: ProcessMesh | None, ckpt: Path, info: dict) -> None:
    """Ranks 0-1, tp 2, hold ``emb.weight`` cut 3 + 4 (split.py cuts 7 rows 4 + 3): ``save`` and a
    ``load`` of ``CKPT/a`` must both raise ``CheckpointError`` on every rank (``info["wrong_*"]``)."""
    if mesh is None:
        return
    model = R.build(2, mesh.tp_rank)
    full = R.full_tensors(0)["emb.weight"]
    model.emb.weight = nn.Parameter(full[:3] if mesh.tp_rank == 0 else full[3:])
    model.emb.weight.tp_dim = 0
    for what, call in (
        ("wrong_save", lambda: checkpoint.save(ckpt / "e", model, step=1, mesh=mesh)),
        ("wrong_load", lambda: checkpoint.load(ckpt / "a", model, mesh=mesh)),
    ):
        try:
            call()
            info[what] = None
        except checkpoint.CheckpointError as err:
            info[what] = str(err)


if __name__ == "__main__":
    run_worker(main)

"""Checkpoints of an interleaved pipeline (2 ranks, ``pp_common``'s deep model, AdamW, float64).

    mpiexec -n 2 python pp_checkpoint.py OUT_DIR

Trains 2 steps with ``schedule="interleaved", virtual_stages=2`` (rank r holds chunks r and r + 2,
non-consecutive layers), saves a checkpoint, trains a third step. Then fresh pipelines built from
another seed load that checkpoint and train the third step again: one interleaved like the first (a
bit-exact resume), one with 1F1B (other layers on each rank: the checkpoint maps tensors by the full
model's names). Each rank writes OUT_DIR/{run}_rank{r}.npz (its parameters under global names) for
run in ``straight``, ``resumed``, ``resumed_1f1b``, and OUT_DIR/info_rank{r}.json.
"""

import json
import sys
from pathlib import Path

import numpy as np
import pp_common

import minidist as md
from minidist import checkpoint, nn
from minidist.parallel import ProcessMesh
from minidist.parallel.pipeline import PipelineParallel

out = Path(sys.argv[1])
mesh = ProcessMesh(dp=1, tp=1, pp=2)
SEED = 7
x, y = pp_common.make_data(SEED)


def build(seed: int, schedule: str, v: int):
    model = pp_common.make_deep_model(seed)
    pipe = PipelineParallel(model, mesh, microbatches=2, schedule=schedule, virtual_stages=v)
    return pipe, pp_common.make_optimizer("adamw", pipe.parameters())


def train(pipe, opt, steps) -> list[float]:
    losses = []
    for step in steps:
        xb, yb = pp_common.global_batch(x, y, step)
        opt.zero_grad()
        losses.append(pipe.train_step(md.tensor(xb, dtype=np.float64), yb, nn.functional.cross_entropy))
        opt.step()
    return losses


pipe, opt = build(SEED, "interleaved", 2)
info = {"losses": train(pipe, opt, range(2)), "names": [n for n, _ in pipe.named_parameters()]}
checkpoint.save(out / "ckpt", pipe, opt, step=2, mesh=mesh)
info["straight"] = train(pipe, opt, [2])
np.savez(out / f"straight_rank{mesh.rank}.npz", **pipe.stage_module.state_dict())
for run, schedule, v in [("resumed", "interleaved", 2), ("resumed_1f1b", "1f1b", 1)]:
    pipe, opt = build(SEED + 1, schedule, v)  # other initial weights: the load must replace them all
    info[f"{run}_step"] = checkpoint.load(out / "ckpt", pipe, opt, mesh=mesh)["step"]
    info[run] = train(pipe, opt, [2])
    np.savez(out / f"{run}_rank{mesh.rank}.npz", **pipe.stage_module.state_dict())
(out / f"info_rank{mesh.rank}.json").write_text(json.dumps(info))

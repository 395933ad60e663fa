"""Train the same model with the naive GPipe step and with PipelineParallel ("gpipe", "1f1b").

    mpiexec -n P python pp_naive.py OUT_DIR CONFIGS_JSON

CONFIGS_JSON: a list of {"m", "seed", "steps", "opt"}. For config k and each way W of "naive", "gpipe"
and "1f1b", every rank (one stage each) builds pp_common's float64 model from the seed, trains ``steps``
steps on pp_common's batches and writes OUT_DIR/k_W_rank{r}.npz: its stage's parameters under the full
model's names, and "losses" (the mean loss of every step, as returned on this rank).
"""

import json
import sys
from pathlib import Path

import numpy as np
import pp_common

import minidist as md
import minidist.distributed as dist
from minidist import nn
from minidist.parallel.pipeline import PipelineParallel, naive_gpipe_step
from minidist.parallel.pipeline.partition import build_stage, partition

out, configs = Path(sys.argv[1]), json.loads(sys.argv[2])
world = dist.init()
s, p = world.rank, world.size
loss_fn = nn.functional.cross_entropy
for k, cfg in enumerate(configs):
    m = cfg["m"]
    x, y = pp_common.make_data(cfg["seed"])
    for way in ("naive", "gpipe", "1f1b"):
        model = pp_common.build(cfg["seed"])
        if way == "naive":  # the same cut as PipelineParallel's default: balanced by parameter count
            stage = build_stage(model, partition(model, p)[s])
        else:
            pipe = PipelineParallel(model, world, microbatches=m, schedule=way)
            stage = pipe.stage_module
        opt = pp_common.make_optimizer(cfg["opt"], stage.parameters())
        losses = []
        for step in range(cfg["steps"]):
            xb, yb = pp_common.global_batch(x, y, step)
            inputs = md.tensor(xb, dtype=np.float64) if s == 0 else None
            targets = yb if s == p - 1 else None
            opt.zero_grad()
            if way == "naive":
                losses.append(naive_gpipe_step(stage, world, inputs, targets, loss_fn, m))
            else:
                losses.append(pipe.train_step(inputs, targets, loss_fn))
            opt.step()
        np.savez(out / f"{k}_{way}_rank{s}.npz", losses=np.array(losses), **stage.state_dict())

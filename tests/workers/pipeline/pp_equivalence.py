"""Train with PipelineParallel (optionally x data parallel) for several configurations in one launch.

    mpiexec -n N python pp_equivalence.py OUT_DIR CONFIGS_JSON

CONFIGS_JSON: a list of {"pp", "dp", "m", "schedule", "steps", "seed", "opt"[, "width", "trace",
"batch", "v", "model"]} with pp * dp = N ("v": virtual stages of the interleaved schedule; "model":
"mlp" or "deep", see pp_common.build). Rank layout as ProcessMesh with tp=1: rank = pp_rank * dp +
dp_rank. For config k every rank writes OUT_DIR/k_rank{r}.npz (its stage's parameters under global names) and
k_rank{r}.json (losses, stage, peak activations measured and from the schedule; with "trace": true,
the trace spans of the last step) and k_rank{r}_predict.npy (``pipe.predict`` of all samples after
training; only stage 0 passes the inputs).
"""

import json
import sys
from pathlib import Path

import numpy as np
import pp_common

import minidist as md
import minidist.distributed as dist
from minidist import nn, trace
from minidist.parallel.pipeline import PipelineParallel, peak_activations

out, configs = Path(sys.argv[1]), json.loads(sys.argv[2])
world = dist.init()
for k, cfg in enumerate(configs):
    pp, dp = cfg["pp"], cfg["dp"]
    assert pp * dp == world.size, (cfg, world.size)
    pp_rank, dp_rank = divmod(world.rank, dp)
    pp_group = world.split(dp_rank, key=pp_rank)  # the ranks holding the same data share, one per stage
    dp_group = world.split(pp_rank, key=dp_rank) if dp > 1 else None  # the replicas of one stage
    model = pp_common.build(cfg["seed"], cfg.get("width", 16), cfg.get("model", "mlp"))
    pipe = PipelineParallel(
        model,
        pp_group,
        microbatches=cfg["m"],
        schedule=cfg["schedule"],
        dp_group=dp_group,
        virtual_stages=cfg.get("v", 1),
    )
    opt = pp_common.make_optimizer(cfg["opt"], pipe.parameters())
    x, y = pp_common.make_data(cfg["seed"])
    losses, peaks = [], []
    for step in range(cfg["steps"]):
        if cfg.get("trace") and step == cfg["steps"] - 1:
            dist.barrier(pp_group)  # the stages' clocks start together (see minidist.trace)
            trace.enable()
        xb, yb = pp_common.global_batch(x, y, step, cfg.get("batch", pp_common.BATCH))
        mine = np.array_split(np.arange(len(xb)), dp)[dp_rank]
        opt.zero_grad()
        losses.append(
            pipe.train_step(md.tensor(xb[mine], dtype=np.float64), yb[mine], nn.functional.cross_entropy)
        )
        opt.step()
        peaks.append(pipe.stats.peak_activations)
    np.savez(out / f"{k}_rank{world.rank}.npz", **pipe.stage_module.state_dict())
    inputs = md.tensor(x, dtype=np.float64) if pipe.stage_index == 0 else None
    np.save(out / f"{k}_rank{world.rank}_predict.npy", pipe.predict(inputs))
    info = {
        "losses": losses,
        "stage": pipe.stage_index,
        "peaks": peaks,
        "theory_peak": peak_activations(pipe.schedule)[pipe.stage_index],
        "names": [name for name, _ in pipe.named_parameters()],
        "events": trace.events() if cfg.get("trace") else None,
    }
    trace.disable()
    (out / f"{k}_rank{world.rank}.json").write_text(json.dumps(info))

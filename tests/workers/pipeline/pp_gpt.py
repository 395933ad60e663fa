"""Train ``GPT.pipeline_layers()`` with PipelineParallel (optionally x data parallel), several configs.

    mpiexec -n N python pp_gpt.py OUT_DIR CONFIGS_JSON

CONFIGS_JSON: a list of {"pp", "dp", "m", "schedule", "seed"[, "v", "n_layer", "tie", "cuts",
"bad_seed", "freeze", "accumulate"]} with pp * dp = N. Rank layout as ProcessMesh with tp = 1:
rank = pp_rank * dp + dp_rank. Token ids (B, T) go into stage 0 as int64 arrays. For config k every
rank writes OUT_DIR/k_rank{r}.npz (its stage's parameters under GPT's names), k_rank{r}.json (losses,
stage, which parameters are tied copies, the gradient norms that ``clip_grad_norm_`` over the pp group
clipped every step by) and k_rank{r}_predict.npy (``pipe.predict`` of all windows after training).
With "bad_seed" the last stage builds its GPT from another seed: construction must raise ValueError on
every rank (the tied copy differs), and the JSON holds the message instead. "freeze": names of
parameters with ``requires_grad = False``; "accumulate" (dp 1): each step's batch in that many parts,
one ``train_step`` each before the optimizer step.
"""

import json
import sys
from pathlib import Path

import numpy as np
import pp_gpt_common as common

import minidist.distributed as dist
from minidist.parallel import clip_grad_norm_
from minidist.parallel.pipeline import PipelineParallel

out, configs = Path(sys.argv[1]), json.loads(sys.argv[2])
world = dist.init()
for k, cfg in enumerate(configs):
    pp, dp = cfg["pp"], cfg["dp"]
    assert pp * dp == world.size, (cfg, world.size)
    pp_rank, dp_rank = divmod(world.rank, dp)
    pp_group = world.split(dp_rank, key=pp_rank)  # one rank per stage, the same data share
    dp_group = world.split(pp_rank, key=dp_rank) if dp > 1 else None  # the replicas of one stage
    seed = cfg["seed"] + (1 if cfg.get("bad_seed") and pp_rank == pp - 1 else 0)
    gpt = common.build(seed, cfg.get("n_layer", 2), cfg.get("tie", True))
    for name, param in gpt.named_parameters():  # a frozen wte.weight: the tied copy inherits it
        param.requires_grad = name not in cfg.get("freeze", ())
    info = {"stage": pp_rank}
    try:
        pipe = PipelineParallel(
            gpt.pipeline_layers(),
            pp_group,
            microbatches=cfg["m"],
            schedule=cfg["schedule"],
            dp_group=dp_group,
            cuts=cfg.get("cuts"),
            virtual_stages=cfg.get("v", 1),
        )
    except ValueError as e:
        info["error"] = str(e)
        (out / f"{k}_rank{world.rank}.json").write_text(json.dumps(info))
        continue
    opt = common.make_optimizer(pipe.parameters())
    ids, targets = common.data(cfg["seed"])
    losses, norms = [], []
    for step in range(common.STEPS):
        xb, yb = common.global_batch(ids, targets, step)
        mine = np.array_split(np.arange(len(xb)), dp)[dp_rank]
        opt.zero_grad()
        parts = [  # "accumulate" (dp 1): train_step on consecutive parts, gradients accumulating
            pipe.train_step(xb[rows], yb[rows], common.loss_fn)  # int64 ids into stage 0
            for rows in np.array_split(mine, cfg.get("accumulate", 1))
        ]
        losses.append(float(np.mean(parts)))
        norms.append(clip_grad_norm_(pipe.parameters(), common.MAX_NORM, pp_group=pp_group))
        opt.step()
    np.savez(out / f"{k}_rank{world.rank}.npz", **pipe.stage_module.state_dict())
    np.save(out / f"{k}_rank{world.rank}_predict.npy", pipe.predict(ids if pp_rank == 0 else None))
    info["losses"], info["norms"] = losses, norms
    info["names"] = [name for name, _ in pipe.named_parameters()]
    info["tied_copies"] = [name for name, p in pipe.named_parameters() if p.is_tied_copy]
    (out / f"{k}_rank{world.rank}.json").write_text(json.dumps(info))

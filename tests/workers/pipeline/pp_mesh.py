"""Train minidist.models.MLP under PipelineParallel on a ProcessMesh (dp x tp x pp), several meshes.

    mpiexec -n N python pp_mesh.py OUT_DIR CONFIGS_JSON

CONFIGS_JSON: a list of {"dp", "tp", "pp", "m", "schedule", "steps", "seed"[, "v"]} with dp * tp * pp = N
("v": virtual stages, with schedule "interleaved").
The tensor-parallel MLP (column/row-parallel pairs, tp_common's sizes) is cut into pp stages; each
dp replica trains on its numpy.array_split share of the global batch. For config k every rank writes
OUT_DIR/k_rank{r}.npz (its stage's parameter shards under global names) and k_rank{r}.json (losses,
mesh coordinates, tp_dim of each parameter).
"""

import json
import sys
from pathlib import Path

import numpy as np
import pp_common
import tp_common

import minidist as md
from minidist import nn
from minidist.models import MLP
from minidist.parallel import PipelineParallel, ProcessMesh

out, configs = Path(sys.argv[1]), json.loads(sys.argv[2])
for k, cfg in enumerate(configs):
    mesh = ProcessMesh(dp=cfg["dp"], tp=cfg["tp"], pp=cfg["pp"])
    md.manual_seed(cfg["seed"])
    model = MLP(tp_common.N_IN, tp_common.HIDDEN, tp_common.N_CLASSES, mesh=mesh, dtype=np.float64)
    pipe = PipelineParallel(
        model, mesh, microbatches=cfg["m"], schedule=cfg["schedule"], virtual_stages=cfg.get("v", 1)
    )
    opt = pp_common.make_optimizer("sgd", pipe.parameters())
    x, y = tp_common.make_data(cfg["seed"])
    losses = []
    for step in range(cfg["steps"]):
        xb, yb = tp_common.global_batch(x, y, step, pp_common.BATCH)
        mine = np.array_split(np.arange(len(xb)), mesh.dp)[mesh.dp_rank]
        opt.zero_grad()
        losses.append(
            pipe.train_step(md.tensor(xb[mine], dtype=np.float64), yb[mine], nn.functional.cross_entropy)
        )
        opt.step()
    np.savez(out / f"{k}_rank{mesh.rank}.npz", **pipe.stage_module.state_dict())
    tp_dims = {name: getattr(p, "tp_dim", None) for name, p in pipe.named_parameters()}
    info = {"losses": losses, "coords": list(mesh.coords), "tp_dims": tp_dims}
    (out / f"{k}_rank{mesh.rank}.json").write_text(json.dumps(info))

"""MPI worker: run hypothesis-drawn configs through the tensor-parallel layers over the world group.

argv: out_dir configs.json. Each config (see tp_common and
tests/parallel/tensor_parallel/test_tensor_parallel.py) names a layer (column / row / mlp), its sizes, bias,
flag (gather_output or input_is_parallel), batch shape and seed. Every rank writes rank{r}.npz with "{i}/y",
"{i}/x.grad", "{i}/p{j}", "{i}/p{j}.grad" for config i; rank 0 also writes meta.json: per config, which
outputs are sharded and each parameter's tp_dim.
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/workers: the shared worker modules
import tp_common  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist.parallel import ColumnParallelLinear, ParallelMLP, RowParallelLinear  # noqa: E402
from minidist.parallel.tensor_parallel.mappings import split_last_axis  # noqa: E402

out_dir, configs = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
world = dist.init()
F64 = np.float64
results, meta = {}, []
for i, cfg in enumerate(configs):
    md.manual_seed(cfg["seed"])
    kind, flag = cfg["kind"], cfg["flag"]
    if kind == "column":
        layer = ColumnParallelLinear(cfg["in"], cfg["out"], cfg["bias"], world, gather_output=flag, dtype=F64)
    elif kind == "row":
        layer = RowParallelLinear(
            cfg["in"], cfg["out"], cfg["bias"], world, input_is_parallel=flag, dtype=F64
        )
    else:
        layer = ParallelMLP(cfg["in"], cfg["hidden"], cfg["out"], cfg["bias"], group=world, dtype=F64)
    x, w = tp_common.layer_inputs(cfg)
    x_sharded = kind == "row" and flag
    y_sharded = kind == "column" and not flag
    if x_sharded:
        x = split_last_axis(x, world)
    if y_sharded:
        w = split_last_axis(w, world)
    for key, value in tp_common.run_layer(layer, np.ascontiguousarray(x), np.ascontiguousarray(w)).items():
        results[f"{i}/{key}"] = value
    tp_dims = [p.tp_dim for p in layer.parameters()]
    meta.append({"x_sharded": x_sharded, "y_sharded": y_sharded, "tp_dims": tp_dims})
np.savez(out_dir / f"rank{world.rank}.npz", **results)
if world.rank == 0:
    (out_dir / "meta.json").write_text(json.dumps(meta))

"""MPI worker (4 ranks, dp=2 x tp=2): a per-rank seed, then a column and a row layer over mesh.tp_group.

    mpiexec -n 4 python tp_seed_mesh.py OUT_DIR

Writes OUT_DIR/rank{r}.npz: the layers' parameters gathered over the tp group to their full shapes,
and the dense layers that the seed of this tp group's first rank builds on one device.
"""

import sys
from pathlib import Path

import numpy as np

import minidist as md
import minidist.distributed as dist
from minidist import nn
from minidist.parallel import ColumnParallelLinear, ProcessMesh, RowParallelLinear

out = Path(sys.argv[1])
world = dist.init()
mesh = ProcessMesh(dp=2, tp=2)
tp = mesh.tp_group
F64 = np.float64


def full(param) -> np.ndarray:
    if param.tp_dim is None:
        return param.data
    parts = dist.all_gather(np.ascontiguousarray(param.data), group=tp).reshape(tp.size, *param.shape)
    return np.concatenate(list(parts), axis=param.tp_dim)


md.manual_seed(world.rank)
layers = [ColumnParallelLinear(6, 8, dtype=F64, group=tp), RowParallelLinear(8, 4, dtype=F64, group=tp)]
arrays = {f"tp{k}.{n}": full(p) for k, layer in enumerate(layers) for n, p in layer.named_parameters()}
md.manual_seed(world.rank - tp.rank)  # the seed of this tp group's first rank
dense = [nn.Linear(6, 8, dtype=F64), nn.Linear(8, 4, dtype=F64)]
arrays.update({f"dense{k}.{n}": p.data for k, layer in enumerate(dense) for n, p in layer.named_parameters()})
np.savez(out / f"rank{world.rank}.npz", **arrays)

"""MPI worker (2 ranks): tensor-parallel layers built after a per-rank seed, ``md.manual_seed(rank)``.

    mpiexec -n 2 python tp_seed.py OUT_DIR

Writes OUT_DIR/rank{r}.npz: every layer's parameters gathered to their full shapes (``full.*``), the
output of the whole model on the same input (``y``), the output of a ParallelMLP with dropout in
training (``y_mlp``), and the parameters of the dense model that rank 0's seed builds on one device
(``dense.*``); and OUT_DIR/rank{r}.json: the errors of the bad-argument cases.
"""

import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

import minidist as md
import minidist.distributed as dist
from minidist import nn
from minidist.parallel import ColumnParallelLinear, ParallelMLP, RowParallelLinear

out = Path(sys.argv[1])
world = dist.init()
rank = world.rank
F64 = np.float64


def full(param) -> np.ndarray:
    """The whole parameter: shards gathered along their tp_dim, replicated ones as they are."""
    if param.tp_dim is None:
        return param.data
    parts = dist.all_gather(np.ascontiguousarray(param.data), group=world).reshape(world.size, *param.shape)
    return np.concatenate(list(parts), axis=param.tp_dim)


def build(tp: bool) -> nn.Sequential:
    """Column(6 -> 8), ReLU, Row(8 -> 4), Dropout, Linear(4 -> 3); with ``tp=False`` the dense twin."""
    if tp:
        first, second = ColumnParallelLinear(6, 8, dtype=F64), RowParallelLinear(8, 4, dtype=F64)
    else:
        first, second = nn.Linear(6, 8, dtype=F64), nn.Linear(8, 4, dtype=F64)
    return nn.Sequential(first, nn.ReLU(), second, nn.Dropout(0.5), nn.Linear(4, 3, dtype=F64))


x = md.tensor(np.random.default_rng(7).standard_normal((5, 6)), dtype=F64)
md.manual_seed(rank)  # the habit of data-parallel scripts: a different stream on every rank
model = build(tp=True)
arrays = {f"full.{name}": full(p) for name, p in model.named_parameters()}
arrays["y"] = model(x).data  # training mode: the dropout on replicated activations must agree too
arrays["y_eval"] = model.eval()(x).data  # no dropout: shows that the dropout above did drop

md.manual_seed(10 + rank)
mlp = ParallelMLP(6, 8, 4, dtype=F64)
arrays.update({f"mlp.{name}": full(p) for name, p in mlp.named_parameters()})

# What rank 0's seeds build on one device, drawing the same numbers in the same order
md.manual_seed(0)
dense = build(tp=False)
arrays.update({f"dense.{name}": p.data for name, p in dense.named_parameters()})
arrays["dense_y"] = dense(x).data
md.manual_seed(10)
dense_mlp = [nn.Linear(6, 8, dtype=F64), nn.Linear(8, 4, dtype=F64)]
for k, layer in enumerate(dense_mlp):
    arrays.update({f"dense_mlp.fc{k + 1}.{name}": p.data for name, p in layer.named_parameters()})
np.savez(out / f"rank{rank}.npz", **arrays)


cases = {
    "group_not_a_communicator_on_rank_1": lambda: ColumnParallelLinear(6, 8, group="tp" if rank else None),
    "bias_array_on_rank_0": lambda: RowParallelLinear(8, 4, bias=np.ones(4) if rank == 0 else True),
    "mlp_bias_array_on_rank_1": lambda: ParallelMLP(6, 8, bias=np.ones(8) if rank else True),
    "mlp_group_not_a_communicator_on_rank_0": lambda: ParallelMLP(
        6, 8, group=MPI.COMM_WORLD if rank == 0 else None
    ),
}
results = {}
for name, case in cases.items():
    try:
        case()
        results[name] = [None, "no error"]
    except (TypeError, ValueError) as error:
        results[name] = [type(error).__name__, str(error)]
results["after"] = float(RowParallelLinear(8, 4)(md.tensor(np.ones((2, 4)), dtype=np.float32)).sum().item())
(out / f"rank{rank}.json").write_text(json.dumps(results))

"""MPI worker (2 ranks): tensor-parallel misuse must raise the same error on every rank, never hang.

    mpiexec -n 2 python tp_errors.py OUT_DIR

Each case builds layers (or clips gradients) with arguments that differ between the ranks, or are bad
on one rank only; rank{r}.json records, per case, [exception type, message] or [None, result]. The
last entries check that the group still works afterwards (no collective was left half done).
"""

import json
import math
import sys
from pathlib import Path

import numpy as np

import minidist as md
import minidist.distributed as dist
from minidist.parallel import ColumnParallelLinear, ParallelMLP, RowParallelLinear, clip_grad_norm_

out = Path(sys.argv[1])
world = dist.init()
rank = world.rank
alone = world.split(rank)  # a tp group of one rank each: for the checks over the pp group only


def tp_pair(seed: int = 0):
    """Column(6 -> 8) then Row(8 -> 4) over the world, after one backward: 4 params, 3 of them sharded."""
    md.manual_seed(seed)
    col, row = ColumnParallelLinear(6, 8, group=world), RowParallelLinear(8, 4, group=world)
    x = md.tensor(np.random.default_rng(seed).random((3, 6)), dtype=np.float32)
    row(col(x)).sum().backward()
    return col, row


def clip(params, *args, **kwargs):
    return clip_grad_norm_(params, *args, **kwargs)


def nan_in_replicated(norm_type: float) -> float:
    col, row = tp_pair()
    if rank == 1:
        row.bias.grad[0] = np.nan  # a replicated gradient, on one rank only
    before = [p.grad.copy() for p in (*col.parameters(), *row.parameters())]
    norm = clip([*col.parameters(), *row.parameters()], 1e-3, norm_type)
    after = [p.grad for p in (*col.parameters(), *row.parameters())]
    unchanged = all(np.array_equal(a, b, equal_nan=True) for a, b in zip(before, after))
    return [repr(norm), unchanged]


def nonfinite_error():
    col, row = tp_pair()
    if rank == 0:
        col.weight.grad[0, 0] = np.inf  # a sharded gradient, on one rank only
    return clip([*col.parameters(), *row.parameters()], 1.0, error_if_nonfinite=True)


def fewer_params_on_rank_1():
    col, row = tp_pair()
    params = [*col.parameters(), *row.parameters()]
    return clip(params if rank == 0 else params[2:], 1.0)


def other_max_norm():
    col, row = tp_pair()
    return clip([*col.parameters(), *row.parameters()], 1.0 + rank)


def other_norm_type_over_pp():
    md.manual_seed(0)
    layer = ColumnParallelLinear(4, 4, group=alone)  # tp = 1: only the pp group compares anything
    layer(md.tensor(np.ones((2, 4), dtype=np.float32))).sum().backward()
    return clip(list(layer.parameters()), 1.0, norm_type=2.0 if rank == 0 else math.inf, pp_group=world)


def numpy_sizes():
    sizes = (np.int64(6), np.int32(8)) if rank == 0 else (6, 8)  # equal values: no mismatch
    layer = ColumnParallelLinear(*sizes, group=world)
    return [type(layer.in_features).__name__, layer.out_features_per_partition]


cases = {
    "row_in_features_differ": lambda: RowParallelLinear(8 if rank == 0 else 12, 4, group=world),
    "column_out_features_differ": lambda: ColumnParallelLinear(
        8, 8 if rank == 0 else 12, group=world, gather_output=True
    ),
    "gather_output_differs": lambda: ColumnParallelLinear(6, 8, group=world, gather_output=rank == 0),
    "input_is_parallel_differs": lambda: RowParallelLinear(8, 4, group=world, input_is_parallel=rank == 0),
    "dtype_differs": lambda: RowParallelLinear(8, 4, group=world, dtype=[np.float32, np.float64][rank]),
    "mlp_activation_differs": lambda: ParallelMLP(4, 8, group=world, activation=["relu", "gelu"][rank]),
    "float_size_on_rank_1": lambda: ColumnParallelLinear(6 if rank == 0 else 6.0, 8, group=world),
    "not_divisible_on_rank_0": lambda: RowParallelLinear(7 if rank == 0 else 8, 4, group=world),
    "mlp_hidden_not_divisible": lambda: ParallelMLP(4, 7, group=world),
    "numpy_sizes": numpy_sizes,
    "scalar_input": lambda: ColumnParallelLinear(6, 8, group=world)(md.tensor(np.float32(1.0))),
    "clip_nan_inf_norm": lambda: nan_in_replicated(math.inf),
    "clip_nan_2_norm": lambda: nan_in_replicated(2.0),
    "clip_error_if_nonfinite": nonfinite_error,
    "clip_fewer_params_on_rank_1": fewer_params_on_rank_1,
    "clip_other_max_norm": other_max_norm,
    "clip_other_norm_type_over_pp": other_norm_type_over_pp,
}
results = {}
for name, case in cases.items():
    try:
        results[name] = [None, case()]
    except (TypeError, ValueError, RuntimeError) as error:
        results[name] = [type(error).__name__, str(error)]

# the group still works: a normal layer pair computes and clips
col, row = tp_pair(1)
results["after"] = clip([*col.parameters(), *row.parameters()], 1e9)
(out / f"rank{rank}.json").write_text(json.dumps(results))

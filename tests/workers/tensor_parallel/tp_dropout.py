"""MPI worker (2 ranks): a plain ``nn.Dropout`` on sharded and on replicated tensor-parallel activations.

    mpiexec -n 2 python tp_dropout.py OUT_DIR

Writes OUT_DIR/rank{r}.npz with the dropout masks (True: kept) this rank drew, and OUT_DIR/rank{r}.json
with the error of dropout on a shard before the RNG tracker was seeded. Every input is nonzero, so a
zero in a dropout's output means a dropped element.
"""

import json
import sys
from pathlib import Path

import numpy as np

import minidist as md
import minidist.distributed as dist
from minidist import nn
from minidist.nn.recompute import recompute
from minidist.parallel import ColumnParallelLinear, RowParallelLinear
from minidist.parallel.tensor_parallel import get_rng_tracker, model_parallel_manual_seed

out = Path(sys.argv[1])
world = dist.init()
rank = world.rank
F64 = np.float64
x = md.tensor(np.random.default_rng(3).uniform(1.0, 2.0, (6, 8)), dtype=F64)  # replicated, nonzero


def kept(t) -> np.ndarray:
    return t.data != 0


# Dropout on a shard before the tracker is seeded: the same clear error on every rank
get_rng_tracker().reset()
md.manual_seed(0)
col = ColumnParallelLinear(8, 64, dtype=F64)
errors = {}
try:
    nn.Dropout(0.5)(col(x))
    errors["unseeded"] = [None, "no error"]
except ValueError as e:
    errors["unseeded"] = [type(e).__name__, str(e)]

model_parallel_manual_seed(0, group=world)
col = ColumnParallelLinear(8, 64, dtype=F64)  # gather_output=False: (6, 32) per rank
row = RowParallelLinear(64, 8, dtype=F64)
drop = nn.Dropout(0.5)
masks = {"replicated_input": kept(drop(x))}  # the layer's input: the same on every rank
h = col(x)
masks["shard"] = kept(drop(h))  # the column layer's output
masks["shard_after_tanh"] = kept(drop(h.tanh() + 3.0))  # computed from a shard: still a shard
y = row(h.tanh() + 3.0)  # the g operator: replicated again
masks["replicated_output"] = kept(drop(y + 100.0))  # (+100: no exact zeros before the dropout)
# inside an activation-recomputation segment: the segment's input is a shard, so is what fn sees
masks["shard_in_recompute"] = kept(recompute(lambda t: drop(t.tanh() + 3.0), h))
# a segment ending in the row layer (the g operator) returns a replicated tensor, dropped alike everywhere
masks["replicated_after_recompute"] = kept(drop(recompute(lambda t: row(t.tanh() + 3.0), h) + 100.0))
# a model as a user writes it: the sharded dropout sits between the two layers
model = nn.Sequential(col, nn.Tanh(), nn.Dropout(0.5), row)
masks["sequential_output"] = model(x).data
np.savez(out / f"rank{rank}.npz", **masks)
(out / f"rank{rank}.json").write_text(json.dumps(errors))

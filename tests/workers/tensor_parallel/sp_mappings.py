"""MPI worker: the sequence-parallel mappings' gradients against finite differences across ranks.

argv: out_dir config.json (``seed``, ``batch``, ``local_t`` positions per rank, ``extra`` trailing axes).
As in tp_mappings.py the objective J is a scalar of the whole program. The three mappings feed
per-rank computations (a tensor-parallel layer downstream, or a sequence shard), so
J = sum over ranks of <w_r, y_r>, one all-reduce of the local terms. Inputs are replicated
(scatter: perturbing x moves it on every rank at once) or per rank (gather, reduce-scatter:
perturbing rank s's x moves only its copy). Central differences of J (exact up to rounding, J being
linear in x) must equal the x.grad that backward left on each rank.
The fused ``all_gather_linear`` is checked the same way, for its input and for its weight.
Also sums flagged gradients with ``allreduce_sequence_parallel_grads`` (float64 and float32 ones).
Writes rank{r}.npz: "{op}/analytic", "{op}/numeric", "{op}/y"; "sp/{i}" the gradients after the sum.
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/workers: the shared worker modules
from cross_rank_fd import numeric_gradient  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist
from minidist import nn
from minidist.parallel.tensor_parallel import sequence_parallel as sp
from minidist.parallel.tensor_parallel.sequence_parallel_linear import all_gather_linear

out_dir, cfg = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
world = dist.init()
n, EPS = world.size, 1e-6
B, T, extra = cfg["batch"], cfg["local_t"], tuple(cfg["extra"])
# The fused column-parallel linear of a sequence shard (sequence_parallel_linear.py): its input x
# (B, T, 3) and its weight W (2, 3) are per rank; each is checked with the other held fixed.
IN = 3
consts = np.random.default_rng(cfg["seed"] + 50 + world.rank)
W0, X0, b0 = consts.standard_normal((2, IN)), consts.standard_normal((B, T, IN)), consts.standard_normal(2)
OPS = {  # name: (function, input replicated?, input shape)
    "scatter": (sp.scatter_to_sequence_parallel_region, True, (B, T * n, *extra)),
    "gather": (sp.gather_from_sequence_parallel_region, False, (B, T, *extra)),
    "reduce_scatter": (sp.reduce_scatter_to_sequence_parallel_region, False, (B, T * n, *extra)),
    "linear_x": (lambda x, g: all_gather_linear(x, md.tensor(W0), md.tensor(b0), g), False, (B, T, IN)),
    "linear_w": (lambda w, g: all_gather_linear(md.tensor(X0), w, None, g), False, (2, IN)),
}


def objective(fn, x: np.ndarray, w: np.ndarray) -> float:
    with md.no_grad():
        local = float((fn(md.tensor(x, dtype=np.float64), world).numpy() * w).sum())
    return float(dist.all_reduce(np.array([local]), group=world)[0])


results = {"W0": W0, "b0": b0}
for name, (fn, replicated_in, shape) in OPS.items():
    x = np.random.default_rng(cfg["seed"] + (0 if replicated_in else 1 + world.rank)).standard_normal(shape)
    xt = md.tensor(x, dtype=np.float64, requires_grad=True)
    y = fn(xt, world)
    w = np.random.default_rng(cfg["seed"] + 101 + world.rank).standard_normal(y.shape)
    (y * md.tensor(w, dtype=np.float64)).sum().backward()
    owners = [None] if replicated_in else range(n)  # None: every rank perturbs together

    def moved_objective(moved, fn=fn, w=w):
        return objective(fn, moved, w)

    numeric = numeric_gradient(x, moved_objective, world.rank, [(o, shape) for o in owners], EPS)
    results[f"{name}/analytic"], results[f"{name}/numeric"] = xt.grad, numeric
    results[f"{name}/x"], results[f"{name}/y"] = x, y.numpy()
    results[f"{name}/sharded"] = np.array(y.sharded_over is not None)

# allreduce_sequence_parallel_grads: flagged parameters summed (two dtypes), the others untouched
rng = np.random.default_rng(cfg["seed"] + 7 + world.rank)
shapes = [((3,), "f8"), ((2, 2), "f4"), ((4,), "f8")]
params = [nn.Parameter(rng.standard_normal(s).astype(d)) for s, d in shapes]
for i, p in enumerate(params):
    p.grad = rng.standard_normal(p.shape).astype(p.dtype)
    results[f"before/{i}"] = p.grad.copy()
params[0].sequence_parallel = params[1].sequence_parallel = True
results["count"] = np.array(sp.allreduce_sequence_parallel_grads(iter(params), world))
for i, p in enumerate(params):
    results[f"after/{i}"] = p.grad
np.savez(out_dir / f"rank{world.rank}.npz", **results)

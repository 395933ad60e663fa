"""MPI worker: the f / g / scatter / gather operators' gradients against finite differences across ranks.

argv: out_dir seed. Each operator is part of a program that runs on all ranks of the world at once;
its objective J is a scalar of the whole program:

* replicated output (g, gather): every rank computes the same J = <w, y>; J counts once;
* per-rank output (f, scatter): J = sum over ranks of <w_r, y_r> (one all-reduce of the local terms).

Inputs are replicated (f, scatter: perturbing x moves it on every rank at once) or per rank (g,
gather: perturbing rank s's x moves only its copy). Central differences of J (exact up to rounding,
as J is linear in x) must equal the x.grad that backward left on each rank.
Writes rank{r}.npz with "{op}/analytic" and "{op}/numeric" (this rank's gradient, shape of x).
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/workers: the shared worker modules
from cross_rank_fd import numeric_gradient  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist
from minidist.parallel import tensor_parallel as tp

out_dir, seed = Path(sys.argv[1]), int(sys.argv[2])
world = dist.init()
n, EPS = world.size, 1e-6
OPS = {  # name: (function, input replicated?, output replicated?)
    "f": (tp.copy_to_tensor_parallel_region, True, False),
    "g": (tp.reduce_from_tensor_parallel_region, False, True),
    "scatter": (tp.scatter_to_tensor_parallel_region, True, False),
    "gather": (tp.gather_from_tensor_parallel_region, False, True),
}


def objective(fn, x: np.ndarray, w: np.ndarray, replicated_out: bool) -> float:
    with md.no_grad():
        local = float((fn(md.tensor(x, dtype=np.float64), world).numpy() * w).sum())
    return local if replicated_out else float(dist.all_reduce(np.array([local]), group=world)[0])


results = {}
for name, (fn, replicated_in, replicated_out) in OPS.items():
    shape = (2, 3 * n) if name == "scatter" else (2, 3)
    x = np.random.default_rng(seed if replicated_in else seed + 1 + world.rank).standard_normal(shape)
    xt = md.tensor(x, dtype=np.float64, requires_grad=True)
    y = fn(xt, world)
    w = np.random.default_rng(seed + 100 if replicated_out else seed + 101 + world.rank).standard_normal(
        y.shape
    )
    (y * md.tensor(w, dtype=np.float64)).sum().backward()
    owners = [None] if replicated_in else range(n)  # None: every rank perturbs together

    def moved_objective(moved, fn=fn, w=w, replicated_out=replicated_out):
        return objective(fn, moved, w, replicated_out)

    numeric = numeric_gradient(x, moved_objective, world.rank, [(o, shape) for o in owners], EPS)
    results[f"{name}/analytic"], results[f"{name}/numeric"] = xt.grad, numeric
np.savez(out_dir / f"rank{world.rank}.npz", **results)

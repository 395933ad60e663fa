"""MPI worker: the vocabulary-parallel loss's gradient against central finite differences across ranks.

argv: out_dir configs.json (vocab_common configs). The objective J = sum(g * loss) is one scalar of
the whole program, the same on every rank (the loss is replicated). Each logit is held by exactly one
rank: to perturb entry j of rank s's slice, every rank evaluates the loss (a collective) while only
rank s moves its entry by +-eps. The central difference must equal the logits.grad that one backward
left on rank s. Writes rank{r}.npz with "{i}/analytic" and "{i}/numeric" (this rank's slice's shape).
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/workers: the shared worker modules
import vocab_common as vc  # noqa: E402
from cross_rank_fd import numeric_gradient  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist.parallel.tensor_parallel import vocab_parallel_cross_entropy  # noqa: E402
from minidist.parallel.tensor_parallel.split import shard_bounds  # noqa: E402

EPS = 1e-6
out_dir, configs = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
world = dist.init()


def loss_fn(cfg: dict):
    return lambda z, t: vocab_parallel_cross_entropy(z, t, world, cfg["reduction"])


def gradients(cfg: dict) -> tuple[np.ndarray, np.ndarray]:
    """(analytic, numeric) gradient of J = sum(g * loss) with respect to this rank's logits."""
    data = vc.inputs(cfg)
    bounds = [shard_bounds(cfg["vocab"], world.size, r) for r in range(world.size)]
    start, stop = bounds[world.rank]
    mine = np.ascontiguousarray(data["logits"][..., start:stop])

    def objective(z: np.ndarray) -> float:
        with md.no_grad():
            loss = loss_fn(cfg)(md.tensor(z), data["targets"])
        return float((loss.numpy() * data["g"]).sum())

    # every rank walks every entry of every rank's slice
    owners = [(owner, (*mine.shape[:-1], b - a)) for owner, (a, b) in enumerate(bounds)]
    numeric = numeric_gradient(mine, objective, world.rank, owners, EPS)
    return vc.run_loss(loss_fn(cfg), mine, data)["logits.grad"], numeric


results = {}
for i, cfg in enumerate(configs):
    results[f"{i}/analytic"], results[f"{i}/numeric"] = gradients(cfg)
np.savez(out_dir / f"rank{world.rank}.npz", **results)

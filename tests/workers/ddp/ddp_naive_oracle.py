"""MPI worker: train one model with ``DataParallelNaive`` and with ``DistributedDataParallel`` variants.

argv: out_dir seed steps global_batch variants_json dtype [dtype ...]
For each dtype, the naive wrapper trains first (results in ``out_dir/<dtype>/naive``), then DDP once per
entry of ``variants_json`` (a list of keyword-argument dicts; results in ``out_dir/<dtype>/ddp<i>``): the
same model and data as ``ddp_equivalence.py`` (``ddp_common``: every rank seeds its own model, the
wrappers broadcast rank 0's), SGD with momentum and weight decay, each rank's loss its summed loss times
world_size / global_batch. Each folder gets ``params_rank<r>.npz`` and ``losses_rank<r>.json``, the
files ``tests/parallel/data_parallel/test_ddp.py``'s ``compare`` reads.
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/workers: the shared worker modules
import ddp_common  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import nn  # noqa: E402
from minidist.parallel.data_parallel import DataParallelNaive, DistributedDataParallel  # noqa: E402


def train(model, out: Path, world: dist.Communicator, seed: int, steps: int, batch: int, dtype) -> None:
    x, y = ddp_common.make_data(seed, 64)
    opt = ddp_common.make_optimizer("sgd", model.parameters())
    losses = []
    for step in range(steps):
        xb, yb = ddp_common.global_batch(x, y, step, batch)
        mine = ddp_common.share(batch, world.size, world.rank)
        logits = model(md.tensor(xb[mine], dtype=dtype))
        local = nn.functional.cross_entropy(logits, yb[mine], reduction="sum")
        opt.zero_grad()
        (local * (world.size / batch)).backward()
        opt.step()
        total = dist.all_reduce(np.array([local.item()]), op="sum", group=world)
        losses.append(float(total[0]) / batch)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / f"params_rank{world.rank}.npz", **model.module.state_dict())
    (out / f"losses_rank{world.rank}.json").write_text(json.dumps(losses))


world = dist.init()
out_dir, seed, steps, batch, variants, *dtypes = sys.argv[1:]
seed, steps, batch = int(seed), int(steps), int(batch)
for name in dtypes:
    dtype = np.dtype(name)
    module = ddp_common.make_model(seed + world.rank, dtype)  # rank 0's weights must win the broadcast
    naive = DataParallelNaive(module, group=world)
    train(naive, Path(out_dir, name, "naive"), world, seed, steps, batch, dtype)
    for i, options in enumerate(json.loads(variants)):
        module = ddp_common.make_model(seed + world.rank, dtype)
        model = DistributedDataParallel(module, group=world, **options)
        train(model, Path(out_dir, name, f"ddp{i}"), world, seed, steps, batch, dtype)

"""MPI worker: train with ZeroRedundancyOptimizer in every (stage, optimizer) of zero_common.CONFIGS.

Usage: ``mpiexec -n N python zero_train.py OUT_DIR SEED STEPS GLOBAL_BATCH``. Per config and rank it
writes ``<stage>_<opt>_rank<r>.npz`` (the parameters after STEPS steps, float64) and
``<stage>_<opt>_rank<r>.json``: the losses; the memory report and layout after the last step; which
``p.grad`` are None then; whether resuming from a ``state_dict()`` taken two steps before the end
reproduces the end bit for bit; and the memory report and layout of a float32 run of the MLP alone.

Each rank takes its numpy.array_split share of every global batch and scales its summed loss by
N / global_batch, so ZeRO's average over ranks is the gradient of the global-batch mean; rank 0 also
adds N times the penalty term (the others add nothing), whose average is the penalty itself.
"""

from __future__ import annotations

import sys

import numpy as np
import zero_common as zc
from dist_worker_utils import run_worker, write_json

import minidist as md
import minidist.distributed as dist
from minidist import nn
from minidist.parallel import ZeroRedundancyOptimizer


def train_steps(zero, model, extra, x, y, steps, batch, world, dtype, first_step=0) -> list[float]:
    losses = []
    for step in range(first_step, first_step + steps):
        xb, yb = zc.global_batch(x, y, step, batch)
        mine = np.array_split(np.arange(batch), world.size)[world.rank]
        local = nn.functional.cross_entropy(
            model(md.tensor(xb[mine], dtype=dtype)), yb[mine], reduction="sum"
        )
        loss = local * (world.size / batch)
        penalty = zc.penalty(extra)
        if world.rank == 0:
            loss = loss + penalty * world.size
        zero.zero_grad()
        loss.backward()
        zero.step()
        total = np.array([local.item()])
        dist.all_reduce(total, op="sum", group=world)
        losses.append(float(total[0]) / batch + penalty.item())
    return losses


def build(seed, world, dtype, stage, opt_name, model_only=False):
    # Different seeds per rank: the constructor's broadcast must still start every rank from rank 0's.
    model, extra = zc.make_model(seed + 17 * world.rank, dtype)
    cls, kwargs = zc.OPTIMIZERS[opt_name]
    params = list(model.parameters()) if model_only else zc.all_params(model, extra)
    zero = ZeroRedundancyOptimizer(params, cls, group=world, stage=stage, **kwargs)
    return model, extra, zero


def main(out_dir: str, seed: str, steps: str, batch: str) -> None:
    seed, steps, batch = int(seed), int(steps), int(batch)
    world = dist.init()
    x, y = zc.make_data(seed)
    for stage, opt_name in zc.CONFIGS:
        tag = f"{stage}_{opt_name}_rank{world.rank}"
        model, extra, zero = build(seed, world, np.float64, stage, opt_name)
        losses = train_steps(zero, model, extra, x, y, steps - 2, batch, world, np.float64)
        saved_params, saved_state = zc.snapshot(model, extra), zero.state_dict()
        losses += train_steps(zero, model, extra, x, y, 2, batch, world, np.float64, first_step=steps - 2)
        final = zc.snapshot(model, extra)
        report = {
            "losses": losses,
            "memory_float64": zero.memory_report(),
            "grad_is_none": [p.grad is None for p in zero.params],
            "layout": zero.layout.describe(),
        }

        # Resume: fresh (different) weights and optimizer, then the saved parameters and shard state.
        model2, extra2, zero2 = build(seed + 1, world, np.float64, stage, opt_name)
        for name, p in [*model2.named_parameters(), *extra2.items()]:
            p.data[...] = saved_params[name]
        zero2.load_state_dict(saved_state)
        train_steps(zero2, model2, extra2, x, y, 2, batch, world, np.float64, first_step=steps - 2)
        resumed = zc.snapshot(model2, extra2)
        report["resume_bit_identical"] = all(np.array_equal(resumed[k], final[k]) for k in final)

        # Memory in float32, the paper's setting: only the MLP's parameters, which every rank has a
        # gradient for (Psi = P = 284). One step is enough to create every buffer.
        model32, extra32, zero32 = build(seed, world, np.float32, stage, opt_name, model_only=True)
        train_steps(zero32, model32, extra32, x, y, 1, batch, world, np.float32)
        report["memory_float32"] = zero32.memory_report()
        report["layout_float32"] = zero32.layout.describe()

        np.savez(f"{out_dir}/{tag}.npz", **final)
        write_json(out_dir, f"{tag}.json", report)


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])

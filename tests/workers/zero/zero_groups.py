"""MPI worker: ZeRO with nanoGPT's AdamW groups, gradient clipping, a schedule and accumulation.

Usage: ``mpiexec -n N python zero_groups.py OUT_DIR SEED``. For stages 1 and 2, every rank trains
``zero_common``'s MLP for GROUP_STEPS steps (``zero_common.train_grouped``: two AdamW groups, decay and
no decay, with their own lr; ``zero.clip_grad_norm_(MAX_NORM)``; ``cosine_with_warmup``; two
microbatches per step) and writes ``stage<s>_rank<r>.npz`` (the parameters) and ``.json``: losses,
norms, learning rates, and three resumes from the state after GROUP_STEPS - 2 steps, each trained
for the last 2 steps on fresh, differently seeded weights:

* ``state_dict``: ``zero.load_state_dict`` (and the scheduler's) in memory; bit-identical to the end?
* ``checkpoint``: ``checkpoint.save`` / ``checkpoint.load`` into a new ZeRO; bit-identical?
* ``plain``: the same checkpoint loaded into a plain AdamW with the same groups, trained on the whole
  batch on every rank (a ZeRO checkpoint holds the full state): the largest difference to the end.
"""

from __future__ import annotations

import copy
import functools
import sys
from pathlib import Path

import numpy as np
import zero_common as zc
from dist_worker_utils import run_worker, write_json

import minidist.distributed as dist
from minidist import checkpoint, optim
from minidist.nn.utils import clip_grad_norm_
from minidist.parallel import ZeroRedundancyOptimizer


def build_zero(seed, world, stage):
    model, _ = zc.make_model(seed + 17 * world.rank, np.float64)  # ZeRO broadcasts rank 0's weights
    zero = ZeroRedundancyOptimizer(
        zc.grouped(model), optim.AdamW, group=world, stage=stage, **zc.GROUP_KWARGS
    )
    return model, zero, zc.schedule(zero)


def run_zero(model, zero, scheduler, x, y, steps, first_step, world):
    clip = functools.partial(zero.clip_grad_norm_, zc.MAX_NORM)
    sums, norms, lrs = zc.train_grouped(
        model, zero, scheduler, clip, x, y, steps, first_step, world.rank, world.size
    )
    totals = dist.all_reduce(np.array(sums), op="sum", group=world)
    return (totals / zc.GROUP_BATCH).tolist(), norms, lrs


def params_of(model) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in model.state_dict().items()}  # copies: steps update in place


def same(a, b) -> bool:
    return all(np.array_equal(a[k], b[k]) for k in a)


def main(out_dir: str, seed: str) -> None:
    seed, world = int(seed), dist.init()
    x, y = zc.make_data(seed)
    first = zc.GROUP_STEPS - 2
    for stage in (1, 2):
        model, zero, scheduler = build_zero(seed, world, stage)
        losses, norms, lrs = run_zero(model, zero, scheduler, x, y, first, 0, world)
        saved_params, saved_state = params_of(model), zero.state_dict()
        saved_schedule = copy.deepcopy(scheduler.state_dict())
        folder = checkpoint.save(Path(out_dir) / f"ckpt{stage}", model, zero, step=first)
        more = run_zero(model, zero, scheduler, x, y, 2, first, world)
        losses, norms, lrs = losses + more[0], norms + more[1], lrs + more[2]
        final = params_of(model)
        report = {
            "losses": losses,
            "norms": norms,
            "lrs": lrs,
            "group_count": len(zero.optimizer.param_groups),
        }

        model2, zero2, scheduler2 = build_zero(seed + 1, world, stage)
        model2.load_state_dict(saved_params)
        zero2.load_state_dict(saved_state)
        scheduler2.load_state_dict(copy.deepcopy(saved_schedule))
        resumed = run_zero(model2, zero2, scheduler2, x, y, 2, first, world)
        report["state_dict_bit_identical"] = same(model2.state_dict(), final) and resumed == more

        model3, zero3, scheduler3 = build_zero(seed + 2, world, stage)
        checkpoint.load(folder, model3, zero3)
        scheduler3.load_state_dict(copy.deepcopy(saved_schedule))
        resumed = run_zero(model3, zero3, scheduler3, x, y, 2, first, world)
        report["checkpoint_bit_identical"] = same(model3.state_dict(), final) and resumed == more

        model4, _ = zc.make_model(seed + 3, np.float64)
        plain = optim.AdamW(zc.grouped(model4), **zc.GROUP_KWARGS)
        scheduler4 = zc.schedule(plain)
        checkpoint.load(folder, model4, plain)
        scheduler4.load_state_dict(copy.deepcopy(saved_schedule))
        clip = functools.partial(clip_grad_norm_, list(model4.parameters()), zc.MAX_NORM)
        zc.train_grouped(model4, plain, scheduler4, clip, x, y, 2, first)
        report["plain_max_diff"] = max(
            float(np.abs(model4.state_dict()[k] - v).max()) for k, v in final.items()
        )

        np.savez(f"{out_dir}/stage{stage}_rank{world.rank}.npz", **final)
        write_json(out_dir, f"stage{stage}_rank{world.rank}.json", report)


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])

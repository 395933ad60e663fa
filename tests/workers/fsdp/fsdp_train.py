"""MPI worker: train the MLP and the GPT with FullyShardedDataParallel in every configuration of CONFIGS.

Usage: ``mpiexec -n N python fsdp_train.py OUT_DIR``. Per configuration and rank it writes
``<config>_rank<r>.npz`` (``fsdp.state_dict()`` after training: the full parameters) and one
``rank<r>.json`` with, per configuration: the clipping norms, the memory figures (peak of the
"gathered_parameters" counter, the gathered sizes of the root and of the units, the bytes the
original parameters and the shards hold between steps), and whether a ``state_dict()`` loaded into a
differently initialised FSDP model gives back the same full parameters bit for bit.
"""

from __future__ import annotations

import sys

import fsdp_common as fc
import numpy as np
from dist_worker_utils import run_worker, write_json

import minidist.distributed as dist
from minidist import nn
from minidist.memory import counters
from minidist.models.transformer import Block
from minidist.parallel import FullyShardedDataParallel
from minidist.parallel.zero_layout import unique_nbytes

# name: (model, optimizer, wrap, prefetch, clip, micro-batches)
CONFIGS = {
    "mlp_sgd_per_linear": ("mlp", "sgd", (nn.Linear,), True, False, 1),
    "mlp_adamw_one_unit": ("mlp", "adamw", None, True, False, 1),
    "gpt_adamw_blocks": ("gpt", "adamw", (Block,), True, True, 1),
    "gpt_adamw_blocks_no_prefetch": ("gpt", "adamw", (Block,), False, True, 1),
    "gpt_adamw_blocks_no_sync": ("gpt", "adamw", (Block,), True, True, 2),
}


def build(kind: str, seed: int, wrap, prefetch: bool, world) -> FullyShardedDataParallel:
    model = fc.make_mlp(seed) if kind == "mlp" else fc.make_gpt(seed)
    return FullyShardedDataParallel(model, group=world, wrap=wrap, prefetch=prefetch)


def main(out_dir: str) -> None:
    world = dist.init()
    counters._active = True  # count the reports (the MemoryTracker turns this on; not here yet)
    report = {}
    for name, (kind, opt_name, wrap, prefetch, clip, accum) in CONFIGS.items():
        # Another seed per rank: the constructor must still start every rank from rank 0's weights.
        fsdp = build(kind, fc.SEED + 11 * world.rank, wrap, prefetch, world)
        original = list(fsdp.module.parameters())
        optimizer = fc.OPTIMIZERS[opt_name](fsdp.shard_param_groups(fc.decay_groups(original)))
        batches = fc.mlp_batches() if kind == "mlp" else fc.gpt_batches()
        counters._peak["gathered_parameters"] = counters._current["gathered_parameters"]
        norms = fc.train(
            fsdp, optimizer, batches, (lambda: fsdp.clip_grad_norm_(fc.CLIP)) if clip else None,
            world.rank, world.size, accum,
        )  # fmt: skip
        full = fsdp.state_dict()
        np.savez(f"{out_dir}/{name}_rank{world.rank}.npz", **full)

        fresh = build(kind, fc.SEED + 99, wrap, prefetch, world)
        fresh.load_state_dict(full)
        again = fresh.state_dict()
        report[name] = {
            "norms": norms,
            "peak_gathered": counters._peak["gathered_parameters"],
            "gathered_now": counters._current["gathered_parameters"],
            "root_bytes": sum(u.full_nbytes for u in fsdp.units if u.name == ""),
            "unit_bytes": [u.full_nbytes for u in fsdp.units if u.name != ""],
            "original_bytes": unique_nbytes([p.data for p in original]),
            "shard_bytes": unique_nbytes([s.data for u in fsdp.units for s in u.shards]),
            "flat_shard_elements": sum(u.flat_shard.size for u in fsdp.units),
            "ndims_kept": all(p.ndim == len(s) for u in fsdp.units for p, s in zip(u.params, u.shapes)),
            "reload_bit_identical": all(np.array_equal(again[k], full[k]) for k in full),
            "unit_names": [u.name for u in fsdp.units],
        }
    write_json(out_dir, f"rank{world.rank}.json", report)


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])

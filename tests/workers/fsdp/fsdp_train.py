"""MPI worker: train the MLP and the GPT with FullyShardedDataParallel in every configuration of CONFIGS.

Usage: ``mpiexec -n N python fsdp_train.py OUT_DIR``. Per configuration and rank it writes
``<config>_rank<r>.npz`` (``fsdp.state_dict()`` after training: the full parameters) and one
``rank<r>.json`` with, per configuration: the clipping norms, the memory figures (peak of the
"gathered_parameters" counter, the gathered sizes of the root and of the units, the bytes the
original parameters and the shards hold between steps), and whether a ``state_dict()`` loaded into a
differently initialised FSDP model gives back the same full parameters bit for bit.
"""

from __future__ import annotations

import functools
import sys

import fsdp_common as fc
import numpy as np
from dist_worker_utils import run_worker, write_json

import minidist.distributed as dist
from minidist import nn, trace
from minidist.memory import counters
from minidist.memory.activations import unique_nbytes
from minidist.models.gpt.transformer import Block
from minidist.parallel import FullyShardedDataParallel

# name: (model, optimizer, wrap, prefetch, clip, micro-batches, param_dtype and reduce_dtype)
CONFIGS = {
    "mlp_sgd_per_linear": ("mlp", "sgd", (nn.Linear,), True, False, 1, None),
    "mlp_adamw_one_unit": ("mlp", "adamw", None, True, False, 1, None),
    "tied_sgd_per_linear": ("tied", "sgd", (nn.Linear,), True, False, 1, None),
    "twice_sgd_per_linear": ("twice", "sgd", (nn.Linear,), True, False, 1, None),
    "gpt_adamw_blocks": ("gpt", "adamw", (Block,), True, True, 1, None),
    "gpt_adamw_blocks_no_prefetch": ("gpt", "adamw", (Block,), False, True, 1, None),
    "gpt_adamw_blocks_no_sync": ("gpt", "adamw", (Block,), True, True, 2, None),
    "gpt_adamw_blocks_bfloat16": ("gpt", "adamw", (Block,), True, True, 1, "bfloat16"),
}


def build(kind: str, seed: int, wrap, prefetch: bool, world, low=None) -> FullyShardedDataParallel:
    return FullyShardedDataParallel(
        fc.make(kind, seed), group=world, wrap=wrap, prefetch=prefetch, param_dtype=low, reduce_dtype=low
    )


def traced_step(fsdp, optimizer, batch, world) -> dict[str, list[int]]:
    """One more step (no clipping) with the collectives traced: per collective, [calls, payload bytes]."""
    trace.enable(collectives=True)
    fc.train(fsdp, optimizer, [batch], None, world.rank, world.size)
    events = [e for e in trace.events() if e["cat"] == trace.COLLECTIVE]
    trace.disable()
    return {
        name: [
            sum(1 for e in events if e["name"] == name),
            sum(e["args"]["payload"] for e in events if e["name"] == name),
        ]
        for name in ("all_gather", "reduce_scatter")
    }


def main(out_dir: str) -> None:
    world = dist.init()
    counters._active = True  # count the reports with no MemoryTracker (which is what turns this on)
    report = {}
    for name, (kind, opt_name, wrap, prefetch, clip, accum, low) in CONFIGS.items():
        # Another seed per rank: the constructor must still start every rank from rank 0's weights.
        fsdp = build(kind, fc.SEED + 11 * world.rank, wrap, prefetch, world, low)
        original = list(fsdp.module.parameters())
        optimizer = fc.OPTIMIZERS[opt_name](fsdp.shard_param_groups(fc.decay_groups(original)))
        batches = fc.batches(kind)
        for category in ("gathered_parameters", "communication"):  # this configuration's peaks
            counters._peak[category] = counters._current[category]
        clipper = functools.partial(fsdp.clip_grad_norm_, fc.CLIP) if clip else None
        norms = fc.train(fsdp, optimizer, batches, clipper, world.rank, world.size, accum)
        full = fsdp.state_dict()
        np.savez(f"{out_dir}/{name}_rank{world.rank}.npz", **full)

        fresh = build(kind, fc.SEED + 99, wrap, prefetch, world, low)
        fresh.load_state_dict(full)
        again = fresh.state_dict()
        report[name] = {
            "norms": norms,
            "peak_gathered": counters._peak["gathered_parameters"],
            "gathered_now": counters._current["gathered_parameters"],
            "communication_now": counters._current["communication"],
            "communication_peak": counters._peak["communication"],
            "root_bytes": sum(u.full_nbytes for u in fsdp.units if u.name == ""),
            "unit_bytes": [u.full_nbytes for u in fsdp.units if u.name != ""],
            "original_bytes": unique_nbytes([p.data for p in original]),
            "shard_bytes": unique_nbytes([s.data for u in fsdp.units for s in u.shards]),
            "flat_shard_elements": sum(u.flat_shard.size for u in fsdp.units),
            "ndims_kept": all(p.ndim == len(s) for u in fsdp.units for p, s in zip(u.params, u.shapes)),
            "reload_bit_identical": all(np.array_equal(again[k], full[k]) for k in full),
            "unit_names": [u.name for u in fsdp.units],
            "traffic": traced_step(fsdp, optimizer, batches[0], world),
        }
    write_json(out_dir, f"rank{world.rank}.json", report)


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])

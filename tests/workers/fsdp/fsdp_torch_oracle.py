"""MPI worker: the tiny GPT trained with FullyShardedDataParallel for
tests/torch_oracle/test_torch_oracle_amp_fsdp_memory.py.

Usage: ``mpiexec -n N python fsdp_torch_oracle.py OUT_DIR``. Trains ``fsdp_common``'s GPT (float64,
per-``Block`` units, AdamW with train_gpt's decay groups, ``clip_grad_norm_`` every step) on
``fsdp_common``'s batches and writes ``rank<r>.npz``: the initial full parameters (``init.<name>``),
those after training (``final.<name>``, ``fsdp.state_dict()``) and the clipping norms (``norms``).
The test trains the same model in PyTorch on one process (``benchmarks/torch_gpt.py``) and compares.
"""

from __future__ import annotations

import functools
import sys

import fsdp_common as fc
import numpy as np
from dist_worker_utils import run_worker

import minidist.distributed as dist
from minidist.models.gpt.transformer import Block
from minidist.parallel import FullyShardedDataParallel


def main(out_dir: str) -> None:
    world = dist.init()
    fsdp = FullyShardedDataParallel(fc.make_gpt(fc.SEED), group=world, wrap=(Block,))
    init = fsdp.state_dict()
    groups = fc.decay_groups(fsdp.module.parameters())
    optimizer = fc.OPTIMIZERS["adamw"](fsdp.shard_param_groups(groups))
    clip = functools.partial(fsdp.clip_grad_norm_, fc.CLIP)
    norms = fc.train(fsdp, optimizer, fc.gpt_batches(), clip, world.rank, world.size)
    final = fsdp.state_dict()
    arrays = {f"init.{k}": v for k, v in init.items()} | {f"final.{k}": v for k, v in final.items()}
    np.savez(f"{out_dir}/rank{world.rank}.npz", norms=np.array(norms), **arrays)


if __name__ == "__main__":
    run_worker(main, sys.argv[1])

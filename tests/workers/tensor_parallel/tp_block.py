"""MPI worker: ``ParallelBlock`` cut from the full GPT block, with and without sequence parallelism.

argv: out_dir configs.json. For each config (gpt_tp_common) and sp in (0, 1): builds the full block
from the seed on every rank, cuts this rank's ``ParallelBlock`` over the world, runs x (this rank's
positions under sequence parallelism) forward and the upstream gradient w backward, then sums the
sequence-parallel gradients over the group. A config with ``dropout`` > 0 runs in training mode and
only its output is kept (replicated output: the ranks must have drawn the same residual masks).
Writes rank{r}.npz ("{i}/{sp}/y", ".../x.grad", ".../<param name>[.grad]") and on rank 0 meta.json:
each parameter's tp_dim, tp_stride and sequence_parallel flag.
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/workers: the shared worker modules
import gpt_tp_common as common  # noqa: E402

import minidist.distributed as dist  # noqa: E402
from minidist.parallel.tensor_parallel import model_parallel_manual_seed  # noqa: E402
from minidist.parallel.tensor_parallel.sequence_parallel import (  # noqa: E402
    allreduce_sequence_parallel_grads,
    split_sequence,
)
from minidist.parallel.tensor_parallel.transformer import ParallelBlock  # noqa: E402

out_dir, configs = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
world = dist.init()
results, meta = {}, []
for i, cfg in enumerate(configs):
    for sp in (0, 1):
        block = ParallelBlock(common.full_block(cfg), world, sequence_parallel=bool(sp))
        x, w = common.block_inputs(cfg)
        if sp:
            x, w = split_sequence(x, world), split_sequence(w, world)
        if cfg.get("dropout", 0.0) > 0:
            model_parallel_manual_seed(cfg["seed"], world)
        out = common.run_module(block, x, w)
        allreduce_sequence_parallel_grads(block.parameters(), world)
        for name, p in block.named_parameters():
            out[f"{name}.grad"] = p.grad
        results.update({f"{i}/{sp}/{key}": value for key, value in out.items()})
        if sp:
            flags = {n: [p.tp_dim, p.tp_stride, p.sequence_parallel] for n, p in block.named_parameters()}
            meta.append(flags)
np.savez(out_dir / f"rank{world.rank}.npz", **results)
if world.rank == 0:
    (out_dir / "meta.json").write_text(json.dumps(meta))

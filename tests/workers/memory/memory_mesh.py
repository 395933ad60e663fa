"""MPI worker (4 ranks): the memory tracker's figures against the formulas, and the FSDP demonstration.

argv: out_dir. Writes rank{r}.json with, per check, what the tracker measured on this rank, and rank 0
writes fsdp_state.npz (the FSDP-trained GPT's full parameters). tests/memory/test_memory.py compares:

* "fsdp": ``memory_common``'s GPT trained with FSDP (a unit per Block) under ``BUDGET``, which one
  rank cannot train in (the test shows the error): the state after the last step, the peaks;
* "zero1", "zero2", "ddp": the same GPT's parameters, gradients and AdamW state after a step;
* "tp": ``ParallelGPT`` on tp = 4 (4 heads), with and without sequence parallelism, 1 and 2 layers:
  the activations held after forward (their difference is one layer's).
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/workers: the shared worker modules
import memory_common as common  # noqa: E402

import minidist.distributed as dist  # noqa: E402
from minidist import memory, nn, optim  # noqa: E402
from minidist.models import ParallelGPT  # noqa: E402
from minidist.models.gpt.model import GPTConfig  # noqa: E402
from minidist.models.gpt.transformer import Block  # noqa: E402
from minidist.parallel import DistributedDataParallel, ProcessMesh, ZeroRedundancyOptimizer  # noqa: E402
from minidist.parallel.fsdp import FullyShardedDataParallel  # noqa: E402

out_dir = Path(sys.argv[1])
world = dist.init()
rank, size = world.rank, world.size
result = {}

# -- FSDP under the budget one rank exceeds ------------------------------------------------------------
model = common.make_gpt()
fsdp = FullyShardedDataParallel(model, wrap=(Block,))
opt = common.adamw(fsdp.parameters())
with memory.MemoryTracker(fsdp, opt, budget=common.BUDGET) as tracker:
    losses = common.train(fsdp, opt, rank, size)
report = tracker.report()
result["fsdp"] = {
    "report": report,
    "losses": losses,
    "unit_sizes": [u.layout.numel for u in fsdp.units],
    "unit_names": [u.name for u in fsdp.units],
}
state = {k: np.asarray(v) for k, v in fsdp.state_dict().items()}  # collective: every rank calls it
if rank == 0:
    np.savez(out_dir / "fsdp_state.npz", **state)

# -- DDP, ZeRO-1, ZeRO-2: the state after step() ----------------------------------------------------------
for name in ("ddp", "zero1", "zero2"):
    model = common.make_gpt()
    if name == "ddp":
        run = DistributedDataParallel(model)
        opt = common.adamw(model.parameters())
    else:
        run = model
        opt = ZeroRedundancyOptimizer(model.parameters(), optim.AdamW, stage=int(name[-1]), lr=common.LR)
    idx, targets = common.batches()[0]
    with memory.MemoryTracker(run, opt) as tracker:
        logits = run(idx[rank::size])
        nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets[rank::size].reshape(-1)
        ).backward()
        opt.step()
        after_step = tracker.report()
        opt.zero_grad()
    result[name] = {"after_step": after_step, "num_params": model.num_parameters()}

# -- tensor (+ sequence) parallelism: activations held after forward, 1 and 2 layers ----------------------
mesh = ProcessMesh(tp=size)
B, T, C, H, V = 2, 8, 32, 4, 11
idx = np.arange(B * T).reshape(B, T) % V
result["tp"] = {"shape": [B, T, C, H]}
for sp in (0, 1):
    for layers in (1, 2):
        model = ParallelGPT(GPTConfig(V, T, layers, H, C), mesh, sequence_parallel=bool(sp))
        with memory.MemoryTracker(model) as tracker:
            logits = model(idx)  # (sequence parallelism splits the tokens inside)
            held = tracker.report()["activations"]["current"]
            model.loss(logits, idx).backward()
            after = tracker.report()["activations"]["current"]
        result["tp"][f"sp{sp}_L{layers}"] = {"held": held, "after_backward": after}

(out_dir / f"rank{rank}.json").write_text(json.dumps(result))

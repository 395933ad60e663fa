"""MPI worker: ``ParallelGPT`` trained STEPS AdamW steps on a dp x cp x tp mesh, +- sequence parallelism.

argv: out_dir config.json (gpt_tp_common's GPT config, plus "dp" and "cp", default 1; tp = the rest of
the world). Every rank seeds differently (seed + rank): the model must still be one (ParallelGPT adopts
rank 0's generator). For sp in (0, 1) it trains on the global batch: dp rank d takes its rows, cp rank
c its tokens of the balanced split, every tp rank the same; the vocabulary-parallel loss; after
backward DDP has averaged over ``mesh.dp_cp_group`` and the sequence-parallel gradients are summed
over tp. Checks that ``pipeline_layers()`` computes the same logits. Writes rank{r}.npz:
"{sp}/losses" (the global mean, averaged over dp x cp), "{sp}/grad/<name>" (first step),
"{sp}/param/<name>", "{sp}/gathered/<name>" (``gather_gpt``'s full tensors); rank 0 writes meta.json:
each parameter's tp_dim, tp_stride, sequence_parallel.
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/workers: the shared worker modules
import gpt_tp_common as common  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import optim  # noqa: E402
from minidist.models import ParallelGPT, gather_gpt  # noqa: E402
from minidist.parallel import DistributedDataParallel, ProcessMesh  # noqa: E402
from minidist.parallel.context_parallel import split_for_context_parallel  # noqa: E402

out_dir, cfg = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
world = dist.init()
dp, cp = cfg.get("dp", 1), cfg.get("cp", 1)
mesh = ProcessMesh(dp=dp, tp=world.size // (dp * cp), cp=cp)
idx, targets = common.gpt_batch(cfg)  # the global batch, the same on every rank
rows = np.array_split(np.arange(cfg["batch"]), dp)[mesh.dp_rank]  # (the test makes B divisible by dp)
idx, targets = (split_for_context_parallel(a[rows], cp, mesh.cp_rank) for a in (idx, targets))
results, meta = {}, {}
for sp in (0, 1):
    md.manual_seed(cfg["seed"] + world.rank)  # a per-rank seed: the model must be rank 0's all the same
    model = ParallelGPT(common.gpt_config(cfg), mesh, sequence_parallel=bool(sp))
    run = DistributedDataParallel(model, group=mesh.dp_cp_group) if dp * cp > 1 else model
    opt = optim.AdamW(model.parameters(), lr=common.LR, weight_decay=common.WEIGHT_DECAY)
    losses = []
    for step in range(common.STEPS):
        logits = run(idx)
        if step == 0:  # the pipeline's layers are the same computation
            with md.no_grad():
                again = model.pipeline_layers()(idx)
            np.testing.assert_array_equal(again.numpy(), logits.numpy())
        loss = model.loss(logits, targets)
        loss.backward()  # DDP: gradients averaged over dp x cp
        model.allreduce_sequence_parallel_grads()  # then the sequence-parallel ones summed over tp
        losses.append(float(dist.all_reduce(loss.numpy().reshape(1), op="avg", group=mesh.dp_cp_group)[0]))
        if step == 0:
            results.update({f"{sp}/grad/{n}": p.grad.copy() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    results.update({f"{sp}/param/{n}": p.numpy() for n, p in model.named_parameters()})
    results[f"{sp}/losses"] = np.array(losses)
    gathered = gather_gpt(model.config, model.named_parameters(), mesh, root=None)  # every rank: one model
    results.update({f"{sp}/gathered/{n}": p.numpy() for n, p in gathered.named_parameters()})
    meta[sp] = {n: [p.tp_dim, p.tp_stride, p.sequence_parallel] for n, p in model.named_parameters()}
np.savez(out_dir / f"rank{world.rank}.npz", **results)
if world.rank == 0:
    (out_dir / "meta.json").write_text(json.dumps(meta))

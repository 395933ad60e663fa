"""MPI worker: ``ParallelGPT`` trained STEPS AdamW steps on the world as a tp group, +- sequence parallelism.

argv: out_dir config.json (gpt_tp_common's GPT config). Every rank seeds differently (seed + rank): the
model must still be one (ParallelGPT adopts rank 0's generator). For sp in (0, 1) it trains on the
global batch (every tp rank the same ids) with the vocabulary-parallel loss, summing the
sequence-parallel gradients over tp after backward, and checks that ``pipeline_layers()`` computes the
same logits. Writes rank{r}.npz: "{sp}/losses", "{sp}/grad/<name>" (first step), "{sp}/param/<name>";
rank 0 writes meta.json: each parameter's tp_dim, tp_stride, sequence_parallel flag.
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
from minidist.models import ParallelGPT  # noqa: E402
from minidist.parallel import ProcessMesh  # noqa: E402

out_dir, cfg = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
world = dist.init()
mesh = ProcessMesh(dp=1, tp=world.size)
results, meta = {}, {}
for sp in (0, 1):
    md.manual_seed(cfg["seed"] + world.rank)  # a per-rank seed: the model must be rank 0's all the same
    model = ParallelGPT(common.gpt_config(cfg), mesh, sequence_parallel=bool(sp))
    opt = optim.AdamW(model.parameters(), lr=common.LR, weight_decay=common.WEIGHT_DECAY)
    idx, targets = common.gpt_batch(cfg)
    losses = []
    for step in range(common.STEPS):
        logits = model(idx)
        if step == 0:  # the pipeline's layers are the same computation
            with md.no_grad():
                again = model.pipeline_layers()(idx)
            np.testing.assert_array_equal(again.numpy(), logits.numpy())
        loss = model.loss(logits, targets)
        loss.backward()
        model.allreduce_sequence_parallel_grads()
        losses.append(float(loss.numpy()))
        if step == 0:
            results.update({f"{sp}/grad/{n}": p.grad.copy() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    results.update({f"{sp}/param/{n}": p.numpy() for n, p in model.named_parameters()})
    results[f"{sp}/losses"] = np.array(losses)
    meta[sp] = {n: [p.tp_dim, p.tp_stride, p.sequence_parallel] for n, p in model.named_parameters()}
np.savez(out_dir / f"rank{world.rank}.npz", **results)
if world.rank == 0:
    (out_dir / "meta.json").write_text(json.dumps(meta))

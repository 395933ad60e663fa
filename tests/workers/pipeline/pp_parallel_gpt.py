"""MPI worker (4 ranks, tp 2 x pp 2): ``ParallelGPT.pipeline_layers()`` under ``PipelineParallel``.

    mpiexec -n 4 python pp_parallel_gpt.py OUT_DIR

The parallel GPT's two ends are ``GPTEmbedding``/``GPTHead`` subclasses, so the pipeline's tied-weight
machinery applies as for the one-process GPT: the last stage's head gets a copy of *this tp rank's*
vocabulary rows of ``wte.weight`` (63 rows over tp 2: 32 + 31), flagged ``is_tied_copy``, whose gradient
is summed with stage 0's. 3 AdamW steps (clipped over tp and pp); each rank writes rank{r}.npz: its
stage's parameters under GPT's names ("param/<name>"), the tied copy ("tied_copy", last stage) and
"losses", and rank{r}.json: the tied names, holders, whether this rank's one is a copy, its tp_dim,
and every stage parameter's [tp_dim, tp_stride].
"""

import json
import sys
from pathlib import Path

import numpy as np

import minidist as md
import minidist.distributed as dist
from minidist import optim
from minidist.models import GPT, GPTConfig, ParallelGPT
from minidist.parallel import PipelineParallel, ProcessMesh, clip_grad_norm_

out = Path(sys.argv[1])
world = dist.init()
mesh = ProcessMesh(dp=1, tp=2, pp=2)
config = GPTConfig(vocab_size=63, block_size=8, n_layer=2, n_head=2, n_embd=8, dtype=np.float64)
md.manual_seed(3)
model = ParallelGPT.from_gpt(GPT(config), mesh)
pipe = PipelineParallel(model.pipeline_layers(), group=mesh.pp_group, microbatches=2)
opt = optim.AdamW(pipe.parameters(), lr=1e-2)
rng = np.random.default_rng(4)
ids = rng.integers(0, 63, (4, 9))
losses = []
for _ in range(3):
    opt.zero_grad()
    losses.append(pipe.train_step(ids[:, :-1], ids[:, 1:], model.loss))
    clip_grad_norm_(pipe.parameters(), 0.05, pp_group=mesh.pp_group)
    opt.step()
tied = [{"name": t.name, "ranks": list(t.ranks), "copy": bool(t.param is not None and t.param.is_tied_copy),
         "tp_dim": None if t.param is None else t.param.tp_dim} for t in pipe.tied]  # fmt: skip
arrays = {f"param/{n}": p.numpy() for n, p in pipe.stage_module.named_parameters() if not p.is_tied_copy}
copies = [t.param for t in pipe.tied if t.param is not None and t.param.is_tied_copy]
if copies:
    arrays["tied_copy"] = copies[0].numpy()
np.savez(out / f"rank{world.rank}.npz", losses=np.array(losses), **arrays)
flags = {n: [p.tp_dim, p.tp_stride] for n, p in pipe.stage_module.named_parameters() if not p.is_tied_copy}
(out / f"rank{world.rank}.json").write_text(json.dumps({"tied": tied, "flags": flags}))

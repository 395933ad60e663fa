"""MPI worker: train with DistributedDataParallel and save each rank's parameters and losses.

argv: out_dir seed steps global_batch optimizer dtype
Each rank takes its numpy.array_split share of every global batch and scales its summed loss by
world_size / global_batch, so DDP's average is the gradient of the global-batch mean.
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import ddp_common  # noqa: E402

import minidist as md  # noqa: E402
from minidist import dist, nn  # noqa: E402
from minidist.parallel import DistributedDataParallel  # noqa: E402

out_dir, seed, steps, batch, opt_name, dtype = sys.argv[1:7]
seed, steps, batch, dtype = int(seed), int(steps), int(batch), np.dtype(dtype)
world = dist.init()
x, y = ddp_common.make_data(seed, 64)
# Different seeds per rank: DDP's broadcast must still make every replica start from rank 0's weights.
model = DistributedDataParallel(ddp_common.make_model(seed + world.rank, dtype), group=world)
opt = ddp_common.make_optimizer(opt_name, model.parameters())
losses = []
for step in range(steps):
    xb, yb = ddp_common.global_batch(x, y, step, batch)
    mine = np.array_split(np.arange(batch), world.size)[world.rank]
    local = nn.functional.cross_entropy(model(md.tensor(xb[mine], dtype=dtype)), yb[mine], reduction="sum")
    loss = local * (world.size / batch)
    opt.zero_grad()
    loss.backward()
    opt.step()
    total = np.array([local.item()])
    dist.all_reduce(total, op="sum", group=world)
    losses.append(float(total[0]) / batch)
np.savez(
    Path(out_dir) / f"params_rank{world.rank}.npz", **{k: v for k, v in model.module.state_dict().items()}
)
(Path(out_dir) / f"losses_rank{world.rank}.json").write_text(json.dumps(losses))

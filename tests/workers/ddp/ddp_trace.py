"""MPI worker: a few traced DDP steps with one bucket per parameter; rank 0 saves the merged Chrome trace.

argv: out_dir overlap(0|1)
Writes out_dir/trace.json (timeline.save_chrome_trace of every rank's events, gathered on rank 0).
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/workers: the shared worker modules
import ddp_common  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import nn, optim, trace  # noqa: E402
from minidist.parallel import DistributedDataParallel  # noqa: E402
from minidist_tools import timeline


class Mark(md.Function):
    """Identity whose backward records a span: it shows when backward reached this point."""

    def forward(self, x):
        return x

    def backward(self, grad):
        with trace.span("backward reached layer 0", "mark"):
            return (grad,)


class MarkLayer(nn.Module):
    def forward(self, x):
        return Mark.apply(x)


out_dir, overlap = Path(sys.argv[1]), sys.argv[2] == "1"
world = dist.init()
md.manual_seed(0)
# The mark sits between layer 0 and layer 1: when backward reaches it, layers 2 and 1 are done.
module = nn.Sequential(
    nn.Linear(64, 256), nn.ReLU(), MarkLayer(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4)
)
# small_bucket_bytes=0: every bucket but the last goes to the comm thread, however small.
model = DistributedDataParallel(
    module, group=world, bucket_cap_mb=1e-6, overlap=overlap, small_bucket_bytes=0
)
opt = optim.SGD(model.parameters(), lr=0.1)
x, y = ddp_common.make_data(world.rank, 512, n_in=64)
world.barrier()
trace.enable()
for _ in range(3):
    with trace.span("forward", "forward"):
        loss = nn.functional.cross_entropy(model(md.tensor(x, dtype=np.float32)), y)
    opt.zero_grad()
    with trace.span("backward", trace.BACKWARD):
        loss.backward()
    with trace.span("optimizer step", "optimizer"):
        opt.step()
trace.disable()
everyone = world.mpi.gather(trace.events(), root=0)
if world.rank == 0:
    timeline.save_chrome_trace(out_dir / "trace.json", everyone)
np.save(out_dir / f"done_rank{world.rank}.npy", np.ones(1))

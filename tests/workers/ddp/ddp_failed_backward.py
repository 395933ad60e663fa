"""MPI worker: a backward pass that raises after some DDP hooks fired must not disable later averaging.

Prints "hooks fired before failure: True/False" and "grads equal across ranks: True/False".
"""

import numpy as np

import minidist as md
import minidist.distributed as dist
from minidist import nn
from minidist.parallel import DistributedDataParallel

world = dist.init()
md.manual_seed(world.rank)
# small_bucket_bytes=0: the buckets filled before the failure go to the comm thread, still running then.
model = DistributedDataParallel(
    nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2)), bucket_cap_mb=1e-6, small_bucket_bytes=0
)
x = md.tensor(np.ones((2, 4), dtype=np.float32) * (world.rank + 1))
fired = []
model.module[1].bias.register_post_accumulate_grad_hook(lambda p: fired.append(True))


class Boom(md.Function):
    def forward(self, a):
        return a

    def backward(self, grad):
        raise RuntimeError("boom")


# Backward finishes the most recently readied input first (last in, first out), so the model's branch,
# the second input of the sum, is differentiated before Boom's branch raises: by then some of DDP's
# hooks have fired (checked below).
side = md.tensor(np.ones((2, 2), dtype=np.float32), requires_grad=True)
try:
    (Boom.apply(side) + model(x)).sum().backward()
except RuntimeError:
    pass
print(f"hooks fired before failure: {bool(fired)}")
model.zero_grad()
model(x).sum().backward()
grads = world.mpi.allgather(model.module[0].weight.grad.copy())
print(f"grads equal across ranks: {all(np.allclose(g, grads[0]) for g in grads)}")

"""MPI worker: the bytes minidist's all-reduces and PowerSGD hook send, for lesson 12's exercises.

argv: out_dir [nbytes] (default 4 MiB: from this size on, the flat algorithms run a ring on 4 ranks).
Run on any number of ranks, nodes simulated with ``MINIDIST_RANKS_PER_NODE`` or real (a
``minidist_tools.cluster``). Rank 0 writes ``network.json`` with

* ``node_of_rank``, ``nbytes``;
* ``ring`` / ``hierarchical``: per rank, the bytes it sent to ranks of *other* nodes in one all-reduce of
  ``nbytes`` with that algorithm (lesson 12, ``inter_node_bytes``). A rank's sends to other nodes are
  known from the algorithm's structure: in the ring, rank r sends only to r + 1, so the last rank of a
  node sends across and the others do not; in the hierarchical one, only the leaders' group crosses;
* ``powersgd`` (with ``POWERSGD=1`` in the environment): the parameter shapes of an MLP, the hook's rank and
  ``min_compression_rate``, and the bytes the gradients' all-reduces reduced in each of 4 DDP steps with
  the PowerSGD hook (``ddp.comm_stats.payload_bytes``; lesson 12, ``powersgd_values``).
"""

import os
import sys

import numpy as np
from dist_worker_utils import run_worker, write_json

import minidist as md
import minidist.distributed as dist
from minidist import nn, optim
from minidist.distributed.topology import node_layout
from minidist.models import MLP
from minidist.parallel import DistributedDataParallel, comm_hooks


def sent(group) -> int:
    """Bytes this rank has sent in the collectives of ``group`` (they leave by its collective channel)."""
    return group.collective_channel.bytes_sent


def main(out_dir: str, nbytes: str = str(4 * 2**20)) -> None:
    world = dist.init()
    layout = node_layout()
    a = np.ones(int(nbytes) // 4, dtype=np.float32)
    result: dict = {"node_of_rank": list(layout.node_of_rank), "nbytes": a.nbytes}

    before = sent(world)
    dist.all_reduce(a, algorithm="ring")
    right = (world.rank + 1) % world.size  # the ring's only destination of this rank
    crosses = layout.node_of_rank[right] != layout.node_of_rank[world.rank]
    result["ring"] = world.mpi.gather(sent(world) - before if crosses else 0, root=0)

    # Hierarchical: the node group stays inside the node, the leaders' group crosses. Without a hierarchy
    # to use (one node, or one rank per node) it runs a flat algorithm over the world, whose messages
    # then all cross (one rank per node) or none do (one node).
    leaders = layout.leader_group
    alone = layout.local_size == 1 and layout.nodes > 1

    def crossing() -> int:
        return (sent(leaders) if leaders is not None else 0) + (sent(world) if alone else 0)

    before = crossing()
    dist.all_reduce(a, algorithm="hierarchical")
    result["hierarchical"] = world.mpi.gather(crossing() - before, root=0)

    if os.environ.get("POWERSGD") == "1":
        result["powersgd"] = powersgd_step(world)
    if world.rank == 0:
        write_json(out_dir, "network.json", result)


def powersgd_step(world) -> dict:
    """Bytes one rank sends in each of 4 DDP steps with the PowerSGD hook (compressing from the third)."""
    md.manual_seed(0)
    model = MLP(48, [64, 8], 10)  # a matrix worth compressing, one that is not, biases, a thin head
    rank, rate = 4, 2  # (64, 48) is compressed; (8, 64) and (10, 8) are not worth it at rank 4
    ddp = DistributedDataParallel(model)
    state = comm_hooks.PowerSGDState(
        process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2, min_compression_rate=rate
    )
    ddp.register_comm_hook(state, comm_hooks.powerSGD_hook)
    opt = optim.SGD(ddp.parameters(), lr=0.1)
    rng = np.random.default_rng(world.rank)
    x, y = md.tensor(rng.standard_normal((8, 48)), dtype=np.float32), rng.integers(0, 10, 8)
    payload = []
    for _ in range(4):  # steps 0 and 1 plain, 2 and 3 compressed
        before = ddp.comm_stats.payload_bytes  # the bytes the bucket's collectives reduced (the hook's own)
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        payload.append(ddp.comm_stats.payload_bytes - before)
    shapes = [list(p.data.shape) for p in model.parameters()]
    return {"shapes": shapes, "rank": rank, "rate": rate, "payload_per_step": payload}


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])

"""Lesson 12: what the network costs, measured in one launch; rank 0 writes the results as JSON.

    mpiexec -n 4 python scripts/network_step.py OUT.json [--mb 0.5 2] [--hooks none fp16 powersgd]
    minidist cluster run -- python scripts/network_step.py OUT.json     # the same across nodes

Two measurements (one launch: starting the ranks costs seconds, more than what is measured):

1. **all-reduce**: every rank all-reduces ``--mb`` MiB of float32 (each size of the list) with each of
   ``--algorithms`` through ``minidist.distributed.all_reduce(a, algorithm=...)``, ``--repeats`` times
   (the algorithms interleaved, each call after a barrier; one sample is the slowest rank's time), after
   one untimed call each. It also counts the bytes each rank sent per call, over all its groups.
2. **DDP steps**: an MLP (``--layers`` hidden layers of ``--width``, float32) trained with
   ``DistributedDataParallel`` on random data (each rank its slice of a global batch of ``--batch``),
   once per communication hook of ``--hooks`` (``none``: DDP's own all-reduce; ``fp16``/``bf16``: the
   gradients cast to 16 bits for the all-reduce; ``powersgd``: PowerSGD of rank ``--powersgd-rank``,
   compressing from the second step): ``--warmup`` untraced steps, then ``--steps`` steps, each after a
   barrier with ``minidist.trace`` on. The spans of the last step are kept.

OUT.json: ``{"hosts": [per rank], "node_of_rank": [...], "allreduce": [{"algorithm", "nbytes",
"seconds": [samples], "bytes_sent": [per rank]}], "params", "ddp": [{"hook", "step_s": [per step, the
slowest rank's], "payload_per_step": [per rank: the bytes its gradient all-reduces reduced per step,
from DDP's ``comm_stats``], "events": [per rank]}]}``. Nodes are what
``minidist.distributed.topology`` sees: network namespaces on a ``minidist_tools.cluster``, or blocks of
``MINIDIST_RANKS_PER_NODE`` ranks on one machine.
"""

import argparse
import json
import os
import socket
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one BLAS thread per rank: several ranks share few cores

import numpy as np  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import nn, optim, trace  # noqa: E402
from minidist.distributed.topology import node_layout  # noqa: E402
from minidist.models import MLP  # noqa: E402
from minidist.parallel import DistributedDataParallel, comm_hooks  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--mb", type=float, nargs="*", default=[0.5, 2.0], help="all-reduce sizes in MiB")
p.add_argument("--algorithms", nargs="+", default=["ring", "hierarchical"], help="all-reduce algorithms")
p.add_argument("--repeats", type=int, default=2, help="timed all-reduces per size and algorithm")
p.add_argument("--hooks", nargs="*", default=["none"], choices=["none", "fp16", "bf16", "powersgd"])
p.add_argument("--powersgd-rank", type=int, default=4)
p.add_argument("--width", type=int, default=512, help="features of every hidden layer")
p.add_argument("--layers", type=int, default=3, help="hidden layers")
p.add_argument("--batch", type=int, default=64, help="GLOBAL batch, split over the ranks")
p.add_argument("--warmup", type=int, default=2, help="untraced steps first (PowerSGD compresses from step 2)")
p.add_argument("--steps", type=int, default=3, help="timed steps; the last one's spans are kept")
p.add_argument("--bucket-cap-mb", type=float, default=1.0, help="DDP's bucket size: several buckets overlap")
args = p.parse_args()

world = dist.init()
layout = node_layout()  # collective: which node each rank is on
hosts = world.mpi.allgather(socket.gethostname())


def slowest(seconds: float) -> float:
    """The slowest rank's time: a collective is done when its last rank is."""
    took = np.array([seconds])
    dist.all_reduce(took, op="max", algorithm="mpi")
    return float(took[0])


def bytes_sent() -> int:
    """Bytes this rank sent on every communicator an all-reduce may use (hierarchical: the node's)."""
    groups = [world, layout.node_group, layout.leader_group]
    return sum(g.collective_channel.bytes_sent for g in groups if g is not None)  # collectives send there


def time_all_reduce(nbytes: int) -> list[dict]:
    a = np.ones(nbytes // 4, dtype=np.float32)
    for name in args.algorithms:
        dist.all_reduce(a, algorithm=name)  # warm-up: first-touch allocations, connections
    runs = {name: {"algorithm": name, "nbytes": a.nbytes, "seconds": []} for name in args.algorithms}
    for _ in range(args.repeats):
        for name in args.algorithms:  # interleaved: a burst of load hits every algorithm alike
            world.barrier()
            before, start = bytes_sent(), time.perf_counter()
            dist.all_reduce(a, algorithm=name)
            took = time.perf_counter() - start
            runs[name]["bytes_sent"] = world.mpi.gather(bytes_sent() - before, root=0)
            runs[name]["seconds"].append(slowest(took))
    return list(runs.values())


def time_ddp(hook: str) -> dict:
    md.manual_seed(0)  # the same weights on every rank (DDP broadcasts rank 0's anyway)
    model = MLP(args.width, [args.width] * args.layers, 10)
    # small_bucket_bytes=0: every bucket goes to DDP's communication thread, so the timeline shows overlap
    ddp = DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb, small_bucket_bytes=0)
    # ddp.register_comm_hook(state, hook) with PyTorch's hooks, as the examples' --comm-hook flag does
    comm_hooks.register_by_name(ddp, hook, powersgd_rank=args.powersgd_rank, start_powerSGD_iter=2)
    opt = optim.SGD(ddp.parameters(), lr=1e-2)
    rng = np.random.default_rng(world.rank)
    local = args.batch // world.size
    x = md.tensor(rng.standard_normal((local, args.width)), dtype=np.float32)
    y = rng.integers(0, 10, local)

    def step() -> None:
        with trace.span("forward", "forward"):
            loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        with trace.span("backward", trace.BACKWARD):
            loss.backward()  # DDP all-reduces the buckets during backward, on its communication thread
        with trace.span("optimizer", "optimizer"):
            opt.step()

    for _ in range(args.warmup):
        step()
    times = []
    payload = ddp.comm_stats.payload_bytes  # bytes the gradients' collectives reduced, hook or not
    for _ in range(args.steps):
        world.barrier()
        trace.enable()  # right after a barrier: the ranks' clocks start together; clears the last step's
        start = time.perf_counter()
        step()
        took = time.perf_counter() - start
        trace.disable()
        times.append(slowest(took))
    payload = (ddp.comm_stats.payload_bytes - payload) / args.steps
    result = {"hook": hook, "step_s": times, "payload_per_step": world.mpi.gather(payload, root=0)}
    result["events"] = world.mpi.gather(trace.events(), root=0)
    result["params"] = sum(q.data.size for q in model.parameters())
    return result


allreduce = [run for mb in args.mb for run in time_all_reduce(int(mb * 2**20))]
ddp_runs = [time_ddp(hook) for hook in args.hooks]
if world.rank == 0:
    result = {"hosts": hosts, "node_of_rank": list(layout.node_of_rank), "allreduce": allreduce}
    result |= {"params": ddp_runs[0]["params"] if ddp_runs else 0, "ddp": ddp_runs}
    with open(args.out, "w") as f:
        json.dump(result, f)
    nodes = len(set(layout.node_of_rank))
    for r in allreduce:
        print(
            f"all-reduce {r['nbytes'] / 2**20:4g} MiB {r['algorithm']:>13}: {min(r['seconds']) * 1e3:7.1f} ms"
        )
    for r in ddp_runs:
        print(f"DDP step, hook {r['hook']:>8}: {np.median(r['step_s']) * 1e3:7.1f} ms on {nodes} node(s)")

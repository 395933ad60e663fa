"""MPI worker (2 ranks): misuses of ``register_comm_hook``; every rank records what it raised.

argv: out_dir. For each case, a fresh DDP of ``ddp_common``'s MLP; the case's calls; the exception
(class name and message) or None goes into ``errors_rank<r>.json``. The job itself must not hang.
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/workers: the shared worker modules
import ddp_common  # noqa: E402
from dist_worker_utils import run_worker, write_json  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import nn  # noqa: E402
from minidist.parallel import DistributedDataParallel  # noqa: E402
from minidist.parallel.comm_hooks import PowerSGDState, allreduce_hook, fp16_compress_hook, powerSGD_hook  # noqa: E402


def backward(model, world) -> None:
    x, y = ddp_common.make_data(0, 8)
    mine = ddp_common.share(8, world.size, world.rank)
    nn.functional.cross_entropy(model(md.tensor(x[mine])), y[mine]).backward()


def wrong_shape_hook(state, bucket):
    return bucket.buffer()[:-1].copy()


def main(out_dir: str) -> None:
    world = dist.init()
    rank = world.rank
    split = world.split(color=rank)  # a group of one rank: not DDP's group
    cases = {
        "twice": lambda m: [m.register_comm_hook(None, allreduce_hook) for _ in range(2)],
        "after_backward": lambda m: (backward(m, world), m.register_comm_hook(None, allreduce_hook)),
        "different_hooks": lambda m: m.register_comm_hook(
            *((None, fp16_compress_hook) if rank == 0 else (PowerSGDState(), powerSGD_hook))),
        "different_rank": lambda m: m.register_comm_hook(
            PowerSGDState(matrix_approximation_rank=1 + rank), powerSGD_hook),
        "not_callable": lambda m: m.register_comm_hook(None, allreduce_hook if rank == 0 else "fp16"),
        "foreign_group": lambda m: m.register_comm_hook(PowerSGDState(process_group=split), powerSGD_hook),
        "wrong_result": lambda m: (m.register_comm_hook(None, wrong_shape_hook), backward(m, world)),
        "fine": lambda m: (m.register_comm_hook(PowerSGDState(process_group=world), powerSGD_hook),
                           backward(m, world)),
    }  # fmt: skip
    results = {}
    for name, case in cases.items():
        model = DistributedDataParallel(ddp_common.make_model(0, np.float64), group=world)
        try:
            case(model)
            results[name] = None
        except Exception as e:  # noqa: BLE001  (recorded for the test)
            results[name] = [type(e).__name__, str(e)]
    write_json(out_dir, f"errors_rank{rank}.json", results)


run_worker(main, sys.argv[1])

"""MPI worker: train ddp_common's MLP with DDP and a communication hook; save parameters and byte counts.

argv: one run per ``--then``-separated list:
    out_dir name hook dtype steps [--rank R] [--start S] [--bucket-cap-mb MB] [--small-bucket-bytes N]
    [--no-warm-start] [--no-error-feedback]
``hook`` is a key of ``comm_hooks.HOOKS`` (``none``: plain DDP). Each rank's loss is its share's summed
loss times world_size / global_batch (as ``ddp/ddp_equivalence.py``), SGD with momentum, global batch
16 of ``ddp_common.make_data(0, 64)``. Writes ``<name>_rank<r>.npz`` (parameters) and
``<name>_stats_rank<r>.json`` (``ddp.comm_stats``). ``--collectives`` (alone, first) also all-reduces
float16 and bfloat16 arrays with every algorithm and writes ``collectives_rank<r>.npz/json``.
"""

import argparse
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
from minidist.parallel.comm_hooks import HOOKS, PowerSGDState, register_by_name  # noqa: E402
from minidist.parallel.comm_hooks.default import BFLOAT16  # noqa: E402

SEED, BATCH = 0, 16

parser = argparse.ArgumentParser()
for name, kind in [("out_dir", str), ("name", str), ("hook", str), ("dtype", str), ("steps", int)]:
    parser.add_argument(name, type=kind)
parser.add_argument("--rank", type=int, default=1)
parser.add_argument("--start", type=int, default=0)
parser.add_argument("--bucket-cap-mb", type=float, default=25)
parser.add_argument("--small-bucket-bytes", type=int, default=2**20)
parser.add_argument("--no-warm-start", action="store_true")
parser.add_argument("--no-error-feedback", action="store_true")


def train(args: argparse.Namespace, world: dist.Communicator) -> None:
    dtype = np.dtype(args.dtype)
    x, y = ddp_common.make_data(SEED, 64)
    model = DistributedDataParallel(
        ddp_common.make_model(SEED, dtype), group=world, bucket_cap_mb=args.bucket_cap_mb,
        small_bucket_bytes=args.small_bucket_bytes,
    )  # fmt: skip
    if args.hook == "powersgd":
        state = PowerSGDState(
            None, matrix_approximation_rank=args.rank, start_powerSGD_iter=args.start,
            use_error_feedback=not args.no_error_feedback, warm_start=not args.no_warm_start,
        )  # fmt: skip
        model.register_comm_hook(state, HOOKS["powersgd"])
    else:  # the examples' way: by the --comm-hook name ("none": no hook)
        register_by_name(model, args.hook)
    opt = ddp_common.make_optimizer("sgd", model.parameters())
    for step in range(args.steps):
        xb, yb = ddp_common.global_batch(x, y, step, BATCH)
        mine = ddp_common.share(BATCH, world.size, world.rank)
        logits = model(md.tensor(xb[mine], dtype=dtype))
        local = nn.functional.cross_entropy(logits, yb[mine], reduction="sum")
        opt.zero_grad()
        (local * (world.size / BATCH)).backward()
        opt.step()
    model.join()  # with a hook registered too: the same collectives on every rank, no hang
    out = Path(args.out_dir)
    np.savez(out / f"{args.name}_rank{world.rank}.npz", **model.module.state_dict())
    stats = model.comm_stats
    write_json(out, f"{args.name}_stats_rank{world.rank}.json", {
        "steps": stats.steps, "bytes_sent": stats.bytes_sent, "payload_bytes": stats.payload_bytes,
        "uncompressed_bytes": stats.uncompressed_bytes, "bytes_saved": stats.bytes_saved,
    })  # fmt: skip


def collectives(out_dir: str, world: dist.Communicator) -> None:
    """float16 and bfloat16 all-reduces (sum and avg) with each algorithm; results and errors saved."""
    results, errors = {}, {}
    for dtype in (np.dtype(np.float16), BFLOAT16):
        for algorithm in ("auto", "ring", "recursive_doubling", "rabenseifner", "mpi"):
            for op in ("sum", "avg"):
                key = f"{dtype.name}_{algorithm}_{op}"
                a = (np.arange(37, dtype=np.float64) / 8 + world.rank).astype(dtype)  # exact in 8 bits
                try:
                    dist.all_reduce(a, op=op, group=world, algorithm=algorithm)
                    results[key] = a.astype(np.float64)
                except TypeError as e:
                    errors[key] = str(e)
    np.savez(Path(out_dir) / f"collectives_rank{world.rank}.npz", **results)
    write_json(out_dir, f"collectives_rank{world.rank}.json", errors)


def main() -> None:
    world = dist.init()
    runs = [[]]
    for arg in sys.argv[1:]:
        if arg == "--then":
            runs.append([])
        else:
            runs[-1].append(arg)
    for argv in runs:
        if argv[0] == "--collectives":
            collectives(argv[1], world)
        else:
            train(parser.parse_args(argv), world)


run_worker(main)

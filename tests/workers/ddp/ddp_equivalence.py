"""MPI worker: train with DistributedDataParallel and save each rank's parameters and losses.

argv: out_dir seed steps global_batch optimizer dtype [--bucket-cap-mb MB] [--no-overlap]
      [--small-bucket-bytes N]
      [--grad-accum K] [--two-heads]
Each global batch is cut into K micro-batches (numpy.array_split order) and each micro-batch into the
ranks' shares. A rank's loss for one share is its summed loss times world_size / global_batch, so that
after K accumulated micro-steps (K - 1 of them in no_sync) DDP's average is the gradient of the mean
loss over the global batch, even when shares are unequal. --two-heads trains ddp_common.TwoHeads with
find_unused_parameters=True: only some ranks use its `extra` head in a step.
``--then`` starts another run in the same launch (``tests/parallel/data_parallel/test_ddp.py`` runs all its
configurations of one world size so: starting the ranks costs more than a run); each seeds its model and data
itself.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/workers: the shared worker modules
import ddp_common  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import nn  # noqa: E402
from minidist.parallel import DistributedDataParallel  # noqa: E402

parser = argparse.ArgumentParser()
for name, kind in [
    ("out_dir", str),
    ("seed", int),
    ("steps", int),
    ("batch", int),
    ("opt", str),
    ("dtype", str),
]:
    parser.add_argument(name, type=kind)
parser.add_argument("--bucket-cap-mb", type=float, default=25)
parser.add_argument("--no-overlap", action="store_true")
parser.add_argument("--small-bucket-bytes", type=int, default=None)
parser.add_argument("--grad-accum", type=int, default=1)
parser.add_argument("--two-heads", action="store_true")


def run(args: argparse.Namespace, world: dist.Communicator) -> None:
    dtype = np.dtype(args.dtype)
    x, y = ddp_common.make_data(args.seed, 64)
    # Different seeds per rank: DDP's broadcast must still make every replica start from rank 0's weights.
    seed = args.seed + world.rank
    module = ddp_common.TwoHeads(seed, dtype) if args.two_heads else ddp_common.make_model(seed, dtype)
    model = DistributedDataParallel(
        module, group=world, bucket_cap_mb=args.bucket_cap_mb, overlap=not args.no_overlap,
        find_unused_parameters=args.two_heads,
        **({} if args.small_bucket_bytes is None else {"small_bucket_bytes": args.small_bucket_bytes}),
    )  # fmt: skip
    opt = ddp_common.make_optimizer(args.opt, model.parameters())
    losses = []
    for step in range(args.steps):
        xb, yb = ddp_common.global_batch(x, y, step, args.batch)
        opt.zero_grad()
        total = np.zeros(1)
        for micro in range(args.grad_accum):
            idx = ddp_common.share(args.batch, args.grad_accum, micro)
            mine = idx[ddp_common.share(len(idx), world.size, world.rank)]
            inputs = md.tensor(xb[mine], dtype=dtype)
            logits = (
                model(inputs, ddp_common.uses_extra(world.rank, step)) if args.two_heads else model(inputs)
            )
            local = nn.functional.cross_entropy(logits, yb[mine], reduction="sum")
            loss = local * (world.size / args.batch)
            if micro < args.grad_accum - 1:
                with model.no_sync():  # accumulate locally; only the last micro-step communicates
                    loss.backward()
            else:
                loss.backward()
            total += local.item()
        opt.step()
        dist.all_reduce(total, op="sum", group=world)
        losses.append(float(total[0]) / args.batch)
    model.join()  # every rank ran the same number of steps: join() returns quietly
    out = Path(args.out_dir)
    np.savez(out / f"params_rank{world.rank}.npz", **model.module.state_dict())
    (out / f"losses_rank{world.rank}.json").write_text(json.dumps(losses))


world = dist.init()
runs = [[]]
for arg in sys.argv[1:]:  # one argument list per run, split on --then
    if arg == "--then":
        runs.append([])
    else:
        runs[-1].append(arg)
for argv in runs:
    run(parser.parse_args(argv), world)

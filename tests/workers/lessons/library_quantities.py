"""MPI worker: the quantities the lessons' exercises compute, as the library computes them on real ranks.

argv: out_dir. Run on 2 ranks; rank 0 writes ``library.json`` with

* ``shapes``: ``{"column"|"row": {"out,in": weight shape of this rank}}`` of ``ColumnParallelLinear`` and
  ``RowParallelLinear`` over the world (lesson 06, ``shard_shape``);
* ``f_backward``: per rank, the local gradient fed to the f operator's backward and what it returned
  (lesson 06, ``f_backward``);
* ``zero``: ``{stage: largest rank's memory_report()}`` of float32 AdamW under ZeRO stages 1 and 2, and
  the number of parameters (lesson 05, ``zero_bytes``);
* ``checkpoint``: the step saved, the files of its committed folder and the ranks that wrote shards
  (lesson 08, ``files_before_latest``);
* ``vocab_loss``: the logits, targets and per-token losses of ``vocab_parallel_cross_entropy`` over the
  world, each rank holding its ``shard_bounds`` slice of a 65-id vocabulary (lesson 11,
  ``vocab_parallel_loss``).
"""

import sys
import tempfile
from pathlib import Path

import numpy as np
from dist_worker_utils import run_worker, write_json

import minidist as md
import minidist.distributed as dist
from minidist import checkpoint, nn, optim
from minidist.parallel import ColumnParallelLinear, RowParallelLinear, ZeroRedundancyOptimizer
from minidist.parallel.tensor_parallel import copy_to_tensor_parallel_region, vocab_parallel_cross_entropy
from minidist.parallel.tensor_parallel.split import shard_bounds


def main(out_dir: str) -> None:
    world = dist.init()
    result: dict = {"shapes": {"column": {}, "row": {}}}
    for out_f, in_f in [(8, 4), (6, 10), (12, 12)]:
        result["shapes"]["column"][f"{out_f},{in_f}"] = list(ColumnParallelLinear(in_f, out_f).weight.shape)
        result["shapes"]["row"][f"{out_f},{in_f}"] = list(RowParallelLinear(in_f, out_f).weight.shape)

    # f's backward: this rank's contribution to dL/dx goes in, what every rank holds comes out.
    local = np.random.default_rng(world.rank).standard_normal((3, 5))
    x = md.tensor(np.zeros((3, 5)), dtype=np.float64, requires_grad=True)
    copy_to_tensor_parallel_region(x, world).backward(local)
    result["f_backward"] = world.mpi.gather({"local": local.tolist(), "out": x.grad.tolist()}, root=0)

    data = np.random.default_rng(11)
    logits, targets = data.standard_normal((7, 65)) * 30 + 500.0, data.integers(0, 65, 7)
    start, stop = shard_bounds(65, world.size, world.rank)
    losses = vocab_parallel_cross_entropy(md.tensor(logits[:, start:stop]), targets, world, reduction="none")
    result["vocab_loss"] = {
        "logits": logits.tolist(),
        "targets": targets.tolist(),
        "losses": losses.numpy().tolist(),
    }

    result["zero"] = {}
    for stage in (1, 2):
        md.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 5))
        opt = ZeroRedundancyOptimizer(model.parameters(), optim.AdamW, stage=stage, lr=1e-3)
        x = md.tensor(np.random.default_rng(world.rank).standard_normal((8, 16)), dtype=np.float32)
        nn.functional.cross_entropy(model(x), np.arange(8) % 5).backward()
        opt.step()
        reports = world.mpi.gather(opt.memory_report(), root=0)
        if world.rank == 0:
            result["zero"][stage] = max(reports, key=lambda r: r["total"])
    result["psi"] = sum(p.size for p in model.parameters())

    root = Path(world.mpi.bcast(tempfile.mkdtemp(prefix="lesson08_") if world.rank == 0 else None, root=0))
    md.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    folder = checkpoint.save(root, model, step=12)
    if world.rank == 0:
        files = sorted(f"{folder.name}/{p.name}" for p in folder.iterdir())
        writers = sorted(int(p.name[4:9]) for p in folder.iterdir() if p.suffix == ".safetensors")
        result["checkpoint"] = {"step": 12, "files": files, "writers": writers}
        write_json(out_dir, "library.json", result)


run_worker(main, sys.argv[1])

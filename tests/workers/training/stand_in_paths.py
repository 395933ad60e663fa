"""MPI worker: data parallelism on the CuPy stand-in equals the CPU, bit for bit.

argv: out_dir. The same few steps of a tiny MLP, once with NumPy arrays and once with
tests/helpers/cupy_stand_in.py as the array backend (device arrays that refuse ``np.`` functions and implicit
host copies), through every path that handles gradients between ranks: DDP with each communication hook
(plain, float16, bfloat16, PowerSGD with error feedback), ZeRO stages 1 and 2 with their sharded gradient
clipping (2- and infinity-norm), and
``minidist.parallel.clip_grad_norm_`` with the infinity norm; and a 2-stage pipeline (1F1B and
interleaved), whose activations cross ranks through the host. Writes rank{r}.json: per case, whether the
parameters lived on the "device", the largest difference from the CPU run, and any error.
"""

import sys
import traceback
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "helpers"))  # tests/helpers/: the stand-in
import pp_common  # noqa: E402
from cupy_stand_in import DeviceArray, install  # noqa: E402
from dist_worker_utils import run_worker, write_json  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import backend, nn, optim  # noqa: E402
from minidist.parallel import (  # noqa: E402
    DistributedDataParallel,
    PipelineParallel,
    ZeroRedundancyOptimizer,
    clip_grad_norm_,
)
from minidist.parallel.comm_hooks import register_by_name  # noqa: E402

CASES = [
    "ddp-none",
    "ddp-fp16",
    "ddp-bf16",
    "ddp-powersgd",
    "zero1",
    "zero2",
    "clip-inf",
    "pp-1f1b",
    "pp-interleaved",
]


def train_pipeline(case: str) -> tuple[list[float], list[np.ndarray], bool]:
    """Two AdamW steps of pp_common's 7-layer MLP as a 2-stage pipeline: activations and gradients cross
    ranks as host arrays (staged) and become device arrays again on arrival. 1F1B sends each message
    alone; the interleaved schedule (2 chunks per rank) batches them."""
    model = pp_common.make_model(0)
    interleaved = case == "pp-interleaved"
    pipe = PipelineParallel(model, microbatches=2, schedule=case[3:], virtual_stages=2 if interleaved else 1)
    opt = optim.AdamW(pipe.parameters(), lr=1e-2)
    x, y = pp_common.make_data(0, n_samples=8)  # every stage the same batch: the first reads x, the last y
    losses = []
    for _ in range(2):
        losses.append(pipe.train_step(md.tensor(x, dtype=np.float64), y, nn.functional.cross_entropy))
        opt.step()
        opt.zero_grad()
    params = list(pipe.parameters())
    return losses, [backend.to_numpy(p.data) for p in params], isinstance(params[0].data, DeviceArray)


def train(case: str, rank: int, size: int) -> tuple[list[float], list[np.ndarray], bool]:
    if case.startswith("pp-"):
        return train_pipeline(case)
    md.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8, dtype=np.float64), nn.GELU(), nn.Linear(8, 3, dtype=np.float64))
    on_device = isinstance(model[0].weight.data, DeviceArray)
    if case.startswith("zero"):
        opt = ZeroRedundancyOptimizer(model.parameters(), optim.AdamW, stage=int(case[-1]), lr=1e-2)
        net = model
    else:
        net = DistributedDataParallel(model, bucket_cap_mb=1e-4)  # several buckets: PowerSGD sees matrices
        if case.startswith("ddp-"):
            register_by_name(net, case[4:], powersgd_rank=1, start_powerSGD_iter=2)  # plain, then compressed
        opt = optim.AdamW(model.parameters(), lr=1e-2)
    data = np.random.default_rng(rank)  # each rank its own rows
    losses = []
    for _ in range(4):
        x, y = data.standard_normal((4, 6)), data.integers(0, 3, 4)
        loss = nn.functional.cross_entropy(net(md.tensor(x, dtype=np.float64)), y)
        opt.zero_grad()
        loss.backward()
        if case.startswith("zero"):
            opt.clip_grad_norm_(0.5, norm_type=2.0 if case == "zero1" else float("inf"))  # both norms
        elif case == "clip-inf":
            clip_grad_norm_(model.parameters(), 0.05, norm_type=float("inf"))
        opt.step()
        losses.append(loss.item())
    return losses, [backend.to_numpy(p.data) for p in model.parameters()], on_device


def main(out_dir: str) -> None:
    world = dist.init()
    report = {}
    for case in CASES:
        cpu = train(case, world.rank, world.size)
        with pytest.MonkeyPatch.context() as patch:
            install(patch)
            try:
                device = train(case, world.rank, world.size)
            except Exception as error:  # recorded: the test names the case and the error
                traceback.print_exc()  # the worker's output shows where
                report[case] = {"error": f"{type(error).__name__}: {error}"}
                continue
        report[case] = {
            "on_device": device[2] and not cpu[2],
            "losses_equal": device[0] == cpu[0],
            "max_diff": max(float(np.abs(a - b).max()) for a, b in zip(device[1], cpu[1], strict=True)),
        }
    write_json(out_dir, f"rank{world.rank}.json", report)


if __name__ == "__main__":
    run_worker(main, sys.argv[1])

"""MPI worker: ``ParallelGPT`` with sequence parallelism on the CuPy stand-in equals the CPU, bit for bit.

argv: out_dir. Two AdamW steps of a tiny ParallelGPT (tp = the world, sequence parallel, V = 11 split
unevenly) on the CPU, then again with tests/helpers/cupy_stand_in.py as the array backend: every op and every
mapping must take its array module from its input (no ``np.`` on device data), and the collectives
stage device arrays through host memory. Writes rank{r}.json: the two runs' losses, whether the
parameters were device arrays, and the largest parameter difference.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "helpers"))  # tests/helpers/: the stand-in
from cupy_stand_in import DeviceArray, install  # noqa: E402
from dist_worker_utils import run_worker, write_json  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import backend, optim  # noqa: E402
from minidist.models import GPTConfig, ParallelGPT  # noqa: E402
from minidist.parallel import ProcessMesh  # noqa: E402


def train(mesh: ProcessMesh) -> tuple[list[float], dict[str, np.ndarray], bool]:
    md.manual_seed(0)
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, dtype=np.float64)
    model = ParallelGPT(config, mesh, sequence_parallel=True)
    opt = optim.AdamW(model.parameters(), lr=1e-2)
    data = np.random.default_rng(0)
    losses = []
    for _ in range(2):
        x, y = data.integers(0, 11, (2, 8)), data.integers(0, 11, (2, 8))
        loss = model.loss(model(x), y)
        loss.backward()
        model.allreduce_sequence_parallel_grads()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    params = {n: backend.to_numpy(p.data) for n, p in model.named_parameters()}
    return losses, params, isinstance(model.wte.weight.data, DeviceArray)


def main(out_dir: str) -> None:
    world = dist.init()
    mesh = ProcessMesh(dp=1, tp=world.size)
    cpu = train(mesh)
    with pytest.MonkeyPatch.context() as monkeypatch:
        install(monkeypatch)
        device = train(mesh)
    worst = max(float(np.abs(device[1][n] - cpu[1][n]).max()) for n in cpu[1])
    result = {"cpu": cpu[0], "device": device[0], "on_device": device[2], "worst": worst}
    write_json(out_dir, f"rank{world.rank}.json", result)


run_worker(main, sys.argv[1])

"""MPI worker: a replayed DDP step equals the eager one bit for bit; other layouts fall back with a reason.

argv: out_dir. Rank 0 writes ``result.json``: ``same`` (losses and parameters of 6 GPT steps with dropout,
eager vs ``Replay``, identical on this rank and every other), ``replays``, and ``reasons``: the one-line
fallback reason ``Replay`` gives for ZeRO, FSDP, a tensor-parallel layer and PipelineParallel.
"""

import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/workers: the shared worker modules
from dist_worker_utils import run_worker, write_json  # noqa: E402
from replay_steps import train_steps  # noqa: E402  (tests/helpers, on the ranks' PYTHONPATH)

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import nn, optim  # noqa: E402
from minidist.compile import Replay, ReplayFallbackWarning  # noqa: E402
from minidist.models import GPT, GPTConfig  # noqa: E402
from minidist.nn import functional as F  # noqa: E402
from minidist.parallel import (  # noqa: E402
    ColumnParallelLinear,
    DistributedDataParallel,
    FullyShardedDataParallel,
    PipelineParallel,
    ZeroRedundancyOptimizer,
)

CONFIG = GPTConfig(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.1)


def gpt_run(world, replay: bool, steps: int = 6):
    md.manual_seed(0)
    model = DistributedDataParallel(GPT(CONFIG), group=world, bucket_cap_mb=0.004)  # several buckets
    opt = optim.AdamW(model.parameters(), lr=2e-3)

    def loss_fn(x, y):
        return F.cross_entropy(model(x).reshape(-1, 40), y.reshape(-1))

    step = Replay(model, opt, loss_fn, max_grad_norm=0.5)
    rng = np.random.default_rng(5 + world.rank)  # each rank its own batches
    batches = [(rng.integers(0, 40, (2, 16)), rng.integers(0, 40, (2, 16))) for _ in range(steps)]
    losses = train_steps(step, batches, replay)
    return losses, [p.data.copy() for p in model.parameters()], step.replays


def reason(model, opt, loss_fn, *inputs):
    step = Replay(model, opt, loss_fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if loss_fn is not None:
            step(*inputs)
    messages = [str(w.message) for w in caught if w.category is ReplayFallbackWarning]
    return step._never if not messages else messages[0]


def main(out_dir: str) -> None:
    world = dist.init()
    eager, replayed = gpt_run(world, False), gpt_run(world, True)
    same = eager[0] == replayed[0] and all(a.tobytes() == b.tobytes() for a, b in zip(eager[1], replayed[1]))
    agreed = np.array([float(same)])
    dist.all_reduce(agreed, op="min", group=world)
    x, y = np.ones((4, 8), np.float32), np.zeros(4, np.int64)
    reasons = {}
    mlp = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    zero = ZeroRedundancyOptimizer(list(mlp.parameters()), optim.SGD, group=world, lr=0.1)
    reasons["zero"] = reason(mlp, zero, lambda a, b: F.cross_entropy(mlp(a), b), x, y)
    md.manual_seed(0)
    fsdp = FullyShardedDataParallel(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)), group=world)
    opt = optim.SGD(fsdp.parameters(), lr=0.1)
    reasons["fsdp"] = reason(fsdp, opt, lambda a, b: F.cross_entropy(fsdp(a), b), x, y)
    tp = nn.Sequential(ColumnParallelLinear(8, 4, group=world, gather_output=True))
    opt = optim.SGD(tp.parameters(), lr=0.1)
    reasons["tensor"] = reason(tp, opt, lambda a, b: F.cross_entropy(tp(a), b), x, y)
    pipe = PipelineParallel(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)), world, microbatches=2)
    reasons["pipeline"] = reason(pipe, opt, None)
    if world.rank == 0:
        write_json(
            out_dir, "result.json", {"same": bool(agreed[0]), "replays": replayed[2], "reasons": reasons}
        )


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])

"""minidist's GPT against the same GPT in PyTorch: tokens/s, MFU and the loss both reach.

    OMP_NUM_THREADS=1 python benchmarks/gpt.py                # quick: 40 steps each, ~30 s on a quiet core
    OMP_NUM_THREADS=1 python benchmarks/gpt.py --steps 500    # the loss comparison (~2.5 min)
    mpiexec -n 8 python benchmarks/gpt.py --comm --dp 2 --tp 2 --pp 2   # bytes per group: gpt_comm.py

The config is nanoGPT's CPU "baby GPT" (block 64, batch 12, 4 layers, 4 heads, width 128, dropout 0 so
that the two runs draw no random numbers), trained on the bundled Shakespeare exactly as
examples/train_gpt.py trains it: AdamW with weight decay on the matrices only, linear warmup then a
cosine decay, the gradient norm clipped to 1. Both models start from the same weights (minidist's,
copied into benchmarks/torch_gpt.py's TorchGPT by ``load_minidist``) and read the same windows (two
``RandomWindows`` with one seed), one thread each.

The two trainings run side by side in ONE process: ``--block`` steps of one, then ``--block`` of the
other, the order swapped every round, so load from other processes falls on both alike. Each block
gives both a tokens/s figure; the report is the median over rounds (the first, warm-up round left
out) and the ratio minidist / torch per round: its median and its range. MFU (model FLOPs
utilisation, Chowdhery et al. 2022, appendix B) = ``GPT.flops_per_token()`` x tokens/s over the
float32 matmul rate this machine measures here (NumPy, 512 x 512, one thread), both by the wall clock
and per CPU second (this process's CPU time: on a shared machine the wall clock also counts the time
other processes hold the core; the CPU-time figures are the steadier ones). At the end both
models are scored on the same 20 validation batches. Where the time of a minidist step goes:
docs/performance.md, "GPT".
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before NumPy and torch load their BLAS

if __name__ == "__main__" and "--comm" in sys.argv[1:]:
    # The communication of one step of the parallel GPT: gpt_comm.py, on MPI ranks and without
    # torch, e.g. ``mpiexec -n 8 python benchmarks/gpt.py --comm --dp 2 --tp 2 --pp 2``.
    import gpt_comm

    gpt_comm.main([a for a in sys.argv[1:] if a != "--comm"])
    sys.exit()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch_gpt import TorchGPT, load_minidist  # noqa: E402

import minidist as md  # noqa: E402
from minidist import optim  # noqa: E402
from minidist.data import CharTokenizer, RandomWindows, load_shakespeare, train_val_split  # noqa: E402
from minidist.models import GPT, GPTConfig  # noqa: E402
from minidist.nn import functional as F  # noqa: E402
from minidist.nn.utils import clip_grad_norm_  # noqa: E402
from minidist.optim.lr_scheduler import cosine_with_warmup  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--steps", type=int, default=40, help="training steps of each model (500: the loss test)")
parser.add_argument("--block", type=int, default=5, help="steps of one model before switching to the other")
parser.add_argument("--batch-size", type=int, default=12)
parser.add_argument("--block-size", type=int, default=64)
parser.add_argument("--n-layer", type=int, default=4)
parser.add_argument("--n-head", type=int, default=4)
parser.add_argument("--n-embd", type=int, default=128)
parser.add_argument("--eval-iters", type=int, default=20, help="validation batches in the final loss")
parser.add_argument("--seed", type=int, default=1337)
parser.add_argument("--comm", action="store_true", help="instead: gpt_comm.py's bytes per group (its flags)")
# examples/train_gpt.py's optimizer settings (its defaults)
LR, MIN_LR, WARMUP, WEIGHT_DECAY, BETAS, CLIP = 2e-3, 2e-4, 100, 0.1, (0.9, 0.99), 1.0


def matmul_rate(size: int = 512, repeats: int = 3) -> tuple[float, float]:
    """FLOP/s of a float32 (size x size) @ (size x size) in NumPy, the median of ``repeats`` products,
    by the wall clock and by CPU time. Measured once per round, between the training blocks, so that it
    sees the same load as they do."""
    a = np.ones((size, size), dtype=np.float32)
    wall, cpu = [], []
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), time.process_time()
        a @ a
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)
    return 2 * size**3 / float(np.median(wall)), 2 * size**3 / float(np.median(cpu))


def schedule_steps(steps: int) -> tuple[int, int]:
    """(warmup, total) as examples/train_gpt.py chooses them: a run shorter than the warmup warms up
    over its first half."""
    return max(1, min(WARMUP, steps // 2)), max(steps, 2)


class MinidistRun:
    """minidist's GPT, optimizer and schedule; ``step(x, y)`` trains on one batch, returns the loss."""

    def __init__(self, config: GPTConfig, steps: int) -> None:
        self.model = GPT(config)
        params = list(self.model.parameters())
        groups = [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": WEIGHT_DECAY},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
        ]
        self.opt = optim.AdamW(groups, lr=LR, betas=BETAS)
        self.sched = cosine_with_warmup(self.opt, *schedule_steps(steps), eta_min=MIN_LR)
        self.vocab = config.vocab_size

    def loss(self, x: np.ndarray, y: np.ndarray) -> md.Tensor:
        return F.cross_entropy(self.model(x).reshape(-1, self.vocab), y.reshape(-1))

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        loss = self.loss(x, y)
        loss.backward()
        clip_grad_norm_(self.model.parameters(), CLIP)
        self.opt.step()
        self.opt.zero_grad()
        self.sched.step()
        return loss.item()

    def evaluate(self, batches: list) -> float:
        self.model.eval()
        with md.no_grad():
            losses = [self.loss(x, y).item() for x, y in batches]
        self.model.train()
        return float(np.mean(losses))


class TorchRun:
    """The same in PyTorch: TorchGPT with minidist's initial weights, torch's AdamW and schedulers."""

    def __init__(self, config: GPTConfig, steps: int, weights: dict) -> None:
        self.model = TorchGPT(
            config.vocab_size, config.block_size, config.n_layer, config.n_head, config.n_embd
        )
        load_minidist(self.model, weights)
        params = list(self.model.parameters())
        groups = [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": WEIGHT_DECAY},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
        ]
        # foreach=False: one update per parameter, as minidist's AdamW (torch's default on CPU too).
        self.opt = torch.optim.AdamW(groups, lr=LR, betas=BETAS, foreach=False)
        warmup, total = schedule_steps(steps)
        self.sched = torch.optim.lr_scheduler.SequentialLR(
            self.opt,
            [
                torch.optim.lr_scheduler.LinearLR(self.opt, start_factor=1e-3, total_iters=warmup),
                torch.optim.lr_scheduler.CosineAnnealingLR(self.opt, T_max=total - warmup, eta_min=MIN_LR),
            ],
            milestones=[warmup],
        )

    def loss(self, x: np.ndarray, y: np.ndarray) -> torch.Tensor:
        logits = self.model(torch.from_numpy(x))
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), torch.from_numpy(y).reshape(-1)
        )

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        loss = self.loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP)
        self.opt.step()
        self.opt.zero_grad()
        self.sched.step()
        return loss.item()

    def evaluate(self, batches: list) -> float:
        self.model.eval()
        with torch.no_grad():
            losses = [self.loss(x, y).item() for x, y in batches]
        self.model.train()
        return float(np.mean(losses))


def run(args: argparse.Namespace) -> dict:
    """Train both side by side; return the per-round tokens/s, the losses and the MFU figures."""
    torch.set_num_threads(1)
    text = load_shakespeare()
    tokenizer = CharTokenizer(text)
    train_ids, val_ids = train_val_split(tokenizer.encode(text))
    config = GPTConfig(
        vocab_size=tokenizer.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
        n_head=args.n_head, n_embd=args.n_embd, dropout=0.0,
    )  # fmt: skip
    md.manual_seed(args.seed)
    ours = MinidistRun(config, args.steps)
    theirs = TorchRun(config, args.steps, {n: p.numpy() for n, p in ours.model.named_parameters()})
    runs = {"minidist": ours, "torch": theirs}
    windows = {
        name: RandomWindows(train_ids, args.block_size, args.batch_size, seed=args.seed) for name in runs
    }
    losses = {name: [] for name in runs}
    # tokens/s per round, by the wall clock and by this process's CPU time (which other processes'
    # load does not inflate: one thread, so CPU seconds are the seconds the step computed).
    tokens_per_s = {name: [] for name in runs}
    tokens_per_cpu_s = {name: [] for name in runs}
    peaks = []
    for r in range(-(-args.steps // args.block)):
        order = ("minidist", "torch") if r % 2 == 0 else ("torch", "minidist")
        for name in order:
            batches = [windows[name].next() for _ in range(min(args.block, args.steps - r * args.block))]
            tokens = len(batches) * args.batch_size * args.block_size
            start, cpu_start = time.perf_counter(), time.process_time()
            losses[name] += [runs[name].step(x, y) for x, y in batches]
            tokens_per_s[name].append(tokens / (time.perf_counter() - start))
            tokens_per_cpu_s[name].append(tokens / (time.process_time() - cpu_start))
        peaks.append(matmul_rate())
    val = RandomWindows(val_ids, args.block_size, args.batch_size, seed=args.seed)
    val_batches = list(val.eval_batches(args.eval_iters))
    return {
        # round 0 is the warm-up (first allocations, caches): left out unless it is the only one
        "tokens_per_s": {name: np.array(t[1:] or t) for name, t in tokens_per_s.items()},
        "tokens_per_cpu_s": {name: np.array(t[1:] or t) for name, t in tokens_per_cpu_s.items()},
        "losses": losses,
        "val_loss": {name: runs[name].evaluate(val_batches) for name in runs},
        "flops_per_token": ours.model.flops_per_token(),
        "peak": float(np.median([wall for wall, _ in peaks])),
        "cpu_peak": float(np.median([cpu for _, cpu in peaks])),
        "dtype": str(ours.model.wte.weight.dtype),
    }


def report(result: dict, args: argparse.Namespace) -> None:
    tps, peak = result["tokens_per_s"], result["peak"]
    ratios = tps["minidist"] / tps["torch"]
    print(
        f"GPT {args.n_layer} layers x {args.n_head} heads x {args.n_embd} wide, block {args.block_size}, "
        f"batch {args.batch_size}, {result['dtype']}; {args.steps} steps each, blocks of {args.block}, "
        f"{len(ratios)} timed rounds; load average {os.getloadavg()[0]:.2f}"
    )
    print(f"float32 matmul (NumPy, 512^3, 1 thread, median of rounds): {peak / 1e9:.1f} GFLOP/s (wall clock)")
    for name in ("minidist", "torch"):
        median, low, high = float(np.median(tps[name])), tps[name].min(), tps[name].max()
        print(
            f"{name:>8}: {median:8,.0f} tokens/s (median; range {low:,.0f}-{high:,.0f}), "
            f"MFU {result['flops_per_token'] * median / peak:.1%}"
        )
    print(
        f"minidist / torch tokens/s: {np.median(ratios):.2f} (median of rounds; range "
        f"{ratios.min():.2f}-{ratios.max():.2f}; goal >= 0.67)"
    )
    cpu = result["tokens_per_cpu_s"]
    cpu_ratios = cpu["minidist"] / cpu["torch"]
    cpu_mfu = {name: result["flops_per_token"] * np.median(cpu[name]) / result["cpu_peak"] for name in cpu}
    print(
        f"per CPU second: minidist {np.median(cpu['minidist']):,.0f}, torch {np.median(cpu['torch']):,.0f} "
        f"tokens/s, ratio {np.median(cpu_ratios):.2f} (range {cpu_ratios.min():.2f}-{cpu_ratios.max():.2f}); "
        f"MFU {cpu_mfu['minidist']:.1%} and {cpu_mfu['torch']:.1%} of {result['cpu_peak'] / 1e9:.1f} GFLOP/s"
    )
    for name in ("minidist", "torch"):
        print(
            f"{name:>8}: first loss {result['losses'][name][0]:.4f}, val loss {result['val_loss'][name]:.4f}"
        )
    gap = abs(result["val_loss"]["minidist"] - result["val_loss"]["torch"])
    print(f"val loss difference after {args.steps} steps: {gap:.1e} (goal <= 0.05)")


if __name__ == "__main__":
    arguments = parser.parse_args()
    report(run(arguments), arguments)

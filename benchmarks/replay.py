"""Eager minidist, replayed minidist (``minidist.compile.Replay``) and an anchor, side by side, one thread.

    OMP_NUM_THREADS=1 python benchmarks/replay.py                     # GPT (baby config) and the small MLP
    OMP_NUM_THREADS=1 python benchmarks/replay.py --gpt-batch 32      # the README's default GPT batch
    OMP_NUM_THREADS=1 python benchmarks/replay.py --only mlp --rounds 60

Workloads: the GPT of ``benchmarks/gpt.py`` (nanoGPT's CPU baby GPT: 4 layers x 4 heads x width 128,
block 64, batch 12, AdamW with decay on the matrices, gradients clipped to 1, dropout 0) against its
PyTorch eager twin (``benchmarks/torch_gpt.py``, same initial weights, torch's AdamW, ``foreach=False``);
and the small MLP of ``benchmarks/small_mlp.py`` (64-256-256-10, batch 128, SGD) against the
hand-written NumPy step (``benchmarks/numpy_reference.py``).

Every round runs ``--block`` steps of each contender in turn (ten times as many for the MLP), in a
rotated order, so that load from other processes falls on all alike; a step's time is this process's
CPU time (one thread: the seconds it computed). The report gives ratios to the anchor and replay /
eager (medians over rounds, the first round left out, and their range), not absolute times, and MFU
(model FLOPs utilisation, Chowdhery et al. 2022, appendix B: ``GPT.flops_per_token()`` x tokens per CPU
second over the float32 sgemm rate measured here first, a 512^3 NumPy product on one thread). It prints
the machine (CPU model, BLAS and the kernel it picked) and the load average before and after: above 0.5
per core the machine was busy, and the report says its ratios are indicative only (the quiet-machine
guard; ``--require-quiet`` refuses to run instead). All contenders' parameters are compared at the end
(eager and replay: exactly equal).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before NumPy and torch load their BLAS
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.argv, _argv = sys.argv[:1], sys.argv  # gpt.py parses at import only under __main__; keep ours
sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from gpt import CLIP, MinidistRun, TorchRun, matmul_rate  # noqa: E402
from numpy_reference import ReferenceStage, dp_step  # noqa: E402

import minidist as md  # noqa: E402
from minidist import optim  # noqa: E402
from minidist.compile import Replay  # noqa: E402
from minidist.data import CharTokenizer, RandomWindows, load_shakespeare, train_val_split  # noqa: E402
from minidist.models import MLP, GPTConfig  # noqa: E402
from minidist.nn import functional as F  # noqa: E402

sys.argv = _argv
BUSY = 0.5  # load average per core above which the machine counts as busy


def machine() -> str:
    """CPU model, core count and the BLAS NumPy uses (with the kernel OpenBLAS chose for this CPU)."""
    cpu = "unknown CPU"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line)
    except (OSError, StopIteration):
        pass
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    kernel = blas.get("openblas configuration", "").split()
    picked = [w for w in kernel if w.isalpha() and w.istitle() and w not in ("OpenBLAS",)]
    return (
        f"{cpu}, {os.cpu_count()} cores; NumPy {np.__version__} with {blas['name']} {blas.get('version', '')}"
        f" (kernel {picked[-1] if picked else 'unknown'}); torch {torch.__version__}; 1 thread each"
    )


class ReplayedGPT(MinidistRun):
    """``gpt.py``'s minidist run with its step recorded once and replayed (the schedule stays outside)."""

    def __init__(self, config: GPTConfig, steps: int) -> None:
        super().__init__(config, steps)
        self.replay = Replay(self.model, self.opt, self.loss, max_grad_norm=CLIP)

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        loss = self.replay(x, y)
        self.sched.step()
        return loss.item()


def gpt_contenders(args: argparse.Namespace) -> tuple[dict, list, dict, int]:
    """{name: step(x, y)}, the batches, {name: its parameters as arrays}, and the FLOPs per token."""
    torch.set_num_threads(1)
    text = load_shakespeare()
    tokenizer = CharTokenizer(text)
    ids, _ = train_val_split(tokenizer.encode(text))
    config = GPTConfig(
        vocab_size=tokenizer.vocab_size, block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0
    )
    steps = args.rounds * args.block + 10
    runs = {}
    for name, cls in (("eager", MinidistRun), ("replay", ReplayedGPT)):
        md.manual_seed(1337)
        runs[name] = cls(config, steps)
    runs["torch"] = TorchRun(config, steps, {n: p.numpy() for n, p in runs["eager"].model.named_parameters()})
    windows = RandomWindows(ids, 64, args.gpt_batch, seed=1337)
    batches = [windows.next() for _ in range(args.block)]  # one block of batches, reused every round
    params = {
        "eager": lambda: [p.data for p in runs["eager"].model.parameters()],
        "replay": lambda: [p.data for p in runs["replay"].model.parameters()],
        "torch": lambda: [p.detach().numpy() for p in runs["torch"].model.parameters()],
    }
    return {n: r.step for n, r in runs.items()}, batches, params, runs["eager"].model.flops_per_token()


def mlp_contenders(args: argparse.Namespace) -> tuple[dict, list, dict, int]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((128, 64), dtype=np.float32)
    y = rng.integers(0, 10, 128)
    models, steps = {}, {}
    for name in ("eager", "replay"):
        md.manual_seed(0)
        model = models[name] = MLP(64, [256, 256], 10)
        opt = optim.SGD(model.parameters(), lr=0.05)
        if name == "eager":

            def eager(x, y, model=model, opt=opt):
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()

            steps[name] = eager
        else:
            steps[name] = Replay(model, opt, lambda a, b, model=model: F.cross_entropy(model(a), b))
    stage = ReferenceStage([p.data for p in models["eager"].parameters()], head=True)
    steps["numpy"] = lambda x, y: dp_step(stage, x, y, 0.05, None)
    params = {
        "eager": lambda: [p.data for p in models["eager"].parameters()],
        "replay": lambda: [p.data for p in models["replay"].parameters()],
        "numpy": lambda: stage.params,
    }
    return steps, [(x, y)] * args.block, params, 0


def measure(steps: dict, batches: list, params: dict, rounds: int) -> dict:
    """CPU seconds per step of each contender, per round (the contenders in rotated order each round)."""
    names = list(steps)
    times = {n: [] for n in names}
    for r in range(rounds + 1):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.process_time()
            for x, y in batches:
                steps[name](x, y)
            times[name].append((time.process_time() - start) / len(batches))
    # Every contender trained the same model on the same batches: eager and replay to the bit.
    ref, steps_run = params[names[0]](), (rounds + 1) * len(batches)
    for name in names[1:]:
        diff = max(float(np.abs(a - b).max()) for a, b in zip(ref, params[name]()))
        print(f"  after {steps_run} steps, parameters' max |{names[0]} - {name}|: {diff:.2e}")
    return {n: np.array(t[1:]) for n, t in times.items()}


def report(title: str, times: dict, anchor: str, flops: int, tokens: int, peak: float) -> None:
    print(title)
    for name, t in times.items():
        ratio = t / times[anchor]
        line = f"  {name:>7}: {np.median(ratio):.3f}x {anchor} (range {ratio.min():.3f}-{ratio.max():.3f})"
        if flops:
            line += f", MFU {flops * tokens / float(np.median(t)) / peak:.1%}"
        print(line)
    gain = times["replay"] / times["eager"]
    print(f"  replay / eager: {np.median(gain):.3f} (range {gain.min():.3f}-{gain.max():.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["gpt", "mlp"], default=None)
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds (one more warms up)")
    parser.add_argument("--block", type=int, default=2, help="GPT steps of one contender per round")
    parser.add_argument(
        "--gpt-batch", type=int, default=12, help="GPT batch (12: nanoGPT's; 32: the README's)"
    )
    parser.add_argument("--require-quiet", action="store_true", help="refuse to run on a busy machine")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    busy = load > BUSY * (os.cpu_count() or 1)
    print(machine())
    print(f"load average {load:.2f} before" + (" (BUSY: ratios are indicative only)" if busy else ""))
    if busy and args.require_quiet:
        raise SystemExit("the machine is busy; rerun when it is quiet (or without --require-quiet)")
    peak = float(np.median([matmul_rate()[1] for _ in range(5)]))  # by CPU time, as the steps
    print(f"sgemm 512^3, 1 thread: {peak / 1e9:.1f} GFLOP/s per CPU second")
    if args.only in (None, "gpt"):
        steps, batches, params, flops = gpt_contenders(args)
        times = measure(steps, batches, params, args.rounds)
        title = f"GPT 4x4x128, block 64, batch {args.gpt_batch}, AdamW, clip 1.0; {args.rounds} rounds"
        report(title, times, "torch", flops, 64 * args.gpt_batch, peak)
    if args.only in (None, "mlp"):
        args.block *= 10  # the MLP's steps are ~100x shorter: 10x the steps per block, 2x the rounds
        steps, batches, params, _ = mlp_contenders(args)
        times = measure(steps, batches, params, args.rounds * 2)
        report(f"MLP 64-256-256-10, batch 128, SGD; {args.rounds * 2} rounds", times, "numpy", 0, 0, peak)
    after = os.getloadavg()[0]
    print(f"load average {after:.2f} after" + (" (BUSY)" if after > BUSY * (os.cpu_count() or 1) else ""))


if __name__ == "__main__":
    main()

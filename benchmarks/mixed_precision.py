"""Mixed precision: examples/train_gpt.py in float32, bfloat16 and float16, side by side.

Trains the same small GPT from the same seed and data in each dtype (one process each), plots the three
training-loss curves (benchmarks/mixed_precision.png) and prints a Markdown table: final train and
validation loss, skipped steps (float16's loss scaler), ms per step of the run (from the example's
tokens/s lines, without evaluation; noisy on a loaded machine), a paired in-process timing of one
forward + backward in the three dtypes taken in turn (machine load hits all three alike), and the bytes
of the arrays one forward keeps for backward (measured by walking the autograd graph: every array an
op saved, each counted once, parameters excluded).

    python benchmarks/mixed_precision.py [--steps 300]          # ~3-6 minutes on a 2-core laptop
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "train_gpt.py"
DTYPES = ("float32", "bfloat16", "float16")
MODEL = {"n-layer": 2, "n-head": 4, "n-embd": 64, "block-size": 32, "batch-size": 16}


def train(dtype: str, steps: int, folder: Path) -> dict:
    """One run of the example; its saved losses and the ms/step of its log lines."""
    out = folder / f"{dtype}.npz"
    flags = [f"--{k}={v}" for k, v in MODEL.items()]
    command = [sys.executable, str(EXAMPLE), *flags, "--dtype", dtype, "--max-iters", str(steps),
               "--eval-interval", str(steps), "--eval-iters", "20", "--log-interval", "25",
               "--warmup-iters", "30", "--sample-tokens", "0", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    rates = [float(r.replace(",", "")) for r in re.findall(r"([\d,]+) tokens/s", result.stdout)]
    tokens = MODEL["batch-size"] * MODEL["block-size"]
    with np.load(out) as saved:
        run = {k: saved[k] for k in ("losses", "val_loss", "train_loss", "skipped_steps")}
    run["ms_per_step"] = 1000 * tokens / np.median(rates[1:])  # the first interval includes warm-up
    return run


def activation_bytes(dtype: str) -> int:
    """Bytes of the arrays the graph of one training forward keeps for backward."""
    sys.path.insert(0, str(REPO))
    import minidist as md  # noqa: PLC0415
    from minidist.models import GPT, GPTConfig  # noqa: PLC0415
    from minidist.nn import functional as F  # noqa: PLC0415

    md.manual_seed(0)
    c = MODEL
    gpt = GPT(
        GPTConfig(block_size=c["block-size"], n_layer=c["n-layer"], n_head=c["n-head"], n_embd=c["n-embd"])
    )
    rng = np.random.default_rng(0)
    x = rng.integers(0, 65, (c["batch-size"], c["block-size"]))
    with md.autocast(dtype=dtype if dtype != "float32" else "bfloat16", enabled=dtype != "float32"):
        loss = F.cross_entropy(gpt(x).reshape(-1, 65), x.reshape(-1))
    params = {id(p.data) for p in gpt.parameters()}
    seen, total, stack, visited = set(), 0, [loss], set()
    while stack:
        node = stack.pop()
        fn = node._ctx
        if fn is None or id(fn) in visited:
            continue
        visited.add(id(fn))
        for value in vars(fn).values():
            if isinstance(value, np.ndarray) and id(value) not in params and id(value) not in seen:
                seen.add(id(value))
                total += value.nbytes
        stack.extend(fn.inputs)
    return total


def paired_ms(rounds: int) -> dict[str, float]:
    """Median ms of a forward + backward of the benchmark's GPT in each dtype, the dtypes taken in turn."""
    import time  # noqa: PLC0415

    import minidist as md  # noqa: PLC0415
    from minidist.models import GPT, GPTConfig  # noqa: PLC0415
    from minidist.nn import functional as F  # noqa: PLC0415

    c = MODEL
    md.manual_seed(0)
    gpt = GPT(
        GPTConfig(block_size=c["block-size"], n_layer=c["n-layer"], n_head=c["n-head"], n_embd=c["n-embd"])
    )
    x = np.random.default_rng(0).integers(0, 65, (c["batch-size"], c["block-size"]))
    times: dict[str, list[float]] = {d: [] for d in DTYPES}
    for i in range(rounds + 2):
        for d in DTYPES:
            start = time.perf_counter()
            with md.autocast(dtype=d if d != "float32" else "bfloat16", enabled=d != "float32"):
                loss = F.cross_entropy(gpt(x).reshape(-1, 65), x.reshape(-1))
            # float16 with the loss scale its training uses (2^16): unscaled, its small gradients are float16
            # subnormals, which NumPy converts ~5x slower; the scale keeps them normal, as it is there for
            (loss * 2.0**16 if d == "float16" else loss).backward()
            if i >= 2:  # two warm-up rounds
                times[d].append(time.perf_counter() - start)
            for p in gpt.parameters():
                p.grad = None
    return {d: 1000 * float(np.median(t)) for d, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=40, help="paired forward + backward timings per dtype")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {d: train(d, args.steps, Path(tmp)) for d in DTYPES}
    for d in DTYPES:
        runs[d]["activation_bytes"] = activation_bytes(d)
    paired = paired_ms(args.rounds)

    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=True)
    for ax, d in zip(axes, DTYPES):
        losses = runs[d]["losses"]
        ax.plot(np.arange(1, len(losses) + 1), losses, lw=0.8, color="0.7", label="per step")
        smooth = np.convolve(losses, np.ones(10) / 10, mode="valid")
        ax.plot(np.arange(10, len(losses) + 1), smooth, lw=1.6, label="mean of 10")
        ax.plot(np.arange(1, len(losses) + 1), runs["float32"]["losses"], lw=0.6, color="k", alpha=0.35,
                label="float32" if d != "float32" else None)  # fmt: skip
        ax.set_title(f"{d}: val {float(runs[d]['val_loss']):.4f}, skipped {int(runs[d]['skipped_steps'])}")
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("training loss")
    fig.suptitle("examples/train_gpt.py, one process, seed 1337: float32 master weights in all three")
    fig.tight_layout()
    fig.savefig(REPO / "benchmarks" / "mixed_precision.png", dpi=110)

    print("| dtype | final train loss | final val loss | skipped steps | ms/step (run) | fwd+bwd ms (paired) "
          "| vs float32 | activation bytes |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for d in DTYPES:
        r = runs[d]
        losses = f"{float(r['train_loss']):.4f} | {float(r['val_loss']):.4f}"
        skipped, ms, nbytes = int(r["skipped_steps"]), r["ms_per_step"], r["activation_bytes"]
        pair = f"{paired[d]:.1f} | {paired[d] / paired['float32']:.2f}x"
        print(f"| {d} | {losses} | {skipped} | {ms:.1f} | {pair} | {nbytes:,} |")
    print(f"load: {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()

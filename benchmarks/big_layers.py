"""Big layers: how close a minidist training step comes to the time of its matmuls alone (issue 16).

    python benchmarks/big_layers.py                       # 4 x Linear(2048, 2048) + ReLU, batch 256
    python benchmarks/big_layers.py --width 1024 --layers 2 --rounds 5

On one rank with one BLAS thread, it times (a) one training step through minidist's public API --
forward, softmax cross-entropy, backward, ``SGD.step``, ``zero_grad`` -- and (b) the same step's
matrix products done with bare NumPy on arrays of the same shapes and layouts: per layer the forward
``X @ W.T``, the input gradient ``dY @ W`` and the weight gradient ``dY.T @ X``, 3 GEMMs of
``2 B W^2`` flops each (``B`` the batch, ``W`` the width). The two take turns (``--steps`` of each per
round, ``--rounds`` rounds) and the medians over rounds are compared, so both see the same load.

It prints the fraction ``matmul time / step time`` (1.0 would mean the step costs nothing but its
matmuls; the issue's goal is >= 0.90) and both rates in GFLOP/s: the step's (the 3 GEMMs per layer's
flops over the step time) against the bare GEMMs' (the machine's measured matmul rate). A step that
skips the first layer's input gradient (nobody needs the gradient of the data) does 1 GEMM in
``3 x layers`` less than (b), so its fraction can exceed 1.0 by up to that share.

Only the public API is used (``md.tensor``, ``nn``, ``optim``), so the script runs unchanged on any
version of the autograd core.
"""

from __future__ import annotations

import argparse
import os
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one BLAS thread: the single-core matmul rate is the yardstick

import numpy as np  # noqa: E402

import minidist as md  # noqa: E402
from minidist import nn, optim  # noqa: E402


def minidist_step(args: argparse.Namespace):
    """A closure running one training step of the MLP through minidist's public API."""
    md.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*layers)  # float32 parameters (nn's default), as the bare GEMMs below
    opt = optim.SGD(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    x = md.tensor(rng.standard_normal((args.batch, args.width), dtype=np.float32))
    targets = md.tensor(rng.integers(0, args.width, size=args.batch))

    def step() -> None:
        loss = nn.functional.cross_entropy(model(x), targets)
        loss.backward()
        opt.step()
        opt.zero_grad()

    return step


def bare_matmuls(args: argparse.Namespace):
    """A closure running the step's 3 GEMMs per layer with bare NumPy, in minidist's layouts."""
    rng = np.random.default_rng(1)
    b, w = args.batch, args.width
    weights = [rng.standard_normal((w, w), dtype=np.float32) * 0.02 for _ in range(args.layers)]
    x = rng.standard_normal((b, w), dtype=np.float32)
    dy = rng.standard_normal((b, w), dtype=np.float32)
    out = np.empty((b, w), dtype=np.float32)
    grad_w = np.empty((w, w), dtype=np.float32)

    def matmuls() -> None:
        for weight in weights:
            np.matmul(x, weight.T, out=out)  # forward: X @ W^T, W stored (out, in) as torch's
            np.matmul(dy, weight, out=out)  # input gradient: dY @ W
            np.matmul(dy.T, x, out=grad_w)  # weight gradient: dY^T @ X

    return matmuls


def timed(fn, steps: int) -> float:
    """Seconds per call of ``fn``, over ``steps`` calls back to back."""
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - start) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=2048, help="in = out features of every Linear")
    p.add_argument("--layers", type=int, default=4, help="Linear + ReLU pairs")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=3, help="steps (and bare GEMM sets) per round")
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()

    contenders = {"minidist step": minidist_step(args), "bare matmuls": bare_matmuls(args)}
    for fn in contenders.values():  # warm up: first-touch of buffers, BLAS's own setup
        fn()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, fn in contenders.items():
            times[name].append(timed(fn, args.steps))
    step, gemm = (float(np.median(times[name])) for name in contenders)

    flops = 3 * args.layers * 2 * args.batch * args.width**2
    print(f"# {args.layers} x Linear({args.width}, {args.width}) + ReLU, batch {args.batch}, float32, SGD; "
          f"1 rank, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}; "
          f"median of {args.rounds} rounds of {args.steps} steps")  # fmt: skip
    for name in contenders:
        t = np.array(times[name])
        print(f"{name:14s} {np.median(t) * 1e3:9.1f} ms  (min {t.min() * 1e3:.1f}, max {t.max() * 1e3:.1f})")
    print(f"matmul time / step time: {gemm / step:.3f}")
    print(f"GFLOP/s: step {flops / step / 1e9:.1f}, bare GEMMs {flops / gemm / 1e9:.1f} "
          f"({3 * args.layers} GEMMs, {flops / 1e9:.2f} GFLOP per step)")  # fmt: skip


if __name__ == "__main__":
    main()

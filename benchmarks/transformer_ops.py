"""The transformer's ops, forward + backward, against PyTorch on the GPT shapes.

    OMP_NUM_THREADS=1 python benchmarks/transformer_ops.py [--rounds 30] [--dtype float32]

Shapes: nanoGPT's CPU "baby GPT" (batch 12, block 64, 4 heads, width 128, vocabulary 65), so
768 tokens per step. Each case times one forward and one backward (a fixed upstream gradient) in
minidist and in torch, interleaved round by round (so that load from other processes hits both
alike), and prints the medians and their ratio. One thread each (torch.set_num_threads(1)).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import minidist as md  # noqa: E402
from minidist.nn import functional as F  # noqa: E402

B, T, H, C, V = 12, 64, 4, 128, 65


def cases(dtype: np.dtype) -> dict:
    """name -> (minidist step, torch step): each runs forward + backward once."""
    rng = np.random.default_rng(0)
    tdtype = getattr(torch, np.dtype(dtype).name)

    def pair(shape, scale=1.0):
        a = (rng.standard_normal(shape) * scale).astype(dtype)
        return md.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)

    def step(fn, grad):
        def run():
            fn().backward(grad)

        return run

    out = {}
    idx = rng.integers(0, V, (B, T))
    w, tw = pair((V, C))
    g = rng.standard_normal((B, T, C)).astype(dtype)
    out["embedding (65 x 128)"] = (
        step(lambda: F.embedding(idx, w), g),
        step(lambda: torch.nn.functional.embedding(torch.tensor(idx), tw), torch.tensor(g)),
    )
    big_idx = rng.integers(0, 50257, (B, T))
    bw, tbw = pair((50257, C))
    out["embedding (50257 x 128)"] = (
        step(lambda: F.embedding(big_idx, bw), g),
        step(lambda: torch.nn.functional.embedding(torch.tensor(big_idx), tbw), torch.tensor(g)),
    )
    x, tx = pair((B, T, C))
    gamma, tgamma = pair((C,))
    beta, tbeta = pair((C,))
    out["layer_norm (12, 64, 128)"] = (
        step(lambda: F.layer_norm(x, (C,), gamma, beta), g),
        step(lambda: torch.nn.functional.layer_norm(tx, (C,), tgamma, tbeta), torch.tensor(g)),
    )
    q, tq = pair((B, H, T, C // H))
    k, tk = pair((B, H, T, C // H))
    v, tv = pair((B, H, T, C // H))
    ga = rng.standard_normal((B, H, T, C // H)).astype(dtype)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for p in (0.0, 0.2):
        out[f"attention causal p={p} (12, 4, 64, 32)"] = (
            step(lambda p=p: F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True), ga),
            step(lambda p=p: sdpa(tq, tk, tv, dropout_p=p, is_causal=True), torch.tensor(ga)),
        )
    h, th = pair((B * T, 4 * C))
    gh = rng.standard_normal((B * T, 4 * C)).astype(dtype)
    out["gelu exact (768, 512)"] = (
        step(lambda: F.gelu(h), gh),
        step(lambda: torch.nn.functional.gelu(th), torch.tensor(gh)),
    )
    from scipy.special import erf  # noqa: PLC0415  (what exact GELU calls on the CPU)

    out["  of which scipy erf alone (forward)"] = (lambda: erf(h.data), lambda: torch.erf(th.detach()))
    out["gelu tanh (768, 512)"] = (
        step(lambda: F.gelu(h, approximate="tanh"), gh),
        step(lambda: torch.nn.functional.gelu(th, approximate="tanh"), torch.tensor(gh)),
    )
    wq, twq = pair((3 * C, C), scale=C**-0.5)
    out["linear (768, 128) -> 384 (reference)"] = (
        step(lambda: F.linear(x, wq), np.ones((B, T, 3 * C), dtype)),
        step(lambda: torch.nn.functional.linear(tx, twq), torch.ones((B, T, 3 * C), dtype=tdtype)),
    )
    qkv, tqkv = pair((B, T, 3 * C))
    g3 = rng.standard_normal((B, T, C)).astype(dtype)
    out["q, k, v by slicing x[..., a:b]"] = (
        step(lambda: sum(qkv[..., i * C : (i + 1) * C] for i in range(3)), g3),
        step(lambda: sum(tqkv[..., i * C : (i + 1) * C] for i in range(3)), torch.tensor(g3)),
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    print(f"load average {load:.2f}, {args.rounds} rounds, {args.dtype}, one thread; times in microseconds")
    print(f"{'op (forward + backward)':40s} {'minidist':>9s} {'torch':>9s} {'ratio':>6s}")
    for name, (ours, theirs) in cases(np.dtype(args.dtype)).items():
        times = {ours: [], theirs: []}
        for _ in range(3):  # warm-up: first calls allocate, import and fill caches
            ours(), theirs()
        for _ in range(args.rounds):
            for run in (ours, theirs):  # interleaved: both see the same load
                start = time.perf_counter()
                run()
                times[run].append(time.perf_counter() - start)
        mine, reference = (np.median(times[f]) * 1e6 for f in (ours, theirs))
        print(f"{name:40s} {mine:9.0f} {reference:9.0f} {mine / reference:6.2f}")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

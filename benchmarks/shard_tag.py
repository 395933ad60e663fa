"""Cost of passing the tensor-parallel shard tag on in ``Function.apply`` (issue 14, item 3).

    python benchmarks/shard_tag.py

Every op's result inherits ``sharded_over`` from its first tagged input (a loop over the 1-3 inputs),
so that dropout can tell a shard from a replicated tensor. This times, in one process and one run,
``Function.apply`` as it is against the same method without those lines, on (a) a tiny op, where the
Python overhead is everything, and (b) a forward + backward of a small MLP. Prints median times and
their ratio (tagged / untagged).
"""

from __future__ import annotations

import statistics
import time
import weakref

import numpy as np

import minidist as md
from minidist import autograd, backend, nn
from minidist.autograd import Function, Tensor, grad_mode


def untagged_apply(cls, *inputs, **options):
    """``Function.apply`` (minidist/autograd/function.py) without the shard tag, line for line."""
    tensors = inputs
    for x in inputs:
        if not isinstance(x, Tensor):
            like = next((t for t in inputs if isinstance(t, Tensor)), None)
            tensors = tuple([autograd._lift(t, like) for t in inputs])
            break
    fn = cls()
    result = fn.forward(*[t._data for t in tensors], **options)
    if isinstance(result, np.generic):
        result = autograd._asarray_like(result, tensors)
    out = Tensor(result)
    records = False
    for t in tensors:
        if t.requires_grad:
            records = True
    if cls.is_view and backend.array_module(result).may_share_memory(result, tensors[0]._data):
        out._version_counter = tensors[0]._version_counter
    if records and grad_mode._grad_enabled:
        out.requires_grad = True
        out._ctx = fn
        fn.inputs = tensors
        if cls.saved_inputs != ():
            fn._versions = [t._version_counter[0] for t in tensors]
        if cls.saves_output:
            fn._output, fn._output_version = weakref.ref(out), out._version_counter[0]
    return out


def time_us(work, inner: int) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        work()
    return (time.perf_counter() - start) / inner * 1e6


def compare(work, inner: int, repeats: int = 41) -> dict[str, float]:
    """Median us per call of ``work`` with each ``Function.apply``, the two variants interleaved round
    by round, so that load from other processes hits both alike."""
    variants = {"untagged": classmethod(untagged_apply), "tagged": classmethod(Function.apply.__func__)}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, apply in variants.items():
            Function.apply = apply
            times[name].append(time_us(work, inner))
    Function.apply = variants["tagged"]
    return {name: statistics.median(t[2:]) for name, t in times.items()}  # the first rounds warm up


def main() -> None:
    md.manual_seed(0)
    a, b = md.tensor(np.ones(4), requires_grad=True), md.tensor(np.ones(4))
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Dropout(0.1), nn.Linear(256, 10))
    x, y = md.tensor(np.ones((32, 64)), dtype=np.float32), np.arange(32) % 10  # the layers are float32

    def step():
        nn.functional.cross_entropy(model(x), y).backward()

    for name, work, inner in (("tiny op (a + b)", lambda: a + b, 500), ("MLP fwd+bwd, batch 32", step, 10)):
        t = compare(work, inner)
        ratio = t["tagged"] / t["untagged"]
        print(f"{name:24s} untagged {t['untagged']:8.2f} us  tagged {t['tagged']:8.2f} us  ratio {ratio:.3f}")


if __name__ == "__main__":
    main()

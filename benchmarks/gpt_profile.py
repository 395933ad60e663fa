"""Where a training step of minidist's GPT goes: per op, per phase, and by cProfile (issue 17, item 6).

    OMP_NUM_THREADS=1 python benchmarks/gpt_profile.py [--steps 20] [--cprofile 25]

The step is benchmarks/gpt.py's (nanoGPT's CPU config, AdamW, clipping, the bundled Shakespeare).
It prints:

All times are this process's CPU time (``time.process_time``; one thread): on a shared machine the
wall clock also counts the time other processes hold the core.

* the phases of a step (forward, loss, backward, clip_grad_norm_, AdamW, zero_grad), timed apart;
* per op (``Function`` subclass): calls per step, the time in its ``forward`` and ``backward``, and
  the whole op's share of the step. Each is timed by wrapping the methods of every Function subclass
  for the length of the measurement: the wrapper adds a little to each call (it is reported as a
  measured per-call cost), so the table says where the time goes, the phases how long a step takes;
* graph nodes per step (ops that recorded themselves for backward) and the Python overhead per op:
  the step's time outside every op's forward and backward (module calls, Function.apply, the graph
  walk, the optimizer's loop), divided by the number of ops;
* with ``--cprofile N``, the N functions of most own time in cProfile over the same steps.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import functools
import os
import pstats
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from gpt import CLIP, MinidistRun  # noqa: E402

import minidist as md  # noqa: E402
from minidist.autograd import Function  # noqa: E402
from minidist.data import CharTokenizer, RandomWindows, load_shakespeare, train_val_split  # noqa: E402
from minidist.models import GPTConfig  # noqa: E402
from minidist.nn.utils import clip_grad_norm_  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--steps", type=int, default=20, help="measured steps (after 3 warm-up steps)")
parser.add_argument("--cprofile", type=int, default=0, help="print cProfile's top N functions by own time")
parser.add_argument("--seed", type=int, default=1337)


def all_functions() -> list[type]:
    """Every Function subclass defined so far (the ops of minidist.ops and of the parallel layers)."""
    found, todo = [], [Function]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            found.append(sub)
            todo.append(sub)
    return found


class OpTimer:
    """Accumulates seconds and calls per (op, "forward" | "backward") while installed."""

    def __init__(self) -> None:
        self.seconds: dict = collections.defaultdict(float)
        self.calls: dict = collections.defaultdict(int)
        self.dtypes: dict = collections.defaultdict(set)  # the float dtypes each op returned
        self.saved: list = []

    def _wrap(self, cls: type, method: str):
        inner = cls.__dict__[method]
        key = (cls.__name__, method)
        seconds, calls, dtypes, clock = self.seconds, self.calls, self.dtypes, time.process_time

        @functools.wraps(inner)
        def timed(*args, **kwargs):
            start = clock()
            result = inner(*args, **kwargs)
            seconds[key] += clock() - start
            calls[key] += 1
            for a in result if isinstance(result, tuple) else (result,):
                if getattr(a, "dtype", None) is not None and a.dtype.kind == "f":
                    dtypes[key].add(a.dtype.name)
            return result

        return timed

    def __enter__(self) -> OpTimer:
        for cls in all_functions():
            for method in ("forward", "backward"):
                if method in cls.__dict__:
                    self.saved.append((cls, method, cls.__dict__[method]))
                    setattr(cls, method, self._wrap(cls, method))
        return self

    def __exit__(self, *exc) -> None:
        for cls, method, inner in self.saved:
            setattr(cls, method, inner)
        self.saved.clear()


def wrapper_cost(repeats: int = 20000) -> float:
    """Seconds one OpTimer wrapper adds to a call (a wrapped no-op minus the bare no-op)."""

    class Nop(Function):
        def forward(self, x):
            return x

    nop, timer = Nop(), OpTimer()
    timed = timer._wrap(Nop, "forward")
    results = []
    for fn in (Nop.forward, timed):
        start = time.process_time()
        for _ in range(repeats):
            fn(nop, 0)
        results.append((time.process_time() - start) / repeats)
    return results[1] - results[0]


def count_nodes(loss: md.Tensor) -> int:
    """Ops recorded in the graph below ``loss`` (each once)."""
    seen, todo = set(), [loss]
    while todo:
        t = todo.pop()
        fn = t._ctx
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        todo.extend(fn.inputs)
    return len(seen)


def phased_step(run: MinidistRun, x: np.ndarray, y: np.ndarray, phases: dict) -> int:
    """One training step with each phase timed into ``phases``; returns the graph's node count."""
    clock = time.process_time
    t0 = clock()
    logits = run.model(x)
    t1 = clock()
    loss = md.nn.functional.cross_entropy(logits.reshape(-1, run.vocab), y.reshape(-1))
    nodes = count_nodes(loss)
    t2 = clock()
    loss.backward()
    t3 = clock()
    clip_grad_norm_(run.model.parameters(), CLIP)
    t4 = clock()
    run.opt.step()
    t5 = clock()
    run.opt.zero_grad()
    run.sched.step()
    t6 = clock()
    for name, seconds in zip(
        ("forward", "loss", "backward", "clip_grad_norm_", "AdamW.step", "zero_grad + schedule"),
        (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5),
    ):
        phases[name] += seconds
    return nodes


def main() -> None:
    args = parser.parse_args()
    text = load_shakespeare()
    tokenizer = CharTokenizer(text)
    train_ids, _ = train_val_split(tokenizer.encode(text))
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=64, n_layer=4, n_head=4, n_embd=128)
    md.manual_seed(args.seed)
    run = MinidistRun(config, args.steps + 100)
    windows = RandomWindows(train_ids, 64, 12, seed=args.seed)
    for _ in range(3):  # warm-up: first allocations, the causal mask's cache
        run.step(*windows.next())
    batches = [windows.next() for _ in range(args.steps)]

    phases: dict = collections.defaultdict(float)
    start = time.process_time()
    nodes = [phased_step(run, x, y, phases) for x, y in batches]
    total = time.process_time() - start
    per_step = total / args.steps
    print(f"{per_step * 1e3:.1f} ms per step ({768 / per_step:,.0f} tokens/s); load {os.getloadavg()[0]:.2f}")
    for name, seconds in phases.items():
        print(f"  {name:<22} {seconds / args.steps * 1e3:7.2f} ms  {seconds / total:6.1%}")

    timed_phases: dict = collections.defaultdict(float)
    with OpTimer() as timer:
        start = time.process_time()
        for x, y in batches:
            phased_step(run, x, y, timed_phases)
        timed_total = time.process_time() - start
    cost = wrapper_cost()
    calls = sum(timer.calls.values())
    in_ops = sum(timer.seconds.values()) - calls * cost
    ops = sorted(
        {name for name, _ in timer.seconds},
        key=lambda n: -sum(timer.seconds[n, m] for m in ("forward", "backward")),
    )
    step_ms = timed_total / args.steps * 1e3
    print(
        f"\nper op (wrapper cost {cost * 1e6:.2f} us per call, subtracted; {step_ms:.1f} ms per timed step)"
    )
    print(f"  {'op':<26} {'calls':>6} {'forward ms':>11} {'backward ms':>12} {'share':>7}")
    for name in ops:
        fwd, bwd = (timer.seconds[name, m] / args.steps * 1e3 for m in ("forward", "backward"))
        n = (timer.calls[name, "forward"] + timer.calls[name, "backward"]) / args.steps
        print(f"  {name:<26} {timer.calls[name, 'forward'] / args.steps:6.0f} {fwd:11.2f} {bwd:12.2f} "
              f"{(fwd + bwd - n * cost * 1e3) / (timed_total / args.steps * 1e3):7.1%}")  # fmt: skip
    # Python overhead: the forward, loss and backward phases' time outside every op's forward and
    # backward (module calls, Function.apply, the graph walk and its gradient sums), per op call. The
    # wrappers' own cost is inside the ops' times, so it does not inflate this.
    graph = sum(timed_phases[k] for k in ("forward", "loss", "backward"))
    outside = graph - sum(timer.seconds.values())
    print(
        f"graph nodes per step: {np.mean(nodes):.0f}; forward+backward calls: {calls / args.steps:.0f}; "
        f"forward/loss/backward time outside the ops: {outside / args.steps * 1e3:.2f} ms per step "
        f"({outside / timed_total:.1%}), {outside / calls * 1e6:.1f} us per op call"
    )
    print(f"  (time inside the ops: {in_ops / args.steps * 1e3:.2f} ms per step)")
    promoted = sorted(f"{n}.{m}" for (n, m), kinds in timer.dtypes.items() if kinds != {"float32"})
    print(f"ops returning other than float32 in this float32 model: {', '.join(promoted) or 'none'}")

    if args.cprofile:
        profiler = cProfile.Profile(time.process_time)
        profiler.enable()
        for x, y in batches:
            run.step(x, y)
        profiler.disable()
        print()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.cprofile)


if __name__ == "__main__":
    main()

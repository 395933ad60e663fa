"""Where a training step of minidist's GPT goes: per op, per phase, and by cProfile (issue 17, item 6).

    OMP_NUM_THREADS=1 python benchmarks/gpt_profile.py [--steps 20] [--cprofile 25]

The step is benchmarks/gpt.py's (nanoGPT's CPU config, AdamW, clipping, the bundled Shakespeare).
It prints:

All times are this process's CPU time (``time.process_time``; one thread): on a shared machine the
wall clock also counts the time other processes hold the core.

* the phases of a step (forward, loss, backward, clip_grad_norm_, AdamW, zero_grad), timed apart;
* per op (``Function`` subclass): calls per step, the time in its ``forward`` and ``backward``, and
  the whole op's share of the step. Each is timed by wrapping the methods of every Function subclass
  for a second pass over the same batches (the wrappers slow that pass down, so the shares are of the
  untimed step);
* graph nodes per step (ops that recorded themselves for backward), the time of forward, loss and
  backward outside every op (module calls, Function.apply, the graph walk and its gradient sums), and
  the fixed cost per op call, measured on the same GPT shrunk until its arrays cost nothing;
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


def fixed_cost_per_call(train_ids: np.ndarray, steps: int = 50) -> float:
    """CPU seconds per op call (forward or backward) of a forward + backward of the same GPT shrunk to
    width 8 on 4 tokens: the arrays are tiny, so this is what every op costs whatever its size (Python,
    Function.apply, the graph walk, NumPy's per-call overhead)."""
    config = GPTConfig(vocab_size=65, block_size=4, n_layer=4, n_head=4, n_embd=8)
    run = MinidistRun(config, 100)
    x, y = RandomWindows(train_ids, 4, 1, seed=0).next()
    for _ in range(3):
        run.loss(x, y).backward()
    start = time.process_time()
    for _ in range(steps):
        loss = run.loss(x, y)
        nodes = count_nodes(loss)
        loss.backward()
    return (time.process_time() - start) / steps / (2 * nodes)


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

    with OpTimer() as timer:
        for x, y in batches:
            run.step(x, y)
    calls = sum(timer.calls.values())
    in_ops = sum(timer.seconds.values())
    ops = sorted(
        {name for name, _ in timer.seconds},
        key=lambda n: -sum(timer.seconds[n, m] for m in ("forward", "backward")),
    )
    print("\nper op (share: of the untimed step above; each time includes one clock read, ~1-2 us)")
    print(f"  {'op':<26} {'calls':>6} {'forward ms':>11} {'backward ms':>12} {'share':>7}")
    for name in ops:
        fwd, bwd = (timer.seconds[name, m] / args.steps * 1e3 for m in ("forward", "backward"))
        print(f"  {name:<26} {timer.calls[name, 'forward'] / args.steps:6.0f} {fwd:11.2f} {bwd:12.2f} "
              f"{(fwd + bwd) / (per_step * 1e3):7.1%}")  # fmt: skip
    # Outside the ops: the forward, loss and backward phases of the untimed steps less the ops' own
    # time (module calls, Function.apply, the graph walk and its gradient sums, reshapes of arrays).
    graph = sum(phases[k] for k in ("forward", "loss", "backward"))
    outside = graph - in_ops
    print(
        f"graph nodes per step: {np.mean(nodes):.0f}; forward+backward calls: {calls / args.steps:.0f}; "
        f"forward/loss/backward time outside the ops: {outside / args.steps * 1e3:.2f} ms per step "
        f"({outside / total:.1%})"
    )
    fixed = fixed_cost_per_call(train_ids)
    print(
        f"fixed cost per op call (the same GPT 8 wide on 4 tokens, where the arrays cost ~nothing): "
        f"{fixed * 1e6:.1f} us, {fixed * calls / args.steps * 1e3:.2f} ms per step of this size"
    )
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

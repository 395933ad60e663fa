"""What minidist's per-op features cost in a training step: an ablation, one more off per row (issue 16).

    python benchmarks/feature_cost.py                 # 64 rows: one rank's share of DP 2
    python benchmarks/feature_cost.py --rows 128      # the whole batch: 1 rank

``peer.py`` found minidist's step above the hand-written NumPy reference and the minimal autograd engine
(``minimal_autograd.py``: a node per op and a tape, nothing else), and ``ddp_breakdown.py`` that at DP 2
about 40-45 % of the gap is the local step (the rest: packing the gradients, the all-reduce's checks and
DDP's bookkeeping). This splits the local step's gap by *what minidist does that the minimal engine does
not*. One process, the small MLP (64-256-256-10, float32, SGD, lr 0.05) on
``--rows`` rows; the contenders, each switching off one more feature than the one above it:

1. ``minidist``: the public API, as ``peer.py`` times it (``MLP`` modules, ``F.cross_entropy``,
   ``loss.backward()``, ``optim.SGD``);
2. ``- modules``: the same ops called as functions (``linear_relu`` for each Linear + ReLU pair, as
   ``nn.Sequential`` runs them, ``F.linear`` for the last layer), no ``Module.__call__``;
3. ``- argument checks``: the ops' own ``apply`` without the wrappers' checks: no shape and dtype check
   in ``linear``, no validation of the targets in ``cross_entropy`` (two reductions), no autocast test;
4. ``- backward checks``: the walk calls ``fn.backward(g)`` directly: no saved-version check (the
   in-place-change error), no check of the returned gradients' number, shapes and dtypes;
5. ``- apply bookkeeping``: a ``Function.apply`` that only runs ``forward``, wraps the result and
   records the op: no lifting of numbers, autocast, shard tag, view test, version record, memory hook;
6. ``- pass and optimizer``: ``run_backward`` called directly (no backward pass, no end-of-pass
   callbacks, no ``Tensor.backward`` argument checks) and SGD as a bare loop (no ``no_grad``, groups,
   version bump);

then ``minimal autograd`` and the ``numpy reference`` as in ``peer.py``. What is left between 6 and
the minimal engine is the engine itself: a ``Function`` and a ``Tensor`` object per op (plain classes
with a ``__dict__``, not ``__slots__``) and Kahn's walk with its consumer count (``graph.py``; the
minimal engine walks a tape), which the assignments (A1.5) ask students to write.

Features 3 to 6 are switched off by patching minidist's functions inside this process and restored
after each round (``ablated``); nothing changes in the library. First a check: 5 steps of every
contender from the same weights must leave parameters allclose to minidist's (rtol 1e-5, atol 1e-6:
the same arithmetic in the same order, so they agree to a few ulps). Timing: ``--rounds`` rounds,
each ``--steps`` steps of every contender in turn, CPU time (``time.process_time``); printed: the
median per step, and each row's difference from the row above and from the reference (µs per step).
Figures: benchmarks/README.md, "What each feature costs".
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402
from minimal_autograd import minimal_step  # noqa: E402
from numpy_reference import ReferenceStage, compare, dp_step  # noqa: E402

import minidist as md  # noqa: E402
from minidist import optim  # noqa: E402
from minidist.autograd import function, grad_mode, graph  # noqa: E402
from minidist.autograd.tensor import Tensor  # noqa: E402
from minidist.models import MLP  # noqa: E402
from minidist.nn import functional as F  # noqa: E402
from minidist.ops.linear import Linear  # noqa: E402
from minidist.ops.linear_relu import LinearReLU, linear_relu  # noqa: E402
from minidist.ops.softmax import CrossEntropy  # noqa: E402

# The module, not the function ``minidist.ops.linear`` that the package exports under the same name.
linear_op = importlib.import_module("minidist.ops.linear")
LEVELS = ("minidist", "- modules", "- argument checks", "- backward checks", "- apply bookkeeping",
          "- pass and optimizer")  # fmt: skip
LR, CHECK_STEPS = 0.05, 5


def lean_apply(cls: type, *tensors: Tensor, **options) -> Tensor:
    """``Function.apply`` with only what the minimal engine does: run forward, wrap, record (level 5)."""
    fn = cls()
    result = fn.forward(*[t._data for t in tensors], **options)
    out = Tensor(result if isinstance(result, np.ndarray) else np.asarray(result))
    if grad_mode._grad_enabled and any(t.requires_grad for t in tensors):
        out.requires_grad, out._ctx, fn.inputs = True, fn, tensors
    return out


@contextlib.contextmanager
def ablated(level: int) -> Iterator[None]:
    """Switch off, for a ``level`` (an index into LEVELS), linear's argument check (2 and up), the
    backward checks (3 and up) and apply's bookkeeping (4 and up); restore all three on exit."""
    saved = linear_op._check, graph._checked_backward, function.Function.__dict__["apply"]
    try:
        if level >= 2:
            linear_op._check = lambda x, weight, bias: None
        if level >= 3:
            graph._checked_backward = lambda fn, g: fn.backward(g)
        if level >= 4:
            function.Function.apply = classmethod(lean_apply)
        yield
    finally:
        linear_op._check, graph._checked_backward = saved[0], saved[1]
        function.Function.apply = saved[2]


def minidist_contender(level: int, x: np.ndarray, y: np.ndarray) -> tuple[Callable[[], None], list]:
    """(one step of minidist with features off up to ``level``, its parameters as Tensors)."""
    md.manual_seed(0)
    mlp = MLP(64, [256, 256], 10)
    params = list(mlp.parameters())
    w0, b0, w1, b1, w2, b2 = params
    xt = md.tensor(x)
    opt = optim.SGD(params, lr=LR)

    def public_step() -> None:  # level 0: exactly peer.py's minidist step on one rank
        opt.zero_grad()
        F.cross_entropy(mlp(xt), y).backward()
        opt.step()

    def forward() -> Tensor:
        if level == 1:  # the wrappers, with their checks, but no modules (Sequential's fused pairs)
            h = linear_relu(linear_relu(xt, w0, b0), w1, b1)
            return F.cross_entropy(F.linear(h, w2, b2), y)
        h = LinearReLU.apply(LinearReLU.apply(xt, w0, b0), w1, b1)
        return CrossEntropy.apply(Linear.apply(h, w2, b2), targets=y, reduction="mean")

    def step() -> None:
        if level < 5:
            opt.zero_grad()
            forward().backward()
            opt.step()
            return
        for p in params:
            p.grad = None
        loss = forward()
        graph.run_backward(loss, np.ones((), dtype=np.float32))
        for p in params:
            p._data -= LR * p.grad

    return (public_step if level == 0 else step), params


def build(rows: int) -> dict[str, tuple[Callable[[], None], list]]:
    """Every contender's (step, parameters) on ``rows`` rows of the same data, from the same weights."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, 64), dtype=np.float32)
    y = rng.integers(0, 10, rows)
    built = {name: minidist_contender(k, x, y) for k, name in enumerate(LEVELS)}
    init = [p.data.copy() for p in built["minidist"][1]]
    stage, minimal_stage = ReferenceStage(init, head=True), ReferenceStage(init, head=True)
    built["minimal autograd"] = (
        lambda: minimal_step(minimal_stage, x, y, LR, lambda flat: None),
        minimal_stage.params,
    )
    built["numpy reference"] = (lambda: dp_step(stage, x, y, LR, None)), stage.params
    return built


def level_of(name: str) -> int:
    """The ablation level a contender runs at (0, nothing switched off, for the two yardsticks)."""
    return LEVELS.index(name) if name in LEVELS else 0


def check(built: dict[str, tuple[Callable[[], None], list]]) -> float:
    """Run CHECK_STEPS steps of every contender; the largest |difference| of a parameter from minidist's.

    Raises ``SystemExit`` naming the contender if one is not allclose (rtol 1e-5, atol 1e-6)."""
    for name, (step, _) in built.items():
        with ablated(level_of(name)):
            for _ in range(CHECK_STEPS):
                step()
    ours = built["minidist"][1]
    worst = 0.0
    for name, (_, params) in built.items():
        diff, ok = compare(params, ours, rtol=1e-5, atol=1e-6)
        if not ok:
            raise SystemExit(
                f"check failed: {name} differs from minidist by {diff:.2e} after {CHECK_STEPS} steps"
            )
        worst = max(worst, diff)
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64, help="batch rows (64: a DP-2 rank's share)")
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    built = build(args.rows)
    load = os.getloadavg()[0]
    worst = check(built)  # also the warm-up
    times: dict[str, list[float]] = {name: [] for name in built}
    for _ in range(args.rounds):
        for name, (step, _) in built.items():
            with ablated(level_of(name)):
                start = time.process_time()
                for _ in range(args.steps):
                    step()
                times[name].append((time.process_time() - start) / args.steps * 1e6)
    med = {name: float(np.median(t)) for name, t in times.items()}
    ref = med["numpy reference"]
    print(f"small MLP 64-256-256-10, {args.rows} rows, float32, SGD, one process; {args.rounds} rounds x "
          f"{args.steps} steps, CPU time; load {load:.2f}, after {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"check: every contender allclose to minidist after {CHECK_STEPS} steps (max |diff| {worst:.1e})")
    print(f"{'':22s} {'median us':>10s} {'vs row above':>13s} {'vs reference':>13s} {'/ reference':>12s}")
    previous = None
    for name, t in med.items():
        step_text = "" if previous is None else f"{t - previous:+.1f}"
        print(f"{name:22s} {t:10.1f} {step_text:>13s} {t - ref:+13.1f} {t / ref:11.3f}x")
        previous = t


if __name__ == "__main__":
    main()

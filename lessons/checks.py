"""Checks for the lessons' "your turn" exercises.

Every check prints one of two markers and never fails on an untouched placeholder, so a new user can
run a notebook top to bottom before doing the exercises:

* ``NOT DONE YET``: the answer is still the placeholder (``None``, or a function that raises
  ``NotImplementedError``);
* ``CORRECT``: the answer passed (and the line after the marker states the rule, now that you have it).

A wrong answer raises ``AssertionError`` that names the inputs, what you returned and what was expected,
followed by a hint that escalates: the first miss of an exercise gets a *question* that points at the
idea, the second and later misses a *nudge* that names the ingredients. No hint ever states the formula:
deriving it is the exercise. Misses are counted per check in this module (one kernel = one student;
``reset_hints()`` starts the count over). ``lessons/build.py`` and ``tests/test_lessons.py`` read the
markers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

_misses: dict[str, int] = {}  # wrong attempts per check, in this kernel


class _NotDone(Exception):
    pass


def reset_hints() -> None:
    """Forget the wrong attempts, so that the next miss of every exercise gets the first hint again."""
    _misses.clear()


def _exercise(question: str, nudge: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Wrap a check: placeholders print NOT DONE YET; a pass prints CORRECT; a wrong answer raises with
    hint 1 (``question``) on its first miss and hint 2 (``nudge``) on every later one."""

    def wrap(check: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(check)
        def run(*answers: Any) -> None:
            if any(a is None or a is Ellipsis for a in answers):
                print(f"NOT DONE YET: fill in the cell above, then re-run this one ({check.__name__}).")
                return
            try:
                check(*answers)
            except _NotDone:
                print(f"NOT DONE YET: the answer is still the placeholder ({check.__name__}).")
                return
            except AssertionError as wrong:
                misses = _misses[check.__name__] = _misses.get(check.__name__, 0) + 1
                hint = f"Hint 1 of 2 (a question): {question}" if misses == 1 else f"Hint 2 of 2: {nudge}"
                raise AssertionError(f"{wrong}\n{hint}") from None  # the check's own traceback is noise
            print(f"CORRECT: {check.__doc__.strip().splitlines()[0]}")

        run.hints = (question, nudge)  # type: ignore[attr-defined]  # read by tests/test_lessons.py
        return run

    return wrap


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except NotImplementedError:
        raise _NotDone() from None


def _close(got: Any, want: Any, context: str, rtol: float = 1e-9, atol: float = 1e-12) -> None:
    got_arr = np.asarray(got, dtype=float)
    want_arr = np.asarray(want, dtype=float)
    assert got_arr.shape == want_arr.shape, f"{context}: shape {got_arr.shape}, expected {want_arr.shape}."
    assert np.allclose(got_arr, want_arr, rtol=rtol, atol=atol), f"{context}: got {got}, expected {want}."


# --- lesson 01: autograd -------------------------------------------------------------------------------


@_exercise(
    "What is the slope of tanh at x, written with the output out = tanh(x) only? And what does the chain "
    "rule do with the gradient that flows in?",
    "Write tanh(x) = sinh(x) / cosh(x), differentiate it with the quotient rule and use "
    "cosh(x)^2 - sinh(x)^2 = 1 to express the slope through tanh alone; then multiply that local slope "
    "by out_grad.",
)
def tanh_backward(fn: Callable[[float, float], float]) -> None:
    """the local derivative of tanh is 1 - tanh(x)**2, times the output's gradient."""
    for x, g in [(0.0, 1.0), (0.5, 2.0), (-1.3, 0.7), (2.0, -1.5)]:
        out = math.tanh(x)
        _close(_call(fn, out, g), (1 - out**2) * g, f"tanh_backward(out=tanh({x}), out_grad={g})")


@_exercise(
    "To measure one partial derivative, which coordinate of x do you move, to where, and how do you "
    "turn the change of f into a slope?",
    "Move one coordinate at a time to both sides of its value by eps (the central difference of the "
    "markdown above), divide the change of f by the distance between the two points, and put the "
    "coordinate back before the next one.",
)
def numerical_grad(fn: Callable[..., np.ndarray]) -> None:
    """central differences: error O(eps^2), one f(x + eps) and one f(x - eps) per coordinate."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(5)

    def f(v: np.ndarray) -> float:
        return float(np.sum(np.exp(2 * v)) + v[0] * v[1] ** 2)

    x_before = x.copy()
    got = _call(fn, f, x, 1e-3)
    assert np.array_equal(x, x_before), "your function changed x: restore each coordinate after perturbing it"
    want = 2 * np.exp(2 * x)
    want[0] += x[1] ** 2
    want[1] += 2 * x[0] * x[1]
    got = np.asarray(got, dtype=float)
    assert got.shape == x.shape, f"the gradient must have x's shape {x.shape}, got {got.shape}"
    err = np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want)))
    assert err < 1e-4, (
        f"relative error {err:.1e} with eps=1e-3 is too large for central differences (expected ~1e-6); "
        "a one-sided difference has an error of order eps, a central one of order eps^2."
    )


# --- lesson 02: MPI ------------------------------------------------------------------------------------


@_exercise(
    "Who is the right neighbour of the last rank, and who is the left neighbour of rank 0?",
    "Both neighbours are one step away in rank order, and the ring wraps around: the modulo operator keeps "
    "a rank inside [0, size). Return them in the order (left, right).",
)
def ring_neighbors(fn: Callable[[int, int], tuple[int, int]]) -> None:
    """rank r receives from (r - 1) % n and sends to (r + 1) % n."""
    for n in (1, 2, 3, 5, 8):
        for r in range(n):
            got = tuple(_call(fn, r, n))
            want = ((r - 1) % n, (r + 1) % n)
            assert got == want, f"ring_neighbors({r}, {n}) = {got}, expected (left, right) = {want}."


@_exercise(
    "Whom does each rank send its token to, and whom does it receive one from?",
    "Use one sendrecv per rank: send your own token to the right neighbour and receive the left "
    "neighbour's into a fresh buffer.",
)
def ring_pass(received: list[Any]) -> None:
    """after one shift around the ring, rank r holds rank (r - 1) % n's token."""
    if any(token is None for token in received):
        raise _NotDone()  # the ring pass was skipped because ring_neighbors is not written yet
    n = len(received)
    for r, token in enumerate(received):
        assert float(np.ravel(token)[0]) == float((r - 1) % n), (
            f"rank {r} holds {np.ravel(token)[0]}, expected the token of rank {(r - 1) % n}."
        )


# --- lesson 03: the ring all-reduce --------------------------------------------------------------------


@_exercise(
    "In the panels, which cell of each row grows at the first step, and so which chunk must the rank "
    "on its left have sent?",
    "Follow one chunk c through the panels: it must end complete on rank c, one rank further right at "
    "every step, so work out which rank sent it first; then count steps backwards. Wrap indices with % n.",
)
def reduce_scatter_send_chunk(fn: Callable[[int, int, int], int]) -> None:
    """in reduce-scatter step s, rank r sends chunk (r - s - 1) % n to its right neighbour (as ring.py)."""
    for n in (2, 3, 4, 7):
        for s in range(n - 1):
            for r in range(n):
                got = _call(fn, r, s, n)
                want = (r - s - 1) % n
                assert got == want, f"send_chunk(rank={r}, step={s}, n={n}) = {got}, expected {want}."


@_exercise(
    "How many steps do reduce-scatter and all-gather take together, and how many bytes does one message "
    "carry?",
    "Each step costs one message, alpha + (its bytes) * beta, and every rank sends at the same time, so "
    "the steps add up and the ranks do not. A message is one chunk: the vector cut into n pieces.",
)
def ring_time(fn: Callable[[float, int, float, float], float]) -> None:
    """T = 2 (n-1) alpha + 2 (n-1)/n N beta (Patarasuk & Yuan 2009)."""
    for nbytes, n, alpha, beta in [(1e6, 2, 1e-5, 1e-10), (4e8, 8, 5e-6, 4e-11), (1e3, 64, 2e-6, 1e-9)]:
        want = 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes * beta
        got = _call(fn, nbytes, n, alpha, beta)
        _close(got, want, f"ring_time(nbytes={nbytes:g}, n={n}, alpha={alpha:g}, beta={beta:g})", rtol=1e-9)


# --- lesson 04: data parallelism -----------------------------------------------------------------------


@_exercise(
    "In the mean loss over all B samples, how much does one sample count? And how much does it count "
    "in microbatch i's own mean?",
    "The factor turns a mean over microbatch i's samples into their share of the mean over the whole "
    "batch. It equals 1/k only when all k microbatches have the same size: try sizes [5, 1].",
)
def microbatch_weight(fn: Callable[[list[int], int], float]) -> None:
    """scale microbatch i's mean loss by b_i / B, so the sum is the mean over the whole batch."""
    for sizes in ([32, 32, 32, 32], [43, 43, 42], [5, 1], [7]):
        total = sum(sizes)
        for i, b in enumerate(sizes):
            _close(_call(fn, sizes, i), b / total, f"microbatch_weight(sizes={sizes}, i={i})")


# --- lesson 05: ZeRO ------------------------------------------------------------------------------------


@_exercise(
    "Which of the three parts (parameters, gradients, optimizer state) does each stage shard, and what "
    "does sharding a part over N ranks do to its bytes on one rank?",
    "Compute the three parts of plain data parallelism separately, divide each one by N only if the stage "
    "shards it, and add them; stage 0 divides none, stage 3 all three.",
)
def zero_bytes(fn: Callable[..., float]) -> None:
    """ZeRO §5: stage 1 shards the optimizer state, 2 also the gradients, 3 also the parameters."""
    # The ZeRO paper's Figure 1: Psi = 7.5 B parameters, N = 64, mixed-precision Adam (2 + 2 + 12 bytes).
    paper = {0: 120e9, 1: 31.4e9, 2: 16.6e9, 3: 1.875e9}  # the figure rounds the last to 1.9 GB
    for stage, want in paper.items():
        got = _call(fn, 7.5e9, 64, stage, 2, 12)
        context = f"zero_bytes(psi=7.5e9, n=64, stage={stage}, b=2, k=12) (ZeRO Figure 1: {want / 1e9} GB)"
        _close(got, want, context, rtol=0.01)
    _close(_call(fn, 1000, 4, 2, 4, 8), 4000 + 12000 / 4, "zero_bytes(psi=1000, n=4, stage=2, b=4, k=8)")


# --- lesson 06: tensor parallelism ---------------------------------------------------------------------


@_exercise(
    "W has shape (out_features, in_features): which axis does a column-parallel layer split, and which "
    "a row-parallel one?",
    "A column layer gives each rank a slice of the OUTPUT features, a row layer a slice of the INPUT "
    "features; only the split axis gets shorter, by the factor tp.",
)
def tp_shard_shape(fn: Callable[[int, int, int, str], tuple[int, int]]) -> None:
    """a column layer keeps out/tp rows of W (out, in); a row layer keeps in/tp columns."""
    for out_f, in_f, tp in [(8, 4, 2), (12, 6, 3), (1024, 4096, 8), (6, 6, 1)]:
        for kind, want in [("column", (out_f // tp, in_f)), ("row", (out_f, in_f // tp))]:
            got = tuple(int(v) for v in _call(fn, out_f, in_f, tp, kind))
            assert got == want, (
                f"shard_shape(out={out_f}, in={in_f}, tp={tp}, {kind!r}) = {got}, expected {want}."
            )


@_exercise(
    "x was used by every rank, each for its own slice of the output. In lesson 01, what happens to the "
    "gradients of a tensor that is used twice?",
    "Every rank holds one part of dL/dx and every rank needs the whole of it: combine the parts over "
    "the ranks (one all-reduce) with the operation of lesson 01, and give each rank its own copy.",
)
def f_and_g(operator: str, f_backward: Callable[[list[np.ndarray]], list[np.ndarray]]) -> None:
    """f goes before a column layer: identity forward, all-reduce (sum) of dL/dx backward."""
    assert operator in ("f", "g"), f"answer 'f' or 'g', got {operator!r}"
    assert operator == "f", (
        "g all-reduces in forward: it sums the partial outputs of a ROW-parallel layer. The input of a "
        "column-parallel layer is already whole on every rank, so its forward needs no communication."
    )
    rng = np.random.default_rng(6)
    # a column-parallel layer on n simulated ranks: rank r computes y_r = x W_r^T; dL/dx_r = dL/dy_r W_r
    for n in (1, 2, 4):
        w = rng.standard_normal((4 * n, 5))
        dy = rng.standard_normal((3, 4 * n))  # dL/dy for the whole output
        w_shards, dy_shards = np.split(w, n, axis=0), np.split(dy, n, axis=1)
        local = [d @ ws for d, ws in zip(dy_shards, w_shards)]  # each rank's contribution to dL/dx
        got = _call(f_backward, [g.copy() for g in local])
        assert len(got) == n, f"return one gradient per rank ({n}), got {len(got)}"
        for r, g in enumerate(got):
            context = f"rank {r} of {n}: dL/dx must be the single-device gradient dL/dy W"
            _close(g, dy @ w, context, rtol=1e-12)


# --- lesson 07: pipeline parallelism -------------------------------------------------------------------


@_exercise(
    "In the text grid of section 1 (p=3, m=4), how many slots of (t_f + t_b) does the whole step last, "
    "and in how many of them is one stage computing?",
    "Count slots: the last microbatch cannot enter stage 0 before the others have, and then it must go "
    "through every stage forward and back. A stage computes in one slot per microbatch. The bubble is "
    "the idle share of the STEP, not a ratio to the compute time.",
)
def bubble_fraction(fn: Callable[[int, int], float]) -> None:
    """the bubble of GPipe and 1F1B is (p - 1) / (m + p - 1) of the step."""
    from minidist.parallel.pipeline import one_f_one_b, simulate

    for p, m in [(1, 4), (2, 1), (4, 4), (4, 16), (8, 3), (3, 32)]:
        want = simulate(one_f_one_b(p, m), 1.0, 2.0).bubble_fraction()
        _close(_call(fn, p, m), want, f"bubble_fraction(p={p}, m={m}) (the simulated step says {want:.4f})")


@_exercise(
    "When stage s starts its first backward, how many forwards has it run?",
    "Stage s runs its warm-up forwards (section 1 says how many) and one more forward before its first "
    "backward, and after that it frees one microbatch for every new one; it can never hold more "
    "microbatches than there are.",
)
def peak_activations_1f1b(fn: Callable[[int, int, int], int]) -> None:
    """1F1B stage s holds at most min(p - s, m) microbatches' activations."""
    from minidist.parallel.pipeline import one_f_one_b, peak_activations

    for p, m in [(4, 8), (4, 2), (2, 5), (6, 6), (1, 3)]:
        peaks = peak_activations(one_f_one_b(p, m))
        for s in range(p):
            got = _call(fn, p, m, s)
            assert got == peaks[s], (
                f"peak_activations_1f1b(p={p}, m={m}, s={s}) = {got}, the schedule holds at most {peaks[s]}."
            )


# --- lesson 08: checkpoints ----------------------------------------------------------------------------


@_exercise(
    "When rank 0 is about to switch `latest`, which folder has the checkpoint's files, and which files "
    "does a reader of that checkpoint open?",
    "The .tmp folder has already been renamed to the committed step folder (look at the listing of DIR "
    "above); a reader needs the manifest and one shard file per writing rank.",
)
def files_before_latest(fn: Callable[[int, list[int]], set[str]]) -> None:
    """before `latest` moves, the step folder (renamed from .tmp) holds every shard and the manifest."""
    for step, writers in [(12, [0, 1]), (3, [0]), (40, [0, 2, 5])]:
        folder = f"step_{step:09d}"
        want = {f"{folder}/manifest.json"} | {f"{folder}/rank{r:05d}.safetensors" for r in writers}
        got = set(_call(fn, step, writers))
        assert got == want, (
            f"files_before_latest(step={step}, writers={writers}): expected {sorted(want)}, "
            f"got {sorted(got)}."
        )


@_exercise(
    "Which global rows does saved shard k hold, and which global rows does the new rank need?",
    "Intersect the two ranges of global rows; skip the shards whose intersection is empty; subtract the "
    "shard's first global row to make the rows local to it.",
)
def shards_needed(fn: Callable[[int, int, int, int], list[tuple[int, int, int]]]) -> None:
    """new tp rank r needs exactly the saved shards that overlap its slice, and only those rows."""
    for size, saved_tp, new_tp in [(12, 2, 3), (12, 3, 2), (8, 4, 4), (8, 1, 4), (8, 4, 1), (24, 4, 6)]:
        data = np.arange(size)
        saved = np.split(data, saved_tp)
        for r in range(new_tp):
            want = np.split(data, new_tp)[r]
            pieces = _call(fn, size, saved_tp, new_tp, r)
            context = (
                f"shards_needed(size={size}, saved_tp={saved_tp}, new_tp={new_tp}, r={r}): the rank needs "
                f"global rows {want[0]}..{want[-1]}; you returned {pieces}"
            )
            assert all(hi > lo for _, lo, hi in pieces), (
                f"{context}. No empty pieces: read only what you need."
            )
            assert len({k for k, _, _ in pieces}) == len(pieces), f"{context}. Each saved shard at most once."
            got = np.concatenate([saved[k][lo:hi] for k, lo, hi in pieces]) if pieces else np.array([])
            assert np.array_equal(got, want), f"{context}, which reads rows {got.tolist()}."


# --- lesson 09: the 3D mesh and the scaling model ------------------------------------------------------


@_exercise(
    "Which coordinate changes between rank 0 and rank 1? And between rank 0 and the first rank of the "
    "second pipeline stage?",
    "One step in tp moves one rank; one step in dp moves as many ranks as a tp group has; one step in pp "
    "moves as many ranks as a whole pipeline stage has.",
)
def mesh_rank(fn: Callable[[int, int, int, int, int], int]) -> None:
    """rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank: tp fastest, then dp, then pp."""
    from minidist.parallel.mesh import mesh_rank as reference

    for dp, tp, pp in [(2, 2, 2), (3, 2, 1), (1, 4, 2), (2, 1, 3), (4, 8, 2)]:
        for d in range(dp):
            for t in range(tp):
                for s in range(pp):
                    got, want = _call(fn, d, t, s, dp, tp), reference(d, t, s, dp, tp)
                    assert got == want, (
                        f"mesh_rank(dp_rank={d}, tp_rank={t}, pp_rank={s}, dp={dp}, tp={tp}) = {got}, "
                        f"the mesh says {want}."
                    )


@_exercise(
    "How long does the step take on one GPU, and which two things take time on each of G GPUs?",
    "On G GPUs each computes a G-th of the FLOPs, then waits for the ring all-reduce of the gradients "
    "(your ring_time of lesson 03); the speedup is a ratio of two step times.",
)
def dp_speedup(fn: Callable[..., float]) -> None:
    """speedup(G) = T(1) / (C/(G F) + 2(G-1) alpha + 2(G-1)/G N beta), with T(1) = C / F."""
    from minidist import perfmodel

    hw = perfmodel.Hardware(flops=1e14, alpha=5e-6, beta=1 / 25e9)
    work = perfmodel.Workload(params=1.3e9, global_batch=1024, tokens_per_sample=2048, bytes_per_value=2)
    for gpus in (1, 8, 256, 1024):
        want = perfmodel.predict(work, hw, dp=gpus).speedup
        args = (work.flops_per_step, gpus, work.params * work.bytes_per_value, hw.flops, hw.alpha, hw.beta)
        context = (
            "dp_speedup(flops_per_step={:g}, gpus={}, grad_bytes={:g}, flops={:g}, alpha={:g}, beta={:g})"
        )
        _close(_call(fn, *args), want, context.format(*args), rtol=1e-6)

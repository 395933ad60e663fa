"""Checks for the lessons' "your turn" exercises.

Every check prints one of two markers and never fails on an untouched placeholder, so a new user can
run a notebook top to bottom before doing the exercises:

* ``NOT DONE YET``: the answer is still the placeholder (``None``, or a function that raises
  ``NotImplementedError``);
* ``CORRECT``: the answer passed.

A wrong answer raises ``AssertionError`` with a hint. ``lessons/build.py`` and ``tests/test_lessons.py``
read the markers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np


class _NotDone(Exception):
    pass


def _exercise(check: Callable[..., None]) -> Callable[..., None]:
    """Wrap a check: placeholders print NOT DONE YET; a pass prints CORRECT; a wrong answer raises."""

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
        print(f"CORRECT: {check.__doc__.strip().splitlines()[0]}")

    return run


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except NotImplementedError:
        raise _NotDone() from None


def _close(got: Any, want: Any, hint: str, rtol: float = 1e-9, atol: float = 1e-12) -> None:
    got_arr = np.asarray(got, dtype=float)
    want_arr = np.asarray(want, dtype=float)
    assert got_arr.shape == want_arr.shape, f"shape {got_arr.shape}, expected {want_arr.shape}. {hint}"
    assert np.allclose(got_arr, want_arr, rtol=rtol, atol=atol), f"got {got}, expected {want}. {hint}"


# --- lesson 01: autograd -------------------------------------------------------------------------------


@_exercise
def tanh_backward(fn: Callable[[float, float], float]) -> None:
    """the local derivative of tanh is 1 - tanh(x)**2, times the output's gradient."""
    for x, g in [(0.0, 1.0), (0.5, 2.0), (-1.3, 0.7), (2.0, -1.5)]:
        out = math.tanh(x)
        want = (1 - out**2) * g
        got = _call(fn, out, g)
        _close(got, want, "Hint: d tanh(x)/dx = 1 - tanh(x)^2, and the chain rule multiplies by out_grad.")


@_exercise
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
        f"relative error {err:.1e} with eps=1e-3 is too large for central differences (expected ~1e-6). "
        "Hint: use (f(x + eps) - f(x - eps)) / (2 eps); a one-sided difference has an O(eps) error."
    )


# --- lesson 02: MPI ------------------------------------------------------------------------------------


@_exercise
def ring_neighbors(fn: Callable[[int, int], tuple[int, int]]) -> None:
    """rank r receives from (r - 1) % n and sends to (r + 1) % n."""
    for n in (1, 2, 3, 5, 8):
        for r in range(n):
            got = tuple(_call(fn, r, n))
            want = ((r - 1) % n, (r + 1) % n)
            assert got == want, (
                f"ring_neighbors({r}, {n}) = {got}, expected (left, right) = {want}. Hint: the ring wraps "
                "around, so use % size; the last rank's right neighbour is rank 0."
            )


@_exercise
def ring_pass(received: list[Any]) -> None:
    """after one shift around the ring, rank r holds rank (r - 1) % n's token."""
    if any(token is None for token in received):
        raise _NotDone()  # the ring pass was skipped because ring_neighbors is not written yet
    n = len(received)
    for r, token in enumerate(received):
        want = float((r - 1) % n)
        assert float(np.ravel(token)[0]) == want, (
            f"rank {r} holds {np.ravel(token)[0]}, expected the token of rank {(r - 1) % n}. Hint: send your "
            "own token to the right and receive the left neighbour's, both in one sendrecv."
        )


# --- lesson 03: the ring all-reduce --------------------------------------------------------------------


@_exercise
def reduce_scatter_send_chunk(fn: Callable[[int, int, int], int]) -> None:
    """in reduce-scatter step s, rank r sends chunk (r - s - 1) % n to its right neighbour (as ring.py)."""
    for n in (2, 3, 4, 7):
        for s in range(n - 1):
            for r in range(n):
                got = _call(fn, r, s, n)
                want = (r - s - 1) % n
                assert got == want, (
                    f"send_chunk(rank={r}, step={s}, n={n}) = {got}, expected {want}. Hint: at step 0 every "
                    "rank sends the chunk numbered one below its own rank (rank 0 the last one); each step "
                    "the index moves one further to the left."
                )


@_exercise
def ring_time(fn: Callable[[float, int, float, float], float]) -> None:
    """T = 2 (n-1) alpha + 2 (n-1)/n N beta (Patarasuk & Yuan 2009)."""
    for nbytes, n, alpha, beta in [(1e6, 2, 1e-5, 1e-10), (4e8, 8, 5e-6, 4e-11), (1e3, 64, 2e-6, 1e-9)]:
        want = 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes * beta
        got = _call(fn, nbytes, n, alpha, beta)
        _close(got, want, "Hint: 2(n-1) steps, each one message of N/n bytes: alpha + (N/n) beta.", rtol=1e-9)


# --- lesson 04: data parallelism -----------------------------------------------------------------------


@_exercise
def microbatch_weight(fn: Callable[[list[int], int], float]) -> None:
    """scale microbatch i's mean loss by b_i / B, so the sum is the mean over the whole batch."""
    for sizes in ([32, 32, 32, 32], [43, 43, 42], [5, 1], [7]):
        total = sum(sizes)
        for i, b in enumerate(sizes):
            got = _call(fn, sizes, i)
            _close(
                got,
                b / total,
                f"for sizes {sizes}. Hint: a mean over b_i samples, weighted so that all samples of the "
                "global batch count equally: b_i / sum(sizes) (equal to 1/k only when all sizes are equal).",
            )


# --- lesson 05: ZeRO ------------------------------------------------------------------------------------


@_exercise
def zero_bytes(fn: Callable[..., float]) -> None:
    """ZeRO §5: stage 1 shards the optimizer state, 2 also the gradients, 3 also the parameters."""
    # The ZeRO paper's Figure 1: Psi = 7.5 B parameters, N = 64, mixed-precision Adam (2 + 2 + 12 bytes).
    paper = {0: 120e9, 1: 31.4e9, 2: 16.6e9, 3: 1.875e9}  # the figure rounds the last to 1.9 GB
    for stage, want in paper.items():
        got = _call(fn, 7.5e9, 64, stage, 2, 12)
        _close(
            got,
            want,
            f"for stage {stage} (Psi=7.5e9, N=64, b=2, K=12; ZeRO Figure 1 says {want / 1e9} GB). Hint: "
            "parameters b*Psi, gradients b*Psi, optimizer state K*Psi; stage s divides the first s of "
            "(optimizer state, gradients, parameters) by N.",
            rtol=0.01,
        )
    _close(_call(fn, 1000, 4, 2, 4, 8), 4000 + 12000 / 4, "for Psi=1000, N=4, stage 2, b=4, K=8.", rtol=1e-9)


# --- lesson 09: the scaling model ----------------------------------------------------------------------


@_exercise
def dp_speedup(fn: Callable[..., float]) -> None:
    """speedup(G) = T(1) / (C/G + 2(G-1) alpha + 2(G-1)/G N beta), with T(1) = C."""
    from minidist import perfmodel

    hw = perfmodel.Hardware(flops=1e14, alpha=5e-6, beta=1 / 25e9)
    work = perfmodel.Workload(params=1.3e9, global_batch=1024, tokens_per_sample=2048, bytes_per_value=2)
    for gpus in (1, 8, 256, 1024):
        want = perfmodel.predict(work, hw, dp=gpus).speedup
        got = _call(
            fn, work.flops_per_step, gpus, work.params * work.bytes_per_value, hw.flops, hw.alpha, hw.beta
        )
        _close(
            got,
            want,
            f"for G={gpus}. Hint: compute C / (G flops); the all-reduce of N bytes costs "
            "2(G-1) alpha + 2(G-1)/G N beta; speedup = (time on 1 GPU) / (time on G).",
            rtol=1e-6,
        )


# --- lesson 06: tensor parallelism ---------------------------------------------------------------------


@_exercise
def tp_shard_shape(fn: Callable[[int, int, int, str], tuple[int, int]]) -> None:
    """a column layer keeps out/tp rows of W (out, in); a row layer keeps in/tp columns."""
    for out_f, in_f, tp in [(8, 4, 2), (12, 6, 3), (1024, 4096, 8), (6, 6, 1)]:
        for kind, want in [("column", (out_f // tp, in_f)), ("row", (out_f, in_f // tp))]:
            got = tuple(int(v) for v in _call(fn, out_f, in_f, tp, kind))
            assert got == want, (
                f"shard_shape(out={out_f}, in={in_f}, tp={tp}, {kind!r}) = {got}, expected {want}. Hint: W "
                "has shape (out_features, in_features); a column-parallel layer splits the OUTPUT features "
                "(axis 0), a row-parallel one the INPUT features (axis 1)."
            )


@_exercise
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
            _close(
                g,
                dy @ w,
                f"rank {r} of {n}: dL/dx must be the single-device gradient dL/dy W. Hint: x was used by "
                "every rank, so its gradient is the SUM over ranks of their contributions (an "
                "all-reduce), and every rank gets that sum.",
                rtol=1e-12,
            )


# --- lesson 07: pipeline parallelism -------------------------------------------------------------------


@_exercise
def bubble_fraction(fn: Callable[[int, int], float]) -> None:
    """the bubble of GPipe and 1F1B is (p - 1) / (m + p - 1) of the step."""
    from minidist.parallel.pipeline import one_f_one_b, simulate

    for p, m in [(1, 4), (2, 1), (4, 4), (4, 16), (8, 3), (3, 32)]:
        want = simulate(one_f_one_b(p, m), 1.0, 2.0).bubble_fraction()
        _close(
            _call(fn, p, m),
            want,
            f"for p={p}, m={m} (the simulated step says {want:.4f}). Hint: the step lasts m + p - 1 slots of "
            "(t_f + t_b); each stage computes in m of them.",
        )


@_exercise
def peak_activations_1f1b(fn: Callable[[int, int, int], int]) -> None:
    """1F1B stage s holds at most min(p - s, m) microbatches' activations."""
    from minidist.parallel.pipeline import one_f_one_b, peak_activations

    for p, m in [(4, 8), (4, 2), (2, 5), (6, 6), (1, 3)]:
        peaks = peak_activations(one_f_one_b(p, m))
        for s in range(p):
            got = _call(fn, p, m, s)
            assert got == peaks[s], (
                f"stage {s} of p={p}, m={m}: you say {got}, the schedule holds at most {peaks[s]}. Hint: "
                "stage s runs p - s - 1 warm-up forwards, then one more forward before its first "
                "backward; it cannot hold more microbatches than there are."
            )


# --- lesson 08: checkpoints ----------------------------------------------------------------------------


@_exercise
def shards_needed(fn: Callable[[int, int, int, int], list[tuple[int, int, int]]]) -> None:
    """new tp rank r needs exactly the saved shards that overlap its slice, and only those rows."""
    for size, saved_tp, new_tp in [(12, 2, 3), (12, 3, 2), (8, 4, 4), (8, 1, 4), (8, 4, 1), (24, 4, 6)]:
        data = np.arange(size)
        saved = np.split(data, saved_tp)
        for r in range(new_tp):
            want = np.split(data, new_tp)[r]
            pieces = _call(fn, size, saved_tp, new_tp, r)
            hint = (
                f"size={size}, saved tp={saved_tp}, new tp={new_tp}, rank {r} needs global rows "
                f"{want[0]}..{want[-1]}; you returned {pieces}. Hint: shard k holds global rows "
                "[k*S, (k+1)*S) with S = size / saved_tp; intersect that with the new rank's range and "
                "convert to rows local to shard k."
            )
            assert all(hi > lo for _, lo, hi in pieces), "no empty pieces: read only shards you need. " + hint
            assert len({k for k, _, _ in pieces}) == len(pieces), "each saved shard at most once. " + hint
            got = np.concatenate([saved[k][lo:hi] for k, lo, hi in pieces]) if pieces else np.array([])
            assert np.array_equal(got, want), hint


@_exercise
def files_before_latest(fn: Callable[[int, list[int]], set[str]]) -> None:
    """before `latest` moves, the step folder (renamed from .tmp) holds every shard and the manifest."""
    for step, writers in [(12, [0, 1]), (3, [0]), (40, [0, 2, 5])]:
        folder = f"step_{step:09d}"
        want = {f"{folder}/manifest.json"} | {f"{folder}/rank{r:05d}.safetensors" for r in writers}
        got = set(_call(fn, step, writers))
        assert got == want, (
            f"step {step}, shards written by ranks {writers}: expected {sorted(want)}, got {sorted(got)}. "
            "Hint: every shard and the manifest must be durable in the committed folder step_<9 digits>/ "
            "(the .tmp folder has already been renamed); 'latest' itself is what gets switched."
        )


# --- lesson 09: the 3D mesh ----------------------------------------------------------------------------


@_exercise
def mesh_rank(fn: Callable[[int, int, int, int, int], int]) -> None:
    """rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank: tp fastest, then dp, then pp."""
    from minidist.parallel.mesh import mesh_rank as reference

    for dp, tp, pp in [(2, 2, 2), (3, 2, 1), (1, 4, 2), (2, 1, 3), (4, 8, 2)]:
        for d in range(dp):
            for t in range(tp):
                for s in range(pp):
                    got, want = _call(fn, d, t, s, dp, tp), reference(d, t, s, dp, tp)
                    assert got == want, (
                        f"(dp_rank, tp_rank, pp_rank) = ({d}, {t}, {s}) in dp={dp}, tp={tp}, pp={pp}: you "
                        f"say rank {got}, the mesh says {want}. Hint: neighbouring ranks share a tp group, "
                        "so tp_rank varies fastest; one pipeline stage spans dp * tp ranks."
                    )

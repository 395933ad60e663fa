"""Checks of lesson 06 (tensor parallelism): the shape of a weight shard, and the f operator
(Megatron-LM, Shoeybi et al. 2019, §3)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from minidist_course.notebook.checks.harness import call, close, exercise, holds, same


@exercise(
    "W has shape (out_features, in_features): which axis does a column-parallel layer split, and which "
    "a row-parallel one?",
    "A column layer gives each rank a slice of the OUTPUT features, a row layer a slice of the INPUT "
    "features; only the split axis gets shorter, by the factor tp.",
)
def tp_shard_shape(fn: Callable[[int, int, int, str], tuple[int, int]]) -> None:
    """shard_shape(out, in, tp, kind) is the shape of the weight shard a column- and a row-parallel layer
    keep, for four layer sizes."""
    for out_f, in_f, tp in [(8, 4, 2), (12, 6, 3), (1024, 4096, 8), (6, 6, 1)]:
        for kind, want in [("column", (out_f // tp, in_f)), ("row", (out_f, in_f // tp))]:
            got = tuple(int(v) for v in call(fn, out_f, in_f, tp, kind))
            context = f"shard_shape(out={out_f}, in={in_f}, tp={tp}, {kind!r})"
            holds(
                got[0] * got[1] * tp == out_f * in_f, context, got, f"{tp} such shards do not hold the weight"
            )
            same(got, want, context, f"a {kind}-parallel layer splits the other axis")


@exercise(
    "x was used by every rank, each for its own slice of the output. In lesson 01, what happens to the "
    "gradients of a tensor that is used twice?",
    "Every rank holds one part of dL/dx and every rank needs the whole of it: combine the parts over "
    "the ranks (one all-reduce) with the operation of lesson 01, and give each rank its own copy.",
)
def f_and_g(operator: str, f_backward: Callable[[list[np.ndarray]], list[np.ndarray]]) -> None:
    """the operator before a column-parallel layer, and its backward on 1, 2 and 4 simulated ranks."""
    assert operator in ("f", "g"), f"answer 'f' or 'g', got {operator!r}"
    assert operator == "f", (
        "g all-reduces in forward: it sums the partial outputs of a ROW-parallel layer. The input of a "
        "column-parallel layer is already whole on every rank, so its forward needs no communication."
    )
    rng = np.random.default_rng(6)
    # a column-parallel layer on n simulated ranks: rank r computes y_r = x W_r^T; its part of dL/dx is
    # dL/dy_r W_r (what the student's function receives)
    for n in (1, 2, 4):
        w = rng.standard_normal((4 * n, 5))
        dy = rng.standard_normal((3, 4 * n))  # dL/dy for the whole output
        w_shards, dy_shards = np.split(w, n, axis=0), np.split(dy, n, axis=1)
        local = [d @ ws for d, ws in zip(dy_shards, w_shards)]  # each rank's contribution to dL/dx
        got = call(f_backward, [g.copy() for g in local])
        assert len(got) == n, f"return one gradient per rank ({n}), got {len(got)}"
        for r, g in enumerate(got):
            context = f"rank {r} of {n}: dL/dx must be the single-device gradient dL/dy W"
            close(g, dy @ w, context, rtol=1e-12)

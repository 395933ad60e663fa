"""Hypothesis strategies shared by the test suite (one module, as in minitorch).

Shapes, axes, permutations and indices are drawn by hypothesis itself, so a failing case shrinks
to the smallest shape that still fails. Array *values* are drawn from a NumPy generator seeded
by a hypothesis-drawn integer: a dense 5x5x5x5 array of hypothesis floats is too large an input
for hypothesis to generate and shrink well, while a seed costs one draw and still makes every
example reproducible from hypothesis' report.

Every value strategy is float64 and bounded, so that finite differences stay accurate
(see ``tests/ops/test_gradcheck.py``).

The last section holds the configurations of the distributed tests: world sizes, dp x tp x pp meshes,
pipeline schedules with their stages, microbatches and virtual stages, optimizers. The tests that run in
this process draw them (schedules as data, mesh arithmetic, checkpoint layouts); the tests that launch
MPI ranks use the tuples, since every case there costs a launch.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

MAX_DIMS = 4
MAX_SIDE = 5

seeds = st.integers(min_value=0, max_value=2**32 - 1)


# ------------------------------------------------------------------------------------------ shapes
def shapes(min_dims: int = 1, max_dims: int = MAX_DIMS, min_side: int = 1, max_side: int = MAX_SIDE):
    """Shapes with ``min_dims``..``max_dims`` axes, each of length ``min_side``..``max_side``."""
    return st.lists(st.integers(min_side, max_side), min_size=min_dims, max_size=max_dims).map(tuple)


@st.composite
def broadcastable_shapes(draw, min_dims: int = 0, max_dims: int = MAX_DIMS):
    """A pair of shapes that NumPy broadcasting accepts together.

    Both are derived from one result shape: each operand keeps only its trailing axes (broadcasting
    then adds the missing leading ones; keeping none gives a 0-d scalar tensor) and may replace any
    kept length by 1 (broadcasting then stretches it).
    """
    result = draw(shapes(max(min_dims, 1), max_dims))

    def operand() -> tuple[int, ...]:
        kept = draw(st.integers(min_dims, len(result)))
        trailing = result[len(result) - kept :]
        squeezed = draw(st.lists(st.booleans(), min_size=kept, max_size=kept))
        return tuple(1 if s else n for n, s in zip(trailing, squeezed))

    return operand(), operand()


@st.composite
def matmul_shapes(draw, max_batch_dims: int = 2):
    """Shapes ``(..., n, k)`` and ``(..., k, m)`` whose batch axes broadcast (0 batch axes: plain 2-D)."""
    n, k, m = (draw(st.integers(1, MAX_SIDE)) for _ in range(3))
    batch_dims = draw(st.integers(0, max_batch_dims))
    if batch_dims == 0:
        return (n, k), (k, m)
    batch_a, batch_b = draw(broadcastable_shapes(min_dims=0, max_dims=batch_dims))
    return batch_a + (n, k), batch_b + (k, m)


# ------------------------------------------------------------------------------------ axis choices
@st.composite
def axes(draw, ndim: int):
    """An ``axis`` argument for a reduction: None, one int, or a tuple of distinct ints.

    Each int is written either as a non-negative axis or as its negative alias (``-1`` = last).
    """
    kind = draw(st.sampled_from(["none", "int", "tuple"]))
    if kind == "none":
        return None

    def spelled(a: int) -> int:
        return a - ndim if draw(st.booleans()) else a

    if kind == "int":
        return spelled(draw(st.integers(0, ndim - 1)))
    chosen = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
    return tuple(spelled(a) for a in chosen)


@st.composite
def reduction_args(draw, ndim: int):
    """``(axis, keepdims)`` for sum / mean / max on a tensor with ``ndim`` axes."""
    return draw(axes(ndim)), draw(st.booleans())


def single_axis(ndim: int):
    """One axis, negative aliases included (softmax, log_softmax)."""
    return st.integers(-ndim, ndim - 1)


@st.composite
def reshape_targets(draw, shape: tuple[int, ...]):
    """A shape with the same number of elements as ``shape``, sometimes with one ``-1``.

    The prime factors of the size are shuffled, cut into consecutive groups (one axis each) and
    interleaved with some length-1 axes.
    """
    size = int(np.prod(shape, dtype=np.int64))
    factors, n, p = [], size, 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    factors = draw(st.permutations(factors))
    cuts = sorted(draw(st.sets(st.integers(1, max(len(factors) - 1, 1)), max_size=len(factors))))
    bounds = [0] + [c for c in cuts if c < len(factors)] + [len(factors)]
    target = [int(np.prod(factors[i:j], dtype=np.int64)) for i, j in zip(bounds, bounds[1:])]
    for _ in range(draw(st.integers(0, 2))):
        target.insert(draw(st.integers(0, len(target))), 1)
    if draw(st.booleans()):
        target[draw(st.integers(0, len(target) - 1))] = -1
    return tuple(target)


def permutations(ndim: int):
    """A permutation of ``range(ndim)`` (a ``transpose`` argument)."""
    return st.permutations(list(range(ndim))).map(tuple)


# ----------------------------------------------------------------------------------------- indices
@st.composite
def basic_indices(draw, shape: tuple[int, ...]):
    """A tuple of ints and non-empty slices (steps 1, 2 or -1) for the leading axes of ``shape``."""
    n_indexed = draw(st.integers(1, len(shape)))
    index = []
    for n in shape[:n_indexed]:
        kind = draw(st.sampled_from(["int", "slice", "full"]))
        if kind == "int":
            i = draw(st.integers(0, n - 1))
            index.append(i - n if draw(st.booleans()) else i)
        elif kind == "full":
            index.append(slice(None))
        else:
            start = draw(st.integers(0, n - 1))
            stop = draw(st.integers(start + 1, n))
            if draw(st.booleans()):  # a reversed slice over the same elements
                index.append(slice(stop - 1, start - 1 if start > 0 else None, -1))
            else:
                index.append(slice(start, stop, draw(st.sampled_from([1, 2]))))
    return tuple(index)


@st.composite
def repeated_integer_indices(draw, n: int, max_len: int = 6):
    """An int64 index array into an axis of length ``n`` that repeats at least one position."""
    picks = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=max_len - 1))
    return np.array(picks + [picks[0]], dtype=np.int64)


# ------------------------------------------------------------------------------------------ values
@st.composite
def arrays(draw, shape: tuple[int, ...], low: float = -2.0, high: float = 2.0):
    """float64 values drawn uniformly from [low, high]."""
    rng = np.random.default_rng(draw(seeds))
    return rng.uniform(low, high, size=shape)


@st.composite
def positive_arrays(draw, shape: tuple[int, ...], low: float = 0.2, high: float = 3.0):
    """float64 values in [low, high] with low > 0 (log, sqrt, non-integer powers)."""
    return draw(arrays(shape, low, high))


@st.composite
def nonzero_arrays(draw, shape: tuple[int, ...], min_abs: float = 0.2, max_abs: float = 2.0):
    """float64 values of either sign with ``min_abs <= |x| <= max_abs`` (denominators, relu's kink)."""
    rng = np.random.default_rng(draw(seeds))
    magnitude = rng.uniform(min_abs, max_abs, size=shape)
    return np.where(rng.random(size=shape) < 0.5, -magnitude, magnitude)


@st.composite
def distinct_arrays(draw, shape: tuple[int, ...], gap: float = 0.05):
    """float64 values that differ pairwise by at least ``gap`` (max without ties)."""
    rng = np.random.default_rng(draw(seeds))
    size = int(np.prod(shape, dtype=np.int64))
    steps = rng.uniform(gap, 2 * gap, size=size).cumsum()
    return rng.permutation(steps - steps.mean()).reshape(shape)


@st.composite
def classification_batches(draw, max_batch: int = MAX_SIDE, max_classes: int = MAX_SIDE):
    """``(logits, targets)``: float64 logits (N, C) and int64 class indices (N,) in [0, C)."""
    n = draw(st.integers(1, max_batch))
    c = draw(st.integers(1, max_classes))
    logits = draw(arrays((n, c), -3.0, 3.0))
    targets = np.array(draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n)), dtype=np.int64)
    return logits, targets


@st.composite
def shape_and_array(draw, values=arrays, min_dims: int = 1, max_dims: int = MAX_DIMS):
    """A shape and an array of it, the values drawn with ``values(shape)``."""
    shape = draw(shapes(min_dims, max_dims))
    return draw(values(shape))


# ------------------------------------------------------------------------ distributed configurations
MAX_WORLD_SIZE = 8  # the most ranks a test launches (on 2 cores: oversubscribed, but still quick)
OPTIMIZERS = ("sgd", "adamw")  # SGD with momentum and AdamW: one and two state tensors per parameter
TP_SIZES = (1, 2, 4)  # tensor-parallel sizes that divide the test models' widths
PIPELINE_SCHEDULES = ("gpipe", "1f1b")  # the schedules for any p and m (interleaved needs m = k * p)
BACKWARD_TIME_RATIOS = (0.5, 1.0, 2.0, 3.0)  # a backward's time over a forward's, for the simulator

optimizers = st.sampled_from(OPTIMIZERS)
tp_sizes = st.sampled_from(TP_SIZES)
schedule_names = st.sampled_from(PIPELINE_SCHEDULES)
backward_time_ratios = st.sampled_from(BACKWARD_TIME_RATIOS)


def world_sizes(max_size: int = MAX_WORLD_SIZE, min_size: int = 1):
    """A number of ranks (a world size, a data-parallel replica count)."""
    return st.integers(min_size, max_size)


def pipeline_stages(min_stages: int = 1, max_stages: int = 8):
    """A number of pipeline stages p."""
    return st.integers(min_stages, max_stages)


def microbatches(min_count: int = 1, max_count: int = 20):
    """A number of microbatches m per step (m < p included: a pipeline that never fills)."""
    return st.integers(min_count, max_count)


@st.composite
def meshes(draw, max_dp: int = 4, max_tp: int = 4, max_pp: int = 4, min_pp: int = 1):
    """A process mesh ``(dp, tp, pp)``: data-, tensor- and pipeline-parallel sizes."""
    return draw(st.integers(1, max_dp)), draw(st.integers(1, max_tp)), draw(st.integers(min_pp, max_pp))


@st.composite
def interleaved_configs(
    draw, min_stages: int = 1, max_stages: int = 8, max_chunks: int = 5, max_rounds: int = 5
):
    """``(p, m, v)`` for the interleaved schedule: p stages of v chunks each (virtual stages), and
    m = k * p microbatches, a multiple of p as the schedule requires (k rounds of p)."""
    p = draw(pipeline_stages(min_stages, max_stages))
    v = draw(st.integers(1, max_chunks))
    k = draw(st.integers(1, max_rounds))
    return p, k * p, v

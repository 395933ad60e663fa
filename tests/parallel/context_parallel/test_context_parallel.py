"""Context parallelism: the balanced split of the sequence and ring attention.

In this process (a world of one rank, cp = 1): the split helpers' properties, the causal block plan
(no visible score skipped, equal work per rank with the balanced layout), ring attention with cp = 1
against ``scaled_dot_product_attention`` and finite differences, on the CuPy stand-in, its errors.
On 2 and 4 real ranks (tests/workers/context_parallel/ring_check.py, one launch each): outputs and
gradients of q, k, v gathered from the ranks against attention of the whole sequence (causal balanced,
causal contiguous, non-causal; hypothesis-drawn shapes), central differences taken across ranks, and
every misuse raising the same error on every rank.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
import strategies as S
from cupy_stand_in import DeviceArray, install
from gradcheck import gradcheck
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi_utils import run_mpi

import minidist as md
import minidist.distributed as dist
from minidist.nn import functional as F
from minidist.parallel.context_parallel import (
    LAYOUTS,
    attention_blocks,
    context_parallel_chunks,
    context_parallel_positions,
    gather_from_context_parallel,
    ring_attention,
    split_for_context_parallel,
)

# Float64 results of ring attention and of one-process attention differ only in the order of their sums
# (blockwise online softmax against one softmax per row): a few ulps of values of order 1.
TOL = 1e-12


# ------------------------------------------------------------------------------------- the split
@given(cp=st.integers(1, 4), chunk=st.integers(1, 3), layout=st.sampled_from(LAYOUTS), data=st.data())
def test_split_then_gather_is_the_identity_and_positions_cover_the_sequence(cp, chunk, layout, data):
    seq_len = chunk * (2 * cp if layout == "balanced" else cp)
    shape = data.draw(S.shapes(1, 3, max_side=3))  # the other axes; the sequence axis goes in at `axis`
    axis = data.draw(st.integers(0, len(shape)))
    shape = shape[:axis] + (seq_len,) + shape[axis:]
    full = data.draw(S.arrays(shape))
    pieces = [split_for_context_parallel(full, cp, r, axis=axis, layout=layout) for r in range(cp)]
    assert all(p.shape[axis] == seq_len // cp for p in pieces)
    np.testing.assert_array_equal(gather_from_context_parallel(pieces, axis=axis, layout=layout), full)
    positions = [context_parallel_positions(seq_len, cp, r, layout) for r in range(cp)]
    assert sorted(np.concatenate(positions).tolist()) == list(range(seq_len))  # each token exactly once
    for r in range(cp):  # rank r's piece holds the tokens at its positions, in that order
        np.testing.assert_array_equal(pieces[r], np.take(full, positions[r], axis=axis))


def test_the_balanced_split_of_the_docstring():
    assert [context_parallel_positions(8, 2, r).tolist() for r in range(2)] == [[0, 1, 6, 7], [2, 3, 4, 5]]
    assert context_parallel_chunks(8, 2, 1, "contiguous") == [(4, 8)]
    assert context_parallel_positions(6, 1, 0).tolist() == list(range(6))  # cp = 1: the whole sequence


def causal_pairs(positions: np.ndarray) -> int:
    """Unmasked (query, key) score entries of these queries: a query at position p sees keys 0..p."""
    return int((positions + 1).sum())


@given(cp=st.integers(1, 6), chunk=st.integers(1, 4))
def test_balanced_split_gives_every_rank_the_same_causal_work_and_the_plan_skips_no_visible_score(cp, chunk):
    for layout in LAYOUTS:
        seq_len = chunk * (2 * cp if layout == "balanced" else cp)
        unmasked, computed = [], []
        for rank in range(cp):
            unmasked.append(causal_pairs(context_parallel_positions(seq_len, cp, rank, layout)))
            visible = area = 0
            for source in range(cp):
                for b in attention_blocks(seq_len, cp, rank, source, True, layout):
                    rows, cols = b.q.stop - b.q.start, b.k.stop - b.k.start
                    area += rows * cols
                    keep = (
                        np.ones((rows, cols), bool)
                        if b.diagonal is None
                        else np.tri(rows, cols, b.diagonal, bool)
                    )
                    visible += int(keep.sum())
                    assert keep.any(), "a fully masked block was planned"
            assert visible == unmasked[-1]  # the plan's masks keep exactly the causal pairs
            computed.append(area)
        assert sum(unmasked) == seq_len * (seq_len + 1) // 2
        if layout == "balanced":  # T (T + 1) / (2 cp) each, and equal work
            assert unmasked == [seq_len * (seq_len + 1) // (2 * cp)] * cp and len(set(computed)) == 1
        elif cp > 1:  # contiguous: rank r computes r + 1 blocks, the last rank cp times the first
            assert computed == [(r + 1) * chunk * chunk for r in range(cp)]
        non_causal = [sum(len(attention_blocks(seq_len, cp, 0, s, False, layout)) for s in range(cp))]
        assert non_causal[0] == cp * len(context_parallel_chunks(seq_len, cp, 0, layout)) ** 2


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda: context_parallel_chunks(10, 3, 0),
            ValueError,
            r"10 tokens cannot be cut into 6 equal chunks",
        ),
        (lambda: context_parallel_chunks(9, 2, 0, "contiguous"), ValueError, r"divisible by 2"),
        (lambda: context_parallel_chunks(8, 2, 2), ValueError, r"rank must be in \[0, 2\), got 2"),
        (lambda: context_parallel_chunks(8, 0, 0), ValueError, r"cp must be >= 1, got cp=0"),
        (lambda: context_parallel_chunks(8, 2, 0, "zigzag"), ValueError, r"layout must be one of"),
        (lambda: context_parallel_chunks(8.0, 2, 0), TypeError, r"seq_len must be an int, got 8.0"),
        (
            lambda: split_for_context_parallel(np.ones((2, 4)), 2, 0, axis=2),
            IndexError,
            r"range of \[-2, 1\]",
        ),
        (
            lambda: gather_from_context_parallel([np.ones((1, 2)), np.ones((1, 3))]),
            ValueError,
            "different shapes",
        ),
    ],
)
def test_split_errors_say_what_to_choose(call, error, message):
    with pytest.raises(error, match=message):
        call()


# ------------------------------------------------------------------- ring attention, cp = 1 here
@st.composite
def attention_inputs(draw, most: tuple[int, ...] = (2, 2, 3, 3, 3)):
    """q, k (B, H, T, hs) and v (B, H, T, hs_v) in float64, T even (the balanced layout's two chunks);
    ``most``: the largest B, H, T/2, hs, hs_v."""
    b, h, t, hs, hs_v = (draw(st.integers(1, n)) for n in most)
    q, k = draw(S.arrays((b, h, 2 * t, hs))), draw(S.arrays((b, h, 2 * t, hs)))
    return q, k, draw(S.arrays((b, h, 2 * t, hs_v)))


@given(inputs=attention_inputs(), causal=st.booleans(), layout=st.sampled_from(LAYOUTS), seed=S.seeds)
def test_cp1_ring_attention_is_ordinary_attention_values_and_gradients(inputs, causal, layout, seed):
    world = dist.init()
    r = np.random.default_rng(seed).standard_normal(inputs[2].shape)
    ours = [md.tensor(x, requires_grad=True) for x in inputs]
    ring_attention(*ours, world, is_causal=causal, layout=layout).backward(r)
    theirs = [md.tensor(x, requires_grad=True) for x in inputs]
    expected = F.scaled_dot_product_attention(*theirs, is_causal=causal)
    expected.backward(r)
    with md.no_grad():
        got = ring_attention(*[md.tensor(x) for x in inputs], world, is_causal=causal, layout=layout)
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=0, atol=TOL)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.grad, b.grad, rtol=0, atol=TOL)


@given(
    inputs=attention_inputs(most=(2, 2, 2, 2, 2)), causal=st.booleans(), scale=st.sampled_from([None, 0.3])
)
def test_cp1_ring_attention_gradients_match_finite_differences(inputs, causal, scale):
    world = dist.init()
    gradcheck(lambda q, k, v: ring_attention(q, k, v, world, is_causal=causal, scale=scale), *inputs)


def test_cp1_ring_attention_on_the_cupy_stand_in_equals_the_cpu(monkeypatch):
    world = dist.init()
    inputs = [np.random.default_rng(i).standard_normal((2, 2, 4, 3)) for i in range(3)]

    def run():
        tensors = [md.tensor(md.backend.xp().asarray(x), requires_grad=True) for x in inputs]
        out = ring_attention(*tensors, world)
        out.sum().backward()
        return out, [out.data, *(t.grad for t in tensors)]

    cpu = run()[1]
    install(monkeypatch)
    out, device = run()
    assert isinstance(out.data, DeviceArray)  # it really ran on the "device"
    for a, b in zip(device, cpu):
        np.testing.assert_array_equal(a.get(), b)  # the same NumPy operations underneath


def test_changing_the_output_in_place_is_caught_in_backward():
    q, k, v = (md.tensor(np.ones((1, 1, 2, 2)), requires_grad=True) for _ in range(3))
    out = ring_attention(q, k, v, dist.init())
    out.data[...] = 0
    out._version_counter[0] += 1  # what an in-place op does
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def ones(*shape, dtype=np.float64):
    return md.tensor(np.ones(shape, dtype=dtype))


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        (
            (ones(1, 1, 2, 2),) * 3,
            {"dropout_p": 0.1},
            NotImplementedError,
            r"dropout_p=0.1\) is not implemented",
        ),
        ((ones(1, 1, 3, 2),) * 3, {}, ValueError, r"T/cp = 3 tokens \(odd\)"),
        ((ones(1, 1, 2, 2),) * 3, {"layout": "zigzag"}, ValueError, r"layout must be one of"),
        ((ones(1, 1, 2, 2),) * 3, {"scale": float("nan")}, ValueError, r"scale must be a finite number"),
        ((ones(1, 1, 2, 2),) * 3, {"dropout_p": 1.5}, ValueError, r"between 0 and 1, got 1.5"),
        (
            (ones(2, 2), ones(2, 2), ones(2, 2)),
            {},
            ValueError,
            r"query must be \(B, heads, T/cp, head_size\)",
        ),
        ((ones(1, 1, 2, 2), ones(1, 1, 4, 2), ones(1, 1, 2, 2)), {}, ValueError, r"do not fit"),
        (
            (ones(1, 1, 2, 2), ones(1, 1, 2, 2, dtype=np.float32), ones(1, 1, 2, 2)),
            {},
            RuntimeError,
            "same dtype",
        ),
        (
            (np.ones((1, 1, 2, 2)), ones(1, 1, 2, 2), ones(1, 1, 2, 2)),
            {},
            TypeError,
            "must be a minidist Tensor",
        ),
    ],
)
def test_ring_attention_misuse_on_one_rank(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        ring_attention(*args, dist.init(), **kwargs)


def test_ring_attention_matches_torch_with_cp1():
    torch = pytest.importorskip("torch")
    inputs = [np.random.default_rng(i).standard_normal((2, 3, 6, 4)) for i in range(3)]
    ours = [md.tensor(x, requires_grad=True) for x in inputs]
    ring_attention(*ours, dist.init()).sum().backward()
    theirs = [torch.tensor(x, requires_grad=True) for x in inputs]
    torch.nn.functional.scaled_dot_product_attention(*theirs, is_causal=True).sum().backward()
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.grad, b.grad.numpy(), rtol=0, atol=TOL)


# ------------------------------------------------------------------- ring attention on 2 and 4 ranks
@st.composite
def ring_cases(draw, cp: int) -> list[dict]:
    """Causal balanced (with finite differences, on tiny shapes), causal contiguous, non-causal, and one
    case on the CuPy stand-in: the worker's cases, as JSON-able dicts."""

    def case(layout, causal, fd=False, stand_in=False):
        small = fd and cp > 2  # finite differences cost 6 cp forwards per local entry
        return {
            "B": 1 if fd else draw(st.integers(1, 2)), "H": draw(st.integers(1, 1 if small else 2)),
            "chunk": 1 if small else draw(st.integers(1, 2)), "hs": draw(st.integers(1, 2 if fd else 3)),
            "hs_v": draw(st.integers(1, 2 if fd else 3)), "layout": layout, "causal": causal,
            "scale": draw(st.sampled_from([None, 0.5])), "seed": draw(S.seeds), "fd": fd,
            "stand_in": stand_in,
        }  # fmt: skip

    return [
        case("balanced", True, fd=True),
        case("contiguous", True),
        case(draw(st.sampled_from(LAYOUTS)), False),
        case("balanced", True, stand_in=True),
    ]


def reference(data, causal: bool, scale):
    """Attention of the whole sequence on one process: output and gradients of <W, O>."""
    q, k, v = (md.tensor(data[name], requires_grad=True) for name in "qkv")
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    (out * md.tensor(data["w"])).sum().backward()
    return {"out": out.numpy(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


CP_ERRORS = {  # case: (class, message pattern), the same on every rank
    "t_local_differs": ("ValueError", r"passed different values: query shape \(\[1, 2, 2, 2\] on ranks? 0"),
    "odd_balanced": ("ValueError", r"rank 0 of the context-parallel group: .*T/cp = 3 tokens \(odd\)"),
    "odd_on_rank_0_only": ("ValueError", r"rank 0 of the context-parallel group: .*T/cp = 3 tokens"),
    "dropout": ("NotImplementedError", r"dropout_p=0.1\) is not implemented under context parallelism"),
    "dtype_differs": ("ValueError", r"dtype \(float32 on rank 0; float64 on ranks? 1"),
    "layout_differs": ("ValueError", r"layout \(balanced on rank 0; contiguous on ranks? 1"),
    "causal_differs": ("ValueError", r"is_causal \(True on rank 0; False on ranks? 1"),
    "not_4d": ("ValueError", r"query must be \(B, heads, T/cp, head_size\), got shape \(2, 4\)"),
}


@pytest.mark.mpi
@pytest.mark.parametrize("cp", [2, 4])
@settings(max_examples=max(1, settings.default.max_examples // 25))  # one launch per cp under "ci"
@given(data=st.data())
def test_ring_attention_on_ranks_equals_attention_of_the_whole_sequence(cp, data):
    cases = data.draw(ring_cases(cp), label="cases")
    torch = None
    try:
        import torch  # the optional oracle
    except ImportError:
        pass
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp)
        (out_dir / "cases.json").write_text(json.dumps(cases))
        run_mpi(cp, "context_parallel/ring_check.py", out_dir, out_dir / "cases.json", timeout=180)
        for i, case in enumerate(cases):
            got = np.load(out_dir / f"case{i}.npz")
            expected = reference(got, case["causal"], case["scale"])
            for name, value in expected.items():
                np.testing.assert_allclose(got[name], value, rtol=0, atol=TOL, err_msg=f"{name} of {case}")
            if torch is not None:
                q, k, v = (torch.tensor(got[name]) for name in "qkv")
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=case["causal"],
                                                                       scale=case["scale"])  # fmt: skip
                np.testing.assert_allclose(got["out"], out.numpy(), rtol=0, atol=TOL)
            if case["fd"]:
                # central differences of <W, O> (eps 1e-6, values of order 1): ~1e-10 off; a wrong
                # gradient is off by order 0.1
                for name in "qkv":
                    np.testing.assert_allclose(got[f"fd_d{name}"], got[f"d{name}"], rtol=0, atol=1e-7)
                assert np.abs(got["dq"]).max() > 0.01  # a non-trivial gradient was checked
        errors = [json.loads((out_dir / f"errors{r}.json").read_text()) for r in range(cp)]
    for name, (kind, pattern) in CP_ERRORS.items():
        assert all(e[name] == errors[0][name] for e in errors), f"{name}: the ranks raised different errors"
        assert errors[0][name][0] == kind and re.search(pattern, errors[0][name][1]), (name, errors[0][name])
    assert all(e["after"] == 8.0 for e in errors)  # the group still works after every error

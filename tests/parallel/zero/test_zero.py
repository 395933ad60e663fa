"""ZeroRedundancyOptimizer (ZeRO stages 1 and 2; Rajbhandari et al., SC 2020, §5).

Three properties, on real MPI ranks (``tests/workers/zero/zero_train.py``, one launch per world size runs
all four (stage, optimizer) configurations):

1. Equivalence to one device (docs/design.md, property 3): after 5 steps the parameters and losses
   equal those of one process training the same model on the whole global batch with the plain optimizer.
2. Memory: ``memory_report()`` matches the paper's per-rank formulas adapted to fp32, and the
   optimizer state of a rank is 1/N of the plain optimizer's (the shards partition it exactly).
3. Bad input (docs/design.md, property 5): every documented error is raised on every rank; uncaught,
   it ends the job instead of hanging.

The reference runs in this process, without MPI (this process never imports ``minidist.distributed``).
"""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import pytest
import strategies as S
import zero_common as zc  # noqa: E402
from mpi_utils import run_mpi  # noqa: E402

import minidist as md  # noqa: E402
from minidist import nn  # noqa: E402

SEED, STEPS, BATCH = 3, 5, 12  # 12 samples: equal shares on 2, 3 and 4 ranks, and 12 on one
# float64: 1 and N ranks differ only in the order in which gradients are summed (per rank, then around
# the ring of the reduce-scatter), a few ulps (~1e-16 relative) per step. After 5 steps of this small,
# well-conditioned problem 1e-9 is a wide margin that still catches any real error (a missing 1/N, a
# wrong shard, a stale parameter) by many orders of magnitude.
TOLERANCE = dict(rtol=1e-9, atol=1e-11)
UNUSED = 7  # index of zero_common's "unused" parameter in all_params()


@pytest.fixture(scope="module", params=[1, 2, 3, 4], ids=lambda n: f"N={n}")
def zero_run(request, tmp_path_factory):
    """Run the worker once per world size; return ``(n, load)`` with ``load(stage, opt, rank)``."""
    n = request.param
    out = tmp_path_factory.mktemp(f"zero_n{n}")
    run_mpi(n, "zero/zero_train.py", out, SEED, STEPS, BATCH, timeout=120)

    def load(stage: int, opt: str, rank: int) -> tuple[dict[str, np.ndarray], dict]:
        tag = f"{stage}_{opt}_rank{rank}"
        with np.load(out / f"{tag}.npz") as archive:
            params = dict(archive)
        return params, json.loads((out / f"{tag}.json").read_text())

    return n, load


@functools.cache
def single_process(opt_name: str) -> tuple[dict[str, np.ndarray], list[float]]:
    """The reference: the plain optimizer, one process, the whole global batch, float64."""
    x, y = zc.make_data(SEED)
    model, extra = zc.make_model(SEED, np.float64)
    cls, kwargs = zc.OPTIMIZERS[opt_name]
    opt = cls(zc.all_params(model, extra), **kwargs)
    losses = []
    for step in range(STEPS):
        xb, yb = zc.global_batch(x, y, step, BATCH)
        loss = nn.functional.cross_entropy(model(md.tensor(xb, dtype=np.float64)), yb) + zc.penalty(extra)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return zc.snapshot(model, extra), losses


@functools.cache
def plain_state_bytes(opt_name: str) -> int:
    """Optimizer-state bytes of the plain (unsharded) optimizer on the float32 MLP after one step."""
    x, y = zc.make_data(SEED)
    model, _ = zc.make_model(SEED, np.float32)
    cls, kwargs = zc.OPTIMIZERS[opt_name]
    opt = cls(model.parameters(), **kwargs)
    nn.functional.cross_entropy(model(md.tensor(x[:BATCH], dtype=np.float32)), y[:BATCH]).backward()
    opt.step()
    return sum(v.nbytes for s in opt.state.values() for v in s.values() if hasattr(v, "nbytes"))


@pytest.mark.mpi
@pytest.mark.parametrize(("stage", "opt"), zc.CONFIGS)
def test_zero_equals_single_process_after_5_steps(zero_run, stage, opt):
    n, load = zero_run
    ref_params, ref_losses = single_process(opt)
    rank0, _ = load(stage, opt, 0)
    for rank in range(n):
        params, report = load(stage, opt, rank)
        assert sorted(params) == sorted(ref_params)
        for name, ref in ref_params.items():
            np.testing.assert_allclose(params[name], ref, **TOLERANCE, err_msg=f"rank {rank} {name}")
            # The all-gather hands every rank the same bits, so the replicas never drift apart.
            np.testing.assert_array_equal(params[name], rank0[name], err_msg=f"rank {rank} {name}")
        np.testing.assert_allclose(report["losses"], ref_losses, **TOLERANCE)


@pytest.mark.mpi
def test_shards_partition_the_flat_vector_cutting_through_parameters(zero_run):
    n, load = zero_run
    layouts = [load(1, "sgd", rank)[1]["layout"] for rank in range(n)]
    sizes = layouts[0]["sizes"]
    assert [lay["stop"] - lay["start"] for lay in layouts] == [
        len(c) for c in np.array_split(np.arange(sum(sizes)), n)
    ]
    # In rank order, the segments must walk through every parameter's elements exactly once.
    walked = [(i, lo, hi) for lay in layouts for i, lo, hi in lay["segments"]]
    merged: list[list[int]] = []
    for i, lo, hi in walked:
        if merged and merged[-1][0] == i:
            assert merged[-1][2] == lo, f"gap or overlap in parameter {i}: {walked}"
            merged[-1][2] = hi
        else:
            assert lo == 0, f"parameter {i} does not start at element 0: {walked}"
            merged.append([i, lo, hi])
    assert merged == [[i, 0, size] for i, size in enumerate(sizes)]
    if n > 1:  # this model's sizes were chosen so that chunk boundaries fall inside parameters
        assert any(hi - lo < sizes[i] for i, lo, hi in walked)


@pytest.mark.mpi
@pytest.mark.parametrize(("stage", "opt"), zc.CONFIGS)
def test_memory_report_matches_the_zero_paper_formulas(zero_run, stage, opt):
    """fp32 (b = 4 bytes), K = 4 bytes per buffer: SGD momentum K = 4, AdamW exp_avg + exp_avg_sq K = 8.

    Paper §5 with mixed precision: (2 + 2 + K) Psi for plain DP, 2 Psi + 2 Psi + K Psi / N_d for stage 1
    (P_os), 2 Psi + (2 + K) Psi / N_d for stage 2 (P_os+g). In fp32 everywhere the 2s become 4s. "Psi / N"
    is this rank's chunk, Psi // N or Psi // N + 1 elements: the "+ rounding" of uneven chunks.
    """
    n, load = zero_run
    k = 4 * zc.STATE_BUFFERS[opt]
    print(f"\nZeRO-{stage} {opt}, N={n}, fp32 (bytes per rank; plain DP holds {4 + 4 + k} x Psi)")
    for rank in range(n):
        report = load(stage, opt, rank)[1]
        mem, layout = report["memory_float32"], report["layout_float32"]
        psi, shard = layout["numel"], layout["stop"] - layout["start"]
        paper = 4 * psi + 4 * psi + k * psi / n if stage == 1 else 4 * psi + (4 + k) * psi / n
        print(
            f"  rank {rank}: params {mem['parameters']}  grads {mem['gradients']}  "
            f"optimizer state {mem['optimizer_state']}  total {mem['total']}  "
            f"(paper: {paper:.1f}; plain DP: {(8 + k) * psi}; Psi = {psi}, shard = {shard})"
        )
        assert mem["parameters"] == 4 * psi  # stages 1 and 2 keep every parameter
        assert mem["optimizer_state"] == k * shard
        if stage == 1:
            assert mem["gradients"] == 4 * psi
        else:
            # The averaged shard; the reduce-scatter may hand it back as a view into a buffer of the
            # longest chunk, so allow up to ceil(Psi / N) elements.
            assert 4 * shard <= mem["gradients"] <= 4 * math.ceil(psi / n)
        sharded_bytes_per_element = k if stage == 1 else 4 + k
        assert abs(mem["total"] - paper) < sharded_bytes_per_element  # off by less than one element
        assert mem["total"] == sum(mem[key] for key in ("parameters", "gradients", "optimizer_state"))


@pytest.mark.mpi
@pytest.mark.parametrize("opt", S.OPTIMIZERS)
def test_optimizer_state_per_rank_is_one_nth_of_plain(zero_run, opt):
    n, load = zero_run
    plain = plain_state_bytes(opt)
    per_rank = [load(2, opt, rank)[1]["memory_float32"]["optimizer_state"] for rank in range(n)]
    print(f"\n{opt}: plain optimizer state {plain} B; ZeRO, N={n}: {per_rank} B per rank")
    assert sum(per_rank) == plain  # the shards partition the state: nothing is kept twice
    for state in per_rank:
        assert abs(state - plain / n) < 4 * zc.STATE_BUFFERS[opt]  # 1/N, up to one element of rounding


@pytest.mark.mpi
@pytest.mark.parametrize(("stage", "opt"), zc.CONFIGS)
def test_stage2_frees_the_gradients_this_rank_does_not_own(zero_run, stage, opt):
    """After step(): stage 1 keeps every full gradient, stage 2 only views of the averaged shard."""
    n, load = zero_run
    for rank in range(n):
        report = load(stage, opt, rank)[1]
        layout, mem, grad_is_none = report["layout"], report["memory_float64"], report["grad_is_none"]
        sizes = layout["sizes"]
        owned = {i: hi - lo for i, lo, hi in layout["segments"]}
        owned_trained = sum(size for i, size in owned.items() if i != UNUSED)
        if stage == 1:
            # Rank 0 has a local gradient for every parameter but "unused"; the others lack the
            # penalised one (index 6) unless they own part of it and so must store its average.
            has_grad = [i != UNUSED and (i != 6 or rank == 0 or i in owned) for i in range(len(sizes))]
            assert mem["gradients"] == 8 * sum(s for s, h in zip(sizes, has_grad) if h)
        else:
            has_grad = [i != UNUSED and owned.get(i) == sizes[i] for i in range(len(sizes))]
            assert 8 * owned_trained <= mem["gradients"] <= 8 * math.ceil(layout["numel"] / n)
        assert grad_is_none == [not h for h in has_grad], f"rank {rank}"
        assert mem["parameters"] == 8 * layout["numel"]
        assert mem["optimizer_state"] == 8 * zc.STATE_BUFFERS[opt] * owned_trained


@pytest.mark.mpi
@pytest.mark.parametrize(("stage", "opt"), zc.CONFIGS)
def test_state_dict_resume_is_bit_identical(zero_run, stage, opt):
    n, load = zero_run
    for rank in range(n):
        assert load(stage, opt, rank)[1]["resume_bit_identical"], f"rank {rank}"


# (case, exception on the rank that is wrong, on the others, fragments of the message)
ERROR_CASES = [
    ("stage 3", "ValueError", "ValueError", ["stage must be 1", "got 3", "stage 3"]),
    ("stage 0", "ValueError", "ValueError", ["stage must be 1", "got 0"]),
    ("optimizer instance", "TypeError", "TypeError", ["Optimizer subclass", "instance", "optim.SGD"]),
    ("not an optimizer", "TypeError", "TypeError", ["Optimizer subclass", "dict"]),
    (
        "count differs",
        "ValueError",
        "ValueError",
        ["parameter count (", "same order"],
    ),
    (
        "total size differs",
        "ValueError",
        "ValueError",
        ["total number of elements (10 on", "11 on"],
    ),
    ("a size differs", "ValueError", "ValueError", ["parameter 0 has between 6 and 9 elements"]),
    ("dtype differs", "ValueError", "ValueError", ["dtype (float"]),
    ("stage 3 on rank 1", "ValueError", "ValueError", ["rank 1 of the group", "stage must be 1", "got 3"]),
    ("stage 2 on rank 1", "ValueError", "ValueError", ["stage (1 on ranks 0, 2; 2 on rank 1)"]),
    ("not a tensor on rank 1", "TypeError", "TypeError", ["rank 1 of the group", "not a tensor"]),
    ("empty", "ValueError", "ValueError", ["empty parameter list"]),
    ("mixed dtypes", "ValueError", "ValueError", ["one dtype", "float32", "float64"]),
    ("load another rank's state", "ValueError", "ValueError", ["different layout", "rank"]),
    (
        "group value differs",
        "ValueError",
        "ValueError",
        ["group 0 weight_decay (0.1 on ranks 0, 2; 0.0 on rank 1)"],
    ),
    ("group count differs", "ValueError", "ValueError", ["parameter groups (1 on ranks 0, 2; 2 on rank 1)"]),
    (
        "groups split differently",
        "ValueError",
        "ValueError",
        ["group 0 elements (6 on ranks 0, 2; 4 on rank 1)"],
    ),
    ("parameter in two groups", "ValueError", "ValueError", ["more than one parameter group"]),
    (
        "bad group value on rank 1",
        "ValueError",
        "ValueError",
        ["rank 1 of the group", "Invalid weight_decay value: -1.0"],
    ),
    (
        "max_norm differs",
        "ValueError",
        "ValueError",
        ["clip_grad_norm_", "max_norm (2.0 on ranks 0, 2; 1.0 on"],
    ),
    (
        "negative max_norm on rank 1",
        "ValueError",
        "ValueError",
        ["rank 1 of the group", "max_norm must be >= 0"],
    ),
]


@pytest.mark.mpi
def test_errors_are_raised_on_every_rank(tmp_path):
    run_mpi(3, "zero/zero_errors.py", "caught", tmp_path, timeout=60)
    for rank in range(3):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for case, on_culprit, on_others, fragments in ERROR_CASES:
            kind, message = seen[case]
            assert kind == (on_culprit if rank == 1 else on_others), f"rank {rank}, {case}: {message}"
            for fragment in fragments if rank == 1 or on_culprit == on_others else []:
                assert fragment in message, f"rank {rank}, {case}: {message!r} lacks {fragment!r}"
        # Afterwards the group still works, even with P = 2 < N = 3 (rank 2 owns nothing):
        # p = 1 - 0.1 * 2p = 0.8.
        assert seen["tiny model"] == ["[0.8, 0.8]", "1" if rank < 2 else "0"]
        for case in ("clip norm", "clip inf norm"):
            norm, expected = seen[case]
            assert float(norm) == pytest.approx(float(expected), rel=1e-15), case
        assert seen["clip nan norm"] == ["nan", "nan"]


@pytest.mark.mpi
def test_uncaught_error_ends_the_job_instead_of_hanging(tmp_path):
    result = run_mpi(2, "zero/zero_errors.py", "uncaught", timeout=30, check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "parameter count (2 on rank 0; 1 on rank 1)" in output, output


def test_zero_layout_chunks_are_the_collectives_chunks():
    """zero/layout.py keeps its own chunk_bounds (importing minidist.distributed starts MPI); it must cut
    exactly as reduce_scatter / all_gather do, or ZeRO's shards would not line up with the messages."""
    from minidist.distributed.algorithms.ring import chunk_bounds as collective_chunks
    from minidist.parallel.zero.layout import chunk_bounds as zero_chunks

    for n in range(1, 9):
        for numel in range(0, 40):
            assert zero_chunks(numel, n) == collective_chunks(numel, n), (numel, n)

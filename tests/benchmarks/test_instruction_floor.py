"""benchmarks/instruction_floor.py and minimal_autograd.py: the tools behind issue 16's measured floors.

The counts themselves need valgrind and minutes (benchmarks/README.md, "Measured floors"); here: the
callgrind reader attributes costs as documented, the minimal engine is the reference's arithmetic (so
``minimal - reference`` is the graph's cost alone), and every contender of the worker runs on real
ranks (one call each, no valgrind).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from mpi_utils import BENCHMARKS, run_mpi

BENCH = BENCHMARKS
sys.path.insert(0, str(BENCH))
from instruction_floor import instructions_by_library  # noqa: E402
from minimal_autograd import minimal_gpipe_step, minimal_step  # noqa: E402
from mpi4py import MPI  # noqa: E402
from numpy_reference import ReferenceStage, dp_step, gpipe_step  # noqa: E402

# A hand-written callgrind file: python's main (self 100) calls into libmpi (inclusive 70: MPI's self
# 40 + a libc lock it calls, 30) and into libc's memcpy (inclusive 5); libmpi's call into libc is
# MPI's work. Names are compressed as callgrind writes them: "(n) name" once, then "(n)".
CALLGRIND = """\
events: Ir
ob=(1) /usr/bin/python3
fl=(1) main.c
fn=(1) main
10 100
cob=(2) /opt/lib/libmpi.so.12
cfl=(2) ???
cfn=(2) MPI_Allreduce
calls=1 0
10 70
cob=(3) /lib/libc.so.6
cfn=(3) memcpy
calls=1 0
11 5
ob=(2)
fl=(2)
fn=(2)
0 40
cob=(3)
cfn=(4) pthread_mutex_lock
calls=1 0
0 30
ob=(3)
fn=(3)
0 5
fn=(4)
0 30
totals: 175
"""


def test_callgrind_reader_counts_calls_into_mpi_inclusively(tmp_path):
    path = tmp_path / "cg.1.2"
    path.write_text(CALLGRIND)
    outside, inside = instructions_by_library(path)
    assert (outside, inside) == (105, 70)  # python 100 + memcpy 5 | MPI 40 + the lock it took 30


def test_minimal_autograd_step_is_the_reference_step():
    """Same arithmetic, so the same parameters after 3 SGD steps up to float32 rounding (the tape adds
    each gradient into the zeroed buffer, the reference adds into it too: bitwise equal is expected,
    allclose with 1e-7 leaves room for BLAS choosing another kernel for a transposed operand)."""
    rng = np.random.default_rng(0)
    params = [rng.standard_normal(s, dtype=np.float32) * 0.1 for s in [(16, 8), (16,), (4, 16), (4,)]]
    x, y = rng.standard_normal((6, 8), dtype=np.float32), rng.integers(0, 4, 6)
    ref, tape = ReferenceStage(params, head=True), ReferenceStage(params, head=True)
    for _ in range(3):
        ref_loss = dp_step(ref, x, y, 0.1, None)
        tape_loss = minimal_step(tape, x, y, 0.1, lambda flat: None)
        assert tape_loss == pytest.approx(ref_loss, rel=1e-6)
    for a, b in zip(tape.params, ref.params):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)
    assert not np.array_equal(ref.params[0], params[0])  # the steps moved the weights


def test_minimal_gpipe_step_on_one_stage_is_the_reference_gpipe_step():
    """One stage (head and first at once, over MPI.COMM_SELF), 4 microbatches: one tape per
    microbatch, the loss scaled by 1/4, gradients summed over the tapes: the reference's update."""
    rng = np.random.default_rng(1)
    params = [rng.standard_normal(s, dtype=np.float32) * 0.1 for s in [(16, 8), (16,), (4, 16), (4,)]]
    x, y = rng.standard_normal((8, 8), dtype=np.float32), rng.integers(0, 4, 8)
    ref, tape = ReferenceStage(params, head=True), ReferenceStage(params, head=True)
    for _ in range(3):
        ref_loss = gpipe_step(ref, x, y, 0.1, 4, MPI.COMM_SELF)
        tape_loss = minimal_gpipe_step(tape, x, y, 0.1, 4, MPI.COMM_SELF, lambda flat: None)
        assert tape_loss == pytest.approx(ref_loss, rel=1e-6)
    for a, b in zip(tape.params, ref.params):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)
    assert not np.array_equal(ref.params[0], params[0])


def test_minimal_gpipe_step_on_two_ranks_is_the_reference_gpipe_step(tmp_path):
    """Two real stages: stage 1 sends the gradient of its received input (a leaf of its tapes) back,
    stage 0 starts from none; a wrong or missing input gradient would move stage 0's weights elsewhere."""
    run_mpi(2, "pipeline/minimal_gpipe.py", tmp_path, timeout=60)
    for rank in (0, 1):
        got = np.load(tmp_path / f"rank{rank}.npz")
        n_params = 2 if rank == 0 else 4
        for k in range(n_params):
            np.testing.assert_allclose(got[f"tape{k}"], got[f"ref{k}"], rtol=0, atol=1e-7)
            assert not np.array_equal(got[f"ref{k}"], got[f"start{k}"])  # the steps moved it
        ref_losses, tape_losses = got["losses"][0::2], got["losses"][1::2]
        if rank == 1:
            np.testing.assert_allclose(tape_losses, ref_losses, rtol=1e-6)
        else:
            assert np.isnan(ref_losses).all() and np.isnan(tape_losses).all()


@pytest.mark.parametrize(
    "args",
    [
        ["step", "--dp", "2"],
        ["step", "--pp", "2"],
        ["step", "--pp", "2", "--executor-only"],
        ["allreduce", "--sizes", "4", "16"],
    ],
    ids=["dp2", "pp2", "pp2-executor-only", "allreduce"],
)
def test_every_contender_of_the_worker_runs_on_two_ranks(args, tmp_path):
    names = tmp_path / "names.txt"
    run_mpi(
        2,
        BENCH / "instruction_floor.py",
        *args,
        "--worker",
        "--calls",
        "1",
        "--names-file",
        names,
        timeout=60,
    )
    got = names.read_text().splitlines()
    if args[0] == "allreduce":
        assert got == [f"{kib} KiB {k}" for kib in (4, 16) for k in ("auto", "bare", "mpi")]
    elif "--executor-only" in args:
        assert got == ["pipeline train_step (no SGD)", "the same loop by hand (no SGD)"]
    else:
        assert {"reference", "minidist", "minimal autograd"} <= set(got)
        assert ("by hand, dist.all_reduce" in got) == (args[-1] == "2" and args[1] == "--dp")

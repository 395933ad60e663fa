"""A9 hidden tests: 3 ranks and a vocabulary of 7 (3 + 2 + 2), reduction "sum", one token per rank's
slice at its border; ring attention on 4 ranks with backward and on 2, and a plan for every rank of
cp = 4."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from gradelib import assert_no_failures, run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "public"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import a9lib  # noqa: E402
from test_a9_parallel import WORKER, loss, ring  # noqa: E402


@pytest.mark.mpi
def test_vocab_parallel_loss_three_ranks():
    cases = [loss(10, 7, (3, 2), "sum", backward=True), loss(11, 7, (5,), "none", backward=True)]
    assert_no_failures(run_ranks(3, WORKER, {"cases": cases}))


def test_causal_plan_four_ranks_and_one():
    failures = []
    for seq_len, cp, layout in [(16, 4, "balanced"), (8, 4, "contiguous"), (6, 1, "balanced")]:
        failures += a9lib.plan_failures(seq_len, cp, layout)
    failures += a9lib.online_step_failures(seed=3)
    assert not failures, failures[0]


@pytest.mark.mpi
def test_ring_attention_four_ranks_backward():
    cases = [ring(12, (1, 2, 16, 2), True, "balanced", True), ring(13, (1, 1, 8, 3), False, "balanced", True)]
    assert_no_failures(run_ranks(4, WORKER, {"cases": cases}))


@pytest.mark.mpi
def test_ring_attention_two_ranks():
    cases = [ring(4, (1, 2, 8, 3), True, "balanced"), ring(8, (2, 1, 4, 2), False, "contiguous", True)]
    assert_no_failures(run_ranks(2, WORKER, {"cases": cases}))

"""A7 hidden tests: 3 ranks (the 59 parameters do not split evenly), shard and training."""

from __future__ import annotations

from pathlib import Path

import pytest
from gradelib import assert_no_failures, run_ranks

WORKER = Path(__file__).resolve().parents[1] / "workers" / "zero_check.py"
pytestmark = pytest.mark.mpi


def test_gradient_shard_uneven():
    assert_no_failures(run_ranks(3, WORKER, {"seed": 2, "steps": 1, "batch": 9, "check": "shard"}))


def test_zero1_three_ranks():
    assert_no_failures(run_ranks(3, WORKER, {"seed": 3, "steps": 3, "batch": 9, "check": "train"}))

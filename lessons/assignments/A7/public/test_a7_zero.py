"""A7 public tests: ZeRO stage 1 on 2 real MPI ranks against single-device training."""

from __future__ import annotations

from pathlib import Path

import pytest
from gradelib import assert_no_failures, run_ranks

WORKER = Path(__file__).resolve().parents[1] / "workers" / "zero_check.py"
pytestmark = pytest.mark.mpi


def test_gradient_shard():
    assert_no_failures(run_ranks(2, WORKER, {"seed": 0, "steps": 1, "batch": 6, "check": "shard"}))


def test_zero1_matches_single_device():
    assert_no_failures(run_ranks(2, WORKER, {"seed": 1, "steps": 3, "batch": 6, "check": "train"}))

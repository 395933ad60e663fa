"""A6.2 public tests: the commit protocol of checkpoint.save on 2 real MPI ranks, watched step by step."""

from __future__ import annotations

from pathlib import Path

import pytest
from gradelib import assert_no_failures, run_ranks

WORKER = Path(__file__).resolve().parents[1] / "workers" / "ckpt_check.py"
pytestmark = pytest.mark.mpi


def test_commit_order():
    assert_no_failures(run_ranks(2, WORKER, {"mode": "commit", "steps": [1, 2]}))

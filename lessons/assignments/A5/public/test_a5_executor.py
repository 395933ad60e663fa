"""A5.2 public tests: PipelineParallel with GPipe and 1F1B on 2 real MPI ranks equals one device."""

from __future__ import annotations

from pathlib import Path

import pytest
from gradelib import assert_no_failures, run_ranks

WORKER = Path(__file__).resolve().parents[1] / "workers" / "pipeline_check.py"
pytestmark = pytest.mark.mpi


def test_executor_matches_single_device():
    runs = [
        {"schedule": "gpipe", "m": 2, "seed": 0},
        {"schedule": "1f1b", "m": 4, "seed": 1},
        {"schedule": "1f1b", "m": 1, "seed": 2},
    ]
    assert_no_failures(run_ranks(2, WORKER, {"runs": runs}))

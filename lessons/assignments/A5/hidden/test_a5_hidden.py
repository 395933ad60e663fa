"""A5 hidden tests: 1F1B programs for hypothesis-drawn (p, m), m < p included; the executor on 3 and
4 ranks with fewer microbatches than stages."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from gradelib import assert_no_failures, run_ranks
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "public"))
from schedule_rules import check_one_f_one_b  # noqa: E402

WORKER = Path(__file__).resolve().parents[1] / "workers" / "pipeline_check.py"


@given(st.integers(1, 7), st.integers(1, 12))
def test_one_f_one_b_any_size(p, m):
    from minidist.parallel.pipeline.schedules import one_f_one_b

    check_one_f_one_b(one_f_one_b(p, m), p, m)


@pytest.mark.mpi
def test_executor_three_and_four_stages():
    runs = [{"schedule": "1f1b", "m": 2, "seed": 3}, {"schedule": "1f1b", "m": 5, "seed": 4}]
    assert_no_failures(run_ranks(3, WORKER, {"runs": runs}))
    assert_no_failures(run_ranks(4, WORKER, {"runs": [{"schedule": "1f1b", "m": 6, "seed": 5}]}))

"""A3 hidden tests: hypothesis bucket plans with mixed dtypes; DDP on 3 ranks with one bucket per
parameter, overlap on and off."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gradelib import assert_no_failures, run_ranks
from hypothesis import given
from hypothesis import strategies as st

WORKER = Path(__file__).resolve().parents[1] / "workers" / "ddp_check.py"


@given(
    st.lists(st.tuples(st.integers(1, 300), st.sampled_from(["float32", "float64"])), min_size=1, max_size=9),
    st.integers(1, 700),
)
def test_plan_buckets_any_sizes(params, cap):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "public"))
    from test_a3_buckets import check_plan

    check_plan([n for n, _ in params], [np.dtype(d) for _, d in params], cap)


@pytest.mark.mpi
def test_ddp_three_ranks_one_bucket_each():
    config = {"seed": 2, "steps": 2, "batch": 9, "bucket_cap_mb": 1e-6, "overlap": False}
    assert_no_failures(run_ranks(3, WORKER, config))


@pytest.mark.mpi
def test_overlap_three_ranks_one_bucket_each():
    config = {
        "seed": 3,
        "steps": 2,
        "batch": 9,
        "bucket_cap_mb": 1e-6,
        "overlap": True,
        "check_overlap": True,
    }
    assert_no_failures(run_ranks(3, WORKER, config))

"""A2 hidden tests: 5 ranks split into groups of 2 and 3, plus the whole world of 5; lengths smaller
than the group size (empty chunks), length 0 and 1, and hypothesis-drawn lengths and ops."""

from __future__ import annotations

from pathlib import Path

import pytest
from gradelib import assert_no_failures, run_ranks
from hypothesis import given, settings
from hypothesis import strategies as st

WORKER = Path(__file__).resolve().parents[1] / "workers" / "ring_check.py"
pytestmark = pytest.mark.mpi

case_lists = st.lists(
    st.fixed_dictionaries(
        {
            "length": st.integers(0, 23),
            "dtype": st.sampled_from(["float64", "float32"]),
            "op": st.sampled_from(["sum", "avg", "max", "min"]),
            "seed": st.integers(0, 1000),
        }
    ),
    min_size=3,
    max_size=6,
)
EDGE = [{"length": n, "dtype": "float64", "op": "sum", "seed": n} for n in (0, 1, 2, 4)]


def run(kind: str, drawn: list[dict]) -> None:
    cases = [{**c, "kind": kind} for c in EDGE + drawn]
    # Groups of 2 and 3 (group ranks differ from world ranks), then the world of 5.
    assert_no_failures(run_ranks(5, WORKER, {"cases": cases, "groups": [2, 3]}))
    assert_no_failures(run_ranks(5, WORKER, {"cases": cases}))


@settings(max_examples=1)
@given(case_lists)
def test_reduce_scatter_groups_and_short_arrays(drawn):
    run("reduce_scatter", drawn)


@settings(max_examples=1)
@given(case_lists)
def test_all_gather_groups_and_short_arrays(drawn):
    run("all_gather", drawn)


@settings(max_examples=1)
@given(case_lists)
def test_all_reduce_groups_and_short_arrays(drawn):
    run("all_reduce", drawn)

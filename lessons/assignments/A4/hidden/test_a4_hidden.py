"""A4 hidden tests: 3 ranks, sub-groups of 2 and 1 (tp=1 is an edge case), 3-d inputs, no bias,
gather/scatter variants, and column feeding row as in Megatron's MLP."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from gradelib import assert_no_failures, run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "public"))
from test_a4_tp import WORKER, case  # noqa: E402

pytestmark = pytest.mark.mpi


def test_f_and_g_three_ranks_and_subgroups():
    assert_no_failures(run_ranks(3, WORKER, {"cases": [case("mappings", 10, batch=(2, 3))]}))
    assert_no_failures(run_ranks(3, WORKER, {"cases": [case("mappings", 11)], "groups": [2, 1]}))


def test_shard_parameter_three_ranks():
    assert_no_failures(run_ranks(3, WORKER, {"cases": [case("shard", 12, fan_in=9, fan_out=6)]}))


def test_column_three_ranks():
    cases = [
        case("column", 13, fan_in=5, fan_out=9, batch=(2, 2)),
        case("column", 14, fan_in=4, fan_out=6, flag=True),
        case("column_row", 15, fan_in=5, hidden=9, fan_out=4),
    ]
    assert_no_failures(run_ranks(3, WORKER, {"cases": cases}))


def test_row_three_ranks_and_subgroups():
    cases = [
        case("row", 16, fan_in=9, fan_out=4, batch=(2, 2)),
        case("row", 17, fan_in=6, fan_out=3, bias=False, flag=True),
        case("column_row", 18, fan_in=4, hidden=6, fan_out=5, bias=False),
    ]
    assert_no_failures(run_ranks(3, WORKER, {"cases": cases}))
    assert_no_failures(
        run_ranks(
            3, WORKER, {"cases": [case("row", 19, fan_in=6, fan_out=3, batch=(2, 2))], "groups": [2, 1]}
        )
    )

"""A4 public tests: the f/g operators and the tensor-parallel layers on 2 real MPI ranks, compared with
one device (float64, the same seed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gradelib import assert_no_failures, run_ranks

WORKER = Path(__file__).resolve().parents[1] / "workers" / "tp_check.py"
pytestmark = pytest.mark.mpi


def case(
    kind: str,
    seed: int,
    fan_in: int = 6,
    fan_out: int = 8,
    bias: bool = True,
    flag: bool = False,
    batch: tuple[int, ...] = (3,),
    hidden: int = 8,
) -> dict:
    return {
        "kind": kind,
        "seed": seed,
        "in": fan_in,
        "out": fan_out,
        "hidden": hidden,
        "bias": bias,
        "flag": flag,
        "batch": list(batch),
    }


def test_f_and_g():
    assert_no_failures(run_ranks(2, WORKER, {"cases": [case("mappings", 0)]}))


def test_shard_parameter():
    assert_no_failures(run_ranks(2, WORKER, {"cases": [case("shard", 1)]}))


def test_column_parallel_linear():
    cases = [case("column", 2), case("column", 3, flag=True, bias=False)]
    assert_no_failures(run_ranks(2, WORKER, {"cases": cases}))


def test_row_parallel_linear():
    cases = [case("row", 4, fan_in=8, fan_out=5), case("row", 5, fan_in=8, fan_out=5, flag=True)]
    assert_no_failures(run_ranks(2, WORKER, {"cases": cases}))

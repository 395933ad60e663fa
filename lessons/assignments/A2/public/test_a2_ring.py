"""A2 public tests: the ring collectives on 3 real MPI ranks, compared exactly with NumPy.

Each test launches one ``mpiexec -n 3`` run of ``workers/ring_check.py`` with several cases: lengths
divisible by 3 and not, float64 and float32, ops sum / avg / max.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gradelib import assert_no_failures, run_ranks

WORKER = Path(__file__).resolve().parents[1] / "workers" / "ring_check.py"
pytestmark = pytest.mark.mpi


def cases(kind: str) -> list[dict]:
    return [
        {"kind": kind, "length": 12, "dtype": "float64", "op": "sum", "seed": 1},
        {"kind": kind, "length": 7, "dtype": "float32", "op": "sum", "seed": 2},
        {"kind": kind, "length": 10, "dtype": "float64", "op": "avg", "seed": 3},
        {"kind": kind, "length": 5, "dtype": "float64", "op": "max", "seed": 4},
    ]


def test_reduce_scatter():
    assert_no_failures(run_ranks(3, WORKER, {"cases": cases("reduce_scatter")}))


def test_all_gather():
    assert_no_failures(run_ranks(3, WORKER, {"cases": cases("all_gather")}))


def test_all_reduce():
    assert_no_failures(run_ranks(3, WORKER, {"cases": cases("all_reduce")}))

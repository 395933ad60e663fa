"""A5.1 public tests: the 1F1B programs (pure Python, no MPI): rules and a rendezvous replay."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from schedule_rules import check_one_f_one_b  # noqa: E402


@pytest.mark.parametrize("p, m", [(2, 4), (4, 6), (4, 2), (3, 1), (1, 3)])
def test_one_f_one_b(p, m):
    from minidist.parallel.pipeline.schedules import one_f_one_b

    check_one_f_one_b(one_f_one_b(p, m), p, m)

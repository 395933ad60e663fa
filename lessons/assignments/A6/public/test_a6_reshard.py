"""A6.1 public tests: resharding on hand-made manifest entries (no files, no MPI)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reshard_cases import check_reshard  # noqa: E402

CASES = [  # (global shape, saved tp_dim, saved tp, tp_dim here, tp here)
    ((4, 6), 0, 2, 0, 2),  # unchanged: own shard only
    ((4, 6), 1, 2, 1, 2),
    ((4, 6), 0, 2, 0, 4),  # column-parallel weight, tp 2 -> 4
    ((4, 8), 1, 4, 1, 2),  # row-parallel weight, tp 4 -> 2
    ((4, 6), 1, 2, 1, 1),  # -> one device
    ((6,), None, 1, None, 2),  # replicated bias
    ((4, 6), None, 1, 1, 2),  # saved by one device, now row-parallel
    ((4, 6), 0, 2, None, 1),  # saved sharded, now replicated
    ((4, 6), 1, 2, 1, 4),  # 6 columns cannot be cut in 4: CheckpointError
]


@pytest.mark.parametrize("shape, saved_dim, saved_tp, tp_dim, tp", CASES)
def test_reshard(shape, saved_dim, saved_tp, tp_dim, tp):
    check_reshard(shape, saved_dim, saved_tp, tp_dim, tp)

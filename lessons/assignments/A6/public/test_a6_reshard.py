"""A6.1 public tests: resharding on hand-made manifest entries (no files, no MPI)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reshard_cases import check_reshard  # noqa: E402

CASES = [  # (global shape, saved tp_dim, saved tp, tp_dim here, tp here[, saved stride, stride here])
    ((4, 6), 0, 2, 0, 2),  # unchanged: own shard only
    ((4, 6), 1, 2, 1, 2),
    ((4, 6), 0, 2, 0, 4),  # column-parallel weight, tp 2 -> 4
    ((4, 8), 1, 4, 1, 2),  # row-parallel weight, tp 4 -> 2
    ((4, 6), 1, 2, 1, 1),  # -> one device
    ((6,), None, 1, None, 2),  # replicated bias
    ((4, 6), None, 1, 1, 2),  # saved by one device, now row-parallel
    ((4, 6), 0, 2, None, 1),  # saved sharded, now replicated
    ((4, 6), 1, 2, 1, 4),  # 6 columns in 4: uneven, 2 + 2 + 1 + 1 (numpy.array_split's rule)
    ((7, 3), 0, 2, 0, 3),  # an uneven vocabulary: 4 + 3 rows saved, 3 + 2 + 2 loaded
    ((12, 2), 0, 2, 0, 2, 3, 3),  # [q; k; v] (stride 3), unchanged: own shard only
    ((12, 2), 0, 2, 0, 4, 3, 3),  # [q; k; v], tp 2 -> 4: each rank its rows of q, of k and of v
    ((12, 2), 0, 2, None, 1, 3, 1),  # [q; k; v] saved on tp 2, loaded on one device
    ((12, 2), 0, 2, 0, 2, 3, 1),  # strided pieces saved, contiguous pieces loaded
    ((10, 2), None, 1, 0, 2, 1, 3),  # 10 rows are not 3 equal blocks: CheckpointError
]


@pytest.mark.parametrize("case", CASES)
def test_reshard(case):
    check_reshard(*case)

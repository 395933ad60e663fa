"""What ``algorithm="auto"`` means: one small table of message-size thresholds, kept in this one place.

Which algorithm is fastest depends on the message size ``N`` (bytes) and the group size ``n``: short
messages are dominated by the number of messages (alpha terms), long ones by the bytes each rank sends
and reduces (beta and gamma terms). See the cost formulas in ``ring.py``, ``recursive_doubling.py``,
``rabenseifner.py``, ``broadcast.py``, ``scatter_allgather.py`` and ``tree_reduce.py``.

PLACEHOLDER: measured numbers follow.
"""

from __future__ import annotations

import math

# collective -> rows (group sizes, [(below this many bytes, algorithm), ...]). The first row whose group
# sizes contain n is used; in it, the first threshold above the message size wins.
AUTO_TABLE: dict[str, list[tuple[range, list[tuple[float, str]]]]] = {
    "all_reduce": [
        (range(2, 3), [(math.inf, "rabenseifner")]),
        (range(3, 1 << 30), [(64 * 1024, "recursive_doubling"), (math.inf, "ring")]),
    ],
    "reduce_scatter": [(range(2, 1 << 30), [(math.inf, "ring")])],
    "all_gather": [(range(2, 1 << 30), [(math.inf, "ring")])],
    "broadcast": [(range(2, 1 << 30), [(math.inf, "tree")])],
    "reduce": [(range(2, 1 << 30), [(math.inf, "tree")])],
}


def choose(collective: str, nbytes: int, group_size: int) -> str:
    """The algorithm ``"auto"`` runs for ``collective`` with ``nbytes`` bytes on ``group_size`` ranks.

    Every rank must get the same answer, so ``nbytes`` must be the same on every rank: the array's size
    for the reductions and broadcast, the total gathered size for ``all_gather``.
    """
    for group_sizes, thresholds in AUTO_TABLE[collective]:
        if group_size in group_sizes:
            for below, algorithm in thresholds:
                if nbytes < below:
                    return algorithm
    return AUTO_TABLE[collective][-1][1][-1][1]  # group size 1: nothing is sent; any answer will do

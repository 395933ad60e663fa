"""Which rank is a straggler: the rule the monitor and the report share.

Rank r is a straggler when its typical compute per step (the median over a window of steps) exceeds the
median of the *other* ranks' typical compute by both

* a factor ``threshold`` (1.2: 20 % slower), which scales with the step, and
* ``min_excess`` seconds (default 2 ms), so that on tiny steps (a millisecond of compute on a shared,
  oversubscribed machine) the scheduler's noise is not called a straggler.

Medians, not means: one step that the operating system interrupted, a garbage collection or the epoch's
evaluation moves a mean but not a median, so a verdict means "slower in most steps of the window", i.e.
consistently. Comparing with the other ranks' median keeps one slow rank from raising the bar it is
measured against (with 4 ranks the mean of all would include it).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Straggler:
    """Rank ``rank`` computes ``compute`` s per step (median) where the other ranks take ``others`` s."""

    rank: int
    compute: float
    others: float

    @property
    def excess(self) -> float:
        """Extra compute seconds per step."""
        return self.compute - self.others

    @property
    def ratio(self) -> float:
        """How many times slower (inf when the others' compute is 0)."""
        return self.compute / self.others if self.others > 0 else float("inf")

    def describe(self) -> str:
        return (f"rank {self.rank} is a straggler: {1e3 * self.compute:.1f} ms of compute per step against "
                f"{1e3 * self.others:.1f} ms on the other ranks (+{1e3 * self.excess:.1f} ms, "
                f"{self.ratio:.2f}x)")  # fmt: skip


def find_stragglers(
    compute_per_rank: Sequence[float], threshold: float = 1.2, min_excess: float = 0.002
) -> list[Straggler]:
    """The stragglers among ranks whose typical compute per step is ``compute_per_rank[r]`` seconds.

    Raises ``ValueError`` for ``threshold`` < 1 or a negative ``min_excess``. One rank: never a straggler.
    """
    if threshold < 1:
        raise ValueError(f"threshold={threshold}: must be >= 1 (1.2 flags a rank 20% slower than the others)")
    if min_excess < 0:
        raise ValueError(f"min_excess={min_excess}: must be >= 0 seconds")
    found = []
    for rank, compute in enumerate(compute_per_rank):
        rest = [c for r, c in enumerate(compute_per_rank) if r != rank]
        if not rest:
            continue
        others = statistics.median(rest)
        if compute > threshold * others and compute - others > min_excess:
            found.append(Straggler(rank, compute, others))
    return found

"""Which elements of the model a ZeRO rank owns: the flat-vector partition of ZeRO (§5).

Lay every parameter end to end, in order, as one logical vector of ``P`` elements (P is the paper's
Psi). Rank ``r`` of ``N`` owns chunk ``r`` of ``numpy.array_split(range(P), N)``: the first ``P % N``
ranks own ``P // N + 1`` elements, the others ``P // N``. This is the chunk layout of
``dist.reduce_scatter`` and ``dist.all_gather``, so one reduce-scatter of the flat gradient hands each
rank exactly the gradient of the elements it owns, and one all-gather of the owned elements rebuilds
every parameter.

A chunk boundary can fall inside a parameter. The owned chunk is therefore described as a list of
*segments*, ``(param_index, lo, hi)``: elements ``lo:hi`` of that parameter, flattened. A rank owns at
most two partial parameters (the first and the last of its segments) and any number of whole ones in
between. Because SGD and AdamW act element by element, updating a 1-D slice of a parameter gives the
same numbers as updating the whole parameter and slicing afterwards, which is why the optimizer can run
on segments unchanged.

This file is pure bookkeeping (no communication, no arrays), so it can be tested without MPI. That is
why it keeps its own five-line ``chunk_bounds`` instead of importing
``minidist.distributed.algorithms.ring``'s: importing ``minidist.distributed`` starts MPI. A test checks that
the two agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


def chunk_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]``: the ``world_size`` chunks of ``numpy.array_split(range(numel), world_size)``.

    Raises ``ValueError`` for a negative ``numel`` or a ``world_size`` below 1.
    """
    if numel < 0 or world_size < 1:
        raise ValueError(f"chunk_bounds needs numel >= 0 and world_size >= 1, got {numel}, {world_size}")
    base, extra = divmod(numel, world_size)
    bounds, start = [], 0
    for r in range(world_size):
        stop = start + base + (1 if r < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


@dataclass(frozen=True)
class Segment:
    """Elements ``lo:hi`` of parameter ``param_index`` (flattened), at ``shard_offset`` of the shard."""

    param_index: int
    lo: int
    hi: int
    shard_offset: int

    @property
    def numel(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True)
class ShardLayout:
    """The partition of ``sizes`` (element counts of the parameters, in order) over ``world_size`` ranks.

    Attributes:
        sizes: element count of every parameter; ``numel = sum(sizes)`` is P.
        offsets: where each parameter starts in the flat vector.
        world_size, rank: N and this rank.
        start, stop: the owned range ``[start, stop)`` of the flat vector (``stop - start`` may be 0
            when P < N).
        segments: the owned range cut at parameter boundaries, in order (parameters of size 0 never
            appear).
    """

    sizes: tuple[int, ...]
    offsets: tuple[int, ...]
    world_size: int
    rank: int
    start: int
    stop: int
    segments: tuple[Segment, ...]

    @classmethod
    def build(cls, sizes: Iterable[int], world_size: int, rank: int) -> ShardLayout:
        """Compute the layout; raises ``ValueError`` for a rank outside ``0..world_size-1``."""
        sizes = tuple(int(s) for s in sizes)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        offsets, total = [], 0
        for s in sizes:
            offsets.append(total)
            total += s
        start, stop = chunk_bounds(total, world_size)[rank]
        segments = []
        for i, (offset, size) in enumerate(zip(offsets, sizes)):
            lo, hi = max(start, offset), min(stop, offset + size)  # overlap of [start, stop) and parameter i
            if lo < hi:
                segments.append(Segment(i, lo - offset, hi - offset, lo - start))
        return cls(sizes, tuple(offsets), world_size, rank, start, stop, tuple(segments))

    @property
    def numel(self) -> int:
        """P, the number of elements of all parameters together."""
        return sum(self.sizes)

    @property
    def shard_numel(self) -> int:
        """Elements this rank owns: ``P // N`` or ``P // N + 1``."""
        return self.stop - self.start

    def owns_whole(self, param_index: int) -> bool:
        """Whether this rank owns every element of the parameter (False for a size-0 parameter)."""
        return any(s.param_index == param_index and s.numel == self.sizes[param_index] for s in self.segments)

    def check_same(self, saved: dict[str, Any]) -> None:
        """``ValueError`` unless ``saved`` (a ``describe()``) is this layout: a ZeRO shard state fits
        only the rank and world size that saved it (the checkpoint module reshards)."""
        current = self.describe()
        if saved != current:
            differing = sorted(k for k in current if saved.get(k) != current[k])
            raise ValueError(
                "ZeroRedundancyOptimizer.load_state_dict: the saved shard has a different layout "
                f"(differing: {', '.join(differing)}; saved world_size={saved.get('world_size')}, "
                f"rank={saved.get('rank')}, numel={saved.get('numel')}; "
                f"here world_size={current['world_size']}, rank={current['rank']}, numel={current['numel']})"
            )

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly summary, stored in ``ZeroRedundancyOptimizer.state_dict()["layout"]``."""
        return {
            "world_size": self.world_size,
            "rank": self.rank,
            "numel": self.numel,
            "sizes": list(self.sizes),
            "start": self.start,
            "stop": self.stop,
            "segments": [[s.param_index, s.lo, s.hi] for s in self.segments],
        }

"""What ``algorithm="auto"`` means: one small table of message-size thresholds, kept in this one place.

Which algorithm is fastest depends on the message size ``N`` (bytes) and the group size ``n``. Short
messages are dominated by the number of messages (the alpha terms of the cost formulas), long ones by
the bytes each rank sends and reduces (beta and gamma); see ``ring.py``, ``recursive_doubling.py``,
``rabenseifner.py``, ``recursive_halving.py``, ``tree_broadcast.py``, ``scatter_allgather.py`` and
``tree_reduce.py``. The formulas
say *where* the crossovers lie only up to the machine's alpha, beta and gamma, so the thresholds below
were measured.

**How they were measured.** On the 2-core development machine (AMD EPYC, 2 cores, 1 MiB L2 per core,
MPICH 5.0.2 over shared memory): ``OMP_NUM_THREADS=1 mpirun -n n python benchmarks/collectives.py`` for n = 2,
3, 4, 6 and 8, timing each algorithm of a collective through the public call (``dist.all_reduce(a,
algorithm=...)``) on float32 arrays of 4 KiB .. 64 MiB, the algorithms interleaved, each call started
after a barrier; one sample is the slowest rank's time, and we compared medians of 30 samples. Each
threshold is a size where the winner changed (rounded to a power of two; between two algorithms within
noise of each other we kept the simpler rule). With more ranks than cores (n > 2 here) the timings are
noisy (medians move by 20-30% between runs) and the ranks compete for the cores, which favours
algorithms with few steps (recursive doubling and halving) more than on a real cluster.

**To re-measure** on another machine: run the benchmark (``benchmarks/collectives.py``) for each
algorithm name in ``dist.ALGORITHMS`` at the group sizes you use, find the crossovers, and edit
:data:`AUTO_TABLE`; ``tests/distributed/test_collectives.py`` checks every algorithm, so no test depends on
these numbers.

Every rank must choose the same algorithm, so ``auto`` looks only at values that all ranks share: the
group size and the array's byte size (which must match anyway), and for ``all_reduce`` on a group that
spans nodes its node layout (``topology.py``, the same on every rank; :data:`ACROSS_NODES_TABLE`).
Ranks that pass arrays of different sizes may end up in different algorithms and hang instead of
raising; ``MINIDIST_DEBUG`` catches that mismatch before any message is sent.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Container

from minidist.distributed.checks import check_choice
from minidist.distributed.comm import Communicator
from minidist.distributed.topology import has_hierarchy, node_layout, world_spans_nodes

# The algorithms each collective offers. "auto" chooses among the hand-written ones by message size and
# group size (choose, below; the thresholds and how they were measured are above).
ALGORITHMS = {
    "all_reduce": ("auto", "ring", "recursive_doubling", "rabenseifner", "hierarchical", "mpi"),
    "reduce_scatter": ("auto", "ring", "recursive_halving", "mpi"),
    "all_gather": ("auto", "ring", "mpi"),
    "broadcast": ("auto", "tree", "scatter_allgather", "mpi"),
    "reduce": ("auto", "tree", "mpi"),
}

KiB, MiB = 1024, 1024 * 1024
ANY = range(2, 1 << 31)  # every group size that sends anything
POWERS_OF_TWO_FROM_4 = frozenset(1 << k for k in range(2, 31))  # measured at 4 and 8

# collective -> rows of (group sizes, [(below this many bytes, algorithm), ...]). The first row whose
# group sizes contain n applies; in it, the first threshold above the message size wins.
AUTO_TABLE: dict[str, list[tuple[Container[int], list[tuple[float, str]]]]] = {
    "all_reduce": [
        # n = 2: one whole-array exchange beats the ring's two half-array steps up to ~512 KiB (at 128 and
        # 256 KiB 0.89-1.12x MPI against the ring's 1.04-1.24x; from 512 KiB the ring wins or ties).
        (range(2, 3), [(512 * KiB, "recursive_doubling"), (math.inf, "ring")]),
        # n = 4: the ring's 6 steps lost to recursive doubling's 2 at 1 and 2 MiB (0.6-1.0x MPI against
        # 1.1-1.6x); Rabenseifner (4 steps of N/2 and N/4) beat both at 512 KiB and 1 MiB in 7 runs of 7
        # (0.80-1.07x MPI against 1.02-1.87x); at 256 KiB recursive doubling still wins (0.95-1.07x).
        (range(4, 5), [(512 * KiB, "recursive_doubling"), (4 * MiB, "rabenseifner"), (math.inf, "ring")]),
        # Oversubscribed 3..7 ranks: few steps matter more; the ring wins from ~1 MiB.
        (range(3, 8), [(1 * MiB, "recursive_doubling"), (math.inf, "ring")]),
        # n = 8: Rabenseifner's 6 steps beat the ring's 14 between 1 and 4 MiB.
        (range(8, 9), [(1 * MiB, "recursive_doubling"), (4 * MiB, "rabenseifner"), (math.inf, "ring")]),
        # Not measured (more ranks than this machine runs usefully): the rule of 3..7 ranks.
        (ANY, [(1 * MiB, "recursive_doubling"), (math.inf, "ring")]),
    ],
    "reduce_scatter": [
        # log2 n steps instead of n - 1 win up to ~32 MiB; at n = 2 both are the same one exchange.
        (POWERS_OF_TWO_FROM_4, [(32 * MiB, "recursive_halving"), (math.inf, "ring")]),
        # Other sizes: folding to a power of two costs a whole extra array; the ring does not.
        (ANY, [(math.inf, "ring")]),
    ],
    "all_gather": [(ANY, [(math.inf, "ring")])],
    "broadcast": [
        # At n = 2 scattering saves nothing (the root sends N bytes either way) and costs a step.
        (range(2, 3), [(math.inf, "tree")]),
        (ANY, [(32 * MiB, "tree"), (math.inf, "scatter_allgather")]),
    ],
    "reduce": [(ANY, [(math.inf, "tree")])],
}


@functools.lru_cache(maxsize=4096)  # asked before every call; the answer for a size never changes
def choose(collective: str, nbytes: int, group_size: int) -> str:
    """The algorithm ``"auto"`` runs for ``collective`` with ``nbytes`` bytes on ``group_size`` ranks.

    ``nbytes`` must be the same on every rank (the array's ``nbytes``), so that all ranks choose alike.
    A group of one rank sends nothing; it gets the table's last algorithm.
    """
    for group_sizes, thresholds in AUTO_TABLE[collective]:
        if group_size in group_sizes:
            return next(algorithm for below, algorithm in thresholds if nbytes < below)
    return AUTO_TABLE[collective][-1][1][-1][1]


# all_reduce on a group that spans nodes and has more than one rank on some node (hierarchical.py):
# "flat" (tuning.choose's pick for the group) below HIERARCHICAL_FROM bytes, "hierarchical" from it on.
#
# How it was measured: `python benchmarks/collectives.py --cluster 2x2 --bandwidth
# 100mbit,1gbit,none` on the 2-core machine (load average 6-8 from other jobs: every step of every
# algorithm waits for a core, ~1-3 ms), 2 network namespaces x 2 ranks on veth links shaped with tc
# tbf, the algorithms taking turns, medians of 10-20 calls, two runs (benchmarks/README.md, "Across
# nodes"). Hierarchical sends N bytes over each link where the ring sends 1.5 N and
# recursive doubling 2 N, but takes 3 steps where recursive doubling takes 2: it won from 256 KiB on
# at 100 Mbit/s (0.5-0.8x the best flat algorithm) and from 1 MiB on at 1 Gbit/s (0.8-1.0x); below
# that, and on unshaped links (memory speed), recursive doubling's fewer steps won or tied. 1 MiB is
# the size from which it won at both shaped speeds. A cluster whose links are fast next to its
# per-step cost would move the threshold up; re-measure there.
HIERARCHICAL_FROM = 1 * MiB
ACROSS_NODES_TABLE: list[tuple[Container[int], list[tuple[float, str]]]] = [
    (ANY, [(HIERARCHICAL_FROM, "flat"), (math.inf, "hierarchical")]),
]


@functools.lru_cache(maxsize=4096)
def choose_across_nodes(nbytes: int, nodes: int, group_size: int) -> str:
    """The algorithm ``all_reduce(algorithm="auto")`` runs on a group of ``group_size`` ranks spread over
    ``nodes`` nodes (some node holding more than one), for ``nbytes`` bytes: ``"hierarchical"``, or
    for ``"flat"`` in :data:`ACROSS_NODES_TABLE` what :func:`choose` picks for the group."""
    for node_counts, thresholds in ACROSS_NODES_TABLE:
        if nodes in node_counts:
            chosen = next(algorithm for below, algorithm in thresholds if nbytes < below)
            return choose("all_reduce", nbytes, group_size) if chosen == "flat" else chosen
    return "hierarchical"


def check_algorithm(collective: str, algorithm: str) -> None:
    """Raise ``ValueError`` listing the valid names if ``collective`` offers no ``algorithm``."""
    valid = ALGORITHMS[collective]
    if algorithm not in valid:  # (check_choice only to raise: this runs before every collective)
        check_choice(algorithm, valid, f"algorithm for {collective}")


def resolve(collective: str, algorithm: str, nbytes: int, group: Communicator) -> str:
    """``algorithm`` itself, or for ``"auto"`` the one this module picks (the same on every rank).
    Noted on the group's channel, for the trace (``safety/traffic.py``).

    The answer depends only on the arguments and on the group's node layout, which never changes, so
    it is kept on the group (``Communicator.resolved``): a training loop asks the same every step, and
    one dictionary look-up costs less than the table look-up and the multi-node test (~1,650
    instructions less per call, docs/performance.md, "Counted").
    """
    key = (collective, algorithm, nbytes)
    chosen = group.resolved.get(key)
    if chosen is None:
        if len(group.resolved) >= 1024:  # many different sizes: start over rather than grow
            group.resolved.clear()
        chosen = group.resolved[key] = _choose(collective, algorithm, nbytes, group)
    group.collective_channel.algorithm = chosen
    return chosen


def _choose(collective: str, algorithm: str, nbytes: int, group: Communicator) -> str:
    chosen = algorithm
    if algorithm in ("auto", "hierarchical"):
        chosen = choose(collective, nbytes, group.size)  # the flat pick
        # A group that may span nodes: its layout decides (computed on the first such call, collectively,
        # then cached on the group). Without a hierarchy to use, "hierarchical" runs the flat pick.
        if collective == "all_reduce" and world_spans_nodes() and has_hierarchy(node_layout(group)):
            layout = node_layout(group)
            chosen = (
                "hierarchical"
                if algorithm == "hierarchical"
                else choose_across_nodes(nbytes, layout.nodes, group.size)
            )
    return chosen

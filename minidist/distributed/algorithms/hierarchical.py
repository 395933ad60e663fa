"""Hierarchical all-reduce: reduce inside each node, all-reduce across nodes, share inside each node.

Across machines, the network link of a node is the bottleneck: shared memory inside a node moves
tens of GB/s, a link between nodes 0.1-10 Gbit/s. A flat ring over all ``n = k L`` ranks (``k`` nodes,
``L`` ranks per node, placed in blocks) sends ``2(n-1)/n N`` bytes over every node's link; recursive
doubling sends ``N`` bytes per rank in each of its steps across nodes, ``L N`` per link per step. The
hierarchical all-reduce sends only what one rank per node must:

1. **reduce** inside each node to its leader (``local_rank`` 0): ``dist.reduce`` on the node group,
   a binomial tree over shared memory (``tree_reduce.py``);
2. **all-reduce** across the ``k`` leaders, one per node: ``dist.all_reduce`` on the leader group with
   the flat algorithm ``tuning.py`` picks for ``k`` ranks (ring, recursive doubling, ...);
3. **broadcast** inside each node from its leader: ``dist.broadcast`` on the node group.

This is Horovod's hierarchical allreduce (Sergeev & Del Balso, "Horovod: fast and easy distributed
deep learning in TensorFlow", 2018, §4: NCCL inside a node, MPI between nodes) and the shape of
NCCL's trees and rings, which go through each node once (Jeaugey, "Massively Scale Your Deep
Learning Training with NCCL 2.4", 2019). The three pieces are the algorithms of Thakur, Rabenseifner &
Gropp, "Optimization of collective communication operations in MPICH" (IJHPCA 2005). (Horovod reduces
by reduce-scatter / all-gather inside the node so that all ``L`` local ranks use the network at once;
with one network link per node, as here, the bytes over the link are the same, and the leader form is
simpler to read.)

**Cost** (alpha-beta-gamma, ``N`` bytes; ``alpha_i, beta_i`` inside a node, ``alpha_e, beta_e`` between
nodes; ring across the leaders)::

    2 ceil(log2 L) (alpha_i + N beta_i) + ceil(log2 L) N gamma        (reduce + broadcast in the node)
  + 2(k-1) alpha_e + 2(k-1)/k N beta_e + (k-1)/k N gamma              (ring across k leaders)

against ``2(kL-1) alpha_e + 2(kL-1)/(kL) N beta_e`` for a flat ring whose slowest step crosses a link.
Across nodes it saves a factor ``(kL-1)/(kL) / ((k-1)/k)`` of the bytes (1.5x for 2 nodes x 2 ranks)
and ``2k(L-1)`` of the slow latencies; it pays for that with the shared-memory steps, which only pay
off when the link is much slower than memory (``tuning.py`` has the measured thresholds).

**Special layouts.** The group may be any sub-communicator, and nodes may hold different numbers of
its ranks (a node with a single rank skips steps 1 and 3). When the group lies on one node, or has
one rank on every node, there is no hierarchy to use: the flat algorithm ``tuning.py`` picks for the
group runs instead. ``"avg"`` is summed through steps 1 and 2 and divided once, by the group size, on
the leaders before step 3, so every rank ends with the same bits (step 3 copies).

**Seen in a trace** (``trace.enable(messages=True)``): the call's span on ``group`` holds the spans of
its three sub-collectives, on groups named ``"<group>.node"`` and ``"<group>.leaders"``; the bytes
sent are counted there (the outer span's ``bytes`` is 0), so a sum over all spans counts them once.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from minidist.distributed.comm import Communicator
from minidist.distributed.reduce_ops import finish
from minidist.distributed.topology import has_hierarchy, node_layout
from minidist.distributed.tuning import choose


def hierarchical_all_reduce(
    group: Communicator,
    flat: np.ndarray,
    op: str,
    *,
    reduce: Callable[..., object],
    all_reduce: Callable[..., object],
    broadcast: Callable[..., object],
) -> None:
    """All-reduce ``flat`` (1-D host array, same length and dtype on every rank) over ``group``, in place.

    Collective over ``group``; the first call also computes the group's node layout (collective,
    ``topology.node_layout``). The three steps are collectives in their own right, each numbered and
    tagged on its own group (the layout's ``node_group`` and ``leader_group``): ``collectives.py``,
    which defines the public ``reduce``, ``all_reduce`` and ``broadcast``, passes them in, so this
    module never imports it. Raises ``DistributedError`` if a rank's array has a different length from
    its partners' (as the flat algorithms do).
    """
    layout = node_layout(group)
    assert has_hierarchy(layout), "collectives.all_reduce runs a flat algorithm for this layout"
    inner = "sum" if op == "avg" else op  # "avg" divides once, at the end of step 2
    node, leaders = layout.node_group, layout.leader_group
    reduce(flat, dst=0, op=inner, group=node)  # 1. to the leader (node rank 0)
    if leaders is not None:  # 2. across nodes, leaders only
        across = choose("all_reduce", flat.nbytes, leaders.size)
        all_reduce(flat, inner, group=leaders, algorithm=across)
        finish(op, flat, group.size)
    broadcast(flat, src=0, group=node)  # 3. from the leader to its node

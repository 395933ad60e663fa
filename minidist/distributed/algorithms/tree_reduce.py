"""Binomial-tree reduce: the reduction of every rank's array ends up on one rank, ``dst``.

The mirror image of the binomial-tree broadcast (``tree_broadcast.py``): data flows *up* the tree and is
combined on the way. Ranks are renumbered relative to the root, ``v = (rank - dst) % n`` (the root is
``v = 0``). In the round with ``distance`` = 1, 2, 4, ...:

* a rank whose bit ``distance`` is set (``v & distance``) sends its partial result to its parent
  ``v - distance`` and is done;
* otherwise, if ``v + distance`` exists, it receives that child's partial result and combines it with
  its own.

Example, n = 6, dst = 0:  round 1: 1->0, 3->2, 5->4;  round 2: 2->0 (holding x2+x3);  round 3: 4->0
(holding x4+x5). After ``ceil(log2 n)`` rounds the root holds the reduction over all ranks.

Cost in the alpha-beta-gamma model of Thakur, Rabenseifner & Gropp, "Optimization of collective
communication operations in MPICH" (IJHPCA 2005), for ``N`` bytes (alpha per message, beta per byte
sent, gamma per byte reduced):

    ceil(log2 n) (alpha + N beta + N gamma)

Good for short messages. For long ones a reduce-scatter followed by a gather to the root (Rabenseifner's
reduce, ``2 (n-1)/n N beta``) moves less data; we leave that to ``algorithm="mpi"``.

No deadlock: a rank sends only after it has received from all its children, and each parent is blocked
in exactly the receive that matches its next child's send.
"""

from __future__ import annotations

import numpy as np

from minidist.distributed.comm import Communicator
from minidist.distributed.reduce_ops import combine_ufunc, finish


def tree_reduce(group: Communicator, flat: np.ndarray, op: str, dst: int) -> None:
    """Reduce ``flat`` (1-D host array, same length on every rank) over ``group`` into ``flat`` on ``dst``.

    On rank ``dst`` the result is written in place into ``flat``; on every other rank ``flat`` is only
    read, never written. Scratch (one allocation per call): ``flat.size`` elements on the root, twice
    that on inner ranks of the tree (a partial result and a receive buffer), none on leaves. Collective
    over ``group``, on its ``collective_channel``. Raises ``DistributedError`` if a child's array has a
    different length.
    """
    n, size = group.size, flat.size
    link = group.collective_channel
    combine = combine_ufunc(op)
    v = (group.rank - dst) % n  # position in the tree: the root is 0

    partial = flat if v == 0 else None  # where my running result lives; None: still just my own `flat`
    incoming = None
    distance = 1
    while distance < n:
        if v & distance:  # send my partial result to my parent; my part is done
            link.host_send(flat if partial is None else partial, (v - distance + dst) % n)
            return
        if v + distance < n:  # receive a child's partial result and combine it with mine
            if incoming is None:  # first child: allocate once (inner ranks also need room for `partial`)
                scratch = np.empty(size if v == 0 else 2 * size, dtype=flat.dtype)
                incoming = scratch[:size]
            link.host_recv(incoming, (v + distance + dst) % n)
            if partial is None:  # first child of a non-root rank: start a partial result outside `flat`
                partial = scratch[size:]
                combine(flat, incoming, out=partial)
            else:
                combine(partial, incoming, out=partial)
        distance *= 2
    finish(op, flat, n)  # only the root gets here: "avg" divides the finished sum

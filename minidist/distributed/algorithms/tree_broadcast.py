"""Binomial-tree broadcast, written with point-to-point messages only.

One rank, the root ``src``, has an array; afterwards every rank has a copy. Sending it from the root to
each of the ``n - 1`` others in turn would take ``n - 1`` message times. A tree doubles the number of
ranks that hold the data in every round: the root sends to one rank, now two ranks send to two more,
then four send to four, ... so everybody has it after ``ceil(log2 n)`` rounds.

Ranks are renumbered relative to the root, ``v = (rank - src) % n``, so that the root is ``v = 0``.
In the round with ``distance`` = 1, 2, 4, ...:

* ranks with ``v < distance`` already hold the data and send it to ``v + distance`` (if that rank exists);
* ranks with ``distance <= v < 2 * distance`` receive it, from ``v - distance``;
* all others wait for a later round.

Example, n = 6, src = 0:  round 1: 0->1;  round 2: 0->2, 1->3;  round 3: 0->4, 1->5.

Cost in the alpha-beta model of Thakur, Rabenseifner & Gropp (IJHPCA 2005), for ``N`` elements:

    ceil(log2 n) * (alpha + N beta)

Good for short messages (few latencies); for long ones every round resends the whole array, and
algorithms that scatter the array and then all-gather it (cost about ``2 N beta``) do better.

No deadlock: in each round every sender's receiver is a rank that has done nothing yet and is blocked in
exactly that receive, so each blocking send finds its receive.
"""

from __future__ import annotations

import numpy as np

from minidist.distributed.comm import Communicator


def tree_broadcast(group: Communicator, flat: np.ndarray, src: int) -> None:
    """Copy ``flat`` (host array, same length and dtype on every rank) from rank ``src`` to every rank.

    In place and collective over ``group``; messages go over ``group.collective_channel``. Raises
    ``DistributedError`` if a rank's array length differs from the root's (it is caught by the rank
    that receives the message).
    """
    n = group.size
    link = group.collective_channel
    v = (group.rank - src) % n  # position in the tree: the root is 0

    def real_rank(virtual: int) -> int:
        return (virtual + src) % n

    distance = 1
    while distance < n:
        if v < distance:  # I have the data: pass it on
            if v + distance < n:
                link.host_send(flat, real_rank(v + distance))
        elif v < 2 * distance:  # my round to receive
            link.host_recv(flat, real_rank(v - distance))
        distance *= 2

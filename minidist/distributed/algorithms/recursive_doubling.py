"""Recursive-doubling all-reduce: ``log2 n`` steps, each exchanging the whole vector (short messages).

Picture the ``n = 2^k`` ranks as the corners of a k-dimensional cube. In step ``j`` (``j = 0 .. k-1``)
every rank swaps its *whole* array with the rank across dimension ``j``, ``partner = rank XOR 2^j``, and
both combine what they got with what they had. After step ``j`` each rank holds the reduction over a
sub-cube of ``2^(j+1)`` ranks, so after ``k`` steps every rank holds the reduction over all of them:

    n = 4:  step 0: 0<->1, 2<->3  (now 0,1 hold x0+x1; 2,3 hold x2+x3)
            step 1: 0<->2, 1<->3  (now everyone holds x0+x1+x2+x3)

Both partners of a step combine the *same two* arrays (in swapped order, which IEEE-754 addition,
``maximum`` and ``minimum`` do not notice), so every rank ends with bit-identical results.

Cost in the alpha-beta-gamma model of Thakur, Rabenseifner & Gropp, "Optimization of collective
communication operations in MPICH" (IJHPCA 2005): a message of ``m`` bytes costs ``alpha + m beta`` and
reducing ``m`` bytes costs ``m gamma``. For ``N`` bytes and ``n`` a power of two:

    log2(n) alpha + log2(n) N beta + log2(n) N gamma

The latency term is the smallest possible (compare the ring's ``2(n-1) alpha``, ``ring.py``), but the
whole vector travels in every step, so for long messages the ring (``2(n-1)/n N beta``) or
Rabenseifner's algorithm (``rabenseifner.py``) wins.

**Group sizes that are not a power of two.** Let ``p`` be the largest power of two ``<= n`` and
``r = n - p`` the number of ranks too many. The first ``2r`` ranks pair up, ``(0, 1), (2, 3), ...``:
the even rank of each pair sends its array to the odd one, which folds it into its own and from then on
stands for both. Now exactly ``p`` ranks remain (the ``r`` odd ranks below ``2r`` and the ``n - 2r``
ranks from ``2r`` on); they renumber themselves ``0 .. p-1`` and run the power-of-two algorithm. At the
end each odd rank sends the finished result back to the even partner that sat out. Example, ``n = 6``:
``p = 4, r = 2``; rank 0 folds into 1 and 2 into 3; ranks 1, 3, 4, 5 act as virtual ranks 0, 1, 2, 3.
This costs ``2 alpha + 2 N beta + N gamma`` more, the standard trick of MPICH (Thakur et al. 2005, §4).
:func:`fold_in` and :func:`fold_out` do the two extra steps; ``rabenseifner.py`` reuses them.
"""

from __future__ import annotations

import numpy as np

from minidist.distributed.comm import Communicator
from minidist.distributed.reduce_ops import combine_ufunc, finish


def largest_power_of_two(n: int) -> int:
    """The largest power of two ``<= n`` (``n >= 1``)."""
    return 1 << (n.bit_length() - 1)


def real_rank(virtual: int, n: int) -> int:
    """The group rank that plays virtual rank ``virtual`` of the power-of-two stage (see :func:`fold_in`)."""
    extra = n - largest_power_of_two(n)
    return 2 * virtual + 1 if virtual < extra else virtual + extra


def fold_in(group: Communicator, flat: np.ndarray, op: str, scratch: np.ndarray | None) -> int | None:
    """Shrink the group to a power of two: return this rank's virtual rank, or None if it sits out.

    Ranks ``2i`` and ``2i + 1`` for ``i < r = n - p`` pair up: the even one sends ``flat`` and returns
    None; the odd one receives into ``scratch`` (``flat.size`` elements; unused elsewhere, may be None)
    and combines, ``flat = flat op theirs``, then plays virtual rank ``i``. Ranks ``>= 2r`` play virtual
    rank ``rank - r``. With ``n`` a power of two nothing is sent and the virtual rank is the rank.
    """
    n, rank = group.size, group.rank
    extra = n - largest_power_of_two(n)
    if rank >= 2 * extra:
        return rank - extra
    link = group.collective_channel
    if rank % 2 == 0:  # hand my contribution to my odd neighbour, which stands for both of us
        link.host_send(flat, rank + 1)
        return None
    assert scratch is not None, "the odd rank of a pair needs a scratch buffer of flat.size elements"
    link.host_recv(scratch, rank - 1)
    combine_ufunc(op)(flat, scratch, out=flat)
    return rank // 2


def fold_out(group: Communicator, flat: np.ndarray) -> None:
    """Undo :func:`fold_in`: each odd rank below ``2r`` sends the finished ``flat`` to its even partner."""
    n, rank = group.size, group.rank
    if rank >= 2 * (n - largest_power_of_two(n)):
        return
    link = group.collective_channel
    if rank % 2 == 0:
        link.host_recv(flat, rank + 1)
    else:
        link.host_send(flat, rank - 1)


def recursive_doubling_all_reduce(group: Communicator, flat: np.ndarray, op: str) -> None:
    """Reduce ``flat`` (1-D host array, same length on every rank) over ``group``, in place, on every rank.

    Allocates one scratch buffer of ``flat.size`` elements (none on ranks that sit out of the
    power-of-two stage). Every rank ends with bit-identical results. Collective over ``group``, on its
    ``collective_channel``. Raises ``DistributedError`` if a partner's array has a different length.
    """
    n, link = group.size, group.collective_channel
    p = largest_power_of_two(n)
    folded = n != p  # fold_in / fold_out are needed (and called) only when n is not a power of two
    sits_out = group.rank < 2 * (n - p) and group.rank % 2 == 0  # see fold_in
    scratch = None if sits_out else link.scratch(flat.size, flat.dtype)
    virtual = fold_in(group, flat, op, scratch) if folded else group.rank
    if virtual is not None:
        combine = combine_ufunc(op)
        distance = 1
        while distance < p:  # step j: swap with the rank across dimension j of the cube
            partner = real_rank(virtual ^ distance, n) if folded else virtual ^ distance  # (n = p: itself)
            link.host_sendrecv(flat, partner, scratch, partner)
            combine(flat, scratch, out=flat)
            distance *= 2
        finish(op, flat, n)  # "avg": divide once, before the result goes back to the ranks that sat out
    if folded:
        fold_out(group, flat)

"""The arrival record: which collective each rank of a group entered last, readable by every rank.

When a collective times out (``watchdog.py``), the rank that gives up knows only the peer it waited for,
and in a ring that peer is usually just waiting too. To say *who never arrived*, each communicator
created while ``MINIDIST_TIMEOUT`` is set gets an arrival record: an MPI one-sided (RMA) window with one
slot per rank holding the number and name of the last collective that rank entered. Entering is a store
into this rank's own slot (no message, no wait). Only a rank that timed out *reads* the slots
(``MPI_Rget`` from every rank), which needs nothing from the slot's owner, not even that it calls MPI:
it works exactly when some rank is stuck in a computation or waiting somewhere else. (Announcing "I
entered #k" by message would cost ``n - 1`` sends per rank per collective, piling up unread unless every
rank kept draining them.) RMA's one rule here: a window must be freed, collectively, before
``MPI_Finalize`` (MPICH fails at exit otherwise): :func:`free_records` frees them at interpreter exit.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
from mpi4py import MPI

SLOT = np.dtype([("seq", np.int64), ("name", "S24")])  # one rank's entry: 32 bytes


class ArrivalRecord:
    """Every rank's last entered collective, in an RMA window each rank can read without the others' help.
    Collective to create (``MPI_Win_allocate``): one :data:`SLOT` per rank, which every rank keeps in a
    passive-target epoch (``MPI_Win_lock_all``) for its whole life, so a read never waits for the owner.
    """

    def __init__(self, mpi_comm: MPI.Comm) -> None:
        self.size = mpi_comm.Get_size()
        self.window = MPI.Win.Allocate(SLOT.itemsize, 1, comm=mpi_comm)
        self.mine = np.frombuffer(self.window.tomemory(), dtype=SLOT, count=1)
        self.mine[0] = (0, b"")
        self.window.Lock_all()
        _records.append(self)

    def enter(self, seq: int, name: str) -> None:
        """Record that this rank entered collective number ``seq``, called ``name``: one local store."""
        self.mine[0] = (seq, name.encode()[: SLOT["name"].itemsize])
        self.window.Sync()  # make the store visible to readers (in MPI's "unified" model, a memory fence)

    def read(self, patience: float = 1.0) -> list[tuple[int, str] | None]:
        """Every rank's ``(seq, name)``, or None for a rank whose slot could not be read in ``patience`` s
        (immediate on shared memory; on a network whose one-sided operations need the target's MPI
        library, a target that never calls MPI may not answer)."""
        slots = np.zeros(self.size, dtype=SLOT)
        raw = slots.view(np.uint8).reshape(self.size, SLOT.itemsize)
        requests = [self.window.Rget([raw[r], MPI.BYTE], r) for r in range(self.size)]
        done = [False] * self.size
        give_up = time.monotonic() + patience
        while not all(done) and time.monotonic() < give_up:
            done = [finished or request.Test() for finished, request in zip(done, requests, strict=True)]
            time.sleep(0 if all(done) else 1e-4)
        return [(int(s["seq"]), s["name"].decode()) if ok else None for s, ok in zip(slots, done)]

    def free(self) -> None:
        """End the epoch and free the window; collective over the communicator."""
        self.window.Unlock_all()
        self.window.Free()


_records: list[ArrivalRecord] = []  # in creation order, which is the same on every rank


def free_records() -> None:
    """Free every arrival record before ``MPI_Finalize`` (Python runs this before mpi4py finalizes).
    Collective, in creation order, which every rank shares (creating a communicator is collective): no
    two ranks can wait on each other in different windows."""
    while _records and not MPI.Is_finalized():
        _records.pop(0).free()


def ranks(group_ranks: list[int]) -> str:
    """``"rank 3"`` or ``"ranks [0, 1, 3]"``: a list of ranks in words, for error messages."""
    return f"rank {group_ranks[0]}" if len(group_ranks) == 1 else f"ranks {group_ranks}"


def describe_arrivals(slots: Sequence[tuple[int, str] | None], seq: int, name: str) -> str:
    """Say where the ranks are relative to collective ``seq`` (``name``), from :meth:`ArrivalRecord.read`:
    ``"Arrival record of #3 all_reduce: ranks [0, 1, 2] entered it; not yet arrived: rank 3 (last entered
    #2 all_reduce)."`` A rank at ``seq`` with another name is in a *different* collective (the ranks
    disagree about the order of their calls)."""
    here, behind, elsewhere, unknown = [], [], [], []
    for rank, slot in enumerate(slots):
        if slot is None:
            unknown.append(f"rank {rank} (its record could not be read)")
        elif slot == (seq, name):
            here.append(rank)
        elif slot[0] < seq:
            last = f"last entered #{slot[0]} {slot[1]}" if slot[0] else "entered no collective on it yet"
            behind.append(f"rank {rank} ({last})")
        else:
            elsewhere.append(f"rank {rank} (in #{slot[0]} {slot[1]})")
    parts = [f"{ranks(here)} entered it"] if here else []
    if behind:
        parts.append(f"not yet arrived: {', '.join(behind)}")
    if elsewhere:
        parts.append(f"in a different collective: {', '.join(elsewhere)}")
    return f"Arrival record of #{seq} {name}: " + "; ".join(parts + unknown) + "."

"""Small metadata exchanges between ranks, as JSON bytes (no pickle), and error agreement.

A checkpoint problem seen by one rank (its shard is corrupt, its disk is full) must stop *every*
rank, or the others would wait forever in the next collective. So each step of ``save``/``load``
ends with :func:`raise_if_any`: the ranks all-gather their error (or None) and all raise the first one.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

from minidist.checkpoint.errors import CheckpointError

if TYPE_CHECKING:
    from mpi4py import MPI


def allgather_json(comm: MPI.Comm, obj: Any) -> list[Any]:
    """Every rank's JSON-serialisable ``obj``, in rank order, on every rank (MPI_Allgatherv of bytes)."""
    from mpi4py import MPI  # noqa: PLC0415  (importing mpi4py initialises MPI: only when used)

    mine = np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8)
    counts = np.zeros(comm.Get_size(), dtype=np.int64)
    comm.Allgather(np.array([mine.size], dtype=np.int64), counts)
    everyone = np.empty(int(counts.sum()), dtype=np.uint8)
    comm.Allgatherv(mine, [everyone, counts.astype(np.int32), MPI.BYTE])
    bounds = np.concatenate([[0], np.cumsum(counts)])
    return [json.loads(everyone[a:b].tobytes()) for a, b in zip(bounds[:-1], bounds[1:])]


def raise_if_any(comm: MPI.Comm, error: CheckpointError | None) -> None:
    """Collective: if any rank passes an error, raise ``CheckpointError`` on every rank.

    The lowest rank's error wins, so every rank raises the same message (naming the file at fault).
    """
    mine = None if error is None else {"problem": error.problem, "path": error.path}
    for rank, err in enumerate(allgather_json(comm, mine)):
        if err is not None:
            if error is not None and rank == comm.Get_rank():
                raise error
            prefix = "" if err["path"] else f"rank {rank}: "
            raise CheckpointError(prefix + err["problem"], err["path"])


def raise_if_any_argument_error(comm: MPI.Comm, error: Exception | None) -> None:
    """Collective: if any rank passes a bad-argument ``TypeError``/``ValueError``, raise it everywhere.

    A bad argument on one rank only (``step=-1`` there) must not leave the others waiting in the next
    collective. The lowest rank's error wins; other ranks raise the same type, prefixed with its rank.
    """
    mine = None if error is None else {"type": type(error).__name__, "message": str(error)}
    for rank, err in enumerate(allgather_json(comm, mine)):
        if err is not None:
            if error is not None and rank == comm.Get_rank():
                raise error
            kind = TypeError if err["type"] == "TypeError" else ValueError
            raise kind(f"rank {rank}: {err['message']}")


def differing(comm: MPI.Comm, values: dict[str, Any]) -> str | None:
    """Collective: compare the JSON ``values`` of every rank; describe the first field that differs.

    Returns None when every rank passed equal values, else e.g. ``"step (rank 0: 5, rank 1: 6)"``,
    the same text on every rank (so that all of them raise together).
    """
    everyone = allgather_json(comm, values)
    for field in values:
        seen = [v[field] for v in everyone]
        if any(v != seen[0] for v in seen):
            shown = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(seen) if r < 4 or v != seen[0])
            return f"{field} ({shown})"
    return None

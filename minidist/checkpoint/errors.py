"""``CheckpointError``, and how every rank comes to raise the same one.

A checkpoint problem seen by one rank (its shard is corrupt, its disk is full, a bad argument there)
must stop *every* rank, or the others would wait forever in the next collective. So each step of
``save``/``load`` runs its checks inside ``with on_every_rank(comm):``: at the end of the block the
ranks exchange their error (or None) through ``minidist.distributed.safety.agreement``, and if any rank had
one, all of them raise the lowest rank's, rebuilt as the same class with the same path.

The helpers below are ``minidist.distributed``'s, with the checkpoint's error classes filled in. They
import it when first called: importing it starts MPI, and importing ``minidist.checkpoint`` must not
(``minidist checkpoint info`` runs without MPI).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, truncated, from an incompatible model, or newer than this code.

    ``save``/``load`` raise it on *every* rank with the same message (the ranks agree through a
    collective first, so none is left waiting). ``path`` is the file or folder at fault (or None) and
    ``problem`` the bare description; ``str(error)`` names both.
    """

    def __init__(self, problem: str, path: object = None) -> None:
        # Both in args: the agreement rebuilds the error on the other ranks from its args, path included.
        super().__init__(problem, None if path is None else str(path))

    @property
    def problem(self) -> str:
        return self.args[0]

    @property
    def path(self) -> str | None:
        return self.args[1]

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}" if self.path else self.problem


class NewerFormatError(CheckpointError):
    """A checkpoint written by a newer minidist: not damaged, so ``save`` never moves it aside."""


KINDS = (CheckpointError, NewerFormatError)  # rebuilt by name on the ranks that did not raise them
LABEL = "world"  # checkpoints are collective over the whole run: "rank 1 of the world: ..."


def world_comm(mesh: Any) -> Any:
    """The ``Communicator`` of the whole run, over which the checkpoint ranks agree: the mesh's world,
    else ``dist.init()``'s."""
    world = getattr(mesh, "world", None) if mesh is not None else None
    if world is None:
        import minidist.distributed as dist  # noqa: PLC0415  (MPI only when a collective checkpoint call is made)

        world = dist.init()
    return world


@contextlib.contextmanager
def on_every_rank(comm: Any, *kinds: type[Exception]) -> Iterator[None]:
    """Collective: if the block raises one of ``kinds`` (default ``CheckpointError``) on any rank, every
    rank raises it (the lowest rank's error, prefixed ``"rank R of the world: "``).

    Every rank must enter the block; a rank whose block succeeds still takes part in the exchange at
    its end. Other exceptions pass through without one (a killed process does not agree either).
    """
    error, caught = None, kinds or (CheckpointError,)
    try:
        yield
    except caught as err:
        error = err
    import minidist.distributed as dist  # noqa: PLC0415  (MPI only when a collective checkpoint call is made)

    dist.raise_if_any(error, comm, label=LABEL, kinds=KINDS)


@contextlib.contextmanager
def any_failure(comm: Any, what: str, path: Path | None) -> Iterator[None]:
    """Collective: whatever the block raises on any rank (an ``OSError`` of a full disk, safetensors' own
    error, a ``TypeError`` from a user's sampler) becomes the same ``CheckpointError`` on every rank,
    naming the rank (``on_every_rank`` prefixes it), ``path`` and the cause. A rank that raised alone
    would leave the others waiting forever in the next collective."""
    with on_every_rank(comm):
        try:
            yield
        except CheckpointError:
            raise
        except Exception as err:  # noqa: BLE001  (any failure: every rank must learn of it)
            where = getattr(err, "filename", None) or path  # an OSError knows its file
            raise CheckpointError(f"{what} failed ({type(err).__name__}: {err})", where) from None


def agree(values: dict[str, Any], comm: Any, *, what: str, fix: str) -> None:
    """Collective: ``ValueError`` on every rank if the ranks' JSON ``values`` differ (``dist.agree``)."""
    import minidist.distributed as dist  # noqa: PLC0415

    dist.agree(values, None, comm, what=what, label=LABEL, fix=fix)


def differences(values: dict[str, Any], comm: Any) -> str | None:
    """Collective: which of the ranks' JSON ``values`` differ, e.g. ``"step (5 on rank 0; 6 on rank 1)"``,
    the same text on every rank; None if all are equal."""
    from minidist.distributed.safety.agreement import all_gather_json, describe_differences  # noqa: PLC0415

    return describe_differences(all_gather_json(values, comm))


def all_gather_json(obj: Any, comm: Any) -> list[Any]:
    """Collective: every rank's JSON ``obj``, in rank order, on every rank (``dist.all_gather_json``)."""
    import minidist.distributed as dist  # noqa: PLC0415

    return dist.all_gather_json(obj, comm)

"""The groups a ``PipelineParallel`` runs on, and agreeing on errors before raising them.

``resolve_groups`` turns what the user passed (a Communicator, None for the world, or a
``ProcessMesh``) into the pipeline group and the optional data-parallel group. ``agree`` makes a
misuse that only some ranks see (a different model, a bad argument on one rank) raise the same error on
every rank, instead of leaving the others waiting in the first message. ``gather_step`` is the small
all-gather that begins every ``train_step`` and ``predict``: it also tells which operation each rank
called, so ``predict`` on one rank while another trains is an error on both, not a garbled message.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist.distributed import Communicator


def resolve_groups(group: Any, dp_group: Communicator | None) -> tuple[Communicator, Communicator | None]:
    """(pp group, dp group) from a Communicator, None (the world) or a mesh with ``.pp_group``."""
    if group is not None and not isinstance(group, Communicator):
        pp_group = getattr(group, "pp_group", None)
        if not isinstance(pp_group, Communicator):
            raise TypeError(
                f"group must be a minidist.distributed.Communicator, None (the world) or a ProcessMesh, got "
                f"{type(group).__name__}"
            )
        if getattr(group, "pp", pp_group.size) != pp_group.size:
            raise ValueError(
                f"mismatched mesh: mesh.pp={group.pp} but its pp_group has {pp_group.size} ranks"
            )
        mesh_dp = getattr(group, "dp_group", None)
        if dp_group is not None and mesh_dp is not None and dp_group is not mesh_dp:
            raise ValueError("pass dp_group or a mesh, not both: the mesh already has a dp_group")
        return pp_group, dp_group if dp_group is not None else mesh_dp
    if dp_group is not None and not isinstance(dp_group, Communicator):
        raise TypeError(
            f"dp_group must be a minidist.distributed.Communicator or None, got {type(dp_group).__name__}"
        )
    return dist.comm.group_or_world(group), dp_group


def agree(
    group: Communicator, error: Exception | None, description: str, what: str = "pipeline group"
) -> None:
    """Raise on every rank of ``group`` if any rank has ``error`` or the ranks' descriptions differ.

    Two small all-gathers (lengths, then the UTF-8 bytes of every rank's error and description), so a
    misuse on one rank is reported by all of them instead of leaving the others waiting.
    """
    text = [(f"{type(error).__name__}: {error}" if error else "").encode(), description.encode()]
    lengths = dist.all_gather(np.array([len(t) for t in text], np.int64), group=group).reshape(-1, 2)
    blob = dist.all_gather(np.frombuffer(b"".join(text), np.uint8).copy(), group=group).tobytes()
    offsets = np.concatenate([[0], np.cumsum(lengths.reshape(-1))])
    pieces = [blob[a:b].decode() for a, b in zip(offsets[:-1], offsets[1:])]
    errors, descriptions = pieces[0::2], pieces[1::2]
    for rank, message in enumerate(errors):
        if message:
            kind = TypeError if message.startswith("TypeError") else ValueError
            raise kind(f"PipelineParallel on rank {rank} of the {what}: {message.split(': ', 1)[1]}")
    if len(set(descriptions)) > 1:
        listing = "; ".join(f"rank {r}: {d}" for r, d in enumerate(descriptions))
        raise ValueError(
            f"PipelineParallel: the ranks of the pipeline group were built differently "
            f"({listing}); build the same model with the same arguments on every rank"
        )


OPERATIONS = ("train_step", "predict")
STEP_FIELDS = 3  # integers per rank after the operation code (the same for every operation)


def gather_step(
    group: Communicator, operation: str, fields: Sequence[int]
) -> tuple[np.ndarray, ValueError | None]:
    """All-gather ``operation`` and up to ``STEP_FIELDS`` ints from every rank of ``group``.

    Returns ``(fields of every rank, shape (group.size, STEP_FIELDS), padded with -1; error)``, where
    ``error`` is a ``ValueError`` (the same on every rank) if the ranks called different operations.
    One all-gather of 4 int64 per rank, whatever the operation, so mismatched calls still pair up.
    """
    record = np.full(1 + STEP_FIELDS, -1, np.int64)
    record[0] = OPERATIONS.index(operation)
    record[1 : 1 + len(fields)] = fields
    everyone = dist.all_gather(record, group=group).reshape(group.size, 1 + STEP_FIELDS)
    codes = everyone[:, 0].tolist()
    error = None
    if len(set(codes)) > 1:
        calls = "; ".join(f"rank {r}: {OPERATIONS[c]}" for r, c in enumerate(codes))
        error = ValueError(
            f"PipelineParallel: the ranks of the pipeline group called different operations ({calls}); "
            "every rank of the group must call train_step or predict together, in the same order"
        )
    return everyone[:, 1:], error


def as_count(value: Any) -> Any:
    """``value`` as a Python int if it is an integer (an int or NumPy integer, not a bool), else itself."""
    if isinstance(value, bool):
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value

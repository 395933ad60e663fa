"""The groups a ``PipelineParallel`` runs on, and the small exchange that begins every step.

``resolve_groups`` turns what the user passed (a Communicator, None for the world, or a
``ProcessMesh``) into the pipeline group and the optional data-parallel group. (A misuse that only
some ranks see raises on every rank through ``minidist.distributed.agreement``.) ``gather_step`` is the small
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

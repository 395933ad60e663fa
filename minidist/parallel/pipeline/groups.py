"""The groups a ``PipelineParallel`` runs on, and the small exchange that begins every step.

``resolve_groups`` turns what the user passed (a Communicator, None for the world, or a
``ProcessMesh``) into the pipeline group and the optional data-parallel group. (A misuse that only
some ranks see raises on every rank through ``minidist.distributed.safety.agreement``.) ``gather_step`` is the
small exchange (an all-gather, done as an all-reduce: ``gather_ints``) that begins every ``train_step``
and ``predict``: it also tells which operation each rank called, so ``predict`` on one rank while
another trains is an error on both, not a garbled message.
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
    return dist.world.group_or_world(group), dp_group


OPERATIONS = ("train_step", "predict")
STEP_FIELDS = 3  # integers per rank after the operation code (the same for every operation)


def gather_ints(group: Communicator, values: Sequence[int]) -> list[list[int]]:
    """Every rank's ``values`` (as many ints on every rank), in rank order, as Python lists.

    One all-reduce (sum) of an int64 table with one row per rank, each rank filling its own row: the
    same result as an all-gather in one collective, where ``dist.all_gather`` (whose chunks may differ
    in length) runs two: the lengths first, then the data (issue 16: twice the messages and Python for
    these few ints, every step).
    """
    table = np.zeros((group.size, len(values)), np.int64)
    table[group.rank] = values
    return dist.all_reduce(table, op="sum", group=group).tolist()


def gather_step(
    group: Communicator, operation: str, fields: Sequence[int]
) -> tuple[list[list[int]], ValueError | None]:
    """Gather ``operation`` and up to ``STEP_FIELDS`` ints from every rank of ``group``.

    Returns ``(fields of every rank: group.size lists of STEP_FIELDS ints, padded with -1; error)``,
    where ``error`` is a ``ValueError`` (the same on every rank) if the ranks called different
    operations. One all-reduce of a (group.size, 4) int64 table (:func:`gather_ints`), whatever the
    operation, so mismatched calls still pair up.
    """
    padding = [-1] * (STEP_FIELDS - len(fields))
    everyone = gather_ints(group, [OPERATIONS.index(operation), *fields, *padding])
    codes = [row[0] for row in everyone]
    error = None
    if len(set(codes)) > 1:
        calls = "; ".join(f"rank {r}: {OPERATIONS[c]}" for r, c in enumerate(codes))
        error = ValueError(
            f"PipelineParallel: the ranks of the pipeline group called different operations ({calls}); "
            "every rank of the group must call train_step or predict together, in the same order"
        )
    return [row[1:] for row in everyone], error


def as_count(value: Any) -> Any:
    """``value`` as a Python int if it is an integer (an int or NumPy integer, not a bool), else itself."""
    if isinstance(value, bool):
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value

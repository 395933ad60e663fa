"""The groups a ``PipelineParallel`` runs on.

``resolve_groups`` turns what the user passed (a Communicator, None for the world, or a
``ProcessMesh``) into the pipeline group and the optional data-parallel group. (A misuse that only
some ranks see raises on every rank through ``minidist.distributed.safety.agreement``.) ``as_count``
lets NumPy integers pass where counts are expected. The small exchange that begins every step is
``step_checks.py``.
"""

from __future__ import annotations

import operator
from typing import Any

import minidist.distributed as dist
from minidist.distributed.comm import Communicator  # any kind: group_or_world says which it takes


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
    return dist.world.group_or_world(group), None if dp_group is None else dist.world.group_or_world(dp_group)


def as_count(value: Any) -> Any:
    """``value`` as a Python int if it is an integer (an int or NumPy integer, not a bool), else itself."""
    if isinstance(value, bool):
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value

"""One-process stand-ins for tensor-parallel argument checks (tests of the errors raised before any message).

``fake_group(size, rank)`` is a Communicator that claims ``size`` ranks and never communicates; the
``same_arguments_everywhere`` fixture (tests/conftest.py) makes the construction-time agreement see every
rank pass this rank's arguments. The real exchanges run in the MPI workers
(tests/workers/tensor_parallel/tp_errors.py, tp_gpt_errors.py).
"""

from __future__ import annotations

from minidist.distributed import Communicator


def fake_group(size: int, rank: int = 0) -> Communicator:
    """A Communicator of ``size`` ranks that never communicates: enough for checks made before any message."""
    group = Communicator.__new__(Communicator)  # skips __init__ (which would duplicate an MPI communicator)
    group.size, group.rank = size, rank
    return group

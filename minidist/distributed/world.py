"""The world communicator (every process of the job) and the module-level shortcuts of ``dist``.

``init()`` builds the world once per process: it finds this process's rank on its machine (and so the
GPU it uses), how many machines the job spans and their host names, and returns the world
:class:`~minidist.distributed.comm.Communicator`. ``get_rank``, ``get_world_size``, ``send`` and ``recv``
take a ``group`` and default to the world, as ``torch.distributed``'s do.
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from minidist import backend
from minidist.distributed import seam
from minidist.distributed.comm import Communicator

# The only global state of dist: the world communicator, this process's rank on its node, the number
# of nodes the world spans and the host name of every world rank (for messages naming a rank's node).
_world: Communicator | None = None
_local_rank: int | None = None
_node_count = 1
hosts: tuple[str, ...] = ()


def init() -> Communicator:
    """Set up the world communicator (all processes of the job) and return it; idempotent.

    Collective the first time: every rank must call it. Also finds this process's *node-local* rank (its
    rank among the processes sharing its machine, via ``MPI_Comm_split_type(COMM_TYPE_SHARED)``) and
    pins the process to GPU ``local_rank % n_gpus`` through ``minidist.backend.use_local_rank``
    (a no-op on the CPU backend). The world is built as ``seam.communicator_class`` and then handed to
    each of ``seam.on_init``: with the safety net installed, a watched communicator, and with more than
    one rank the hook that makes an uncaught exception abort every rank and the liveness watchdog thread
    (``safety/``). Raises ``ValueError`` for a malformed ``MINIDIST_TIMEOUT``, ``MINIDIST_ABORT_GRACE``,
    ``MINIDIST_WATCHDOG`` or ``MINIDIST_PEER_TIMEOUT``.
    """
    global _world, _local_rank, _node_count, hosts
    if _world is None:
        world = MPI.COMM_WORLD
        node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
        _local_rank = node.Get_rank()
        node.Free()
        if world.Get_size() > 1:
            # Each rank's host, and whether it leads its node (local rank 0): the number of nodes tells
            # "auto" whether any group can span nodes; the hosts name an unreachable rank's node.
            ranks = world.allgather((MPI.Get_processor_name(), _local_rank == 0))
            _node_count = sum(leader for _, leader in ranks)
            hosts = tuple(host for host, _ in ranks)
        backend.use_local_rank(_local_rank)
        _world = seam.communicator_class(world, name="world")
        for start in seam.on_init:
            start(_world)
    return _world


def is_initialized() -> bool:
    """True once :func:`init` has run in this process."""
    return _world is not None


def group_or_world(group: Communicator | None) -> Communicator:
    """``group`` itself, or the world communicator for ``None`` (calling :func:`init` if needed).

    Raises ``TypeError`` if ``group`` is not a communicator of the installed class (``seam.py``): a raw
    mpi4py communicator, or ``comm.py``'s bare class built by hand, which lacks what the collectives
    run with (call numbers, deadlines, the liveness watchdog).
    """
    if group is None:
        return init()
    if not isinstance(group, seam.communicator_class):
        got = type(group).__name__
        if isinstance(group, Communicator):
            got = f"the bare {type(group).__module__}.{got} (no call numbers, no deadlines)"
        raise TypeError(
            f"group must be a minidist.distributed.Communicator or None (the world), got {got}; "
            "wrap a raw mpi4py communicator with minidist.distributed.Communicator(comm)"
        )
    return group


def get_rank(group: Communicator | None = None) -> int:
    """This process's rank in ``group`` (default: the world)."""
    return group_or_world(group).rank


def get_world_size(group: Communicator | None = None) -> int:
    """The number of ranks in ``group`` (default: the world)."""
    return group_or_world(group).size


def get_local_rank() -> int:
    """This process's rank among the processes on the same machine (calls :func:`init` if needed)."""
    init()
    assert _local_rank is not None  # set by init()
    return _local_rank


def node_count() -> int:
    """The number of machines (shared-memory nodes) the world's ranks run on (calls :func:`init`)."""
    init()
    return _node_count


def send(a: Any, dst: int, group: Communicator | None = None, tag: int = 0) -> None:
    """Send array ``a`` to rank ``dst`` of ``group``; see :meth:`Communicator.send`."""
    group_or_world(group).send(a, dst, tag)


def recv(a: Any, src: int, group: Communicator | None = None, tag: int = 0) -> Any:
    """Receive from rank ``src`` of ``group`` into array ``a``; see :meth:`Communicator.recv`."""
    return group_or_world(group).recv(a, src, tag)

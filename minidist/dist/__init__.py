"""``minidist.dist``: processes that talk to each other, with hand-written collectives.

Reading order: ``comm.py`` (communicators, send/recv) -> ``ring.py`` (ring all-reduce) -> ``broadcast.py``
(binomial tree) -> ``collectives.py`` (the public entry points) -> ``mpi_builtin.py`` (MPI's own
collectives, the reference). ``staging.py`` moves GPU arrays through host memory; ``reduce_ops.py``
names the reductions; ``validate.py`` checks arguments; ``errors.py`` holds our exceptions.

This package uses only ``minidist.backend`` from the rest of minidist: it knows nothing of autograd or
modules. Importing it initialises MPI.
"""

from minidist.dist.collectives import ALGORITHMS, all_gather, all_reduce, broadcast, reduce_scatter
from minidist.dist.comm import (
    Communicator,
    barrier,
    get_local_rank,
    get_rank,
    get_world_size,
    init,
    is_initialized,
    recv,
    send,
)
from minidist.dist.errors import CollectiveMismatchError, CollectiveTimeoutError, DistributedError
from minidist.dist.reduce_ops import REDUCE_OPS
from minidist.dist.staging import mpi_is_cuda_aware

__all__ = [
    "ALGORITHMS",
    "REDUCE_OPS",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "Communicator",
    "DistributedError",
    "all_gather",
    "all_reduce",
    "barrier",
    "broadcast",
    "get_local_rank",
    "get_rank",
    "get_world_size",
    "init",
    "is_initialized",
    "mpi_is_cuda_aware",
    "recv",
    "reduce_scatter",
    "send",
]

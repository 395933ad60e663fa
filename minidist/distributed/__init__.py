"""``minidist.distributed``: processes that talk to each other, with hand-written collectives.

Reading order, the mechanism: ``comm.py`` (a communicator: send, recv, sendrecv, one MPI call each) ->
``world.py`` (``init()``, the world and its shortcuts) -> ``algorithms/`` (one collective algorithm per
file, ring all-reduce first) -> ``collectives.py`` (the public entry points: check, pick, stage, run)
-> ``tuning.py`` (what ``algorithm="auto"`` picks) -> ``topology.py`` (which ranks share a node).
``p2p_batch.py`` adds non-blocking sends and receives (the interleaved pipeline's);
``staging.py`` moves GPU arrays through host memory; ``reduce_ops.py`` names the reductions;
``checks.py`` checks arguments; ``errors.py`` holds our exceptions.

The safety net, fenced off in ``safety/`` and installed around the mechanism by the one call below
(``seam.py`` says how): tagged messages, deadlines (``MINIDIST_TIMEOUT``), the liveness watchdog (on by
default), debug fingerprints (``MINIDIST_DEBUG=1``), trace spans, and how every rank comes to raise
the same error (``safety/agreement.py``). With the default settings it changes no result.

This package uses only ``minidist.backend`` and ``minidist.trace`` from the rest of minidist: it knows
nothing of autograd or modules. Importing it initialises MPI.
"""

from minidist.distributed import safety

safety.install()  # before anything below can make a communicator

from minidist.distributed.collectives import (  # noqa: E402
    all_gather,
    all_reduce,
    barrier,
    broadcast,
    reduce,
    reduce_scatter,
)
from minidist.distributed.errors import (  # noqa: E402
    CollectiveMismatchError,
    CollectiveTimeoutError,
    DistributedError,
)
from minidist.distributed.reduce_ops import REDUCE_OPS  # noqa: E402
from minidist.distributed.safety.agreement import agree, all_gather_json, raise_if_any  # noqa: E402
from minidist.distributed.safety.calls import collective_call  # noqa: E402
from minidist.distributed.safety.debug import debug_enabled  # noqa: E402
from minidist.distributed.safety.watchdog import abort, timeout_seconds  # noqa: E402

# dist.Communicator(raw_mpi_comm) wraps a communicator as init() and split() do: watched (seam.py).
from minidist.distributed.safety.watched import WatchedCommunicator as Communicator  # noqa: E402
from minidist.distributed.staging import mpi_is_cuda_aware  # noqa: E402
from minidist.distributed.tuning import ALGORITHMS  # noqa: E402
from minidist.distributed.world import (  # noqa: E402
    get_local_rank,
    get_rank,
    get_world_size,
    init,
    is_initialized,
    recv,
    send,
)

__all__ = [
    "init", "is_initialized", "get_rank", "get_world_size", "get_local_rank", "Communicator",
    "send", "recv", "all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "barrier",
    "REDUCE_OPS", "ALGORITHMS", "mpi_is_cuda_aware",
    "DistributedError", "CollectiveMismatchError", "CollectiveTimeoutError",
    "collective_call", "agree", "all_gather_json", "raise_if_any", "abort", "timeout_seconds",
    "debug_enabled",
]  # fmt: skip

"""``minidist.distributed``: processes that talk to each other, with hand-written collectives.

Reading order: ``comm.py`` (communicators, send/recv; ``p2p_batch.py`` adds non-blocking ones, for the
interleaved pipeline) -> ``ring.py`` (ring all-reduce, reduce-scatter,
all-gather) -> ``recursive_doubling.py`` (all-reduce for short messages; folding a group to a power of
two) -> ``rabenseifner.py`` (all-reduce for long messages in ``2 log2 n`` steps) ->
``recursive_halving.py`` (reduce-scatter in ``log2 n`` steps) -> ``broadcast.py``
(binomial tree) -> ``scatter_allgather.py`` (broadcast for long messages) -> ``tree_reduce.py``
(binomial-tree reduce to one rank) -> ``topology.py`` (which ranks share a node) -> ``hierarchical.py``
(all-reduce inside nodes, then across them) -> ``tuning.py`` (what ``algorithm="auto"`` picks) ->
``collectives.py`` (the public entry points) -> ``mpi_builtin.py`` (MPI's own collectives, the
reference). ``staging.py`` moves GPU arrays through host memory; ``reduce_ops.py`` names the
reductions; ``validate.py`` checks arguments; ``errors.py`` holds our exceptions; ``traffic.py``
counts the bytes each rank sends, per group and call, for the trace; ``agreement.py`` makes every rank
raise the same error when any rank sees a problem (used by every layer above).

When things go wrong: ``tags.py`` (every message of a collective names its call) -> ``liveness.py``
(on by default: a watchdog thread names a rank that left, a message of another call, a collective
stuck for ``MINIDIST_WATCHDOG`` seconds, and ends the job) -> ``debug.py`` (``MINIDIST_DEBUG=1``:
ranks compare each collective call, call site (``call_site.py``) included, before running it; also home of the
``@collective_call`` hook and ``barrier``) -> ``watchdog.py``
(``MINIDIST_TIMEOUT=seconds``: waits with a deadline; an uncaught exception aborts the whole job,
after ``MINIDIST_ABORT_GRACE`` seconds) -> ``arrivals.py`` (which collective each rank entered last) ->
``report.py`` (``exit_with_error``: a script's fatal error printed once, naming the ranks that raised it).

This package uses only ``minidist.backend`` and ``minidist.trace`` from the rest of minidist: it knows
nothing of autograd or modules. Importing it initialises MPI.
"""

from minidist.distributed.collectives import (
    ALGORITHMS,
    all_gather,
    all_reduce,
    broadcast,
    reduce,
    reduce_scatter,
)
from minidist.distributed.comm import Communicator
from minidist.distributed.errors import CollectiveMismatchError, CollectiveTimeoutError, DistributedError
from minidist.distributed.reduce_ops import REDUCE_OPS
from minidist.distributed.safety.agreement import agree, all_gather_json, raise_if_any
from minidist.distributed.safety.debug import barrier, collective_call, debug_enabled
from minidist.distributed.safety.report import exit_with_error
from minidist.distributed.safety.watchdog import abort, timeout_seconds
from minidist.distributed.staging import mpi_is_cuda_aware
from minidist.distributed.world import (
    get_local_rank,
    get_rank,
    get_world_size,
    init,
    is_initialized,
    recv,
    send,
)

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
    "collective_call",
    "debug_enabled",
    "get_local_rank",
    "get_rank",
    "get_world_size",
    "init",
    "abort",
    "exit_with_error",
    "agree",
    "all_gather_json",
    "raise_if_any",
    "is_initialized",
    "mpi_is_cuda_aware",
    "recv",
    "reduce",
    "reduce_scatter",
    "send",
    "timeout_seconds",
]

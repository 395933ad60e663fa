"""Data parallelism: every rank holds the whole model and a slice of each global batch.

Reading order: ``naive.py`` (``DataParallelNaive``: the two rules, identical start and averaged
gradients, with one all-reduce per parameter) -> ``ddp.py`` (``DistributedDataParallel``, the real one:
buckets, overlap, ``no_sync``, ``join``) -> ``buckets.py`` (which gradients share one all-reduce) ->
``launch.py`` (where and when each bucket's all-reduce runs) -> ``comm_thread.py`` (the thread that runs
them during backward). Last, ``checks.py``: the options agreed across the group before DDP is built,
and the bookkeeping that makes every rank raise the same error instead of hanging.
"""

from minidist.parallel.data_parallel.ddp import DistributedDataParallel
from minidist.parallel.data_parallel.naive import DataParallelNaive

__all__ = ["DataParallelNaive", "DistributedDataParallel"]

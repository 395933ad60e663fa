"""Data parallelism: every rank holds the whole model and a slice of each global batch.

Reading order: ``ddp.py`` (``DistributedDataParallel``: buckets, overlap, ``no_sync``) ->
``buckets.py`` (which gradients share one all-reduce) -> ``launch.py`` (where and when each bucket's
all-reduce runs) -> ``comm_thread.py`` (the thread that runs them during backward). ``checks.py`` holds
the agreement checks that make every rank raise the same error.
"""

from minidist.parallel.data_parallel.ddp import DistributedDataParallel

__all__ = ["DistributedDataParallel"]

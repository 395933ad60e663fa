"""Parallel training strategies built from autograd Functions and ``dist`` collectives."""

from minidist.parallel.data_parallel import DistributedDataParallel
from minidist.parallel.zero import ZeroRedundancyOptimizer

__all__ = ["DistributedDataParallel", "ZeroRedundancyOptimizer"]

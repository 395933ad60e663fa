"""Parallel training strategies built from autograd Functions and ``dist`` collectives."""

from minidist.parallel.data_parallel import DistributedDataParallel

__all__ = ["DistributedDataParallel"]

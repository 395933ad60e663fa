"""Fully sharded data parallelism (ZeRO stage 3, PyTorch's FSDP): parameters, gradients and optimizer
state all sharded over the data-parallel group, each unit gathered only while it computes.

Reading order: ``units.py`` (which parameters form which unit) -> ``flat_unit.py`` (one unit's
sharded flat vector: gather, free, reduce-scatter) -> ``fully_sharded.py`` (the Module wrapper:
forward, backward under recomputation, prefetch, the optimizer's view, full state dicts).
"""

from minidist.parallel.fsdp.fully_sharded import FullyShardedDataParallel

__all__ = ["FullyShardedDataParallel"]

"""Fully sharded data parallelism (ZeRO stage 3, PyTorch's FSDP): parameters, gradients and optimizer
state all sharded over the data-parallel group, each unit gathered only while it computes.

Reading order: ``units.py`` (which parameters form which unit) -> ``flat_unit.py`` (one unit's
sharded flat vector: gather, free, reduce-scatter) -> ``schedule.py`` (when: each unit under
recomputation, prefetch, the end of backward) -> ``fully_sharded.py`` (the Module wrapper and its public
API) -> ``state.py`` (full state dicts, the optimizer's groups).
"""

from minidist.parallel.fsdp.fully_sharded import FullyShardedDataParallel

__all__ = ["FullyShardedDataParallel"]

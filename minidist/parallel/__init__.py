"""Parallel training strategies built from autograd Functions and ``dist`` collectives.

Reading order: ``data_parallel/`` (a naive wrapper, then DDP) and ``zero/`` -> ``fsdp/`` (ZeRO-3,
parameters sharded too) -> ``mesh.py`` (the dp x tp x pp x cp grid) -> ``tensor_parallel/`` (Megatron-LM
layers) -> ``clip_grad.py`` (the global gradient norm over shards) -> ``pipeline/`` (a naive GPipe, then
stages, schedules as data, the executor) -> ``context_parallel/`` (the sequence split over ranks, ring
attention). ``agreed.py`` is where every parallel layer meets its argument checks (``checks`` in each
folder, read last); ``comm_hooks/`` compress DDP's gradient all-reduces.
"""

from minidist.parallel.clip_grad import clip_grad_norm_
from minidist.parallel.data_parallel import DistributedDataParallel
from minidist.parallel.fsdp import FullyShardedDataParallel
from minidist.parallel.mesh import ProcessMesh
from minidist.parallel.pipeline import PipelineParallel
from minidist.parallel.tensor_parallel import ColumnParallelLinear, ParallelMLP, RowParallelLinear
from minidist.parallel.zero import ZeroRedundancyOptimizer

__all__ = [
    "ColumnParallelLinear",
    "DistributedDataParallel",
    "FullyShardedDataParallel",
    "ParallelMLP",
    "PipelineParallel",
    "ProcessMesh",
    "RowParallelLinear",
    "ZeroRedundancyOptimizer",
    "clip_grad_norm_",
]

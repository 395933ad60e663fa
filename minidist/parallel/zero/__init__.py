"""ZeRO stages 1 and 2 (Rajbhandari et al., SC 2020, §5): optimizer state and gradients sharded over ranks.

Reading order: ``optimizer.py`` (``ZeroRedundancyOptimizer``: reduce-scatter, step the shard,
all-gather) -> ``layout.py`` (which rank owns which elements) -> ``groups.py`` (parameter groups over
shards) -> ``clip.py`` (clipping by the norm of gradients that exist only as shards) -> ``memory.py``
(the paper's bytes per rank, and the report that measures them). Last, ``checks.py``: the arguments
checked and agreed across the group before the optimizer's body runs, so every rank raises the same error.
"""

from minidist.parallel.zero.optimizer import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer"]

"""ZeRO stages 1 and 2 (Rajbhandari et al., SC 2020, §5): optimizer state and gradients sharded over ranks.

Reading order: ``optimizer.py`` (``ZeroRedundancyOptimizer``) -> ``layout.py`` (which rank owns which
elements) -> ``groups.py`` (parameter groups over shards) -> ``clip.py`` (clipping by the norm of
gradients that exist only as shards). ``checks.py`` holds the argument and agreement checks.
"""

from minidist.parallel.zero.optimizer import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer"]

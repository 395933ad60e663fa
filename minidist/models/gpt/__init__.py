"""The GPT: one process (``model.py``, ``transformer.py``), as pipeline layers (``pipeline.py``), and cut
over a mesh (``parallel.py``, ``parallel_layers.py``), with the pieces put back together (``gather.py``).
"""

from minidist.models.gpt.gather import gather_gpt
from minidist.models.gpt.model import GPT, GPTConfig
from minidist.models.gpt.parallel import ParallelGPT

__all__ = ["GPT", "GPTConfig", "ParallelGPT", "gather_gpt"]

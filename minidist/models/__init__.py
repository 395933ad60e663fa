"""Ready-made models built from ``minidist.nn`` (and, for a mesh with tp > 1, tensor-parallel layers)."""

from minidist.models.gpt import GPT, GPTConfig
from minidist.models.mlp import MLP
from minidist.models.parallel_gpt import ParallelGPT
from minidist.models.parallel_gpt_gather import gather_gpt

__all__ = ["MLP", "GPT", "GPTConfig", "ParallelGPT", "gather_gpt"]

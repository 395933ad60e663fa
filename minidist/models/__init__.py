"""Ready-made models built from ``minidist.nn`` (and, for a mesh with tp > 1, tensor-parallel layers)."""

from minidist.models.gpt import GPT, GPTConfig, ParallelGPT, gather_gpt
from minidist.models.mlp import MLP

__all__ = ["MLP", "GPT", "GPTConfig", "ParallelGPT", "gather_gpt"]

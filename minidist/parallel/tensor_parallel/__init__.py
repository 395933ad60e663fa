"""Tensor parallelism, Megatron-LM style (Shoeybi et al. 2019, §3): one layer's weights split over a group.

Reading order: ``mappings.py`` (the f and g operators and their gather/scatter variants: all the
communication) -> ``layers.py`` (``ColumnParallelLinear``, ``RowParallelLinear``) -> ``mlp.py``
(``ParallelMLP``: column then row, one all-reduce each way) -> ``vocab_parallel.py`` (the embedding
split over the vocabulary) and ``vocab_parallel_loss.py`` (the cross-entropy of vocabulary-sharded
logits, never gathered) -> ``random.py`` (the RNG tracker: dropout masks per rank on sharded
activations, shared on replicated ones; and the generator a layer's ranks share when it is built) ->
``sequence_parallel.py`` (the LayerNorm regions split along the sequence: all-gather / reduce-scatter
instead of all-reduce; ``sequence_parallel_linear.py``: the column layer that keeps only its input's
shard) -> ``cut.py`` (a full layer cut into this rank's piece) -> ``transformer.py`` (the GPT block:
heads split, MLP column then row, optionally sequence parallel). Last, ``checks/``: every layer's
arguments compared across its group before the layer's own code runs (``@agreed_arguments``,
``minidist/parallel/agreed.py``), so a mismatch raises on every rank. The process grid these groups come from
is
``minidist/parallel/mesh.py``; gradient clipping over shards is ``minidist/parallel/clip_grad.py``.
"""

from minidist.parallel.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, shard_parameter
from minidist.parallel.tensor_parallel.mappings import (
    copy_to_tensor_parallel_region,
    gather_from_tensor_parallel_region,
    reduce_from_tensor_parallel_region,
    scatter_to_tensor_parallel_region,
)
from minidist.parallel.tensor_parallel.mlp import ParallelMLP
from minidist.parallel.tensor_parallel.random import (
    RNGStatesTracker,
    get_rng_tracker,
    model_parallel_manual_seed,
)
from minidist.parallel.tensor_parallel.sequence_parallel import (
    allreduce_sequence_parallel_grads,
    gather_from_sequence_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
)
from minidist.parallel.tensor_parallel.transformer import (
    ParallelBlock,
    ParallelCausalSelfAttention,
    ParallelFeedForward,
)
from minidist.parallel.tensor_parallel.vocab_parallel import VocabParallelEmbedding
from minidist.parallel.tensor_parallel.vocab_parallel_loss import vocab_parallel_cross_entropy

__all__ = [
    "ColumnParallelLinear", "RowParallelLinear", "shard_parameter", "ParallelMLP",
    "copy_to_tensor_parallel_region", "reduce_from_tensor_parallel_region",
    "scatter_to_tensor_parallel_region", "gather_from_tensor_parallel_region",
    "RNGStatesTracker", "get_rng_tracker", "model_parallel_manual_seed",
    "scatter_to_sequence_parallel_region", "gather_from_sequence_parallel_region",
    "reduce_scatter_to_sequence_parallel_region", "allreduce_sequence_parallel_grads",
    "ParallelBlock", "ParallelCausalSelfAttention", "ParallelFeedForward",
    "VocabParallelEmbedding", "vocab_parallel_cross_entropy",
]  # fmt: skip

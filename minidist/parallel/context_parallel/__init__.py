"""Context parallelism: the sequence axis split over a cp group, attention computed by ring attention.

A transformer's activations grow with the sequence length T; past a few thousand tokens they no longer
fit one device even with tensor parallelism. Context parallelism gives each of cp ranks T/cp of the
tokens of every sequence. Every layer but attention works token by token, so it runs on the local
tokens unchanged (the weights are replicated over cp: their gradients are averaged over the mesh's
``dp_cp_group``, as data parallelism's are). Attention needs every query to meet every key; ring
attention passes the key/value blocks round the cp ranks.

Reading order: ``split.py`` (which tokens a rank holds: the balanced causal layout, 2 cp chunks with
rank r holding r and 2cp-1-r) -> ``ring_pass.py`` (one hop round the ring, started before the compute
it overlaps) -> ``ring_attention.py`` (the online softmax forward and its backward; the causal plan of
which blocks to compute) -> ``checks.py`` (arguments agreed across the group). The grid the cp group
comes from is ``minidist/parallel/mesh.py`` (``ProcessMesh(dp, tp, pp, cp)``).

Sources: Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise Transformers for Near-Infinite
Context"; Milakov & Gimelshein 2018 (online softmax); Dao et al. 2022 (FlashAttention); the balanced
("zigzag") split as in Megatron-LM's context parallelism.
"""

from minidist.parallel.context_parallel.ring_attention import (
    Block,
    RingAttention,
    attention_blocks,
    ring_attention,
)
from minidist.parallel.context_parallel.split import (
    LAYOUTS,
    all_gather_from_context_parallel,
    context_parallel_chunks,
    context_parallel_positions,
    gather_from_context_parallel,
    split_for_context_parallel,
)

__all__ = [
    "LAYOUTS", "split_for_context_parallel", "context_parallel_chunks", "context_parallel_positions",
    "gather_from_context_parallel", "all_gather_from_context_parallel",
    "attention_blocks", "ring_attention", "RingAttention", "Block",
]  # fmt: skip

"""The arithmetic of 4-D transformer parallelism: activation memory and the bytes each group moves.

:mod:`minidist_tools.perfmodel.step` turns costs into seconds; this module counts the two quantities that
decide how to split a transformer: how many bytes of activations one layer keeps for backward on one rank,
and how many bytes each process group sends per training step. Pure arithmetic, no MPI. Symbols as in
Korthikanti et al. 2022: ``s`` sequence length, ``b`` microbatch size, ``h`` hidden width, ``a``
attention heads, ``t`` tensor-parallel size, ``L`` layers.

**Memory** (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", 2022,
§4). One pre-norm layer keeps, per token and per width unit: LayerNorm inputs (2 of them), attention's
QKV input, Q and K, V, the projection input, MLP inputs (1 h and 4 h) and the GELU input (4 h): ``16 h``
values; dropout masks after attention and after the MLP: ``2 h`` mask bytes; and per head the softmax
output, its dropout mask and the dropout output: ``2 a s`` values and ``a s`` mask bytes. With values
of 2 bytes and 1-byte masks that is the paper's ``s b h (34 + 5 a s / h)`` bytes.

* Tensor parallelism (§4.2.1) splits everything inside the attention and MLP regions over ``t`` ranks,
  but not the LayerNorm inputs, nor the inputs of the first linear layers, nor the dropout masks after
  the regions: ``s b h (10 + 24 / t + 5 a s / (h t))``.
* Sequence parallelism (§4.2.2) splits the remainder along the sequence: ``s b h (34 + 5 a s / h) / t``.

**Communication**, counted as the bytes *one rank sends* (a ring sends what it receives). A ring
all-reduce of N bytes over n ranks sends ``2 (n - 1) / n N`` per rank; a reduce-scatter or an
all-gather (N = the full, unsplit buffer) ``(n - 1) / n N`` each (Patarasuk & Yuan, JPDC 2009), so an
all-reduce moves exactly what a reduce-scatter followed by an all-gather moves: that is why sequence
parallelism costs no extra bandwidth (Korthikanti et al. §4.2.2), but for one thing: to store only a
1/t shard of a column layer's input, its backward all-gathers the input again (Megatron-LM and
minidist do; ``regather`` below).
"""

from __future__ import annotations

from numbers import Integral
from typing import Any, NamedTuple


class Traffic(NamedTuple):
    """Bytes one rank sends in one training step, in the forward and in the backward pass."""

    forward: float
    backward: float

    @property
    def total(self) -> float:
        """``forward + backward`` bytes."""
        return self.forward + self.backward


def activation_memory_per_layer(
    seq: int,
    batch: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    bytes_per_value: float = 2,
    mask_bytes: float = 1,
) -> float:
    """Bytes of activations one transformer layer keeps for backward on one tensor-parallel rank.

    ``seq`` s tokens (with context parallelism: this rank's ``T / cp``), ``batch`` b sequences, width
    ``hidden`` h, ``heads`` a, ``tp`` t ranks. ``bytes_per_value``: 2 for 16-bit activations, 4 for
    float32; ``mask_bytes``: bytes per dropout-mask entry, 1 as in the paper, 0 without dropout (no
    mask is kept). With the defaults the three cases are the paper's formulas (Korthikanti et al.
    2022, §4, eq. 1-3): ``sbh(34 + 5as/h)``, ``sbh(10 + 24/t + 5as/(ht))`` with ``tp`` and
    ``sbh(34 + 5as/h) / t`` with ``tp`` and sequence parallelism. Raises ``ValueError`` for sizes < 1
    or ``sequence_parallel`` without ``tp > 1``.
    """
    for value, name in ((seq, "seq"), (batch, "batch"), (hidden, "hidden"), (heads, "heads"), (tp, "tp")):
        _check_positive_int(value, name)
    if sequence_parallel and tp == 1:
        raise ValueError("sequence_parallel splits over the tensor-parallel group: it needs tp > 1")
    e, m = bytes_per_value, mask_bytes
    sbh = seq * batch * hidden
    # Kept whole on every rank under plain tp: 2 LayerNorm inputs, attention's and the MLP's input (the
    # f operator copies them), and the 2 dropout masks after the row-parallel layers.
    replicated = sbh * (4 * e + 2 * m)
    # Inside the tp regions, split over the heads / the 4h features: Q, K, V, the projection input,
    # the MLP's 4h input of its second layer and the GELU input (12 h values per token)...
    split = sbh * 12 * e
    # ...and per head the softmax output, its dropout mask and the dropout output (a s values each).
    scores = seq * batch * heads * seq * (2 * e + m)
    if sequence_parallel:
        return (replicated + split + scores) / tp
    return replicated + (split + scores) / tp


def all_reduce_bytes(nbytes: float, n: int) -> float:
    """Bytes one rank sends in a ring all-reduce of ``nbytes``: ``2 (n - 1) / n`` of it (0 for n = 1)."""
    _check_positive_int(n, "n")
    return 2 * (n - 1) / n * nbytes


def recursive_doubling_bytes(nbytes: float, n: int) -> float:
    """Bytes one rank sends in a recursive-doubling all-reduce of ``nbytes`` over ``n`` ranks, ``n`` a
    power of two: ``log2 n`` exchanges of the whole array, ``log2(n) N`` (Thakur, Rabenseifner & Gropp
    2005). From n = 4 on that is more than the ring's ``2 (n-1)/n N`` (2 N against 1.5 N), in fewer
    messages, which is why minidist's ``algorithm="auto"`` runs it for short arrays only
    (``minidist/distributed/tuning.py``). Raises ``ValueError`` for an ``n`` that is not a power of two
    (the fold to one makes the ranks send different amounts)."""
    _check_positive_int(n, "n")
    if n & (n - 1):
        raise ValueError(f"recursive doubling folds {n} ranks to a power of two first: give a power of two")
    return (n.bit_length() - 1) * nbytes


def reduce_scatter_bytes(nbytes: float, n: int) -> float:
    """Bytes one rank sends in a ring reduce-scatter of a full buffer of ``nbytes``: ``(n - 1) / n``."""
    _check_positive_int(n, "n")
    return (n - 1) / n * nbytes


def all_gather_bytes(nbytes: float, n: int) -> float:
    """Bytes one rank sends in a ring all-gather whose *result* has ``nbytes``: ``(n - 1) / n`` of it."""
    _check_positive_int(n, "n")
    return (n - 1) / n * nbytes


def tensor_parallel_bytes_per_layer(
    batch: int,
    seq: int,
    hidden: int,
    tp: int,
    sequence_parallel: bool = False,
    bytes_per_value: float = 4,
    regather: bool = True,
) -> Traffic:
    """Bytes one rank sends over its tp group for one transformer layer in one step.

    Forward: 2 all-reduces (g) of the ``batch x seq x hidden`` activations, after attention and after
    the MLP; backward: 2 more (f, before each region) (Shoeybi et al. 2019, §3, Fig. 4). Under sequence
    parallelism each becomes an all-gather before the region and a reduce-scatter after it, forward
    and backward (Korthikanti et al. 2022, §4.2.2): the same bytes. ``regather`` (sequence parallelism
    only): the two column-parallel layers keep just their input's sequence shard and all-gather it
    again in backward for their weight gradient (Megatron-LM's implementation, and minidist's
    ``ParallelBlock``): 2 more all-gathers per layer in backward, the price of storing 1/tp of the input.
    ``seq``: the tokens this rank's tp group works on (``T / cp`` under context parallelism).
    """
    _check_positive_int(tp, "tp")
    nbytes = batch * seq * hidden * bytes_per_value
    if not sequence_parallel:
        one = all_reduce_bytes(nbytes, tp)
        return Traffic(forward=2 * one, backward=2 * one)
    one = all_gather_bytes(nbytes, tp) + reduce_scatter_bytes(nbytes, tp)  # one region, one pass
    again = 2 * all_gather_bytes(nbytes, tp) if regather else 0.0
    return Traffic(forward=2 * one, backward=2 * one + again)


def tensor_parallel_bytes(
    layers: int,
    batch: int,
    seq: int,
    hidden: int,
    tp: int,
    sequence_parallel: bool = False,
    bytes_per_value: float = 4,
    regather: bool = True,
) -> Traffic:
    """Bytes one rank sends over its tp group in one step of a whole GPT: ``layers`` layers (above)
    plus the vocabulary-parallel embedding's all-reduce of its output (forward only; a reduce-scatter
    under sequence parallelism) and the output head's f (its input's gradient all-reduced in backward;
    an all-gather forward and a reduce-scatter backward under sequence parallelism). The loss's own
    all-reduces are :func:`vocab_parallel_loss_bytes`; ``regather`` as in
    :func:`tensor_parallel_bytes_per_layer` (the head's input is not gathered again)."""
    _check_positive_int(layers, "layers")
    per_layer = tensor_parallel_bytes_per_layer(
        batch, seq, hidden, tp, sequence_parallel, bytes_per_value, regather
    )
    embedding, head = vocabulary_ends_bytes(batch, seq, hidden, tp, sequence_parallel, bytes_per_value)
    return Traffic(
        layers * per_layer.forward + embedding.forward + head.forward,
        layers * per_layer.backward + embedding.backward + head.backward,
    )


def vocabulary_ends_bytes(
    batch: int, seq: int, hidden: int, tp: int, sequence_parallel: bool = False, bytes_per_value: float = 4
) -> tuple[Traffic, Traffic]:
    """``(embedding, head)``: bytes one rank sends over its tp group for the two vocabulary-parallel ends
    of a GPT in one step (a pipeline holds them on different stages). The embedding sums its partial
    lookups (g: an all-reduce forward, nothing backward; under sequence parallelism a reduce-scatter
    forward, an all-gather backward); the head needs every position (f: nothing forward, an
    all-reduce of the input's gradient backward; under sequence parallelism an all-gather forward, a
    reduce-scatter backward) (Shoeybi et al. 2019, §3; Korthikanti et al. 2022, §4.2.2)."""
    _check_positive_int(tp, "tp")
    nbytes = batch * seq * hidden * bytes_per_value
    if sequence_parallel:
        gather, scatter = all_gather_bytes(nbytes, tp), reduce_scatter_bytes(nbytes, tp)
        return Traffic(scatter, gather), Traffic(gather, scatter)
    return Traffic(all_reduce_bytes(nbytes, tp), 0.0), Traffic(0.0, all_reduce_bytes(nbytes, tp))


def vocab_parallel_loss_bytes(batch: int, seq: int, tp: int, bytes_per_value: float = 4) -> Traffic:
    """Bytes one rank sends for the vocabulary-parallel cross-entropy: three all-reduces of one value
    per token (the max logit, the sum of exponentials, the target's logit) in forward, none in backward
    (each rank's softmax slice is computed from what forward kept) (Shoeybi et al. 2019, §3)."""
    return Traffic(3 * all_reduce_bytes(batch * seq * bytes_per_value, tp), 0.0)


def context_parallel_bytes_per_layer(
    batch: int, seq: int, hidden: int, cp: int, tp: int = 1, bytes_per_value: float = 4
) -> Traffic:
    """Bytes one rank sends round its cp ring for one layer's attention in one step (ring attention,
    Liu et al. 2023). ``seq`` is the full sequence T: each rank holds ``T / cp`` tokens, and its K and V
    blocks (``batch x T/cp x hidden/tp`` values each: the tp rank's heads) pass ``cp - 1`` hops forward.
    Backward passes K and V round again (``cp - 1`` hops) and the gradients dK and dV travel with them,
    one hop more to reach their owner (``cp`` hops). Fully masked causal blocks are skipped in compute,
    not in communication: every block still goes round."""
    _check_positive_int(cp, "cp")
    _check_positive_int(tp, "tp")
    if cp == 1:
        return Traffic(0.0, 0.0)
    block = batch * (seq / cp) * (hidden / tp) * bytes_per_value
    return Traffic(forward=2 * block * (cp - 1), backward=2 * block * (cp - 1) + 2 * block * cp)


def pipeline_bytes_per_boundary(
    batch: int,
    seq: int,
    hidden: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    bytes_per_value: float = 4,
) -> Traffic:
    """Bytes that cross one stage boundary in one step, per tp rank: the activations of ``batch``
    sequences of ``seq`` tokens (all microbatches together) forward, sent by the earlier stage, and
    their gradients backward, sent by the later one (Narayanan et al. 2021, §3). So a middle stage
    sends ``forward`` to the next stage and ``backward`` to the previous one. Under sequence
    parallelism a tp rank sends only its ``1 / tp`` slice of the sequence."""
    nbytes = batch * seq * hidden * bytes_per_value / (tp if sequence_parallel else 1)
    return Traffic(nbytes, nbytes)


def sequence_parallel_grad_bytes(values: int, tp: int, bytes_per_value: float = 4) -> Traffic:
    """Bytes one rank sends to sum, over its tp group after backward, the gradients of the ``values``
    parameter elements it uses on its sequence shard only: under sequence parallelism every tp rank
    sees other positions, so each LayerNorm's weight and bias gradient is a partial sum (Korthikanti
    et al. 2022, §4.2.2; Megatron-LM all-reduces them in its finalize-grads step). In minidist's GPT
    that is ``6 h`` per layer (two LayerNorms' weights and biases, the two row-parallel layers'
    biases, added after the reduce-scatter), ``2 h`` for ``ln_f`` and the ``block_size x h`` position
    table ``wpe`` (each rank adds only its positions' rows). One ring all-reduce."""
    return Traffic(0.0, all_reduce_bytes(values * bytes_per_value, tp))


def tied_embedding_bytes(vocab_rows: int, hidden: int, bytes_per_value: float = 4) -> Traffic:
    """Bytes one rank sends to keep a pipeline's tied token table equal on the first and the last stage:
    the gradient of its ``vocab_rows x hidden`` piece (its tp shard) summed over the two ranks holding
    it, an all-reduce of 2 ranks after backward, which sends the whole piece once (Shoeybi et al. 2019,
    §3; Narayanan et al. 2021 keep the embedding and output layer in sync this way)."""
    return Traffic(0.0, all_reduce_bytes(vocab_rows * hidden * bytes_per_value, 2))


def data_parallel_bytes(grad_bytes: float, n: int) -> Traffic:
    """Bytes one rank sends to average ``grad_bytes`` of gradients over ``n`` ranks with a ring
    all-reduce, in backward: ``2 (n - 1) / n`` of them (Patarasuk & Yuan 2009). Under context
    parallelism the group is the ``dp x cp`` ranks holding the same weights (``mesh.dp_cp_group``)."""
    return Traffic(0.0, all_reduce_bytes(grad_bytes, n))


def communication_per_step(
    layers: int,
    batch: int,
    seq: int,
    hidden: int,
    grad_bytes: float,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = False,
    bytes_per_value: float = 4,
) -> dict[str, Traffic]:
    """Bytes one rank sends per step to each group, for a GPT on a dp x tp x pp x cp mesh.

    ``batch``: the global batch of sequences of ``seq`` tokens; ``grad_bytes``: the gradient bytes this
    rank holds (its pipeline stage's tp shard). Counted for a rank with ``layers / pp`` layers that also
    has the embedding's, the head's and the loss's tp traffic, and sends activations to a next stage and
    gradients to a previous one (``0`` for ``pp = 1``): exact for ``pp = 1``, an upper bound for every
    stage otherwise (only the first stage embeds, only the last has the head and the loss).
    Sequence parallelism as minidist runs it (``regather``). Returns ``{"tp": ..., "cp": ..., "pp": ...,
    "dp": ...}`` (``"dp"``: over the dp x cp group).
    Raises ``ValueError`` if ``layers`` is not divisible by ``pp`` or ``batch`` by ``dp``.
    """
    for value, name in ((dp, "dp"), (tp, "tp"), (pp, "pp"), (cp, "cp"), (layers, "layers"), (batch, "batch")):
        _check_positive_int(value, name)
    if layers % pp or batch % dp:
        raise ValueError(f"need layers % pp == 0 and batch % dp == 0, got {layers} % {pp}, {batch} % {dp}")
    b, s_local, e = batch // dp, seq / cp, bytes_per_value
    tp_traffic = tensor_parallel_bytes(layers // pp, b, s_local, hidden, tp, sequence_parallel, e)
    loss = vocab_parallel_loss_bytes(b, s_local, tp, e)
    cp_layer = context_parallel_bytes_per_layer(b, seq, hidden, cp, tp, e)
    boundary = pipeline_bytes_per_boundary(b, s_local, hidden, tp, sequence_parallel, e)
    return {
        "tp": Traffic(tp_traffic.forward + loss.forward, tp_traffic.backward + loss.backward),
        "cp": Traffic(cp_layer.forward * (layers // pp), cp_layer.backward * (layers // pp)),
        "pp": boundary if pp > 1 else Traffic(0.0, 0.0),
        "dp": data_parallel_bytes(grad_bytes, dp * cp),
    }


def _check_positive_int(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")

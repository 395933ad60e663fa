"""Ring attention: self-attention over a sequence whose tokens are split across the ranks of a cp group.

Every rank holds the queries, keys and values of its T/cp tokens (the layout of ``split.py``). Each
query must meet every key; ring attention (Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise
Transformers for Near-Infinite Context") keeps the queries where they are and passes the key/value
blocks round the ring of cp ranks (``ring_pass.py``): after cp steps every rank's queries have met
every block, and no rank ever holds more than two K/V blocks or one (T/cp x T/cp) block of scores.
The next block's transfer is started before the current block is used, so communication overlaps
compute.

**Forward**, this rank's queries Q against the block K_j, V_j of step s (per query row; ``m`` the
running maximum, ``l`` the running sum of exponentials, ``O`` the running unnormalised output,
starting at -inf, 0, 0)::

    S  = scale Q K_j^T (+ causal bias)          this block's scores
    m' = max(m, rowmax S)
    P  = exp(S - m')
    l  = l exp(m - m') + rowsum P
    O  = O exp(m - m') + P V_j,      m = m'

and after the last block ``O = O / l`` and ``LSE = m + log l`` (the log of the row's softmax
denominator over all T keys). The factor ``exp(m - m')`` rescales what was summed under the old
maximum, so the result is exactly ``softmax(scale Q K^T + bias) V`` over the whole sequence: the online
softmax (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax") applied blockwise, as
FlashAttention does on one GPU (Dao et al. 2022, Alg. 1).

**Backward** (FlashAttention's form, Dao et al. 2022, Alg. 2: P recomputed from LSE, no (T, T) array
kept), with ``dO = dL/dO`` and ``D = rowsum(dO * O)`` (which equals rowsum(dP * P), the softmax
Jacobian's term)::

    P = exp(S - LSE),   dV_j += P^T dO,   dP = dO V_j^T,   dS = P * (dP - D),
    dQ += scale dS K_j,   dK_j += scale dS^T Q

The K/V blocks go round the ring again, and each block's accumulators dK_j, dV_j travel with it: a rank
adds its queries' share and passes them on, and one last hop brings them home, so after cp steps every
rank holds the full dK, dV of its own block (a sum over every rank's queries). dQ stays local.

**Causal masking** from global positions (``split.context_parallel_chunks``), per pair of chunks (see
:func:`attention_blocks`): skipped when every key comes after every query (it would add exp(-inf) = 0),
computed without a mask when every key comes at or before every query, masked (the diagonal chunks)
otherwise. With the balanced layout every rank computes the same number of chunk pairs; with the
contiguous one rank cp-1 computes cp times as many as rank 0.

Saved for backward: Q (scaled), K, V, O and LSE, i.e. O(T/cp) memory per row of queries; no score block.
Messages per rank and attention layer: forward cp - 1 hops of (K, V); backward cp - 1 hops of (K, V) and
cp hops of (dK, dV), each ``B H (T/cp) (2 hs)`` elements.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import numpy as np

from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor
from minidist.backend import array_module, is_gpu_array
from minidist.distributed.comm import Communicator
from minidist.distributed.world import group_or_world
from minidist.parallel.context_parallel.checks import check_ring_attention_args
from minidist.parallel.context_parallel.ring_pass import RingPass
from minidist.parallel.context_parallel.split import context_parallel_chunks

KV_TAG, GRAD_TAG = 181, 182  # the two kinds of message on the cp group: K/V blocks, their gradients


class Block(NamedTuple):
    """One (query chunk, key chunk) pair that has visible scores: local slices along the sequence axis
    of this rank's queries and of the key block, and ``diagonal``: None when every score is visible,
    else the mask keeps key j for query i iff ``j <= i + diagonal`` (``numpy.tri``'s ``k``)."""

    q: slice
    k: slice
    diagonal: int | None


def attention_blocks(
    seq_len: int, cp: int, rank: int, source: int, is_causal: bool = True, layout: str = "balanced"
) -> list[Block]:
    """The chunk pairs that cp ``rank``'s queries compute against the key block of rank ``source``.

    Communication-free, so also usable to count each rank's work (the sum of the pairs' areas).
    Raises as :func:`~minidist.parallel.context_parallel.split.context_parallel_chunks`.
    """
    blocks = []
    for q_start, q_stop, q_local in _local_chunks(seq_len, cp, rank, layout):
        for k_start, k_stop, k_local in _local_chunks(seq_len, cp, source, layout):
            q = slice(q_local, q_local + q_stop - q_start)
            k = slice(k_local, k_local + k_stop - k_start)
            # BEGIN SOLUTION A9.2: the causal plan: skip a fully masked pair, no mask on a fully visible one
            if not is_causal or k_stop - 1 <= q_start:  # every key at or before every query
                blocks.append(Block(q, k, None))
            elif k_start <= q_stop - 1:  # some keys after some queries: the mask from global positions
                blocks.append(Block(q, k, q_start - k_start))
            # else every key comes after every query: no score is visible, nothing to compute
            # END SOLUTION
    return blocks


def _local_chunks(seq_len: int, cp: int, rank: int, layout: str) -> list[tuple[int, int, int]]:
    """(global start, global stop, local start) of each chunk cp ``rank`` holds."""
    chunks, local = [], 0
    for start, stop in context_parallel_chunks(seq_len, cp, rank, layout):
        chunks.append((start, stop, local))
        local += stop - start
    return chunks


@functools.lru_cache(maxsize=32)
def _causal_bias(rows: int, cols: int, diagonal: int, dtype: str, gpu: bool) -> Any:
    """The additive (rows, cols) mask: 0 where key j <= query i + diagonal, -inf elsewhere; cached."""
    bias = np.where(np.tri(rows, cols, k=diagonal, dtype=bool), 0.0, -np.inf).astype(dtype)
    if gpu:
        import cupy  # noqa: PLC0415  (only on the GPU backend)

        return cupy.asarray(bias)
    bias.setflags(write=False)  # shared by every call: nobody may change it in place
    return bias


def _swap(a: Any) -> Any:
    """The last two axes swapped (a view): K^T of a batch of matrices."""
    return a.swapaxes(-1, -2)


def _pack(xp: Any, *arrays: Any) -> Any:
    """One flat buffer holding ``arrays`` one after the other: one message per hop instead of two."""
    flat = xp.empty(sum(a.size for a in arrays), dtype=arrays[0].dtype)
    offset = 0
    for a in arrays:
        flat[offset : offset + a.size].reshape(a.shape)[...] = a
        offset += a.size
    return flat


def _unpack(flat: Any, *shapes: tuple[int, ...]) -> list[Any]:
    """Views of ``flat`` with ``shapes``, as :func:`_pack` laid them out."""
    views, offset = [], 0
    for shape in shapes:
        size = math.prod(shape)
        views.append(flat[offset : offset + size].reshape(shape))
        offset += size
    return views


class RingAttention(Function):
    """O = softmax(scale Q K^T + causal bias) V over the whole cp-split sequence (module docstring)."""

    saved_inputs = (1, 2)  # K and V; Q is kept scaled, as the op's own array
    saves_output = True  # O, for D = rowsum(dO * O): changing the output in place is caught in backward
    returns_new_arrays = True

    def forward(self, q, k, v, group=None, is_causal=True, scale=1.0, layout="balanced"):
        xp = array_module(q)
        cp, rank, seq_len = group.size, group.rank, q.shape[-2] * group.size
        qs = q * q.dtype.type(scale)  # scaling Q is cheaper than scaling every block of scores
        m = xp.full(q.shape[:-1] + (1,), -np.inf, dtype=q.dtype)  # running row maximum
        l = xp.zeros(q.shape[:-1] + (1,), dtype=q.dtype)  # noqa: E741  running sum of exp(S - m)
        o = xp.zeros(v.shape, dtype=q.dtype)  # running unnormalised output
        kv, ring = _pack(xp, k, v), RingPass(group, KV_TAG, "K/V block")
        for step in range(cp):
            # BEGIN SOLUTION A9.2: the ring's order: whose K/V block this rank holds at this step
            source = (rank - step) % cp  # whose block this rank holds at this step
            # END SOLUTION
            if step + 1 < cp:
                ring.start(kv)  # the next block travels while this one is used
            k_j, v_j = _unpack(kv, k.shape, v.shape)
            for b in attention_blocks(seq_len, cp, rank, source, is_causal, layout):
                bias = None if b.diagonal is None else self._bias(b, q)
                _online_softmax_step(qs[..., b.q, :], k_j[..., b.k, :], v_j[..., b.k, :], bias,
                                     m[..., b.q, :], l[..., b.q, :], o[..., b.q, :])  # fmt: skip
            if step + 1 < cp:
                kv = ring.wait()
        # Every row met its own position's key (causal) or every key, so l > 0 and m is finite.
        o /= l
        xp.log(l, out=l)
        l += m  # now LSE, the log of each row's softmax denominator
        self.qs, self.k, self.v, self.o, self.lse = qs, k, v, o, l
        self.group, self.is_causal, self.scale, self.layout = group, is_causal, scale, layout
        return o

    @staticmethod
    def _bias(b: Block, q: Any) -> Any:
        rows, cols = b.q.stop - b.q.start, b.k.stop - b.k.start
        return _causal_bias(rows, cols, b.diagonal, q.dtype.str, is_gpu_array(q))

    def backward(self, grad):
        xp = array_module(grad)
        qs, k, v, o, lse, group = self.qs, self.k, self.v, self.o, self.lse, self.group
        cp, rank, seq_len = group.size, group.rank, qs.shape[-2] * group.size
        d = (grad * o).sum(axis=-1, keepdims=True)  # D = rowsum(dO * O)
        dq = xp.zeros_like(qs)
        kv = _pack(xp, k, v)
        kv_ring, grad_ring = RingPass(group, KV_TAG, "K/V block"), RingPass(group, GRAD_TAG, "dK/dV block")
        for step in range(cp):
            # BEGIN SOLUTION A9.2: the same order in backward: whose K/V block this rank holds now
            source = (rank - step) % cp
            # END SOLUTION
            if step + 1 < cp:
                kv_ring.start(kv)
            k_j, v_j = _unpack(kv, k.shape, v.shape)
            dkv = xp.zeros(kv.size, dtype=kv.dtype)  # this rank's share of block j's dK, dV
            dk_j, dv_j = _unpack(dkv, k.shape, v.shape)
            for b in attention_blocks(seq_len, cp, rank, source, self.is_causal, self.layout):
                bias = None if b.diagonal is None else self._bias(b, qs)
                _block_backward(qs[..., b.q, :], k_j[..., b.k, :], v_j[..., b.k, :], bias, lse[..., b.q, :],
                                d[..., b.q, :], grad[..., b.q, :], dq[..., b.q, :], dk_j[..., b.k, :],
                                dv_j[..., b.k, :])  # fmt: skip
            if step > 0:  # the shares of the ranks this block visited before: they arrived meanwhile
                dkv += grad_ring.wait()
            grad_ring.start(dkv)  # onward; after the last step, home to the block's owner
            if step + 1 < cp:
                kv = kv_ring.wait()
        dk, dv = _unpack(grad_ring.wait(), k.shape, v.shape)  # this rank's own block, summed over all
        dq *= dq.dtype.type(self.scale)
        q_in, k_in, v_in = self.inputs
        return (
            dq if q_in.requires_grad else None,
            dk if k_in.requires_grad else None,
            dv if v_in.requires_grad else None,
        )


def _online_softmax_step(qs, k, v, bias, m, l, o) -> None:  # noqa: E741
    """Fold one block of scores into the running max ``m``, sum ``l`` and output ``o`` (in place:
    they are views of this rank's whole arrays)."""
    xp = array_module(qs)
    # BEGIN SOLUTION A9.2: the online softmax: new running max, rescale l and o by exp(m - m'), add the block
    scores = qs @ _swap(k)
    if bias is not None:
        scores += bias
    m_new = xp.maximum(m, scores.max(axis=-1, keepdims=True))
    scores -= m_new
    xp.exp(scores, out=scores)  # P = exp(S - m'): every exponent <= 0, no overflow
    alpha = xp.exp(m - m_new)  # what was summed under the old maximum, rescaled to the new one
    l *= alpha
    l += scores.sum(axis=-1, keepdims=True)
    o *= alpha
    o += scores @ v
    m[...] = m_new
    # END SOLUTION


def _block_backward(qs, k, v, bias, lse, d, do, dq, dk, dv) -> None:
    """Add one block's terms to ``dq`` (unscaled), ``dk`` and ``dv`` (in place; module docstring)."""
    xp = array_module(qs)
    p = qs @ _swap(k)
    if bias is not None:
        p += bias
    p -= lse
    xp.exp(p, out=p)  # P = exp(S - LSE): the forward's softmax weights, recomputed
    dv += _swap(p) @ do
    ds = do @ _swap(v)  # dP
    ds -= d
    ds *= p  # dS = P * (dP - D)
    dq += ds @ k
    dk += _swap(ds) @ qs  # qs holds the scale already


def ring_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    group: Communicator | None = None,
    is_causal: bool = True,
    scale: float | None = None,
    layout: str = "balanced",
    dropout_p: float = 0.0,
) -> Tensor:
    """Self-attention of a sequence split over the context-parallel ``group``; collective over it.

    ``query``, ``key``: (B, heads, T/cp, hs); ``value``: (B, heads, T/cp, hs_v); this rank's tokens in
    the ``layout`` of ``split.py`` (``"balanced"`` or ``"contiguous"``), the same shapes on every rank.
    Returns (B, heads, T/cp, hs_v): this rank's rows of ``softmax(scale Q K^T + mask) V`` over the whole
    sequence, which equals ``scaled_dot_product_attention`` of the gathered sequence. ``is_causal``:
    query at global position i sees keys 0..i. ``scale`` defaults to 1/sqrt(hs). ``group`` None: the
    world. With cp = 1 this is ordinary attention (no message is sent).

    Raises (on every rank of ``group``, agreed: one all-gather of a few numbers per call):
        TypeError: an input is not a Tensor.
        RuntimeError: inputs of different dtypes, or not floating-point (as torch's attention).
        ValueError: inputs not 4-D or of shapes that do not fit (query and key equal, value the same but
            for its last axis), no tokens, T/cp odd under the balanced layout, an unknown layout, a
            scale that is not finite, ``dropout_p`` outside [0, 1], or ranks that passed different
            shapes, dtypes or options (the message names them and the ranks).
        NotImplementedError (a RuntimeError): ``dropout_p > 0``.
    """
    group = group_or_world(group)
    check_ring_attention_args(query, key, value, group, is_causal, scale, layout, dropout_p)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    return RingAttention.apply(
        query, key, value, group=group, is_causal=bool(is_causal), scale=scale, layout=layout
    )

"""Scaled dot-product attention (Vaswani et al. 2017, "Attention Is All You Need", §3.2.1) as one op.

For queries Q (..., L, E), keys K (..., S, E) and values V (..., S, Ev):

    S = scale Q K^T + B        (L, S) scores; B = 0 where a query may attend, -inf where it may not
    P = softmax(S)             along each row (over the S keys)
    O = (P * M) V              M: inverted-dropout mask (M = m / (1 - p), m ~ Bernoulli(1 - p)), else 1

Backward, with dO = dL/dO:

    dV = (P * M)^T dO,   dP = (dO V^T) * M,   dS = P * (dP - rowsum(dP * P))   (softmax's Jacobian),
    dQ = scale dS K,     dK = scale dS^T Q

The ``(..., L, S)`` arrays are the memory of attention: this op keeps only P (and M with dropout) of
them, where the same graph from matmul, add, softmax and dropout ops would keep S, P and P * M.
The matrix products are ``xp.matmul`` on the batched arrays: one call per product for all heads.

Low precision (``minidist.autocast``): Q, K, V come rounded to float16/bfloat16; the op computes on
float32 copies (the softmax in float32, as Micikevicius et al. 2018 §3.3 ask), keeps Q, K, V and P in
the low dtype for backward and returns O (and the gradients) in it. PyTorch's fused CPU kernel rounds
the (unnormalised) softmax weights to the low dtype before multiplying V; here they stay float32, so
the outputs differ from torch's by at most 2^-8 (bfloat16) or 2^-11 (float16) times max|V|, with
minidist the closer to the exact result (tests/torch_oracle/test_torch_oracle_amp_fsdp_memory.py).
"""

from __future__ import annotations

import functools
import math
from contextlib import nullcontext
from typing import Any

import numpy as np

from minidist.autograd import autocast, grad_mode
from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor
from minidist.backend import array_module, is_gpu_array
from minidist.ops.arithmetic import unbroadcast
from minidist.ops.dropout import mask_stream, scaled_keep_mask
from minidist.ops.dtypes import autocast_low, autocast_output


def _swap(a: Any) -> Any:
    """The last two axes swapped (a view): K^T of a batch of matrices."""
    return a.swapaxes(-1, -2)


class ScaledDotProductAttention(Function):
    """O = dropout(softmax(scale Q K^T + bias)) V (module docstring for the math and the backward).

    ``bias``: an additive (L, S)-broadcastable array (0 or -inf for a boolean mask) or None;
    ``empty_rows``: whether a row may have no key left (a mask, or S = 0; never with the causal mask
    alone: key 0 is always there).
    """

    saved_inputs = (1, 2)  # K and V; Q is kept scaled, as the op's own array
    returns_new_arrays = True
    handles_low_precision = True  # computes on float32 copies of 2-byte inputs (module docstring)

    def forward(self, q, k, v, bias=None, empty_rows=False, scale=1.0, dropout_p=0.0):
        low = q.dtype if autocast.is_low(q.dtype) else None
        if low is not None:
            out = self._forward(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), bias,
                                empty_rows, scale, dropout_p)  # fmt: skip
            # kept for backward in the low dtype (half the bytes), as a low-precision op saves them
            self.qs, self.p = self.qs.astype(low), self.p.astype(low)
            self.k, self.v, self.low = k, v, low
            return out.astype(low)
        self.low = None
        return self._forward(q, k, v, bias, empty_rows, scale, dropout_p)

    def _forward(self, q, k, v, bias, empty_rows, scale, dropout_p):
        xp = array_module(q)
        qs = q * q.dtype.type(scale)  # scaling Q (L x E values) is cheaper than scaling S (L x S)
        scores = qs @ _swap(k)
        if bias is not None:
            scores += bias  # in place, no second (L, S) array (the mask never adds axes: checked)
        # The softmax, in place on our own scores. Subtracting each row's maximum first changes nothing
        # mathematically (softmax(s) = softmax(s - c)) but keeps every exponent <= 0, so e^s cannot
        # overflow in float32 (e^89 already does). The masked entries are -inf and become exactly 0.
        if scores.shape[-1]:
            row_max = scores.max(axis=-1, keepdims=True)
        else:  # no keys at all (S = 0): max() of nothing raises; every row is empty, so outputs are 0
            row_max = xp.zeros(scores.shape[:-1] + (1,), dtype=scores.dtype)
        if empty_rows:  # a row whose keys are all masked: 0 weights (and output), as torch
            row_max = xp.where(xp.isneginf(row_max), 0, row_max)
        scores -= row_max
        xp.exp(scores, out=scores)
        total = scores.sum(axis=-1, keepdims=True)
        if empty_rows:
            total[total == 0] = 1  # only an all-masked row sums to 0 (else its maximum gives e^0 = 1)
        scores *= 1 / total  # one division per row, then products
        p = scores
        self.keep = scaled_keep_mask(p, dropout_p) if dropout_p > 0 else None
        self.qs, self.k, self.v, self.p, self.scale = qs, k, v, p, scale
        return (p * self.keep if self.keep is not None else p) @ v

    def backward(self, grad):
        if self.low is not None:  # float32 copies; the graph walk rounds the gradients to the low dtype
            f32 = np.float32
            self.qs, self.k, self.v, self.p = (a.astype(f32) for a in (self.qs, self.k, self.v, self.p))
            grad, self.low = grad.astype(f32), None
        # BEGIN SOLUTION A8.2: attention's backward: dL/dq, dL/dk, dL/dv from the saved weights P
        qs, k, v, p, keep = self.qs, self.k, self.v, self.p, self.keep
        dp = grad @ _swap(v)
        if keep is not None:
            dp *= keep
        # dS = P * (dP - rowsum(dP * P)), in place on dP: the softmax backward (module docstring)
        dp -= (dp * p).sum(axis=-1, keepdims=True)
        dp *= p
        ds = dp
        q_in, k_in, v_in = self.inputs
        grad_q = grad_k = grad_v = None
        if q_in.requires_grad:
            grad_q = ds @ k
            grad_q *= grad_q.dtype.type(self.scale)
            grad_q = unbroadcast(grad_q, q_in.shape)
        if k_in.requires_grad:
            grad_k = unbroadcast(_swap(ds) @ qs, k_in.shape)  # qs holds the scale already
        if v_in.requires_grad:
            weights = p * keep if keep is not None else p
            grad_v = unbroadcast(_swap(weights) @ grad, v_in.shape)
        return grad_q, grad_k, grad_v
        # END SOLUTION


def mixed_dtypes_error(query: Any, key: Any, value: Any) -> RuntimeError | None:
    """torch's error for query, key and value of different dtypes, or None when they agree (also used by
    ``ring_attention``'s checks, so both attentions say the same thing)."""
    # Cached by dtypes, never by the tensors: a cache keyed by them kept the last 16 calls' q, k, v and
    # the graphs behind them alive (the memory tracker saw a dropped graph never freed).
    return _mixed_dtypes_error(query.dtype, key.dtype, value.dtype)


@functools.lru_cache(maxsize=16)
def _mixed_dtypes_error(query: Any, key: Any, value: Any) -> RuntimeError | None:
    if query == key == value:
        return None
    return RuntimeError(
        "Expected query, key, and value to have the same dtype, but got query.dtype: "
        f"{query} key.dtype: {key} and value.dtype: {value} instead."
    )


def _causal_bias(rows: int, cols: int, dtype: str, gpu: bool) -> Any:
    """The (rows, cols) additive causal mask, built once per shape: 0 on and below the diagonal
    (query i sees keys 0..i, top-left aligned as torch's ``is_causal``), -inf above it."""
    bias = np.where(np.tri(rows, cols, dtype=bool), 0.0, -np.inf).astype(dtype)
    if gpu:
        import cupy  # noqa: PLC0415  (only on the GPU backend)

        return cupy.asarray(bias)
    bias.setflags(write=False)  # shared by every call: nobody may change it in place
    return bias


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    """softmax(query key^T * scale + mask) value, as ``torch.nn.functional.scaled_dot_product_attention``.

    Shapes: query (..., L, E), key (..., S, E), value (..., S, Ev) -> (..., L, Ev); the leading axes
    (batch, heads) broadcast. ``scale`` defaults to 1/sqrt(E). ``is_causal``: query i attends to keys
    0..i (lower-triangular (L, S) mask, top-left aligned). ``attn_mask`` broadcastable to (..., L, S):
    boolean (True = may attend) or of the query's float dtype (added to the scores; not
    differentiated). A query whose keys are all masked (or S = 0) gets zero weights, so a zero output,
    as torch.
    ``dropout_p``: dropout on the attention weights, drawn from minidist's seeded generator (the
    per-rank stream for a tensor-parallel shard, as ``dropout``); pass 0 in evaluation, as torch.

    Raises:
        NotImplementedError (a RuntimeError): ``attn_mask`` is a Tensor that requires grad (outside
            ``no_grad``): torch differentiates it, this op does not.
        RuntimeError: both ``attn_mask`` and ``is_causal`` given; query, key and value of different
            dtypes, or not floating-point; a mask of another dtype or of a shape that does not
            broadcast; E or S differ between the inputs, or their leading axes do not broadcast
            (torch's texts where it has them).
        ValueError: an input with fewer than 2 axes, or ``dropout_p`` outside [0, 1].
    """
    autocasting = autocast.low_dtype is not None
    if autocasting:  # a low-precision op: inputs and result rounded (module docstring)
        query, key, value = autocast_low(query), autocast_low(key), autocast_low(value)
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.ndim < 2:
            raise ValueError(
                f"scaled_dot_product_attention: {name} must be (..., length, features), got {t.shape}"
            )
    mixed = mixed_dtypes_error(query, key, value)
    if mixed is not None:
        raise mixed
    if query.dtype.kind != "f" and not autocast.is_low(query.dtype):  # (integers failed in NumPy's exp)
        raise RuntimeError(
            f"scaled_dot_product_attention: expected floating-point query, key and value, got {query.dtype}; "
            "convert them to float32 or float64"
        )
    (length, features), (keys, key_features) = query.shape[-2:], key.shape[-2:]
    if features != key_features or keys != value.shape[-2]:
        raise RuntimeError(
            f"scaled_dot_product_attention: query {query.shape}, key {key.shape} and value {value.shape} "
            "do not fit: query and key need the same last axis (E), key and value the same length (S)"
        )
    try:
        np.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    except ValueError:
        raise RuntimeError(
            f"scaled_dot_product_attention: the leading (batch, head) axes of query {query.shape}, key "
            f"{key.shape} and value {value.shape} do not broadcast against each other"
        ) from None
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"dropout probability must be between 0 and 1, got {dropout_p}")
    bias = None
    if is_causal:
        if attn_mask is not None:
            raise RuntimeError(
                "_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True"
            )
        dtype = "<f4" if autocast.is_low(query.dtype) else query.dtype.str  # a 2-byte op computes in float32
        bias = _causal_bias(length, keys, dtype, is_gpu_array(query.data))
    elif attn_mask is not None:
        if isinstance(attn_mask, Tensor) and attn_mask.requires_grad and grad_mode.is_grad_enabled():
            # torch differentiates a float mask (a learned attention bias); this op does not, and a bias
            # silently left without its gradient would never train.
            raise NotImplementedError(
                "scaled_dot_product_attention: attn_mask requires grad, but minidist's attention does not "
                "differentiate the mask; pass attn_mask.detach(), or add a learned bias to the scores "
                "with your own ops (softmax(q @ k^T * scale + bias) @ v)"
            )
        bias = _mask_to_bias(attn_mask, query, key, (length, keys))
    scale = 1.0 / math.sqrt(features) if scale is None else float(scale)
    # Only a dropout draws: without one, a tensor-parallel shard needs no seeded per-rank stream.
    with mask_stream(query) if dropout_p > 0 else nullcontext():
        out = ScaledDotProductAttention.apply(
            query,
            key,
            value,
            bias=bias,
            empty_rows=attn_mask is not None or keys == 0,
            scale=scale,
            dropout_p=float(dropout_p),
        )
    return autocast_output(out) if autocasting else out


def _mask_to_bias(attn_mask: Any, query: Tensor, key: Tensor, scores_shape: tuple[int, int]) -> Any:
    """The additive bias of a boolean or float mask (checked): 0 / -inf, or the float mask itself."""
    mask = array_module(query.data).asarray(attn_mask.data if isinstance(attn_mask, Tensor) else attn_mask)
    if mask.dtype != bool and mask.dtype != query.dtype:
        raise RuntimeError(
            "Expected attn_mask dtype to be bool or float or to match query dtype, but got attn_mask.dtype: "
            f"{mask.dtype} and query.dtype: {query.dtype} instead."
        )
    weights_shape = np.broadcast_shapes(query.shape[:-2], key.shape[:-2]) + scores_shape
    try:
        fits = np.broadcast_shapes(mask.shape, weights_shape) == weights_shape
    except ValueError:
        fits = False
    if not fits:  # torch's error too (its in-place add cannot grow the weights either)
        raise RuntimeError(
            f"scaled_dot_product_attention: attn_mask of shape {mask.shape} does not broadcast to the "
            f"attention weights' shape {weights_shape} (..., L, S)"
        )
    if mask.dtype == bool:
        xp = array_module(mask)
        return xp.where(mask, query.dtype.type(0), query.dtype.type(-np.inf))
    return mask

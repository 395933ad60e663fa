"""Embedding lookup: row ``i`` of a weight matrix for every integer index ``i`` (a token's vector).

    y[b, t, :] = W[i[b, t], :]          dL/dW[v, :] = sum over the (b, t) with i[b, t] = v of dL/dy[b, t, :]

Forward is a gather; backward is a scatter-*add*: a token that appears k times in the batch gets the
sum of its k gradients (a plain ``grad_W[i] = g`` would keep only the last one).

**How the scatter-add is done.** Measured on one core (numpy 2.4, float32, width 128; load ~2):
``np.add.at`` takes ~1.1 ms for 768 indices whatever the vocabulary (it is an unbuffered loop, ~11 ns
per element), while the one-hot product ``onehot(i)^T @ g`` ((V, N) @ (N, D), one BLAS call) takes
0.2 ms at V = 65, 0.8 ms at V = 256, 1.8 ms at V = 512 and 7 ms at V = 1024. (Sorting the indices
and ``np.add.reduceat`` was second at V = 65, 0.25 ms, but 2x slower than ``add.at`` at V = 50257;
a ``np.bincount`` per column was slower than both.) So small vocabularies (a character-level GPT's
~65) use the product, large ones ``add.at`` (on the GPU ``cupyx.scatter_add``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor
from minidist.backend import array_module, is_gpu_array

# Up to this many rows the one-hot matmul beats np.add.at (module docstring: 0.8 vs 1.3 ms at 256).
ONE_HOT_MAX_ROWS = 256


class Embedding(Function):
    """y = W[indices] for W (V, D) and integer ``indices`` of any shape; y is indices.shape + (D,).

    dL/dW = scatter-add of dL/dy into the rows ``indices`` (module docstring); the row ``padding_idx``
    (if given) gets no gradient, as in torch.
    """

    saved_inputs = ()  # only the indices (an option, not an input) and W's shape are kept
    returns_new_arrays = True  # W.grad can be the scatter's own fresh array

    def forward(self, weight, indices=None, padding_idx=None):
        self.indices, self.padding_idx = indices, padding_idx
        self.weight_shape = weight.shape
        return array_module(weight).take(weight, indices, axis=0)  # take: faster than weight[indices]

    def backward(self, grad):
        xp = array_module(grad)
        rows, width = self.weight_shape
        flat = self.indices.reshape(-1)
        g = grad.reshape(flat.size, width)
        if rows <= ONE_HOT_MAX_ROWS:
            # onehot (V, N) @ g (N, D). Caveat: 0 * inf = nan, so an inf/nan gradient row would reach
            # every row of dW here, not only its own (a step with such a gradient is lost either way).
            one_hot = xp.zeros((rows, flat.size), dtype=grad.dtype)
            one_hot[flat, xp.arange(flat.size)] = 1
            grad_w = one_hot @ g
        else:
            grad_w = xp.zeros(self.weight_shape, dtype=grad.dtype)
            if is_gpu_array(grad):
                import cupyx  # noqa: PLC0415  (only on the GPU backend)

                cupyx.scatter_add(grad_w, flat, g)
            else:
                np.add.at(grad_w, flat, g)  # unbuffered: a repeated index adds each time
        if self.padding_idx is not None:
            grad_w[self.padding_idx] = 0
        return (grad_w,)


def embedding(input: Any, weight: Tensor, padding_idx: int | None = None) -> Tensor:
    """Rows of ``weight`` (V, D) picked by the integer ``input`` (any shape, e.g. (B, T)) -> (B, T, D).

    As ``torch.nn.functional.embedding``; ``input`` is an integer array or integer Tensor (never
    differentiated). ``padding_idx`` (may be negative, counted from V) marks a row whose gradient is
    always zero.

    Raises:
        RuntimeError: ``input`` is not of an integer dtype (float or bool), as torch.
        IndexError: an index is negative or >= V ("index out of range in self", as torch), checked
            before any work.
        ValueError: ``weight`` is not 2-D, or ``padding_idx`` is outside [-V, V).
    """
    # the indices on the weight's device (a NumPy batch for a CuPy table is moved there)
    indices = array_module(weight.data).asarray(input.data if isinstance(input, Tensor) else input)
    if indices.dtype.kind not in "iu":
        raise RuntimeError(
            "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, "
            f"Int; but got {indices.dtype} instead (while checking arguments for embedding); pass integer "
            "token ids, e.g. x.astype(np.int64)"
        )
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-D (num_embeddings, embedding_dim), got {weight.shape}")
    rows = weight.shape[0]
    if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= rows):
        raise IndexError(
            f"index out of range in self: embedding indices must lie in [0, {rows}) (num_embeddings), "
            f"got values from {int(indices.min())} to {int(indices.max())}"
        )
    if padding_idx is not None:
        if not -rows <= padding_idx < rows:
            raise ValueError(
                f"embedding: padding_idx must be within num_embeddings ({rows}), got {padding_idx}"
            )
        padding_idx = int(padding_idx) % rows
    return Embedding.apply(weight, indices=indices, padding_idx=padding_idx)

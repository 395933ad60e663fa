"""A column-parallel linear layer on a sequence shard: all-gather, product, and only the shard kept.

Under sequence parallelism (Korthikanti et al. 2022, §4.2.2) a column-parallel layer (``c_attn``,
``c_fc``) reads the whole sequence, all-gathered from the ranks' slices (the paper's g). Its weight
gradient needs that whole input again in backward. Keeping the gathered (B, T, in) array would store
t times the shard on every rank, undoing part of the memory sequence parallelism saves; the paper
instead keeps only the rank's shard (B, T / t, in) and all-gathers it a second time in backward, one
extra all-gather per layer (which Megatron-LM overlaps with the input-gradient product). This op does
the same, fused, with the gradients of ``ops/linear.py``::

    X = [x_0; ...; x_{t-1}] (axis 1)      y = X W_r^T + b_r                          (forward, X not kept)
    dL/dW_r = g^T X  (X all-gathered again)          dL/db_r = sum_rows g
    dL/dx_r = rows of rank r of sum_s g_s W_s        (a reduce-scatter: every rank's columns used X)

where g = dL/dy on this rank (its output features), and "rows" are all leading axes flattened.
"""

from __future__ import annotations

from typing import Any

from minidist.autograd import Function, Tensor
from minidist.distributed.comm import Communicator
from minidist.ops.linear import _check, _rows
from minidist.parallel.tensor_parallel.sequence_parallel import gather_sequence, reduce_scatter_sequence


class AllGatherLinear(Function):
    """y = all_gather_seq(x) W^T + b; backward re-gathers x for dL/dW and reduce-scatters dL/dx (module doc).

    x (B, T / t, in) this rank's positions, W (out_r, in), b (out_r,) or absent; y (B, T, out_r).
    """

    saved_inputs = (0, 1)  # the shard x and W (not the gathered input: the point of this op)
    returns_new_arrays = True

    def forward(self, x: Any, weight: Any, bias: Any = None, group: Communicator | None = None) -> Any:
        _check(x, weight, bias)
        self.x, self.weight, self.group = x, weight, group
        full = gather_sequence(x, group)  # (B, T, in): used here, then freed
        y = _rows(full) @ weight.T
        if bias is not None:
            y += bias
        return y.reshape(*full.shape[:-1], weight.shape[0])

    def backward(self, grad: Any) -> tuple[Any, ...]:
        inputs, rows = self.inputs, _rows(grad)
        grad_x = grad_w = None
        if inputs[1].requires_grad:  # the same on every rank of the group: the collectives pair up
            full = gather_sequence(self.x, self.group)  # the second all-gather of the input
            grad_w = rows.T @ _rows(full)
        if inputs[0].requires_grad:
            partial = (rows @ self.weight).reshape(*grad.shape[:-1], self.weight.shape[1])
            grad_x = reduce_scatter_sequence(partial, self.group)
        if len(inputs) == 2:
            return grad_x, grad_w
        return grad_x, grad_w, rows.sum(axis=0) if inputs[2].requires_grad else None


def all_gather_linear(x: Tensor, weight: Tensor, bias: Tensor | None, group: Communicator) -> Tensor:
    """The column-parallel product of a sequence shard ``x`` (B, T / t, in): (B, T, out_r) (module doc).

    Collective over ``group`` (an all-gather forward; an all-gather and a reduce-scatter backward).
    Raises ``ValueError`` for shapes that do not fit (the Linear op's checks), ``RuntimeError`` for
    mixed dtypes, and ``ValueError`` for an ``x`` without a sequence axis (fewer than 3 axes).
    """
    if x.ndim < 3:
        raise ValueError(
            f"sequence-parallel linear: expects activations (B, T / t, in) with the sequence on axis 1, "
            f"got shape {x.shape}"
        )
    if bias is None:
        return AllGatherLinear.apply(x, weight, group=group)
    return AllGatherLinear.apply(x, weight, bias, group=group)

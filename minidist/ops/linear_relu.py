"""``linear_relu``: a Linear layer and the ReLU after it as one op (operator fusion).

An MLP is Linear, ReLU, Linear, ReLU, ... Run as two ops, each pair records two graph nodes, two
``Function`` objects and two output tensors, and the ReLU writes its result into a second array of the
layer's output size. Fused, the pair is one node, and the ReLU zeroes the negative entries of the
matmul's own fresh result in place. On the small MLP (``benchmarks/small_mlp.py``) that is two graph
nodes fewer per forward (of six) and per microbatch of a pipeline stage (docs/performance.md, "What each
feature costs"). GPUs do the same with a GEMM epilogue (cuBLASLt's
``CUBLASLT_EPILOGUE_RELU_BIAS``); Megatron-LM fuses the bias add with the GeLU after it for the same
reason (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", §4.2, operator fusion).

    y = max(x W^T + b, 0)          dL/d(x W^T + b) = g * [y > 0], then Linear's three gradients

The arithmetic is exactly the unfused pair's (the same products, the same mask, multiplied in the same
order), so the results are bit-identical; ``nn.Sequential`` uses it for a plain ``nn.Linear``
followed by ``nn.ReLU``.
"""

from __future__ import annotations

from minidist.autograd import autocast
from minidist.autograd.tensor import Tensor
from minidist.ops.elementwise import ReLU, relu
from minidist.ops.linear import Linear, linear, one_per_output


class LinearReLU(Linear):
    """y = max(x W^T + b, 0) for x (..., in), W (out, in), b (out,) or absent; y is (..., out).

    Same checks and errors as :class:`minidist.ops.linear.Linear` (``ValueError`` for mismatched
    shapes, ``RuntimeError`` for mixed dtypes). Saves x, W and the (..., out) boolean mask.
    """

    handles_low_precision = False  # fused only for float32/float64 (see linear_relu)

    def forward(self, x, weight, bias=None):
        y = super().forward(x, weight, bias)
        self.positive = y > 0  # the ReLU's mask, as ops.elementwise.ReLU keeps it
        y *= self.positive  # y is the matmul's own new array (or a view of it): no second array
        return y

    def backward(self, grad):
        # The ReLU's own backward (it reads only ``self.positive``, which forward kept as ReLU does), then
        # the Linear's on its result: the unfused pair's code, so it cannot drift from it, and in the
        # A1 starter (where ReLU.backward is assignment A1.3) the fused op needs the student's ReLU too.
        (grad,) = ReLU.backward(self, grad)
        return super().backward(grad)


def linear_relu(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """relu(linear(x, weight, bias)) as one op, bit-identical to the two: x (..., in), weight (out, in),
    bias (out,) or None; returns (..., out). Errors: those of ``linear``.

    Under ``minidist.autocast``, or with a bias that only broadcasts, this is the two ops unfused.
    """
    # Any other bias (a scalar, a list, a broadcasting shape) goes where ``linear`` sends it: unfused.
    if autocast.low_dtype is not None or (bias is not None and not one_per_output(bias, weight)):
        return relu(linear(x, weight, bias))
    if bias is None:
        return LinearReLU.apply(x, weight)
    return LinearReLU.apply(x, weight, bias)

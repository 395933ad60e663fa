"""Which dtype an op's result has (PyTorch's type promotion), and the differentiable cast ``to``.

PyTorch's rules (https://pytorch.org/docs/stable/tensor_attributes.html#type-promotion-doc), which
differ from NumPy's:

1. The categories are bool < integer < floating. Tensors with dimensions decide the dtype: the
   largest dtype of the highest category among them (int64 + float32 -> float32, where NumPy gives
   float64; float32 + float64 -> float64).
2. A 0-d tensor (e.g. a loss) only matters if its category is higher than theirs.
3. A Python number only matters if its category is higher than every tensor's: it then gives the
   default dtype of its category (int tensor + 0.5 -> float32, not float64; float32 tensor * 2.0
   stays float32). A NumPy or CuPy array that is not a Tensor counts as such a constant.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist import backend
from minidist.autograd import autocast
from minidist.autograd.function import Function
from minidist.autograd.tensor import DEFAULT_DTYPE, Tensor

_CATEGORY_OF_KIND = {"b": 0, "i": 1, "u": 1, "f": 2}


def _category(dtype: np.dtype) -> int:
    if dtype.kind == "V" and dtype.itemsize == 2:  # ml_dtypes' bfloat16 is a float (bf16 + f32 -> f32)
        return 2
    return _CATEGORY_OF_KIND.get(dtype.kind, 3)


_DEFAULT_OF_CATEGORY = {0: np.dtype(bool), 1: np.dtype(np.int64), 2: np.dtype(DEFAULT_DTYPE)}


def _weak_category(x: Any) -> int:
    """The category of a constant (Python number, NumPy scalar or array) that is not a Tensor."""
    if isinstance(x, bool):
        return 0
    if isinstance(x, int):
        return 1
    if isinstance(x, float):
        return 2
    dtype = getattr(x, "dtype", None)
    return _category(dtype) if dtype is not None else _category(np.asarray(x).dtype)


def _highest(dtypes: list[np.dtype]) -> np.dtype | None:
    """The largest dtype of the highest category in ``dtypes`` (None if empty)."""
    if not dtypes:
        return None
    top = max(_category(d) for d in dtypes)
    return np.result_type(*[d for d in dtypes if _category(d) == top])


def result_type(*operands: Any) -> np.dtype:
    """The dtype PyTorch gives ``operands`` combined elementwise (rules 1-3 of the module text)."""
    tensors = [x for x in operands if isinstance(x, Tensor)]
    dtype = _highest([t.dtype for t in tensors if t.ndim > 0])
    zero_dim = _highest([t.dtype for t in tensors if t.ndim == 0])
    if dtype is None or (zero_dim is not None and _category(zero_dim) > _category(dtype)):
        dtype = zero_dim
    weak = [_weak_category(x) for x in operands if not isinstance(x, Tensor)]
    if weak and (dtype is None or max(weak) > _category(dtype)):
        dtype = _DEFAULT_OF_CATEGORY.get(max(weak), np.dtype(np.complex128))
    return np.dtype(dtype)


class Cast(Function):
    """y = x converted to another dtype;  dL/dx = dL/dy converted back to x's dtype."""

    saved_inputs = ()
    handles_low_precision = True  # a cast only converts (rounds): no arithmetic to move to float32

    def forward(self, x, dtype=None):
        self.dtype = x.dtype
        return x.astype(dtype)

    def backward(self, grad):
        return (grad.astype(self.dtype),)


def to(x: Tensor, dtype: Any) -> Tensor:
    """``x`` in ``dtype`` (``x`` itself when it already has it), as ``torch.Tensor.to(dtype)``."""
    dtype = np.dtype(dtype)
    return x if x.dtype == dtype else Cast.apply(x, dtype=dtype)


class RoundBFloat16(Function):
    """y = x rounded to bfloat16's values, kept float32 (bfloat16 emulated on CuPy, which has none);
    dL/dx = dL/dy rounded likewise (a gradient between low-precision ops is low precision)."""

    saved_inputs = ()
    handles_low_precision = True

    def forward(self, x):
        return autocast.round_bfloat16(x)

    def backward(self, grad):
        return (autocast.round_bfloat16(grad),)


def autocast_low(x: Any) -> Any:
    """``x`` rounded to autocast's low dtype for a low-precision op (a float Tensor; else ``x``).

    float64 is not cast, as in PyTorch (a float64 tensor is not "autocast-eligible"): a float64 model
    or input keeps its precision inside ``autocast``, which is meant for float32 ones."""
    if not isinstance(x, Tensor) or x._data.dtype.kind != "f" or x._data.dtype.itemsize == 8:
        return x  # None (no bias), an integer or float64 tensor, or a low one (bfloat16's kind is "V")
    if autocast.emulated:
        return RoundBFloat16.apply(x)
    return to(x, autocast.low_dtype)


def autocast_output(y: Tensor) -> Tensor:
    """The result of a low-precision op under autocast: rounded to bfloat16 where that is emulated
    (CuPy, autograd/autocast.py); on NumPy the op returned the low dtype already."""
    return RoundBFloat16.apply(y) if autocast.emulated else y


def autocast_float32(x: Any) -> Any:
    """``x`` in float32 for an op of autocast's float32 list, if it is a low-precision Tensor."""
    if isinstance(x, Tensor) and autocast.is_low(x._data.dtype):
        return Cast.apply(x, dtype=np.dtype(np.float32))
    return x


def promote(a: Any, b: Any, floating: bool = False) -> tuple[Any, Any]:
    """``a`` and ``b`` both in their result dtype (``floating``: at least float32, for true division).

    Tensors are cast with the differentiable :func:`to`; constants become arrays of that dtype.
    """
    # The common cases first (measured: the general rule costs ~3 us per op, this ~0.3 us):
    # two tensors of one dtype, or a float tensor and a Python number (lifted to its dtype by apply).
    a_tensor, b_tensor = isinstance(a, Tensor), isinstance(b, Tensor)
    if a_tensor and b_tensor:
        if a._data.dtype == b._data.dtype and (a._data.dtype.kind == "f" or not floating):
            return a, b
    elif a_tensor or b_tensor:
        t, other = (a, b) if a_tensor else (b, a)
        if t._data.dtype.kind == "f" and type(other) in (float, int):
            return a, b
    dtype = result_type(a, b)
    if floating and _category(dtype) < 2:
        dtype = np.dtype(DEFAULT_DTYPE)
    return _as(a, dtype), _as(b, dtype)


def _as(x: Any, dtype: np.dtype) -> Any:
    if isinstance(x, Tensor):
        return to(x, dtype)
    if hasattr(x, "astype"):  # a NumPy / CuPy array or scalar
        return x.astype(dtype, copy=False)
    return backend.asarray(x, dtype=dtype)  # a Python number (int32 tensor + 3 stays int32)

"""Elementwise functions of one tensor: exp, log, tanh, sigmoid, relu, gelu.

Each backward multiplies the incoming gradient by the local derivative f'(x), evaluated from
what forward saved.
"""

from __future__ import annotations

import math

from minidist.autograd import autocast
from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor
from minidist.backend import array_module as _xp
from minidist.backend import is_gpu_array
from minidist.ops.dtypes import DEFAULT_DTYPE, autocast_float32, to


class Exp(Function):
    """y = e^x;  dy/dx = e^x = y."""

    saved_inputs, saves_output = (), True

    def forward(self, x):
        self.y = _xp(x).exp(x)
        return self.y

    def backward(self, grad):
        return (grad * self.y,)


class Log(Function):
    """y = ln x (natural log; x > 0);  dy/dx = 1/x."""

    def forward(self, x):
        self.x = x
        return _xp(x).log(x)

    def backward(self, grad):
        return (grad / self.x,)


class Tanh(Function):
    """y = tanh x;  dy/dx = 1 - y^2."""

    saved_inputs, saves_output = (), True

    def forward(self, x):
        self.y = _xp(x).tanh(x)
        return self.y

    def backward(self, grad):
        # BEGIN SOLUTION A1.3: the derivative of tanh
        return (grad * (1 - self.y * self.y),)
        # END SOLUTION


class Sigmoid(Function):
    """y = 1 / (1 + e^-x);  dy/dx = y (1 - y).

    With e = e^-|x| (never overflows): y = 1 / (1 + e) for x >= 0 and y = e / (1 + e) for x < 0,
    the same value written so that the negative tail keeps its tiny positive values (float32
    sigmoid(-20) = 2.06e-9, as PyTorch) instead of rounding 1 + tanh(x/2) to exactly 0, which made
    log(sigmoid(x)) -inf with a NaN gradient.
    """

    saved_inputs, saves_output = (), True

    def forward(self, x):
        xp = _xp(x)
        e = xp.exp(-xp.abs(x))
        self.y = xp.where(x >= 0, 1, e) / (1 + e)
        return self.y

    def backward(self, grad):
        # BEGIN SOLUTION A1.3: the derivative of sigmoid
        return (grad * self.y * (1 - self.y),)
        # END SOLUTION


class ReLU(Function):
    """y = max(x, 0);  dy/dx = 1 where x > 0, else 0 (we pick 0 at x = 0, as PyTorch does)."""

    saved_inputs = ()  # the mask x > 0 is a new array: changing x later does not touch it

    def forward(self, x):
        self.positive = x > 0
        return x * self.positive

    def backward(self, grad):
        # BEGIN SOLUTION A1.3: the derivative of relu
        return (grad * self.positive,)
        # END SOLUTION


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715
_SQRT_HALF = math.sqrt(0.5)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _erf(x):
    """The error function elementwise. NumPy has none, so SciPy's (Cephes) on the CPU and CuPy's on
    the GPU; imported here, on first use, so that importing minidist needs neither."""
    if is_gpu_array(x):
        from cupyx.scipy.special import erf  # noqa: PLC0415  (only on the GPU backend)
    else:
        from scipy.special import erf  # noqa: PLC0415
    return erf(x)


class GELU(Function):
    """Exact GELU, y = x Phi(x) with Phi the standard normal CDF (Hendrycks & Gimpel 2016, §2):

    y = x/2 (1 + erf(x / sqrt 2))
    dy/dx = Phi(x) + x phi(x),  phi(x) = e^(-x^2/2) / sqrt(2 pi)   (the normal density)
    """

    def forward(self, x):
        self.x = x
        self.cdf = 0.5 * (1 + _erf(x * _SQRT_HALF))
        return x * self.cdf

    def backward(self, grad):
        x = self.x
        return (grad * (self.cdf + x * _INV_SQRT_2PI * _xp(x).exp(-0.5 * x * x)),)


class GELUTanh(Function):
    """GELU, tanh approximation (Hendrycks & Gimpel 2016, §2; GPT-2's):

    y = x/2 (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
    dy/dx = (1 + t)/2 + x/2 (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2),  t = tanh(u)
    """

    def forward(self, x):
        self.x = x
        self.t = _xp(x).tanh(_SQRT_2_OVER_PI * (x + _GELU_C * x**3))
        return 0.5 * x * (1 + self.t)

    def backward(self, grad):
        x, t = self.x, self.t
        du_dx = _SQRT_2_OVER_PI * (1 + 3 * _GELU_C * x * x)
        return (grad * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * du_dx),)


def _floating(x):
    """An integer or bool tensor as float32 first, as PyTorch (``exp`` of an int64 tensor is float32;
    NumPy's ``exp`` would give float64, which then fails in ``matmul`` against float32 weights)."""
    if isinstance(x, Tensor) and x._data.dtype.kind in "biu":
        return to(x, DEFAULT_DTYPE)
    return x


def exp(x):
    if autocast.low_dtype is not None:  # exp and log are on autocast's float32 list
        x = autocast_float32(x)
    return Exp.apply(_floating(x))


def log(x):
    if autocast.low_dtype is not None:
        x = autocast_float32(x)
    return Log.apply(_floating(x))


def tanh(x):
    return Tanh.apply(_floating(x))


def sigmoid(x):
    return Sigmoid.apply(_floating(x))


def relu(x):
    return ReLU.apply(x)


def gelu(x, approximate: str = "none"):
    """GELU of a tensor of any shape, as ``torch.nn.functional.gelu``: exact (erf) by default,
    the tanh approximation with ``approximate="tanh"``. Raises ``ValueError`` for another value."""
    if approximate == "none":
        return GELU.apply(x)
    if approximate == "tanh":
        return GELUTanh.apply(x)
    raise ValueError(f"gelu: approximate must be 'none' (exact, erf) or 'tanh', got {approximate!r}")

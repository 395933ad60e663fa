"""Replay-time kernels: ops whose arithmetic a replay runs with fewer temporaries, to the same bits.

An eager op is written for clarity: GELU's backward, ``grad * (cdf + x / sqrt(2 pi) * exp(-x^2 / 2))``,
makes seven arrays of x's size. A replay knows the op's results are used only as recorded, so it may run
a variant that reuses its own arrays (``out=``, in-place ufuncs). Each variant here performs the same
IEEE operations in the same order as the op it stands for (``a + b`` and ``b + a`` are the same
operation; ``(a * b) * c`` and ``a * (b * c)`` are not, and are kept apart), so it gives the same bits,
NaN, infinities and signed zeros included (tests/compile/test_kernels.py).

Measured on the baby GPT's GELU input (12 x 64 x 512 float32, one thread, CPU time): forward + backward
~15 ms eager, ~12-14 ms with this variant (a loaded 2-core machine, benchmarks/replay.py's note). The
rest of GELU is SciPy's ``erf`` and NumPy's ``exp``, which no reordering changes. The other hot ops
already work in place on their own arrays: attention's scale, mask and softmax (``ops/attention.py``),
LayerNorm's statistics and normalisation (``ops/layer_norm.py``), Linear's bias add (``ops/linear.py``).

Source: the same idea as a compiler's elementwise fusion (the TorchInductor pass of Ansel et al. 2024,
§5), limited to what NumPy can express: fewer arrays, not fewer kernel launches.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist.backend import is_gpu_array
from minidist.ops.elementwise import _INV_SQRT_2PI, _SQRT_HALF, GELU


class ReplayGELU(GELU):
    """``GELU`` with two temporaries per pass instead of seven (module docstring); NumPy arrays only."""

    def forward(self, x: Any) -> Any:
        if is_gpu_array(x):
            return super().forward(x)
        self.x = x
        cdf = np.multiply(x, _SQRT_HALF)  # 0.5 * (1 + erf(x * sqrt(1/2))), in place
        _erf_ufunc()(cdf, out=cdf)
        cdf += 1
        cdf *= 0.5
        self.cdf = cdf
        return x * cdf

    def backward(self, grad: Any) -> tuple[Any]:
        if is_gpu_array(grad):
            return super().backward(grad)
        x, out = self.x, self.cdf  # cdf is this op's own array, not needed after this backward
        e = np.multiply(x, -0.5)  # exp(-0.5 * x * x)
        e *= x
        np.exp(e, out=e)
        d = np.multiply(x, _INV_SQRT_2PI)  # (x / sqrt(2 pi)) * exp(...)
        d *= e
        out += d  # cdf + ...
        out *= grad  # grad * (...)
        return (out,)


def _erf_ufunc() -> Any:
    """SciPy's ``erf`` (a ufunc: it writes into ``out=``), the one ``GELU`` uses on the CPU."""
    from scipy.special import erf  # noqa: PLC0415  (as ops/elementwise.py: loaded on first use)

    return erf


# The op classes a replay runs as another kernel.
KERNELS: dict[type, type] = {GELU: ReplayGELU}

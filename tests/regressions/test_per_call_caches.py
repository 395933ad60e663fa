"""The collective call path's per-call caches keep the answers they replaced (one process, no MPI launch).

* ``reduce_ops.finish``'s ``"avg"`` divides by a 0-d array cached per (group size, dtype): bit for bit
  the division by the int it replaced, for every float dtype (bfloat16 too) and whichever dtype came
  first for the same group size; integers still refuse the in-place float division (``TypeError``).
* ``messages.encode_header`` looks the dtype up by identity: the same codes as by name, and a
  non-native byte order is still refused (``TypeError``), as ``str(dtype)`` refused it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from minidist.distributed.reduce_ops import finish
from minidist.parallel.pipeline.checks import stand_in_spec
from minidist.parallel.pipeline.messages import DTYPES, encode_header

FLOATS = [np.float16, np.float32, np.float64, ml_dtypes.bfloat16]


@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_avg_divides_like_the_int_whatever_dtype_came_first(n):
    rng = np.random.default_rng(n)
    for dtype in FLOATS + FLOATS[::-1]:  # both orders: a divisor cached for one dtype is not reused
        summed = (rng.standard_normal(257) * 100).astype(dtype)
        expected = summed.copy()
        np.divide(expected, n, out=expected)  # what finish did before the cache
        got = summed.copy()
        finish("avg", got, n)
        assert got.dtype == np.dtype(dtype)
        assert got.tobytes() == expected.tobytes(), (np.dtype(dtype).name, n)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_avg_of_integers_still_raises_type_error(dtype):
    with pytest.raises(TypeError):
        finish("avg", np.arange(5, dtype=dtype), 4)


def test_header_dtype_codes_by_identity_match_the_names():
    for code, name in enumerate(DTYPES):
        assert encode_header(np.zeros((2, 3), name))[:4].tolist() == [code, 2, 2, 3]
    with pytest.raises(TypeError, match="must be a floating array"):
        encode_header(np.zeros(3, np.dtype("float32").newbyteorder()))
    with pytest.raises(TypeError, match="must be a floating array"):
        encode_header(np.zeros(3, np.int64))


@pytest.mark.parametrize("dtype", [">f8", ">f4", np.longdouble, np.int64, np.float32])
def test_a_failed_chunks_stand_in_zeros_can_always_be_sent(dtype):
    """A chunk that fails before any activation crossed its boundary sends zeros shaped like its input;
    their header must encode, or the sender raises alone and the next stage waits forever (a
    big-endian float64 batch into a float64 model hung 2 ranks this way)."""
    shape, stand_in = stand_in_spec(np.zeros((2, 6), dtype))
    assert shape == (2, 6)
    encode_header(np.zeros(shape, stand_in))  # no TypeError

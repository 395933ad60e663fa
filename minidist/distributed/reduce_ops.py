"""Reduction operators: how two ranks' contributions are combined.

A reduction collective combines the arrays of all ranks element by element. The operator must be
associative and commutative (up to floating-point rounding), because each algorithm combines the
contributions in its own order: a ring adds them in ring order, MPI in whatever order it likes.

==========  ===========================  ============  ======================================
op          combines two arrays with     MPI operator  dtypes
==========  ===========================  ============  ======================================
``"sum"``   ``numpy.add``                ``MPI.SUM``   ints, unsigned ints, floats
``"avg"``   ``numpy.add``, then ``/ n``  ``MPI.SUM``   floats only (an int mean would truncate)
``"max"``   ``numpy.maximum``            ``MPI.MAX``   ints, unsigned ints, floats
``"min"``   ``numpy.minimum``            ``MPI.MIN``   ints, unsigned ints, floats
==========  ===========================  ============  ======================================

"floats" includes ``float16`` and ``bfloat16``. NumPy has no bfloat16 of its own; the dtype comes from
``ml_dtypes`` (``ml_dtypes.bfloat16``, 8 exponent bits and 7 mantissa bits: float32's range with 3 decimal
digits), whose NumPy ufuncs add, compare and divide it, so the hand-written algorithms reduce it like any
float. MPI has no bfloat16 datatype: ``algorithm="mpi"`` raises ``TypeError`` for it (``mpi_builtin.py``).
``"avg"`` is not an MPI operator: it is a sum followed by one division by the group size ``n``, done by
:func:`finish` once, on the final result, rather than at every step.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from minidist.distributed.checks import check_choice

REDUCE_OPS = ("sum", "avg", "max", "min")

_COMBINE = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum}
_MPI_OP = {"sum": MPI.SUM, "avg": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}
# Floats that NumPy knows only through ml_dtypes: their dtype.kind is "V" (void), not "f". Named, not
# imported: an array of such a dtype exists only if its maker imported ml_dtypes already, and importing
# it here would cost every rank about 1 s of CPU at start-up.
_EXTRA_FLOATS = ("bfloat16",)
# (op, dtype) pairs that passed check_op. It runs before every reduction, and a training loop passes
# the same pair every step: a set look-up (~0.1 us) instead of the checks (~0.6 us). Only pairs that
# passed are added, so a wrong pair is checked, and rejected, on every call.
_accepted: set[tuple] = set()


def check_op(op: str, dtype: np.dtype) -> None:
    """Check that ``op`` is a known reduction and makes sense for ``dtype``.

    Raises ``ValueError`` for an unknown ``op`` (listing the valid ones) and ``TypeError`` for a dtype
    that cannot be reduced (bool, complex, strings, ...) or for ``"avg"`` on an integer dtype.
    """
    try:
        if (op, dtype) in _accepted:
            return
    except TypeError:  # an unhashable op (a list, ...): the checks below reject it
        pass
    check_choice(op, REDUCE_OPS, "reduction op")
    given, dtype = dtype, np.dtype(dtype)
    is_float = dtype.kind == "f" or (dtype.kind == "V" and dtype.name in _EXTRA_FLOATS)
    if dtype.kind not in "iu" and not is_float:
        raise TypeError(
            f"cannot reduce arrays of dtype {dtype}; reductions support integer and float dtypes "
            "(e.g. int32, int64, float16, bfloat16, float32, float64)"
        )
    if op == "avg" and not is_float:
        raise TypeError(
            f"op='avg' needs a float dtype, got {dtype}: an integer mean would be silently truncated; "
            "convert to float (a.astype(np.float64)) or use op='sum' and divide yourself"
        )
    _accepted.add((op, given))


def combine_ufunc(op: str) -> np.ufunc:
    """The NumPy ufunc that combines two contributions, used as ``combine(mine, theirs, out=mine)``."""
    return _COMBINE[op]


def mpi_op(op: str) -> MPI.Op:
    """The MPI operator for ``op`` (``"avg"`` maps to ``MPI.SUM``; call :func:`finish` afterwards)."""
    return _MPI_OP[op]


def finish(op: str, reduced: np.ndarray, group_size: int) -> None:
    """Complete a reduction in place: for ``"avg"`` divide the summed ``reduced`` by ``group_size``."""
    if op == "avg":
        key = (group_size, reduced.dtype)
        divisor = _divisors.get(key)
        if divisor is None:
            divisor = _divisors[key] = np.array(group_size, dtype=reduced.dtype)
        np.divide(reduced, divisor, out=reduced)


# (group size, dtype) -> the group size as a 0-d array of that dtype. NumPy divides by it as by the int
# (the same float division, bit for bit), but without converting a Python int on every call: ~1,000
# instructions less per "avg" call with this look-up paid (docs/performance.md, "Counted").
_divisors: dict[tuple, np.ndarray] = {}

"""From an array to a buffer MPI can read or write: host staging and datatypes.

Two questions come up every time an array is handed to MPI, and this module is the one place that
answers them:

1. **Where does the memory live?** MPI reads and writes memory through plain pointers. An MPI built
   without CUDA support ("not CUDA-aware") cannot follow a pointer into GPU memory, so a CuPy array must
   be *staged*: copied to a host NumPy buffer before MPI sees it and, if MPI wrote into it, copied back
   afterwards. NumPy arrays pass through untouched (no copy). :func:`host_view` does this.
2. **What is one element?** MPI counts in elements of an ``MPI.Datatype``. :func:`mpi_datatype` maps a
   NumPy dtype to one. If this MPI has no datatype for a dtype (``float16`` is an extension that some MPI
   builds lack), the data can still be *moved* as an opaque block of ``itemsize`` bytes per element;
   only MPI's own reductions need to know the arithmetic type (:func:`mpi_reduction_datatype`).

This module imports without CuPy: GPU arrays are recognised with ``minidist.backend.is_gpu_array``.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import numpy as np
from mpi4py import MPI

from minidist.backend import array_module, is_gpu_array

# Derived "n opaque bytes" datatypes, one per itemsize. They are created once and kept for the life of
# the process (a handful of tiny objects), so we never have to remember to free them.
_opaque_types: dict[int, MPI.Datatype] = {}
# dtype -> the datatype mpi_datatype answers, remembered because every message asks (a look-up here
# costs a fifth of working the answer out again).
_datatypes: dict[np.dtype, MPI.Datatype] = {}


def mpi_is_cuda_aware() -> bool:
    """True if this MPI library says it can read and write GPU memory directly.

    Open MPI answers the question with ``MPIX_Query_cuda_support``; we call it only if mpi4py exposes it
    (as ``MPI.Query_cuda_support``), and answer False otherwise, which is always safe: staging through
    the host works with every MPI, it is only slower. The collectives do not use the answer yet; they
    always stage (see :func:`host_view`). Never raises.
    """
    query = getattr(MPI, "Query_cuda_support", None)
    if query is None:
        return False
    try:
        return bool(query())
    except Exception:  # an MPI error or an mpi4py without the binding: assume the safe answer
        return False


class host_view:  # lower case: it is used like a function, ``with host_view(a) as host``
    """``with host_view(a) as host``: a NumPy array holding ``a``'s data for MPI; results go back to ``a``.

    For a NumPy ``a``, ``host`` is ``a`` itself: no copy, and MPI's writes land in ``a`` directly.

    For a CuPy ``a``, ``host`` is a host array of ``a.shape`` and ``a.dtype`` (``a.nbytes`` bytes):

    * ``copy_in=True`` fills it from the GPU first (needed when the data will be sent or reduced);
      ``copy_in=False`` leaves it uninitialised (enough for a pure receive, which overwrites everything).
    * ``copy_out=True`` copies the host array back into ``a`` when the ``with`` block ends normally. If the
      block raises, nothing is copied back, so a GPU ``a`` is never left half updated by a failed
      operation. (A NumPy ``a``, which MPI writes into directly, may be.)

    A production library would keep pinned (page-locked) host buffers around to make these copies faster;
    we allocate plainly to keep the idea visible. (A class rather than a ``@contextmanager`` generator:
    this runs for every message, and the class costs a quarter as much.)
    """

    __slots__ = ("_a", "_copy_in", "_copy_out", "_host")

    def __init__(self, a: Any, *, copy_in: bool = True, copy_out: bool = False) -> None:
        self._a, self._copy_in, self._copy_out, self._host = a, copy_in, copy_out, None

    def __enter__(self) -> np.ndarray:
        a = self._a
        if not is_gpu_array(a):
            return a
        self._host = a.get() if self._copy_in else np.empty(a.shape, dtype=a.dtype)
        return self._host

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._host is not None and self._copy_out and exc_type is None:
            self._a.set(self._host)


def like(host: np.ndarray, a: Any) -> Any:
    """Return ``host`` on the same device as ``a``: ``host`` itself for NumPy, a GPU copy for CuPy."""
    if is_gpu_array(a):
        return array_module(a).asarray(host)
    return host


def mpi_reduction_datatype(dtype: np.dtype) -> MPI.Datatype | None:
    """The predefined MPI datatype for ``dtype`` that MPI's reduction ops understand, or None.

    None means this MPI has no such datatype (for example ``float16`` on an MPI without the extension),
    so MPI's built-in ``Allreduce`` cannot be used for that dtype.
    """
    dtype = np.dtype(dtype)
    # Only plain numbers in this machine's byte order: MPI would add byte-swapped values as garbage.
    if dtype.kind not in "biufc" or not dtype.isnative:
        return None
    try:
        # mpi4py's own table from a NumPy type code ("f" -> MPI_FLOAT, "e" -> the float16 extension, ...)
        datatype = MPI.Datatype.fromcode(dtype.char)
    except (ValueError, KeyError, TypeError):
        return None
    if datatype == MPI.DATATYPE_NULL:
        return None
    return datatype


def mpi_datatype(dtype: np.dtype) -> MPI.Datatype:
    """An MPI datatype whose one element is one element of ``dtype``, good for moving data.

    The predefined datatype when MPI has one, else a committed contiguous block of ``dtype.itemsize``
    bytes. With the block type MPI can send, receive and count elements, but not add them.

    Raises ``TypeError`` for dtypes that are references rather than values (``object``): their bytes are
    pointers that mean nothing in another process.
    """
    datatype = _datatypes.get(dtype)  # asked for every message: answer from the table before anything else
    if datatype is not None:
        return datatype
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise TypeError(f"cannot send arrays of dtype {dtype}: they hold Python object pointers, not values")
    datatype = mpi_reduction_datatype(dtype)
    if datatype is None:
        if dtype.itemsize not in _opaque_types:
            _opaque_types[dtype.itemsize] = MPI.BYTE.Create_contiguous(dtype.itemsize).Commit()
        datatype = _opaque_types[dtype.itemsize]
    _datatypes[dtype] = datatype
    return datatype


def mpi_buffer(host: np.ndarray) -> list:
    """The mpi4py buffer specification ``[array, datatype]`` for a C-contiguous NumPy array.

    MPI sees ``host.size`` elements of :func:`mpi_datatype` ``(host.dtype)``, i.e. ``host.nbytes`` bytes.
    """
    return [host, mpi_datatype(host.dtype)]

"""The array backend: NumPy on the CPU, CuPy on a GPU.

Every array that minidist creates comes from ``xp()``, so the same autograd, layers and collectives run
on either device. The choice is made once, from the environment variable ``MINIDIST_DEVICE``:

* ``cpu`` (default): NumPy.
* ``cuda``: CuPy; raises ``DeviceUnavailableError`` (a ``RuntimeError``) if CuPy or a GPU is missing.
* ``auto``: CuPy when it imports and sees at least one GPU, else NumPy.

On a multi-GPU node each rank should use its own GPU. ``dist.init()`` computes the node-local rank with
an MPI shared-memory split and calls :func:`use_local_rank`, which selects GPU ``local_rank % n_gpus``.
This module imports nothing from MPI (it is the bottom layer).
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import numpy as np

_VALID_DEVICES = ("cpu", "cuda", "auto")
_module: ModuleType | None = None  # numpy or cupy, chosen lazily on first use


class DeviceUnavailableError(RuntimeError):
    """``MINIDIST_DEVICE=cuda`` without CuPy or a GPU: a setting to fix (scripts report it once)."""


def _try_import_cupy() -> ModuleType | None:
    """Return the cupy module if it imports and sees a GPU, else None (never raises)."""
    try:
        import cupy  # noqa: PLC0415  (optional dependency, imported only when asked for)

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy
    except Exception:  # ImportError, or a CUDA driver error on a machine without a GPU
        return None
    return None


def _choose() -> ModuleType:
    wanted = os.environ.get("MINIDIST_DEVICE", "cpu").lower()
    if wanted not in _VALID_DEVICES:
        raise ValueError(f"MINIDIST_DEVICE={wanted!r} is not one of {_VALID_DEVICES} (unset: the CPU)")
    if wanted == "cpu":
        return np
    cupy = _try_import_cupy()
    if cupy is not None:
        return cupy
    if wanted == "cuda":
        raise DeviceUnavailableError(
            'MINIDIST_DEVICE=cuda but CuPy with a visible GPU is not available; `pip install -e ".[gpu]"` '
            "on a machine with a CUDA GPU, or use MINIDIST_DEVICE=cpu."
        )
    return np


def xp() -> ModuleType:
    """The backend array module (``numpy`` or ``cupy``) that new arrays are made with."""
    global _module
    if _module is None:
        _module = _choose()
    return _module


def device() -> str:
    """``'cpu'`` or ``'cuda:<id>'``: where new arrays live."""
    mod = xp()
    if mod is np:
        return "cpu"
    return f"cuda:{mod.cuda.Device().id}"


def use_local_rank(local_rank: int) -> None:
    """Pin this process to GPU ``local_rank % n_gpus`` (no-op on the CPU backend).

    Called by ``dist.init()`` with the node-local rank, so 8 ranks on a node with 8 GPUs use one GPU each.
    """
    mod = xp()
    if mod is np:
        return
    n_gpus = mod.cuda.runtime.getDeviceCount()
    mod.cuda.Device(local_rank % n_gpus).use()


def is_gpu_array(a: Any) -> bool:
    """True for a CuPy array (checked without importing CuPy)."""
    return type(a).__module__.startswith("cupy")


def array_module(a: Any) -> ModuleType:
    """The module (numpy or cupy) that owns array ``a``."""
    if is_gpu_array(a):
        import cupy  # noqa: PLC0415

        return cupy
    return np


def asarray(data: Any, dtype: Any = None) -> Any:
    """Convert ``data`` (list, scalar, NumPy or CuPy array) into a backend array of ``dtype``."""
    return xp().asarray(data, dtype=dtype)


def to_numpy(a: Any) -> np.ndarray:
    """A host (NumPy) copy or view of array ``a``; CuPy arrays are copied from the device."""
    if is_gpu_array(a):
        return a.get()
    return np.asarray(a)

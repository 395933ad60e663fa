"""A CuPy stand-in: device arrays that refuse what real CuPy refuses, so GPU code paths run on any CPU.

``install(monkeypatch)`` puts a fake ``cupy`` (and ``cupyx.scipy.special.erf``, ``cupyx.scatter_add``)
into ``sys.modules`` and makes it minidist's backend, as ``MINIDIST_DEVICE=cuda`` would on a GPU machine.
Its arrays (:class:`DeviceArray`) keep a NumPy array out of NumPy's reach and fail, as CuPy does, on

* implicit conversion to NumPy (``np.asarray(device)``, a host array built from one): CuPy's TypeError;
* arithmetic between a device array and a host array (``device * host``, ``cupy.exp(host)``): CuPy's
  "Unsupported type" TypeError; host arrays are accepted only where CuPy copies them over itself:
  ``cupy.asarray``/``cupy.array`` and as indices (``device[host_ids]``, ``cupy.take``);
* a host array assigned through a basic index (``device[...] = host``): CuPy's ValueError (it fills);
* a ``bfloat16`` array given to ``cupyx`` (``erf``, ``scatter_add``): CuPy 14 added bfloat16 to most of
  ``cupy`` but not to ``cupyx`` (cupy/cupy#9630); CuPy 13, which the ``gpu`` extra allows, has none at all;

and, stricter than CuPy, on any ``np.<function>`` applied to a device array (CuPy would forward many of
them through ``__array_function__``, but minidist's rule is the input's array module, never ``np.``). A
scalar result is a 0-d device array, as CuPy's ``a.sum()`` is; ``.get()`` and ``.item()`` copy to the host.
"""

from __future__ import annotations

import operator
import sys
import types
from typing import Any

import numpy as np

_HOST_MESSAGE = "Unsupported type <class 'numpy.ndarray'>"  # CuPy's text for a host operand


def _unwrap(value: Any, host_ok: bool = False) -> Any:
    """The NumPy array inside a device array; a host array only where CuPy would accept one."""
    if isinstance(value, DeviceArray):
        return value._a
    if isinstance(value, np.ndarray) and not host_ok:
        raise TypeError(_HOST_MESSAGE)
    if isinstance(value, (tuple, list)):
        return type(value)(_unwrap(v, host_ok) for v in value)
    return value


def _wrap(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return DeviceArray(value)
    if isinstance(value, np.generic) and not isinstance(value, np.dtype):
        return DeviceArray(np.asarray(value))  # CuPy's reductions return 0-d arrays, not scalars
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    return value


class _Device:
    """``cupy.cuda.Device``: a GPU by number; ``with device:`` makes it current (a no-op here)."""

    def __init__(self, index: int = 0) -> None:
        self.id = index

    def use(self) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def __enter__(self) -> _Device:
        return self

    def __exit__(self, *_: object) -> None:
        pass


class DeviceArray:
    """A stand-in ``cupy.ndarray`` around a private NumPy array."""

    __array_priority__ = 1000  # NumPy defers to our operators (host @ device comes here and fails)

    def __init__(self, host: np.ndarray) -> None:
        self._a = host

    def get(self) -> np.ndarray:
        return self._a.copy()

    def set(self, host: np.ndarray) -> None:
        """Copy a host array of the same shape in, as ``cupy.ndarray.set`` (staging's in-place results)."""
        if not isinstance(host, np.ndarray) or host.shape != self._a.shape:
            raise ValueError("set: a host array of the device array's shape is required")
        self._a[...] = host

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError(
            "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a NumPy "
            "array explicitly."
        )

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        raise TypeError(f"numpy's {ufunc.__name__}.{method} applied to a device array: use its array module")

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        raise TypeError(f"np.{func.__name__} applied to a device array: use its array module")

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: DeviceArray(self._a.T))
    device = property(lambda self: _Device(0))  # CuPy's: the GPU holding the array (NumPy 2's is "cpu")

    def __getattr__(self, name: str) -> Any:  # methods: reshape, sum, astype, transpose, fill, ...
        if name.startswith("__"):  # not the inner array's __array_interface__: NumPy would read it directly
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr)

        def method(*args: Any, **kwargs: Any) -> Any:
            # Host arrays pass as method arguments (axes for transpose, indices for take), not as data.
            return _wrap(attr(*_unwrap(args, host_ok=name != "dot"), **_unwrap_kwargs(kwargs)))

        return method

    def item(self) -> Any:
        return self._a.item()

    def __getitem__(self, index: Any) -> Any:
        return _wrap(self._a[_unwrap(index, host_ok=True)])

    def __setitem__(self, index: Any, value: Any) -> None:
        index = _unwrap(index, host_ok=True)
        parts = index if isinstance(index, tuple) else (index,)
        if isinstance(value, np.ndarray) and value.ndim and not any(isinstance(i, np.ndarray) for i in parts):
            # CuPy copies a host value in only for an array index; a basic index fills: its ValueError
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
        self._a[index] = value._a if isinstance(value, DeviceArray) else value

    def __len__(self) -> int:
        return len(self._a)

    def __float__(self) -> float:
        return float(self._a)

    def __int__(self) -> int:
        return int(self._a)

    def __bool__(self) -> bool:
        return bool(self._a)

    def __repr__(self) -> str:
        return f"DeviceArray({self._a!r})"


def _unwrap_kwargs(kwargs: dict) -> dict:
    return {k: _unwrap(v) for k, v in kwargs.items()}


def _operator(op: Any, reflected: bool = False) -> Any:
    def apply(self: DeviceArray, other: Any) -> Any:
        a, b = self._a, _unwrap(other)
        return _wrap(op(b, a) if reflected else op(a, b))

    return apply


def _in_place(op: Any) -> Any:
    def apply(self: DeviceArray, other: Any) -> DeviceArray:
        self._a = op(self._a, _unwrap(other))  # the i-operators of NumPy arrays change them in place
        return self

    return apply


for _name in (
    "add",
    "sub",
    "mul",
    "truediv",
    "floordiv",
    "pow",
    "matmul",
    "mod",
    "and",
    "or",
    "xor",
    "lshift",
    "rshift",
):
    _op = getattr(operator, _name + "_" if _name in ("and", "or") else _name)
    setattr(DeviceArray, f"__{_name}__", _operator(_op))
    setattr(DeviceArray, f"__r{_name}__", _operator(_op, reflected=True))
    setattr(DeviceArray, f"__i{_name}__", _in_place(getattr(operator, f"i{_name}")))
for _name in ("lt", "le", "gt", "ge", "eq", "ne"):
    setattr(DeviceArray, f"__{_name}__", _operator(getattr(operator, _name)))


def _unary(op: Any) -> Any:
    return lambda self: _wrap(op(self._a))


for _name in ("neg", "pos", "abs", "invert"):
    setattr(DeviceArray, f"__{_name}__", _unary(getattr(operator, _name)))
DeviceArray.__hash__ = None  # type: ignore[assignment]  (as an ndarray: it defines __eq__)
DeviceArray.__module__ = "cupy"  # what minidist.backend.is_gpu_array looks at

_HOST_IN = {"asarray", "array", "ascontiguousarray", "take"}  # CuPy copies host data in for these


class _FakeCupy(types.ModuleType):
    """``cupy``: NumPy's functions on the arrays inside device arrays, results wrapped again; its
    submodules likewise (``cupy.linalg.norm`` is NumPy's ``linalg.norm`` on the inner arrays)."""

    ndarray = DeviceArray

    def __init__(self, name: str, source: types.ModuleType = np) -> None:
        super().__init__(name)
        self._source = source

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._source, name)
        if isinstance(attr, types.ModuleType):  # cupy.linalg, cupy.fft, ...: wrapped the same way
            return _FakeCupy(f"{self.__name__}.{name}", attr)
        if isinstance(attr, type) or not callable(attr):  # dtypes (cupy.float64 is numpy's), constants
            return attr

        def function(*args: Any, **kwargs: Any) -> Any:
            return _wrap(attr(*_unwrap(args, host_ok=name in _HOST_IN), **_unwrap_kwargs(kwargs)))

        return function


def _no_bfloat16(a: Any) -> Any:
    """``a``, unless it is bfloat16: cupyx's kernels are typed for CuPy's own dtypes (cupy/cupy#9630)."""
    if getattr(a, "dtype", None) is not None and a.dtype.name == "bfloat16":
        raise TypeError("cupyx does not support bfloat16 (cast to float32 first, or keep it on the host)")
    return a


def _fake_modules() -> dict[str, types.ModuleType]:
    cupy = _FakeCupy("cupy")
    cupy.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=lambda: 1), Device=_Device)
    cupyx = types.ModuleType("cupyx")
    cupyx.scatter_add = lambda a, index, values: np.add.at(
        _no_bfloat16(a)._a, _unwrap(index, True), _unwrap(values)
    )
    scipy = types.ModuleType("cupyx.scipy")
    special = types.ModuleType("cupyx.scipy.special")
    from scipy.special import erf  # noqa: PLC0415

    special.erf = lambda x: _wrap(erf(_unwrap(_no_bfloat16(x))))
    cupyx.scipy, scipy.special = scipy, special
    return {"cupy": cupy, "cupyx": cupyx, "cupyx.scipy": scipy, "cupyx.scipy.special": special}


def install(monkeypatch: Any) -> types.ModuleType:
    """Make the stand-in minidist's backend for one test (undone with the monkeypatch); returns it."""
    from minidist import backend  # noqa: PLC0415

    modules = _fake_modules()
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(backend, "_module", modules["cupy"])
    return modules["cupy"]

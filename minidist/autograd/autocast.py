"""Automatic mixed precision: ``autocast``, the switch that makes matrix products low precision.

Inside ``with minidist.autocast("bfloat16"):`` (as ``torch.autocast``) the ops fall in three kinds:

* **low precision** (PyTorch's "lower_precision_fp" list): ``linear`` / ``nn.Linear``, ``matmul``
  (``@``) and the two products of ``scaled_dot_product_attention``. Their inputs are rounded to the low
  dtype by a differentiable cast (``ops.dtypes.Cast``: its gradient is cast back to the input's dtype,
  so a float32 parameter, the *master weight*, still gets a float32 ``.grad``); they return, save for
  backward, and pass back gradients in the low dtype. float64 inputs are left as they are (as in
  PyTorch, only float32 is cast: float64 means more precision was asked for).
* **float32** (PyTorch's "fp32" list): ``softmax``, ``log_softmax``, ``cross_entropy``, ``layer_norm``,
  ``sum``, ``mean``, ``exp``, ``log``: a low-precision input is cast to float32 first, because their
  sums and exponentials lose too much in 8 (bfloat16) or 11 (float16) significant bits.
* **everything else** (``gelu``, ``dropout``, ``relu``, ``*``, ``+`` ...) keeps its input's dtype, as in
  PyTorch: low in, low out. ``x + residual`` of a low and a float32 tensor promotes to float32.

The two lists are those of ``torch.autocast("cuda")``. ``torch.autocast("cpu")`` differs, deliberately
not followed here: its softmax, log_softmax, layer_norm, sum, mean, exp and log take a low input and
return the low dtype (computed in float32 inside and rounded), where these return float32; rounded to
the low dtype, minidist's values are torch's bits (log_softmax: torch rounds intermediates, so it is
<= 2 ulps off, more near 0). Its cross_entropy returns float32, as here. Products, gelu, relu and adds
give torch CPU's dtypes and bits (gelu: an ulp of the low dtype apart at a few values, two erf codes).
``scaled_dot_product_attention``: torch's CPU kernel rounds the softmax weights to the low dtype
before multiplying V; minidist keeps them in float32 (closer to the exact result). The float32 master
gradients of a small MLP under bfloat16 equal torch's to the bit
(tests/torch_oracle/test_torch_oracle_amp_fsdp_memory.py).

How it is computed here, and why: NumPy's float16 arithmetic is ~200x slower than float32's, and
ml_dtypes' bfloat16 ufuncs are slow too, so no op does elementwise arithmetic in a 2-byte dtype.
Low-precision arrays are *stored* in the low dtype (real half bytes: saved activations take half the
memory) and *computed* in float32: a product is ``(a.astype(f32) @ b.astype(f32)).astype(low)``, the
numerics of a tensor core (low-precision inputs, float32 accumulation, rounded output). An op of the
third kind whose inputs are low is run by :func:`upcast_apply` on float32 copies, its result rounded
back; it keeps the low arrays it was given for backward, not their float32 copies.

On CuPy (GPU) float16 arrays are real; bfloat16 does not exist there, so it is *emulated*: float32
arrays whose values are rounded to bfloat16 (round-to-nearest-even on the bits, :func:`round_bfloat16`)
at the same places as on NumPy. Values are the same as with real bfloat16; memory is not halved.

Sources: Micikevicius et al. 2018, "Mixed Precision Training" (ICLR), §3.1 (float32 master weights),
§3.3 (float32 accumulation, float32 reductions and softmax); Kalamkar et al. 2019, "A Study of BFLOAT16
for Deep Learning Training" (bfloat16: float32's exponent, so no loss scaling is needed).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

_FLOAT32 = np.dtype(np.float32)
# The low dtype while autocast is on, else None: the one flag every autocast-aware op checks.
low_dtype: np.dtype | None = None
# Whether bfloat16 is emulated by rounded float32 arrays (the CuPy backend): set with low_dtype.
emulated = False


def is_low(dtype: Any) -> bool:
    """True for a 2-byte float dtype (float16, or ml_dtypes' bfloat16, whose ``kind`` is "V")."""
    return dtype.itemsize == 2 and dtype.kind in "fV"


def low_precision_dtype(name: Any) -> np.dtype:
    """The NumPy dtype for ``"bfloat16"`` / ``"float16"`` (or such a dtype). ``ml_dtypes`` is imported
    here, on first use (its import costs ~1 s of CPU). Raises ``ValueError`` for any other dtype."""
    text = name if isinstance(name, str) else getattr(name, "__name__", None)
    if text is None:  # torch.bfloat16 (no __name__, and NumPy cannot read it) or a NumPy dtype
        text = str(name) if str(name).startswith("torch.") else str(np.dtype(name))
    text = text.replace("torch.", "")
    if text in ("bfloat16", "bf16"):
        import ml_dtypes  # noqa: PLC0415

        return np.dtype(ml_dtypes.bfloat16)
    if text in ("float16", "half", "fp16"):
        return np.dtype(np.float16)
    raise ValueError(
        f"autocast: dtype must be 'bfloat16' or 'float16' (the low precision the matrix products run in), "
        f"got {name!r}; for float32 training leave autocast off (or pass enabled=False)"
    )


class autocast:  # noqa: N801  (torch's name: a context manager used like a function)
    """Run the ops inside in mixed precision (module docstring), as ``torch.autocast`` (with the op lists
    of its CUDA autocast on every device: the module docstring says where torch's CPU lists differ).

    ``dtype``: "bfloat16" (default, as torch's CPU autocast) or "float16". ``enabled=False`` makes the
    block run in float32, as if there were no ``autocast``. Nested blocks restore the outer setting on
    exit. Run ``loss.backward()`` after the block (as in PyTorch): backward uses the dtypes that the
    forward chose. ``device_type`` is accepted for PyTorch's signature and ignored (minidist's backend
    decides). On the CuPy backend bfloat16 is emulated (module docstring). Raises ``ValueError`` for
    another dtype. Also usable as a decorator.
    """

    def __init__(self, device_type: Any = None, dtype: Any = "bfloat16", enabled: bool = True, **_: Any):
        if device_type not in (None, "cpu", "cuda"):  # md.autocast("float16"): the dtype given first
            device_type, dtype = None, device_type
        self._dtype_arg = dtype
        self.dtype = low_precision_dtype(dtype)
        self.enabled = bool(enabled)

    def __enter__(self) -> autocast:
        global low_dtype, emulated
        # A stack, not one slot: the same instance may be entered again inside itself (one autocast
        # object kept by a training loop and used by a nested helper); each exit restores its own entry.
        self.__dict__.setdefault("_previous", []).append((low_dtype, emulated))
        if self.enabled:
            from minidist import backend  # noqa: PLC0415

            low_dtype = self.dtype
            emulated = self.dtype.kind == "V" and backend.xp().__name__ == "cupy"
        else:
            low_dtype, emulated = None, False
        return self

    def __exit__(self, *exc: Any) -> None:
        global low_dtype, emulated
        low_dtype, emulated = self._previous.pop()

    def __call__(self, fn: Any) -> Any:
        import functools  # noqa: PLC0415

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with autocast(dtype=self._dtype_arg, enabled=self.enabled):
                return fn(*args, **kwargs)

        return wrapper


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Autocast off inside (an op that has cast its inputs already calls itself again in it)."""
    global low_dtype, emulated
    previous, low_dtype, emulated = (low_dtype, emulated), None, False
    try:
        yield
    finally:
        low_dtype, emulated = previous


def is_autocast_enabled(device_type: str | None = None) -> bool:
    """Whether an ``autocast`` block is active (as ``torch.is_autocast_enabled``; ``device_type`` is
    accepted for its signature and ignored: one autocast state serves the backend in use)."""
    return low_dtype is not None


def get_autocast_dtype(device_type: str | None = None) -> np.dtype | None:
    """The low dtype of the active ``autocast`` block, or None outside one (unlike
    ``torch.get_autocast_dtype(device_type)``, which returns the device's default low dtype even
    outside a block). ``device_type`` is accepted for torch's signature and ignored."""
    return low_dtype


def round_bfloat16(a: Any) -> Any:
    """float32 ``a`` rounded to the nearest bfloat16 value (ties to even), still float32.

    bfloat16 is float32's upper 16 bits: add 0x7FFF plus the lowest kept bit, then clear the low 16
    bits (the carry rounds up); inf and NaN are kept as they are. Works on NumPy and CuPy arrays; on
    NumPy it equals ``a.astype(ml_dtypes.bfloat16).astype(np.float32)`` (tests/amp/test_amp.py).
    """
    from minidist.backend import array_module  # noqa: PLC0415

    xp = array_module(a)
    bits = xp.ascontiguousarray(a, dtype=xp.float32).view(xp.uint32)
    lsb = (bits >> 16) & 1
    rounded = (bits + (0x7FFF + lsb)) & xp.uint32(0xFFFF0000)
    special = (bits & xp.uint32(0x7F800000)) == 0x7F800000  # exponent all ones: inf or NaN
    return xp.where(special, bits, rounded).astype(xp.uint32).view(xp.float32)


def upcast_apply(fn: Any, arrays: list[Any], options: dict[str, Any]) -> Any:
    """``fn.forward`` on float32 copies of the low-precision ``arrays``, its result rounded back.

    For the ops that keep their input's dtype (module docstring): the result is low when every float
    input was; what forward saved of its inputs is kept as the low arrays it was given (not the float32
    copies: the memory saving), and ``fn.backward`` is replaced by one that computes in float32 too (the
    graph walk casts each gradient to its input's dtype). Only called when ``autocast`` is on and an
    input is low; one op of the graph at a time.
    """
    low = None
    upcast, originals = [], {}
    all_low = True
    for a in arrays:
        dtype = getattr(a, "dtype", None)
        if dtype is not None and is_low(dtype):
            low = dtype
            up = a.astype(_FLOAT32)
            originals[id(up)] = a
            upcast.append(up)
        else:
            if dtype is not None and dtype.kind == "f":
                all_low = False
            upcast.append(a)
    result = fn.forward(*upcast, **options)
    saved = {}
    for name, value in fn.__dict__.items():  # swap the float32 copies forward kept for the low arrays
        original = originals.get(id(value))
        if original is not None and value is not result:
            saved[name] = original
    fn.__dict__.update(saved)
    forward_backward = fn.backward

    def backward(grad: Any) -> Any:
        for name in saved:
            fn.__dict__[name] = fn.__dict__[name].astype(_FLOAT32)
        return forward_backward(grad.astype(_FLOAT32) if is_low(grad.dtype) else grad)

    fn.backward = backward
    if all_low and getattr(result, "dtype", None) == _FLOAT32:
        return result.astype(low)
    return result

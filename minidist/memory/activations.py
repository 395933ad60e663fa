"""Activations: the arrays the autograd graph keeps alive for backward, counted by base buffer.

``Function.apply`` calls :func:`record` for each op it records while a tracker listens, and
``Function.release`` (after the op's backward) calls :func:`release`. An op keeps alive the arrays it
saved on itself in ``forward`` (Linear's x, Softmax's output, a dropout mask) *and* the arrays of its
input tensors (``fn.inputs``), until ``release`` drops them; both are counted, because both are really
held. Parameters are not activations (the tracker measures them), so leaves that require grad and the
buffers the tracker registered as parameters are skipped.

Each underlying buffer is counted once however many ops keep it or a view into it (a reshape, a
transpose, the same x saved by three Linears): a reference count per base buffer, keyed by ``id``. The
key is safe because while the count is above zero an op holds the buffer, so its ``id`` cannot be
reused. A graph dropped without backward is released when its op objects are collected
(``weakref.finalize``), so the count still returns to zero.

Source: what PyTorch calls "saved tensors" (``torch.autograd.graph.saved_tensors_hooks``); the
per-layer count is compared with Korthikanti et al. 2022, §4, in ``minidist_tools/perfmodel/memory.py``.
"""

from __future__ import annotations

import tracemalloc
import weakref
from typing import Any

import numpy as np

from minidist.memory import counters

_refs: dict[int, list] = {}  # base id -> [count, nbytes, owner]
_params: set[int] = set()  # base ids of parameter buffers (the tracker's model), never activations
_session = 0  # bumped by reset(): a record made before the latest reset() is not subtracted
scope = ""  # the module path now running (set by the tracker around each module's forward)
# The tracker's forward wrappers, which only set ``scope``: ``nn.Sequential`` may run a Linear and its
# ReLU fused in their place (``nn.layers.run_in_order``). Held by identity, not by a flag on the function,
# which ``functools.wraps`` would copy onto a user's wrapper of one of them.
scope_setters: weakref.WeakSet = weakref.WeakSet()


def reset(param_bases: set[int]) -> None:
    """Start counting afresh (a tracker starts); ``param_bases``: ids of the parameters' buffers."""
    global _session
    _refs.clear()
    _params.clear()
    _params.update(param_bases)
    _session += 1


def base_of(a: Any) -> Any:
    """The array that owns ``a``'s memory (``a`` itself unless it is a view). NumPy and CuPy: ``.base``."""
    while hasattr(getattr(a, "base", None), "dtype"):
        a = a.base
    return a


def _is_array(v: Any) -> bool:
    return hasattr(v, "base") and hasattr(v, "nbytes") and not isinstance(v, np.generic)


def record(fn: Any, tensors: tuple) -> None:
    """Count the buffers op ``fn`` (just recorded on the graph, with inputs ``tensors``) keeps alive."""
    arrays = [t._data for t in tensors if t._ctx is not None or not t.requires_grad]
    arrays += [v for v in fn.__dict__.values() if _is_array(v)]
    # A leaf that requires grad is a parameter, counted elsewhere, also when the op saved its array (Linear's
    # weight): FSDP's gathered weights are such leaves, and their buffer is "gathered_parameters".
    leaves = {id(base_of(t._data)) for t in tensors if t._ctx is None and t.requires_grad}
    bases: dict[int, int] = {}
    for a in arrays:
        b = base_of(a)
        key = id(b)
        if key not in _params and key not in leaves:
            bases[key] = int(b.nbytes)
    if not bases:
        return
    saved = [_session, *bases]
    fn._mem_saved = saved
    weakref.finalize(fn, release, saved)  # a graph dropped without backward: release at collection
    owner = f"{type(fn).__name__} in {scope}" if scope else type(fn).__name__
    for key, nbytes in bases.items():  # the increments last: the budget check may raise in allocated()
        ref = _refs.get(key)
        if ref is None:
            _refs[key] = [1, nbytes, owner]
            counters.allocated("activations", nbytes, owner)
        else:
            ref[0] += 1


def release(saved: list) -> None:
    """The op that :func:`record` counted as ``saved`` freed its arrays: subtract buffers no op keeps."""
    if not saved or saved[0] != _session:
        saved.clear()
        return
    keys = saved[1:]
    saved.clear()  # idempotent: release() after backward, then the finalizer at collection
    for key in keys:
        ref = _refs.get(key)
        if ref is None:
            continue
        ref[0] -= 1
        if ref[0] == 0:
            del _refs[key]
            counters.allocated("activations", -ref[1], ref[2])


def held() -> int:
    """Bytes of activations counted now (the buffers some recorded op still keeps)."""
    return sum(ref[1] for ref in _refs.values())


# --- the bytes behind arrays, each buffer once (and NumPy's own count, the tracker's cross-check) ---


def unique_nbytes(arrays: Any) -> int:
    """Bytes behind ``arrays`` (``None`` skipped), each underlying buffer once (views charged to it)."""
    owners = {}
    for a in arrays:
        if a is not None:
            b = base_of(a)
            owners[id(b)] = int(b.nbytes)
    return sum(owners.values())


def traced_numpy_bytes() -> int:
    """Bytes of NumPy buffers alive now, as ``tracemalloc`` traced them (0 if it is not tracing).

    NumPy reports each array buffer it allocates to tracemalloc in its own domain
    (``numpy.lib.tracemalloc_domain``), independently of minidist: the cross-check of the tracker.
    """
    if not tracemalloc.is_tracing():
        return 0
    domain = tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)
    stats = tracemalloc.take_snapshot().filter_traces([domain]).statistics("filename")
    return sum(s.size for s in stats)

"""``Tensor``: an array that remembers the op that computed it, and ``tensor()`` to make one.

Second in ``minidist/autograd/`` (after ``grad_mode.py``; then ``function.py``, ``graph.py``). A
``Tensor`` wraps a backend array (``numpy.ndarray`` or ``cupy.ndarray``) in ``_data``; an op's
result also holds the ``Function`` that made it (``_ctx``, shown as ``grad_fn``), which is how the
graph is recorded. Every tensor carries a version counter that in-place changes bump (``.data = ...``,
``+=``, optimizer steps), so that backward can refuse values an op saved that have changed since.
``Tensor.backward`` starts a pass (``grad_mode.run_pass``) around the graph walk (``graph.py``); the
operators (``+``, ``@``, ``.sum()`` ...) call the ops in ``minidist/ops``. Source: the API follows
PyTorch's ``torch.Tensor`` (Paszke et al. 2019).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from minidist import backend
from minidist.autograd import grad_mode
from minidist.autograd.graph import run_backward

if TYPE_CHECKING:
    from minidist.autograd.function import Function

DEFAULT_DTYPE = np.float32


def bump_version(tensor: Tensor) -> None:
    """Record that ``tensor.data`` was changed in place through an index (``t.data[...] = a``).

    The ``data`` setter and the in-place operators bump ``tensor._version`` themselves; a write into
    the array itself is invisible to them, so code that does one (ZeRO's parameter update) calls this,
    and a backward that still needs the old values raises instead of using the new ones.
    """
    tensor._version += 1


class Tensor:
    """An n-dimensional array that remembers how it was computed.

    Attributes:
        data: the backend array (NumPy on CPU, CuPy on GPU), any shape.
        grad: a backend array of ``data.shape``, or ``None``; ``backward()`` accumulates into it.
        requires_grad: whether gradients flow to this tensor.
        grad_fn: the ``Function`` that produced it (``None`` for a leaf).
        _version: how many in-place changes it has seen (shared with its views).
    """

    # Makes ``ndarray + Tensor`` call ``Tensor.__radd__`` instead of NumPy's elementwise loop.
    __array_priority__ = 1000
    # The group whose ranks hold different parts of this tensor (a tensor-parallel shard), else None.
    # Set by minidist.parallel.tensor_parallel, passed on to results by Function.apply, read by dropout.
    sharded_over: Any = None

    def __init__(self, data: Any, requires_grad: bool = False) -> None:
        self._data = data
        # Counts the in-place changes we can see (``.data = ...``, ``+=``, optimizer steps); an op
        # records it for the tensors it saved, and backward refuses a tensor changed since. A list,
        # so that a view (w.T, x[0], x.reshape(...)) and the tensor it looks into share one counter.
        self._version_counter = [0]
        self.grad: Any = None
        self.requires_grad = bool(requires_grad)
        self._ctx: Function | None = None  # the op that produced this tensor (None for a leaf)
        self._post_accumulate_hooks: list[Callable[[Tensor], None]] = []

    @property
    def data(self) -> Any:
        """The backend array. Assigning it (``w.data = a``, and so ``w.data *= 10``) bumps ``_version``."""
        return self._data

    @data.setter
    def data(self, value: Any) -> None:
        self._data = value
        self._version_counter[0] += 1

    @property
    def _version(self) -> int:
        """How many in-place changes this tensor (or a view sharing its memory) has seen."""
        return self._version_counter[0]

    @_version.setter
    def _version(self, value: int) -> None:
        self._version_counter[0] = value

    # -- basic properties ------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._data.shape)

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def size(self) -> int:
        return int(self._data.size)

    @property
    def is_leaf(self) -> bool:
        return self._ctx is None

    @property
    def grad_fn(self) -> Function | None:
        """The op that produced this tensor (``None`` for a leaf), as torch's ``Tensor.grad_fn``."""
        return self._ctx

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        if self._ctx is not None:  # as torch: a result shows the op that made it, a leaf its flag
            grad = f", grad_fn=<{type(self._ctx).__name__}Backward>"
        else:
            grad = ", requires_grad=True" if self.requires_grad else ""
        return f"tensor({backend.to_numpy(self.data)!r}{grad})"

    def numpy(self) -> np.ndarray:
        """A host NumPy copy of the data (detached from the graph)."""
        return np.array(backend.to_numpy(self.data))

    def item(self) -> float:
        """The value of a one-element tensor as a Python number."""
        if self.size != 1:
            raise ValueError(f"item() needs a tensor with one element, this one has shape {self.shape}")
        return self.data.reshape(-1)[0].item()

    def detach(self) -> Tensor:
        """A new leaf tensor sharing this data (and its version counter), cut from the graph."""
        out = Tensor(self.data, requires_grad=False)
        out._version_counter = self._version_counter
        return out

    def register_post_accumulate_grad_hook(self, hook: Callable[[Tensor], None]) -> None:
        """Call ``hook(tensor)`` each time backward has finished accumulating into this leaf's ``.grad``."""
        if not self.is_leaf:
            raise RuntimeError("post-accumulate-grad hooks can only be registered on leaf tensors")
        self._post_accumulate_hooks.append(hook)

    # -- backward --------------------------------------------------------------------------------
    def backward(self, grad: Any = None, retain_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) into ``leaf.grad`` for every leaf that requires gradients.

        Args:
            grad: gradient of some scalar with respect to this tensor, same shape as ``self``.
                May be omitted only when ``self`` has one element (then it is 1).
            retain_graph: keep what the ops saved for backward, so that a second ``backward()``
                through the same graph works (and accumulates the same gradients again). By default
                the graph is freed as the walk passes, as in PyTorch: its saved arrays can go.

        Raises:
            RuntimeError: ``self`` does not require grad, or is not a scalar and ``grad`` is None;
                the graph was already freed by an earlier ``backward()`` (torch's "Trying to backward
                through the graph a second time"); a tensor an op saved was changed in place since
                the forward (torch's "modified by an inplace operation", see ``Tensor._version``).
            ValueError: ``grad`` has the wrong shape, or an op's backward returned a wrong shape.
            TypeError: an op's backward did not return a tuple.
        """
        if not self.requires_grad:
            raise RuntimeError(
                "backward() called on a tensor that does not require grad: no input of the computation had "
                "requires_grad=True (or it ran inside no_grad())"
            )
        if grad is None:
            if self.size != 1:
                raise RuntimeError(
                    f"backward() on a non-scalar tensor of shape {self.shape} needs a gradient argument; "
                    "reduce it first (e.g. loss.mean()) or pass grad=an array of the same shape"
                )
            # ones(shape): one C call; NumPy's ones_like is Python code (empty_like + copyto).
            grad = backend.xp().ones(self._data.shape, dtype=self._data.dtype)
        else:
            grad = backend.asarray(grad.data if isinstance(grad, Tensor) else grad, dtype=self.dtype)
            if grad.shape != self.data.shape:
                raise ValueError(f"backward(): grad has shape {grad.shape}, expected {self.shape}")

        # One pass (counted, with its end-of-pass callbacks) around the one graph walk (graph.py).
        grad_mode.run_pass(lambda: run_backward(self, grad, retain_graph=retain_graph))

    # -- operators (the ops live in minidist/ops; imported at the bottom of this file) ----------
    def __add__(self, other): return ops.add(self, other)  # fmt: skip

    def __radd__(self, other): return ops.add(other, self)  # fmt: skip

    def __sub__(self, other): return ops.sub(self, other)  # fmt: skip

    def __rsub__(self, other): return ops.sub(other, self)  # fmt: skip

    def __mul__(self, other): return ops.mul(self, other)  # fmt: skip

    def __rmul__(self, other): return ops.mul(other, self)  # fmt: skip

    def __truediv__(self, other): return ops.div(self, other)  # fmt: skip

    def __rtruediv__(self, other): return ops.div(other, self)  # fmt: skip

    def __matmul__(self, other): return ops.matmul(self, other)  # fmt: skip

    def __rmatmul__(self, other): return ops.matmul(other, self)  # fmt: skip

    def __pow__(self, exponent): return ops.pow(self, exponent)  # fmt: skip

    def __neg__(self): return ops.neg(self)  # fmt: skip

    def __getitem__(self, index): return ops.getitem(self, index)  # fmt: skip

    def exp(self) -> Tensor: return ops.exp(self)  # fmt: skip

    def log(self) -> Tensor: return ops.log(self)  # fmt: skip

    def tanh(self) -> Tensor: return ops.tanh(self)  # fmt: skip

    def sigmoid(self) -> Tensor: return ops.sigmoid(self)  # fmt: skip

    def relu(self) -> Tensor: return ops.relu(self)  # fmt: skip

    # Reductions take NumPy's axis/keepdims or torch's dim/keepdim (see minidist/ops/reduction.py).
    def sum(self, axis=None, keepdims: bool = False, *, dim=None, keepdim=None) -> Tensor:
        return ops.sum(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def mean(self, axis=None, keepdims: bool = False, *, dim=None, keepdim=None) -> Tensor:
        return ops.mean(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def max(self, axis=None, keepdims: bool = False, *, dim=None, keepdim=None):
        return ops.max(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def reshape(self, *shape) -> Tensor: return ops.reshape(self, *shape)  # fmt: skip

    view = reshape  # torch's name; NumPy's reshape copies where no view exists (torch's view would raise)

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        """Swap axes ``dim0`` and ``dim1`` (torch's meaning, not NumPy's permutation)."""
        return ops.transpose(self, dim0, dim1)

    def permute(self, *dims) -> Tensor:
        """Reorder the axes: axis i of the result is axis ``dims[i]`` of this tensor."""
        return ops.permute(self, *dims)

    @property
    def T(self) -> Tensor:
        return ops.transpose(self)

    def to(self, dtype: Any) -> Tensor:
        """This tensor in ``dtype`` (itself if it has it already); differentiable, as ``torch.Tensor.to``."""
        return ops.to(self, dtype)

    def float(self) -> Tensor: return ops.to(self, np.float32)  # fmt: skip

    def double(self) -> Tensor: return ops.to(self, np.float64)  # fmt: skip

    # -- in-place updates (minidist/ops/inplace.py): change .data and bump _version ------------------
    def __iadd__(self, other): return ops.inplace.update(self, other, "add")  # fmt: skip

    def __isub__(self, other): return ops.inplace.update(self, other, "sub")  # fmt: skip

    def __imul__(self, other): return ops.inplace.update(self, other, "mul")  # fmt: skip

    def __itruediv__(self, other): return ops.inplace.update(self, other, "div")  # fmt: skip

    def add_(self, other, alpha=1): return ops.inplace.update_(self, other, "add", alpha)  # fmt: skip

    def sub_(self, other, alpha=1): return ops.inplace.update_(self, other, "sub", alpha)  # fmt: skip

    def mul_(self, other): return ops.inplace.update_(self, other, "mul")  # fmt: skip

    def div_(self, other): return ops.inplace.update_(self, other, "div")  # fmt: skip

    def copy_(self, src): return ops.inplace.update_(self, src, "copy")  # fmt: skip

    def zero_(self): return ops.inplace.update_(self, 0, "copy")  # fmt: skip


def tensor(data: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """Create a leaf tensor from a list, scalar, NumPy or CuPy array: always a copy, on the backend device.

    The dtype follows ``torch.tensor``: ``dtype`` if given; else an array (or NumPy scalar) keeps its
    own (a float64 array stays float64); Python floats become float32 (PyTorch's default dtype),
    Python ints int64, bools bool. A float32 model wants ``md.tensor(x, dtype=np.float32)`` for
    float64 data (matmul raises on mixed dtypes, as in torch).

    Raises ``TypeError`` if ``requires_grad`` is asked for on non-floating data.
    """
    if isinstance(data, Tensor):
        data = data.data
    keeps_dtype = dtype is not None or hasattr(data, "dtype")  # arrays and NumPy scalars
    array = backend.xp().array(data, dtype=dtype)  # a copy: in-place updates must not reach `data`
    if not keeps_dtype and array.dtype.kind == "f" and array.dtype != DEFAULT_DTYPE:
        array = array.astype(DEFAULT_DTYPE)  # Python floats: the default dtype, not NumPy's float64
    if requires_grad and array.dtype.kind != "f":
        raise TypeError(f"only floating-point tensors can require gradients, got dtype {array.dtype}")
    return Tensor(array, requires_grad=requires_grad)


# ops import Tensor from here and Function from function.py (which imports this module): load them last.
from minidist import ops  # noqa: E402

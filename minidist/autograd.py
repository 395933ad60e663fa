"""Reverse-mode automatic differentiation: ``Tensor``, ``Function`` and ``backward``.

A ``Tensor`` wraps a backend array (``numpy.ndarray`` or ``cupy.ndarray``). Every differentiable
operation is a ``Function`` subclass (in ``minidist/ops/``) whose ``forward`` computes the result
from arrays and whose ``backward`` maps the gradient of the output to the gradients of the inputs
(the vector-Jacobian product). Calling an op on tensors that require gradients records the
``Function`` on the output tensor (``tensor._ctx``), so the tensors form a directed acyclic graph.

``loss.backward()`` walks that graph once from the output (:func:`run_backward`, the one graph walk,
which activation recomputation calls too), passing a tensor's gradient on only when
every op that used the tensor has contributed (a topological order found iteratively, so a chain of
50,000 ops does not hit Python's recursion limit), sums the gradients that meet at a tensor, and
*accumulates* them into the ``.grad`` of leaf tensors, as PyTorch does. As in PyTorch, the walk
frees each op's saved arrays after its backward (``retain_graph=True`` keeps them), and every tensor
carries a version counter that in-place changes bump, so that backward refuses values an op saved
that have changed since the forward instead of silently using the new ones.

Source: the chain rule in reverse mode, as in Griewank & Walther, "Evaluating Derivatives" (2008),
ch. 3; the API follows PyTorch (Paszke et al. 2019) and the code layout micrograd (Karpathy 2020).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from minidist import backend

# --- grad mode ----------------------------------------------------------------------------------
_grad_enabled = True


@contextlib.contextmanager
def _grad_mode(enabled: bool) -> Iterator[None]:
    global _grad_enabled
    previous, _grad_enabled = _grad_enabled, enabled
    try:
        yield
    finally:
        _grad_enabled = previous


def no_grad() -> contextlib.AbstractContextManager[None]:
    """Context manager: ops inside record no graph (for evaluation and optimizer updates)."""
    return _grad_mode(False)


def enable_grad() -> contextlib.AbstractContextManager[None]:
    """Context manager: ops inside record the graph even within ``no_grad()`` (as ``torch.enable_grad``).

    Activation recomputation needs it: it records a segment's graph during a backward pass that the
    caller may have started under ``no_grad()``.
    """
    return _grad_mode(True)


def is_grad_enabled() -> bool:
    """False inside ``no_grad()``."""
    return _grad_enabled


# --- callbacks run when the current backward pass ends (used by DistributedDataParallel) ---------
_end_of_backward_callbacks: list[Callable[[], None]] = []
_in_backward = False
_backward_passes = 0  # how many backward passes have started in this process


def backward_pass_count() -> int:
    """The number of backward passes started so far; a hook can tell one pass from the next with it.

    DDP stores it when it queues its end-of-pass callback: if a later pass sees a different number
    while the callback is still pending, the earlier pass failed (its callback was dropped).
    """
    return _backward_passes


def queue_callback(callback: Callable[[], None]) -> None:
    """Run ``callback()`` once, after the backward pass that is running now has finished.

    Raises ``RuntimeError`` outside a backward pass. DDP uses it to finish its gradient
    communication before ``loss.backward()`` returns, as PyTorch's autograd engine does.
    """
    if not _in_backward:
        raise RuntimeError("queue_callback() can only be called from a hook during backward()")
    _end_of_backward_callbacks.append(callback)


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
        return tuple(self.data.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def size(self) -> int:
        return int(self.data.size)

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
        global _in_backward, _backward_passes
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
            grad = backend.xp().ones_like(self.data)
        else:
            grad = backend.asarray(grad.data if isinstance(grad, Tensor) else grad, dtype=self.dtype)
            if grad.shape != self.data.shape:
                raise ValueError(f"backward(): grad has shape {grad.shape}, expected {self.shape}")

        _in_backward = True
        _backward_passes += 1
        succeeded = False
        try:
            run_backward(self, grad, retain_graph=retain_graph)
            succeeded = True
        finally:
            _in_backward = False
            if not succeeded:  # a failed pass must not leave callbacks for the next, unrelated one
                _end_of_backward_callbacks.clear()
        callbacks = list(_end_of_backward_callbacks)
        _end_of_backward_callbacks.clear()
        for callback in callbacks:
            callback()

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

    def reshape(self, *shape) -> Tensor:
        return ops.reshape(self, *shape)

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


def run_backward(root: Tensor, grad: Any, retain_graph: bool = False) -> None:
    """The graph walk: backpropagate ``grad`` (d something / d ``root``) to every leaf below ``root``.

    Kahn's topological order: a tensor's gradient is passed on only when every op that used it has
    contributed; gradients that meet at a tensor are summed; leaves *accumulate* into ``.grad`` and
    then run their post-accumulate hooks. ``grad`` must be a backend array of ``root``'s shape.

    This is the whole of backward except the bookkeeping of a *pass*: it starts none and runs no
    end-of-pass callbacks. ``Tensor.backward`` wraps it in a pass; activation recomputation
    (``minidist.nn.recompute``) calls it inside the running pass, for the graph of a recomputed
    segment, so that parameters there accumulate and fire their hooks exactly as usual.

    Each op's saved arrays are dropped right after its backward unless ``retain_graph``; an op met
    again later raises (see :meth:`Function.release`).
    """
    # BEGIN SOLUTION A1.5: walk the graph in topological order, summing and accumulating gradients
    pending = {id(root): grad}  # gradients summed so far, per tensor, not yet passed on
    waiting = _count_consumers(root)  # per tensor: consumers whose backward has not run yet
    ready = [root]  # tensors whose every consumer is done: their gradient is complete
    while ready:
        # Last in, first out: right after a layer's backward its parameters become ready and
        # are finished next, so their hooks fire early (DDP overlaps communication from there).
        node = ready.pop()
        g = pending.pop(id(node), None)  # None: no consumer produced a gradient for it
        if node._ctx is None:  # a leaf: all contributions have arrived
            if g is not None:
                node.grad = g.copy() if node.grad is None else node.grad + g
                for hook in node._post_accumulate_hooks:
                    hook(node)
            continue
        fn = node._ctx
        inputs = fn.inputs
        input_grads = _checked_backward(fn, g) if g is not None else (None,) * len(inputs)
        if not retain_graph:
            fn.release()
        for inp, g_inp in zip(inputs, input_grads):
            if not inp.requires_grad:
                continue
            key = id(inp)
            if g_inp is not None:
                pending[key] = g_inp if key not in pending else pending[key] + g_inp
            waiting[key] -= 1
            if waiting[key] == 0:
                ready.append(inp)
    # END SOLUTION


def _checked_backward(fn: Function, grad: Any) -> tuple[Any, ...]:
    """Call ``fn.backward(grad)`` and check it returned one gradient of the right shape per input.

    A wrong return value (a bare array instead of a tuple, a missing gradient, a wrong shape) would
    otherwise be zipped against the inputs silently and give wrong gradients: the most common mistake
    when writing a new op, so the error names the op and what was wrong.
    """
    name = type(fn).__name__
    fn.check_saved_versions()
    grads = fn.backward(grad)
    if not isinstance(grads, tuple):
        raise TypeError(
            f"{name}.backward must return a tuple (one gradient per input), got {type(grads).__name__}"
        )
    if len(grads) != len(fn.inputs):
        raise ValueError(f"{name}.backward returned {len(grads)} gradients for {len(fn.inputs)} inputs")
    cast = False
    for i, (inp, g) in enumerate(zip(fn.inputs, grads)):
        if g is None:
            continue
        data = inp._data  # not the property: this loop runs for every op of every backward
        if tuple(g.shape) != data.shape:
            raise ValueError(
                f"{name}.backward returned a gradient of shape {tuple(g.shape)} for input {i} of shape "
                f"{inp.shape}; each gradient must have its input's shape"
            )
        if g.dtype != data.dtype and inp.requires_grad:
            cast = True
    if cast:  # a gradient has its input's dtype, as in torch (float32 + float64 -> float64 output)
        grads = tuple(
            g if g is None or not t.requires_grad else g.astype(t.dtype, copy=False)
            for t, g in zip(fn.inputs, grads)
        )
    return grads


def _count_consumers(root: Tensor) -> dict[int, int]:
    """For every tensor reachable from ``root`` that requires grad: how many op inputs it feeds.

    Backward may pass a tensor on only when all those consumers have sent their gradient (Kahn's
    algorithm for a topological order, 1962). An explicit stack replaces recursion, so a chain of
    50,000 ops does not hit Python's recursion limit. ``x * x`` counts ``x`` twice, once per input.
    """
    # BEGIN SOLUTION A1.5: count every tensor's consumers (op inputs it feeds)
    counts = {id(root): 0}
    stack = [root]
    while stack:
        node = stack.pop()
        if node._ctx is None:
            continue
        for inp in node._ctx.inputs:
            if not inp.requires_grad:
                continue
            if id(inp) not in counts:
                counts[id(inp)] = 0
                stack.append(inp)
            counts[id(inp)] += 1
    return counts
    # END SOLUTION


class Function:
    """One differentiable operation: ``forward`` on arrays, ``backward`` = vector-Jacobian product.

    Subclasses implement ``forward(self, *arrays, **options) -> array`` (saving on ``self`` what
    ``backward`` needs) and ``backward(self, grad) -> tuple`` with one gradient (or ``None``) per
    input, each of that input's shape. Users call ``MyFunction.apply(*tensors, **options)``.
    """

    inputs: tuple[Tensor, ...] = ()
    # Which inputs ``forward`` keeps for ``backward`` (None: all of them, the safe default for a new
    # op); backward checks that those were not changed in place since. ``saves_output``: forward
    # keeps its own result (exp, tanh, sigmoid), which must not change either.
    saved_inputs: tuple[int, ...] | None = None
    saves_output = False
    # The result may be a view into input 0's array (reshape, permute, basic indexing): then both
    # tensors share one version counter, so changing either in place is seen through the other.
    is_view = False
    _released = False  # set by release(): the saved arrays are gone

    def forward(self, *arrays: Any, **options: Any) -> Any:
        raise NotImplementedError

    def backward(self, grad: Any) -> tuple[Any, ...]:
        raise NotImplementedError

    def release(self) -> None:
        """Drop everything ``forward`` saved (and the inputs), after this op's backward has run.

        Called by the graph walk unless ``retain_graph=True``, so the activations can be freed as
        backward proceeds, as in PyTorch; using this op again raises instead of reusing stale state.
        """
        self.__dict__.clear()
        self._released = True

    def check_saved_versions(self) -> None:
        """Raise ``RuntimeError`` if this op was released, or a tensor it saved changed in place.

        Without it, ``w.data *= 10`` (or ``optimizer.step()``) between forward and backward would
        give gradients computed from the new values silently. Torch's version counters, same texts.
        """
        name = type(self).__name__
        if self._released:
            raise RuntimeError(
                f"Trying to backward through the graph a second time (or directly access saved tensors "
                f"after they have already been freed): the values {name} saved were freed by the first "
                "backward(). Specify retain_graph=True in the first backward() if you need to backward "
                "through the graph a second time, or compute the forward again."
            )
        saved = range(len(self.inputs)) if self.saved_inputs is None else self.saved_inputs
        changed = [(f"its input {i}", self.inputs[i], self._versions[i]) for i in saved
                   if self.inputs[i]._version_counter[0] != self._versions[i]]  # fmt: skip
        if self.saves_output:
            output = self._output()
            if output is not None and output._version_counter[0] != self._output_version:
                changed.append(("its output", output, self._output_version))
        if changed:
            which, t, expected = changed[0]
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace "
                f"operation: the {t.dtype} tensor of shape {t.shape} saved by {name} ({which}) is at "
                f"version {t._version}; expected version {expected} instead. Hint: change tensors in "
                "place (w.data = ..., +=, optimizer.step()) only after backward(), or compute the "
                "forward again after the change."
            )

    @classmethod
    def apply(cls, *inputs: Any, **options: Any) -> Tensor:
        """Run the op on tensors (Python numbers and arrays are lifted to constant tensors)."""
        like = next((x for x in inputs if isinstance(x, Tensor)), None)
        tensors = tuple(_lift(x, like) for x in inputs)
        fn = cls()
        result = fn.forward(*[t._data for t in tensors], **options)
        # Full reductions give NumPy scalars; keep .data a (0-d) backend array so in-place writes work.
        if isinstance(result, np.generic):
            result = _asarray_like(result, tensors)
        out = Tensor(result)
        for t in tensors:  # computed from a shard: a shard too (Tensor.sharded_over)
            if t.sharded_over is not None:
                out.sharded_over = t.sharded_over
                break
        if cls.is_view and backend.array_module(result).may_share_memory(result, tensors[0]._data):
            out._version_counter = tensors[0]._version_counter
        if _grad_enabled and any(t.requires_grad for t in tensors):
            out.requires_grad = True
            out._ctx = fn
            fn.inputs = tensors
            fn._versions = tuple([t._version_counter[0] for t in tensors])
            if fn.saves_output:  # a weak reference: the output holds fn, fn must not keep it alive
                fn._output, fn._output_version = weakref.ref(out), out._version
        return out


def _asarray_like(value: Any, tensors: tuple[Tensor, ...]) -> Any:
    xp = backend.array_module(tensors[0].data) if tensors else backend.xp()
    return xp.asarray(value)


def _lift(x: Any, like: Tensor | None) -> Tensor:
    """A constant tensor from a number or array, in the dtype of ``like`` (2 * float32 stays float32)."""
    if isinstance(x, Tensor):
        return x
    # Only a floating tensor imposes its dtype: int tensor + 0.5 must not truncate 0.5 to 0.
    dtype = like.dtype if like is not None and like.dtype.kind == "f" else None
    return Tensor(backend.asarray(x, dtype=dtype))


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


from minidist import ops  # noqa: E402  (ops import Tensor/Function from this module)

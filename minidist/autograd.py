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
*accumulates* them into the ``.grad`` of leaf tensors, as PyTorch does.

Source: the chain rule in reverse mode, as in Griewank & Walther, "Evaluating Derivatives" (2008),
ch. 3; the API follows PyTorch (Paszke et al. 2019) and the code layout micrograd (Karpathy 2020).
"""

from __future__ import annotations

import contextlib
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


class Tensor:
    """An n-dimensional array that remembers how it was computed.

    Attributes:
        data: the backend array (NumPy on CPU, CuPy on GPU), any shape.
        grad: a backend array of ``data.shape``, or ``None``; ``backward()`` accumulates into it.
        requires_grad: whether gradients flow to this tensor.
    """

    # Makes ``ndarray + Tensor`` call ``Tensor.__radd__`` instead of NumPy's elementwise loop.
    __array_priority__ = 1000
    # The group whose ranks hold different parts of this tensor (a tensor-parallel shard), else None.
    # Set by minidist.parallel.tensor_parallel, passed on to results by Function.apply, read by dropout.
    sharded_over: Any = None

    def __init__(self, data: Any, requires_grad: bool = False) -> None:
        self.data = data
        self.grad: Any = None
        self.requires_grad = bool(requires_grad)
        self._ctx: Function | None = None  # the op that produced this tensor (None for a leaf)
        self._post_accumulate_hooks: list[Callable[[Tensor], None]] = []

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

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
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
        """A new leaf tensor sharing this data, cut from the graph."""
        return Tensor(self.data, requires_grad=False)

    def register_post_accumulate_grad_hook(self, hook: Callable[[Tensor], None]) -> None:
        """Call ``hook(tensor)`` each time backward has finished accumulating into this leaf's ``.grad``."""
        if not self.is_leaf:
            raise RuntimeError("post-accumulate-grad hooks can only be registered on leaf tensors")
        self._post_accumulate_hooks.append(hook)

    # -- backward --------------------------------------------------------------------------------
    def backward(self, grad: Any = None) -> None:
        """Accumulate d(self)/d(leaf) into ``leaf.grad`` for every leaf that requires gradients.

        Args:
            grad: gradient of some scalar with respect to this tensor, same shape as ``self``.
                May be omitted only when ``self`` has one element (then it is 1).

        The graph is kept (as with PyTorch's ``retain_graph=True``): calling ``backward()`` again on
        the same output accumulates the same gradients a second time.

        Raises:
            RuntimeError: ``self`` does not require grad, or is not a scalar and ``grad`` is None.
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
            run_backward(self, grad)
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

    def sum(self, axis=None, keepdims: bool = False) -> Tensor:
        return ops.sum(self, axis=axis, keepdims=keepdims)

    def mean(self, axis=None, keepdims: bool = False) -> Tensor:
        return ops.mean(self, axis=axis, keepdims=keepdims)

    def max(self, axis=None, keepdims: bool = False) -> Tensor:
        return ops.max(self, axis=axis, keepdims=keepdims)

    def reshape(self, *shape) -> Tensor:
        return ops.reshape(self, *shape)

    def transpose(self, *axes) -> Tensor:
        return ops.transpose(self, *axes)

    @property
    def T(self) -> Tensor:
        return ops.transpose(self)


def run_backward(root: Tensor, grad: Any) -> None:
    """The graph walk: backpropagate ``grad`` (d something / d ``root``) to every leaf below ``root``.

    Kahn's topological order: a tensor's gradient is passed on only when every op that used it has
    contributed; gradients that meet at a tensor are summed; leaves *accumulate* into ``.grad`` and
    then run their post-accumulate hooks. ``grad`` must be a backend array of ``root``'s shape.

    This is the whole of backward except the bookkeeping of a *pass*: it starts none and runs no
    end-of-pass callbacks. ``Tensor.backward`` wraps it in a pass; activation recomputation
    (``minidist.nn.recompute``) calls it inside the running pass, for the graph of a recomputed
    segment, so that parameters there accumulate and fire their hooks exactly as usual.
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
        input_grads = _checked_backward(node._ctx, g) if g is not None else (None,) * len(node._ctx.inputs)
        for inp, g_inp in zip(node._ctx.inputs, input_grads):
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
    grads = fn.backward(grad)
    if not isinstance(grads, tuple):
        raise TypeError(
            f"{name}.backward must return a tuple (one gradient per input), got {type(grads).__name__}"
        )
    if len(grads) != len(fn.inputs):
        raise ValueError(f"{name}.backward returned {len(grads)} gradients for {len(fn.inputs)} inputs")
    for i, (inp, g) in enumerate(zip(fn.inputs, grads)):
        if g is not None and tuple(g.shape) != inp.shape:
            raise ValueError(
                f"{name}.backward returned a gradient of shape {tuple(g.shape)} for input {i} of shape "
                f"{inp.shape}; each gradient must have its input's shape"
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

    def forward(self, *arrays: Any, **options: Any) -> Any:
        raise NotImplementedError

    def backward(self, grad: Any) -> tuple[Any, ...]:
        raise NotImplementedError

    @classmethod
    def apply(cls, *inputs: Any, **options: Any) -> Tensor:
        """Run the op on tensors (Python numbers and arrays are lifted to constant tensors)."""
        like = next((x for x in inputs if isinstance(x, Tensor)), None)
        tensors = tuple(_lift(x, like) for x in inputs)
        fn = cls()
        result = fn.forward(*(t.data for t in tensors), **options)
        # Full reductions give NumPy scalars; keep .data a (0-d) backend array so in-place writes work.
        if isinstance(result, np.generic):
            result = _asarray_like(result, tensors)
        out = Tensor(result)
        for t in tensors:  # computed from a shard: a shard too (Tensor.sharded_over)
            if t.sharded_over is not None:
                out.sharded_over = t.sharded_over
                break
        if _grad_enabled and any(t.requires_grad for t in tensors):
            out.requires_grad = True
            out._ctx = fn
            fn.inputs = tensors
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
    """Create a leaf tensor from a list, scalar, NumPy or CuPy array (copied to the backend device).

    Floating-point data becomes float32 unless ``dtype`` is given (PyTorch's default dtype);
    integer and boolean data keep their dtype (class labels stay integers).

    Raises ``TypeError`` if ``requires_grad`` is asked for on non-floating data.
    """
    if isinstance(data, Tensor):
        data = data.data
    array = backend.asarray(data, dtype=dtype)
    if dtype is None and array.dtype.kind == "f" and array.dtype != DEFAULT_DTYPE:
        array = array.astype(DEFAULT_DTYPE)
    if requires_grad and array.dtype.kind != "f":
        raise TypeError(f"only floating-point tensors can require gradients, got dtype {array.dtype}")
    return Tensor(array, requires_grad=requires_grad)


from minidist import ops  # noqa: E402  (ops import Tensor/Function from this module)

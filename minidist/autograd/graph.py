"""The backward pass: the one graph walk (``run_backward``) and the checks around each op's backward.

Last in ``minidist/autograd/`` (after ``grad_mode.py``, ``tensor.py``, ``function.py``). Read
``run_backward`` first, then its two helpers: ``_count_consumers`` (how many ops use each tensor) and
``_checked_backward`` (one op's backward, with its return value checked).

``loss.backward()`` walks the graph once from the output, passing a tensor's gradient on only when
every op that used the tensor has contributed (a topological order found iteratively, so a chain of
50,000 ops does not hit Python's recursion limit), sums the gradients that meet at a tensor, and
*accumulates* them into the ``.grad`` of leaf tensors, as PyTorch does. As in PyTorch, the walk
frees each op's saved arrays after its backward (``retain_graph=True`` keeps them), and refuses
values an op saved that were changed in place since the forward (``Function.check_saved_versions``).

Source: the chain rule in reverse mode, as in Griewank & Walther, "Evaluating Derivatives" (2008),
ch. 3; Kahn's topological order (1962); the API follows PyTorch (Paszke et al. 2019) and the code
layout micrograd (Karpathy 2020).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from minidist.autograd.function import Function
    from minidist.autograd.tensor import Tensor

# While a step is captured (``minidist/compile``) a list that the walk appends to, in the order things
# happen: ``(leaf, owned)`` when a leaf's ``.grad`` is set, before its hooks; ``(node, called)`` for each
# op reached. None otherwise (one global test per node).
_tape: list | None = None


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
    # Tensors whose pending gradient is a new array that nothing else refers to: a leaf may keep it
    # as its .grad without a copy (a sum made here, or an op's result that it declares new).
    owned: set[int] = set()
    waiting = _count_consumers(root)  # per tensor: consumers whose backward has not run yet
    ready = [root]  # tensors whose every consumer is done: their gradient is complete
    while ready:
        # Last in, first out: right after a layer's backward its parameters become ready and
        # are finished next, so their hooks fire early (DDP overlaps communication from there).
        node = ready.pop()
        g = pending.pop(id(node), None)  # None: no consumer produced a gradient for it
        if node._ctx is None:  # a leaf: all contributions have arrived
            if g is not None:
                if node.grad is None:  # a copy unless no one else can see g: .grad must be its own
                    node.grad = g if id(node) in owned else g.copy()
                else:
                    node.grad = node.grad + g
                if _tape is not None:
                    _tape.append((node, id(node) in owned))
                for hook in node._post_accumulate_hooks:
                    hook(node)
            continue
        fn = node._ctx
        inputs = fn.inputs
        input_grads = _checked_backward(fn, g) if g is not None else (None,) * len(inputs)
        if _tape is not None:
            _tape.append((node, g is not None))
        if not retain_graph:
            fn.release()
        for inp, g_inp in zip(inputs, input_grads):
            if not inp.requires_grad:
                continue
            key = id(inp)
            if g_inp is not None:
                if key not in pending:
                    pending[key] = g_inp
                    if fn.returns_new_arrays:
                        owned.add(key)
                else:
                    pending[key] = _add_gradients(pending[key], g_inp)
                    owned.add(key)
            waiting[key] -= 1
            if waiting[key] == 0:
                ready.append(inp)
    # END SOLUTION


def _add_gradients(a: Any, b: Any) -> Any:
    """a + b for two gradients of one tensor; a low-precision pair (autocast) is summed in float32 and
    rounded once: NumPy's float16 arithmetic is ~200x slower (``autograd/autocast.py``)."""
    if a.dtype.itemsize == 2 and a.dtype.kind in "fV":
        return (a.astype(np.float32) + b).astype(a.dtype)
    return a + b


def _checked_backward(fn: Function, grad: Any) -> tuple[Any, ...]:
    """Call ``fn.backward(grad)`` and check it returned one gradient of the right shape per input.

    A wrong return value (a bare array instead of a tuple, a missing gradient, a wrong shape) would
    otherwise be zipped against the inputs silently and give wrong gradients: the most common mistake
    when writing a new op, so the error names the op and what was wrong. This runs for every op of
    every backward: the checks are plain compares, and the messages are built only on an error.
    """
    fn.check_saved_versions()
    grads = fn.backward(grad)
    inputs = fn.inputs
    if not isinstance(grads, tuple) or len(grads) != len(inputs):
        _raise_bad_return(fn, grads)
    cast = False
    for inp, g in zip(inputs, grads):
        if g is None:
            continue
        data = inp._data  # not the property: one attribute lookup fewer, for every input of every op
        if g.shape != data.shape:
            _raise_bad_return(fn, grads)
        # ``is`` first: NumPy shares one dtype object per type, so a match rarely needs the slower ``!=``.
        if g.dtype is not data.dtype and g.dtype != data.dtype and inp.requires_grad:
            cast = True
    if cast:  # a gradient has its input's dtype, as in torch (float32 + float64 -> float64 output)
        grads = tuple(
            g if g is None or not t.requires_grad else g.astype(t.dtype, copy=False)
            for t, g in zip(inputs, grads)
        )
    return grads


def _raise_bad_return(fn: Function, grads: Any) -> None:
    """The error for a backward that returned no tuple, the wrong number of gradients or a wrong shape."""
    name = type(fn).__name__
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

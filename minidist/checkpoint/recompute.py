"""Activation recomputation ("gradient checkpointing"): trade compute for activation memory.

Chen, Xu, Zhang & Guestrin, "Training Deep Nets with Sublinear Memory Cost" (2016), §3: run a
segment ``fn`` of the network forward *without* recording its graph, so the activations inside it
are freed at once, and keep only its inputs. In backward, run ``fn`` again from those inputs, this
time recording, and backpropagate through the fresh graph. Splitting an n-layer network into
sqrt(n) segments stores O(sqrt(n)) activations for the price of one extra forward pass.

Two details make the recomputed gradients *equal* to the plain ones:

* randomness: the generator state (and the tensor-parallel tracker's) is saved before the forward
  and restored for the recomputation, so dropout draws the same masks (Megatron-LM does the same,
  Shoeybi et al. 2019; Korthikanti et al. 2022 §4 for selective recomputation);
* the inner backward runs inside the outer one without starting a new pass: parameter gradients
  accumulate and their hooks fire exactly as usual (DDP buckets still see them), and end-of-pass
  callbacks still run once, when the outer ``loss.backward()`` finishes. That is why this module
  walks the inner graph itself (``_inner_backward``) instead of calling ``Tensor.backward``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from minidist import autograd, backend
from minidist.autograd import Function, Tensor, no_grad
from minidist.checkpoint import rng


def recompute(fn: Callable[..., Tensor], *args: Any) -> Tensor:
    """``fn(*args)``, without storing the activations inside ``fn``; they are recomputed in backward.

    Args:
        fn: a function of tensors (and other arguments) that returns ONE ``Tensor``; it may use
            parameters (they get their gradients as usual) and dropout (same masks in both runs).
            It must be deterministic given its inputs and the generator state.
        args: tensors (gradients flow to those that require them) and plain values, passed as given.

    Returns:
        the output of ``fn``, with the same values and, after backward, the same gradients for
        ``args`` and for the parameters used inside ``fn`` as without recomputation.

    Raises:
        TypeError: ``fn`` does not return a Tensor. RuntimeError (in backward): the recomputed
            output has another shape (``fn`` is not deterministic in its structure).
    """
    positions = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
    if not autograd.is_grad_enabled():  # nothing will be differentiated: just run it
        return _checked(fn(*args))

    def body(*tensors: Tensor) -> Tensor:
        full = list(args)
        for i, t in zip(positions, tensors):
            full[i] = t
        return _checked(fn(*full))

    tensors = [args[i] for i in positions]
    flags = tuple(t.requires_grad for t in tensors)
    # The output must require grad even when no input does (e.g. the first layer's input), since
    # parameters inside fn do: a constant "anchor" input that requires grad guarantees it.
    anchor = Tensor(backend.xp().zeros(()), requires_grad=True)
    return _Recompute.apply(*tensors, anchor, body=body, flags=flags)


def _checked(out: Any) -> Tensor:
    if not isinstance(out, Tensor):
        raise TypeError(f"recompute: fn must return one Tensor, got a {type(out).__name__}")
    return out


class _Recompute(Function):
    """y = fn(x...) computed without a graph;  dL/dx = backward through a recomputed fn(x...)."""

    def forward(self, *arrays: Any, body: Callable[..., Tensor], flags: tuple[bool, ...]) -> Any:
        self.body, self.flags = body, flags
        self.inputs_data = arrays[: len(flags)]  # the only activations kept: the segment's inputs
        self.rng = rng.get_states()
        with no_grad():
            out = body(*(Tensor(a) for a in self.inputs_data))
        self.out_shape = out.shape
        return out.data

    def backward(self, grad: Any) -> tuple[Any, ...]:
        leaves = [Tensor(a, requires_grad=f) for a, f in zip(self.inputs_data, self.flags)]
        current = rng.get_states()
        rng.set_states(self.rng)  # replay the forward's random draws (dropout masks)
        try:
            with _grad_mode(True):
                out = self.body(*leaves)
        finally:
            rng.set_states(current)  # the rest of training continues from where it was
        if out.shape != self.out_shape:
            raise RuntimeError(
                f"recompute: fn returned shape {out.shape} when recomputed but {self.out_shape} in forward"
            )
        grads = _inner_backward(out, grad, leaves) if out.requires_grad else [None] * len(leaves)
        return (*grads, None)  # None for the anchor


def _inner_backward(root: Tensor, grad: Any, inputs: list[Tensor]) -> list[Any]:
    """Backpropagate ``grad`` through the graph of ``root`` inside the running backward pass.

    The same walk as ``Tensor.backward`` (Kahn's topological order), except that the gradients of
    ``inputs`` are returned instead of accumulated, and no new pass is started (see module docstring).
    """
    slot = {id(t): k for k, t in enumerate(inputs)}
    result: list[Any] = [None] * len(inputs)
    pending = {id(root): grad}
    waiting = autograd._count_consumers(root)
    ready = [root]
    while ready:
        node = ready.pop()
        g = pending.pop(id(node), None)
        if node._ctx is None:
            if id(node) in slot:
                result[slot[id(node)]] = g
            elif g is not None:  # a parameter used inside fn: accumulate as backward() does
                node.grad = g.copy() if node.grad is None else node.grad + g
                for hook in node._post_accumulate_hooks:
                    hook(node)
            continue
        fn = node._ctx
        input_grads = autograd._checked_backward(fn, g) if g is not None else (None,) * len(fn.inputs)
        for inp, g_inp in zip(fn.inputs, input_grads):
            if not inp.requires_grad:
                continue
            if g_inp is not None:
                pending[id(inp)] = g_inp if id(inp) not in pending else pending[id(inp)] + g_inp
            waiting[id(inp)] -= 1
            if waiting[id(inp)] == 0:
                ready.append(inp)
    return result


@contextlib.contextmanager
def _grad_mode(enabled: bool) -> Iterator[None]:
    """Record the graph during the recomputation even if the caller's backward runs under no_grad."""
    previous, autograd._grad_enabled = autograd._grad_enabled, enabled
    try:
        yield
    finally:
        autograd._grad_enabled = previous

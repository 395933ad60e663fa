"""Activation recomputation ("gradient checkpointing"): trade compute for activation memory.

Chen, Xu, Zhang & Guestrin, "Training Deep Nets with Sublinear Memory Cost" (2016), §3: run a
segment ``fn`` of the network forward *without* recording its graph, so the activations inside it
are freed at once, and keep only its inputs. In backward, run ``fn`` again from those inputs, this
time recording, and backpropagate through the fresh graph. Splitting an n-layer network into
sqrt(n) segments stores O(sqrt(n)) activations for the price of one extra forward pass.

Two details make the recomputed gradients *equal* to the plain ones:

* randomness: every generator's state (``minidist.random.get_all_rng_states``: the default one and
  the tensor-parallel tracker's) is saved before the forward and restored for the recomputation, so
  dropout draws the same masks (Megatron-LM does the same, Shoeybi et al. 2019; Korthikanti et al.
  2022 §4 for selective recomputation);
* the inner backward runs inside the outer one without starting a new pass: it is autograd's own
  graph walk (``autograd.run_backward``), not ``Tensor.backward``, so parameter gradients accumulate
  and their hooks fire exactly as usual (DDP buckets still see them), and end-of-pass callbacks still
  run once, when the outer ``loss.backward()`` finishes.

PyTorch calls this ``torch.utils.checkpoint``; here the name "checkpoint" is kept for saving
training state (``minidist.checkpoint``), and this is ``from minidist.nn.recompute import recompute``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minidist import autograd, backend
from minidist import random as md_random
from minidist.autograd import Function, Tensor, enable_grad, no_grad
from minidist.autograd import autocast as autocast_state


def recompute(
    fn: Callable[..., Tensor], *args: Any, after_backward: Callable[[], None] | None = None
) -> Tensor:
    """``fn(*args)``, without storing the activations inside ``fn``; they are recomputed in backward.

    Args:
        fn: a function of tensors (and other arguments) that returns ONE ``Tensor``; it may use
            parameters (they get their gradients as usual) and dropout (same masks in both runs).
            It must be deterministic given its inputs and the generator state.
        args: tensors (gradients flow to those that require them) and plain values, passed as given.
        after_backward: called once the backward through the recomputed ``fn`` has finished (its
            parameters' gradients are complete): FSDP reduce-scatters and frees a unit there.

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
    # Both runs of fn see the inputs' tensor-parallel shard tags (Tensor.sharded_over), so dropout on
    # a shard draws per-rank masks inside a segment exactly as outside it.
    tags = tuple(t.sharded_over for t in tensors)
    # The output must require grad even when no input does (e.g. the first layer's input), since
    # parameters inside fn do: a constant "anchor" input that requires grad guarantees it.
    anchor = Tensor(backend.xp().zeros(()), requires_grad=True)
    out = _Recompute.apply(*tensors, anchor, body=body, flags=flags, tags=tags, after_backward=after_backward)
    # The tag is fn's output's, not the inputs' (apply's guess): a segment ending in the g operator
    # (RowParallelLinear) returns the same tensor on every rank even from a shard.
    out.sharded_over = out._ctx.out_tag
    return out


def _checked(out: Any) -> Tensor:
    if not isinstance(out, Tensor):
        raise TypeError(f"recompute: fn must return one Tensor, got a {type(out).__name__}")
    return out


def _tagged(t: Tensor, tag: Any) -> Tensor:
    t.sharded_over = tag
    return t


class _Recompute(Function):
    """y = fn(x...) computed without a graph;  dL/dx = backward through a recomputed fn(x...)."""

    # The segment's inputs go in as they are (a low-precision input is not upcast by Function.apply):
    # the ops inside decide under the autocast state of the forward, which backward replays.
    handles_low_precision = True

    def forward(
        self,
        *arrays: Any,
        body: Callable[..., Tensor],
        flags: tuple[bool, ...],
        tags: tuple[Any, ...],
        after_backward: Callable[[], None] | None = None,
    ) -> Any:
        self.body, self.flags, self.tags, self.after_backward = body, flags, tags, after_backward
        self.inputs_data = arrays[: len(flags)]  # the only activations kept: the segment's inputs
        self.rng = md_random.get_all_rng_states()
        # The autocast state of the forward (backward runs after its `with` block has ended): the
        # recomputation must run the same ops in the same precision, as torch.utils.checkpoint does.
        self.low_dtype = autocast_state.low_dtype
        with no_grad():
            out = body(*(_tagged(Tensor(a), tag) for a, tag in zip(self.inputs_data, tags)))
        self.out_shape, self.out_tag = out.shape, out.sharded_over
        return out.data

    def backward(self, grad: Any) -> tuple[Any, ...]:
        # Fresh leaves for the segment's inputs: the walk below accumulates their gradients in .grad.
        leaves = [
            _tagged(Tensor(a, requires_grad=f), tag)
            for a, f, tag in zip(self.inputs_data, self.flags, self.tags)
        ]
        current = md_random.get_all_rng_states()
        md_random.set_all_rng_states(self.rng)  # replay the forward's random draws (dropout masks)
        low = self.low_dtype
        replay = autocast_state.autocast(dtype=low or "bfloat16", enabled=low is not None)
        try:
            with enable_grad(), replay:
                out = self.body(*leaves)
        finally:
            md_random.set_all_rng_states(current)  # the rest of training continues from where it was
        if out.shape != self.out_shape:
            raise RuntimeError(
                f"recompute: fn returned shape {out.shape} when recomputed but {self.out_shape} in forward"
            )
        if out.requires_grad:
            autograd.run_backward(out, grad)  # inside the running pass: no new pass, no callbacks
        if self.after_backward is not None:
            self.after_backward()
        return (*(leaf.grad for leaf in leaves), None)  # None for the anchor

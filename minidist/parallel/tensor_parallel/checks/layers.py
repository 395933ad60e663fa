"""The checks of the tensor-parallel layers' arguments: each takes a layer's arguments and returns them
checked, agreed across the group and normalised (``seam.agreed_arguments`` calls it before the body).

* :func:`linear`: ``ColumnParallelLinear`` and ``RowParallelLinear`` (``../layers.py``);
* :func:`cut`: their ``from_linear``, a full ``nn.Linear`` cut into this rank's piece (``../cut.py``);
* :func:`mlp`: ``ParallelMLP`` (``../mlp.py``), one agreement for the whole block;
* :func:`attention`, :func:`block`: the GPT modules of ``../transformer.py`` (heads split over the group);
* :func:`checked_input`: the decorator of the linear layers' ``forward`` (the input's width, per call).

Every one ends with ``arguments.agree``: one small exchange, after which every rank raises the same
error or none, and the ranks share one generator.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Container
from typing import Any

import numpy as np

from minidist.distributed.comm import Communicator
from minidist.nn.layers import Linear
from minidist.parallel.tensor_parallel.checks.arguments import (
    agree,
    check_divisible,
    describe_dtype,
    flag,
    positive_int,
    resolve_group,
)

Check = Callable[..., dict[str, Any]]


def linear(layer: str, split: str) -> Check:
    """The check of ``ColumnParallelLinear`` (``split="out_features"``) or ``RowParallelLinear``
    (``"in_features"``): the sizes as ints, the flags (``bias`` and the layer's own) as bools, the
    split size divisible by the group size, all of them and the dtype the same on every rank."""

    def check(
        in_features: Any, out_features: Any, bias: Any, group: Any, dtype: Any, **flags: Any
    ) -> dict[str, Any]:
        group, error = resolve_group(layer, group)
        sizes: tuple[Any, ...] = (in_features, out_features)
        flags = {"bias": bias, **flags}
        try:
            if error is not None:
                raise error
            sizes = (
                positive_int(layer, "in_features", in_features),
                positive_int(layer, "out_features", out_features),
            )
            flags = {name: flag(layer, name, value) for name, value in flags.items()}
            check_divisible(layer, split, sizes[1] if split == "out_features" else sizes[0], group)
        except (TypeError, ValueError) as e:
            error = e
        arguments = {"in_features": sizes[0], "out_features": sizes[1], **flags}
        agree(group, layer, {**arguments, "dtype": describe_dtype(dtype)}, error)
        return {**arguments, "group": group, "dtype": dtype}

    return check


def cut(kind: str) -> Check:
    """The check of ``kind.from_linear(linear, group, [stride,] sequence_parallel)``: raises on every rank
    ``TypeError`` for a bad group or something else than an ``nn.Linear``, ``ValueError`` if the split
    axis (out_features / stride for a column layer, in_features for a row layer) is not divisible by
    the group size; the group resolved."""

    def check(linear: Any, group: Any, sequence_parallel: bool, **stride: Any) -> dict[str, Any]:
        group = _agree_to_cut(kind, linear, group, stride.get("stride", 1), {"sp": sequence_parallel})
        return {"linear": linear, "group": group, "sequence_parallel": sequence_parallel, **stride}

    return check


def _agree_to_cut(kind: str, linear: Linear, group: Any, stride: int, flags: dict[str, Any]) -> Communicator:
    group, error = resolve_group(kind, group)
    shape: dict[str, Any] = {}
    try:
        if error is not None:
            raise error
        if not isinstance(linear, Linear):
            raise TypeError(f"{kind}.from_linear: expects an nn.Linear, got {type(linear).__name__}")
        shape = dict(in_features=linear.in_features, out_features=linear.out_features)
        if (
            isinstance(stride, bool)
            or not isinstance(stride, int)
            or stride < 1
            or linear.out_features % stride
        ):
            raise ValueError(
                f"{kind}.from_linear: stride={stride!r} must be a positive int dividing "
                f"out_features={linear.out_features} into equal blocks"
            )
        if kind == "ColumnParallelLinear":
            name = "out_features / stride" if stride > 1 else "out_features"
            check_divisible(kind, name, linear.out_features // stride, group)
        else:
            check_divisible(kind, "in_features", linear.in_features, group)
    except (TypeError, ValueError) as e:
        error = e
    agree(
        group,
        kind,
        {**shape, "bias": getattr(linear, "bias", None) is not None, "stride": repr(stride), **flags},
        error,
    )
    return group


def mlp(activations: Container[str]) -> Check:
    """The check of ``ParallelMLP`` (``activations``: the names it knows): the sizes as ints
    (``out_features`` None: ``in_features``), ``bias`` a bool, ``hidden_features`` divisible by the group
    size, a known activation, a dropout in [0, 1], all the same on every rank."""

    def check(
        in_features: Any, hidden_features: Any, out_features: Any, bias: Any, activation: Any,
        dropout: Any, group: Any, dtype: Any,
    ) -> dict[str, Any]:  # fmt: skip
        group, error = resolve_group("ParallelMLP", group)
        out_features = in_features if out_features is None else out_features
        sizes = (in_features, hidden_features, out_features)
        try:
            if error is not None:
                raise error
            names = ("in_features", "hidden_features", "out_features")
            sizes = tuple(positive_int("ParallelMLP", n, v) for n, v in zip(names, sizes))
            bias = flag("ParallelMLP", "bias", bias)
            check_divisible("ParallelMLP", "hidden_features", sizes[1], group)
            if activation not in activations:
                raise ValueError(f"activation must be one of {sorted(activations)}, got {activation!r}")
            if not 0.0 <= dropout <= 1.0:
                raise ValueError(f"dropout probability must be between 0 and 1, got {dropout}")
        except (TypeError, ValueError) as e:
            error = e
        arguments = dict(zip(("in_features", "hidden_features", "out_features"), sizes))
        # dropout as a float when it is a number: 0, 0.0 and np.float64(0.0) are the same probability
        rate = float(dropout) if isinstance(dropout, (int, float, np.integer, np.floating)) else repr(dropout)
        arguments.update(bias=bias, activation=repr(activation), dropout=rate)
        agree(group, "ParallelMLP", {**arguments, "dtype": describe_dtype(dtype)}, error)
        in_features, hidden_features, out_features = sizes
        return dict(
            in_features=in_features, hidden_features=hidden_features, out_features=out_features,
            bias=bias, activation=activation, dropout=dropout, group=group, dtype=dtype,
        )  # fmt: skip

    return check


def attention(attn: Any, group: Any, sequence_parallel: bool) -> dict[str, Any]:
    """The check of ``ParallelCausalSelfAttention(attn, group, sequence_parallel)``: its heads split."""
    dtype = attn.c_attn.weight.dtype
    name = "ParallelCausalSelfAttention"
    group = _agree_on_heads(name, group, attn.n_embd, attn.n_head, sequence_parallel, dtype)
    return {"attn": attn, "group": group, "sequence_parallel": sequence_parallel}


def block(block: Any, group: Any, sequence_parallel: bool) -> dict[str, Any]:
    """The check of ``ParallelBlock(block, group, sequence_parallel)``: one agreement for the block."""
    attn = block.attn
    dtype = attn.c_attn.weight.dtype
    group = _agree_on_heads("ParallelBlock", group, attn.n_embd, attn.n_head, sequence_parallel, dtype)
    return {"block": block, "group": group, "sequence_parallel": sequence_parallel}


def _agree_on_heads(layer: str, group: Any, n_embd: int, n_head: int, sp: bool, dtype: Any) -> Communicator:
    """Check ``n_head`` % group size (``ValueError``) and agree on the sizes across the group; the group."""
    group, error = resolve_group(layer, group)
    if error is None and n_head % group.size:
        divisors = [d for d in range(1, n_head + 1) if n_head % d == 0]
        error = ValueError(
            f"{layer}: n_head={n_head} is not divisible by the tensor-parallel size {group.size}: each "
            f"rank computes n_head / tp whole attention heads; choose tp among {divisors}, or change n_head"
        )
    sizes = {"n_embd": n_embd, "n_head": n_head, "sequence_parallel": sp, "dtype": describe_dtype(dtype)}
    agree(group, layer, sizes, error)
    return group


def checked_input(forward: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """Decorate a parallel linear layer's ``forward(x)``: ``ValueError`` (on this rank: shapes are
    local) unless ``x``'s last axis is what the layer takes, ``in_features``, or ``in_features / group
    size`` for a row-parallel layer whose input is parallel (``input_is_parallel``); then the body
    runs. Per forward it costs one more call and a shape comparison."""

    @functools.wraps(forward)
    def checked(layer: Any, x: Any) -> Any:
        if getattr(layer, "input_is_parallel", False):
            expected, what = layer.in_features_per_partition, "in_features / group size"
        else:
            expected, what = layer.in_features, "in_features"
        if x.ndim == 0 or x.shape[-1] != expected:
            raise ValueError(
                f"{type(layer).__name__}({layer.in_features}, {layer.out_features}) on a group of "
                f"{layer.group.size} got input of shape {x.shape}: it expects input of shape "
                f"(..., {expected}), its last axis must be {expected} ({what})"
            )
        return forward(layer, x)

    return checked

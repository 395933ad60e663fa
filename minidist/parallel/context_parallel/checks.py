"""Ring attention's arguments, checked on every rank and compared across the cp group.

A mistake only one rank sees (a sequence cut into pieces of other lengths, another dtype, another
layout) must not leave the others waiting for a K/V block that never comes, or worse, receive a block of
the wrong size. So every rank checks its own arguments, then all ranks compare a short numeric summary
of them (one all-gather of 20 float64 per rank, every call: ring attention runs once per layer
and step, and the shapes can change between calls, e.g. the last batch or generation). Only when
something is wrong do the ranks make the slower exchange of ``minidist.distributed.safety.agreement.agree``,
which builds the same error, naming the ranks and the values, on every rank.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist.autograd.tensor import Tensor
from minidist.distributed.comm import Communicator
from minidist.distributed.safety.agreement import agree
from minidist.ops.attention import mixed_dtypes_error
from minidist.parallel.context_parallel.split import LAYOUTS


def check_ring_attention_args(
    query: Any, key: Any, value: Any, group: Communicator, is_causal: Any, scale: Any, layout: Any,
    dropout_p: Any,
) -> None:  # fmt: skip
    """Raise the same exception on every rank of ``group`` if any rank's arguments are wrong, or if the
    ranks' shapes, dtypes or options differ (``ring_attention``'s docstring lists the errors)."""
    error = _local_error(query, key, value, scale, layout, dropout_p)
    values = _values(query, key, value, is_causal, scale, layout, dropout_p) if error is None else {}
    if group.size == 1:
        if error is not None:
            raise error
        return
    summary = _summary(values, error)
    everyone = dist.all_gather(summary, group=group).reshape(group.size, summary.size)
    if everyone[:, 0].any() or not (everyone == everyone[0]).all():  # an error, or values that differ
        agree(
            values,
            error,
            group,
            what="ring_attention",
            label="context-parallel group",
            fix="every rank of the cp group must pass its T/cp tokens, with equal shapes, dtype and options",
            kinds=(NotImplementedError,),
        )


def _local_error(
    query: Any, key: Any, value: Any, scale: Any, layout: Any, dropout_p: Any
) -> Exception | None:
    """What is wrong with this rank's arguments on their own, or None."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            return TypeError(f"ring_attention: {name} must be a minidist Tensor, got {type(t).__name__}")
        if t.ndim != 4:
            return ValueError(
                f"ring_attention: {name} must be (B, heads, T/cp, head_size), got shape {t.shape}"
            )
    mixed = mixed_dtypes_error(query, key, value)
    if mixed is not None:
        return mixed
    if query.dtype.kind != "f":
        return RuntimeError(
            f"ring_attention: expected floating-point query, key and value, got {query.dtype}"
        )
    if key.shape != query.shape or value.shape[:-1] != query.shape[:-1]:
        return ValueError(
            f"ring_attention: query {query.shape}, key {key.shape} and value {value.shape} do not fit: "
            "self-attention needs query and key of the same shape, and value the same but for its last axis"
        )
    if query.shape[-2] == 0:
        return ValueError("ring_attention: no tokens (T/cp = 0) on this rank")
    if layout not in LAYOUTS:
        return ValueError(f"ring_attention: layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "balanced" and query.shape[-2] % 2:
        return ValueError(
            f"ring_attention: the balanced layout holds two equal chunks per rank, but this rank has "
            f"T/cp = {query.shape[-2]} tokens (odd); choose a sequence length divisible by 2 cp "
            "(split with split_for_context_parallel)"
        )
    if scale is not None and not (_is_real(scale) and math.isfinite(scale)):
        return ValueError(f"ring_attention: scale must be a finite number or None, got {scale!r}")
    if not (_is_real(dropout_p) and 0.0 <= dropout_p <= 1.0):
        return ValueError(f"dropout probability must be between 0 and 1, got {dropout_p!r}")
    if dropout_p > 0:
        return NotImplementedError(
            f"ring_attention: attention dropout (dropout_p={dropout_p}) is not implemented under context "
            "parallelism: each rank would have to draw, for every block of scores it computes, exactly the "
            "mask one process would draw for those (query, key) positions, and draw it again in backward. "
            "Train with attention dropout 0 (GPTConfig(dropout=0.0), as large pre-training runs do), or "
            "with cp = 1"
        )
    return None


def _is_real(x: Any) -> bool:
    """A real number (Python's or NumPy's, not a bool)."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool | np.bool_)


def _values(query: Tensor, key: Tensor, value: Tensor, is_causal: Any, scale: Any, layout: str,
            dropout_p: Any) -> dict[str, Any]:  # fmt: skip
    """What must be equal on every rank, as JSON values (for agree's message)."""
    return {
        "query shape": list(query.shape), "key shape": list(key.shape), "value shape": list(value.shape),
        "dtype": str(query.dtype), "is_causal": bool(is_causal), "layout": layout,
        "scale": None if scale is None else float(scale), "dropout_p": float(dropout_p),
    }  # fmt: skip


def _summary(values: dict[str, Any], error: Exception | None) -> np.ndarray:
    """The values as a fixed-length float64 vector (zeros and an error flag when this rank has an
    error): equal on two ranks exactly when their values are equal and neither has an error."""
    if error is not None:
        return np.concatenate([[1.0], np.zeros(19)])  # the flag: the ranks take agree's slow path
    dtype = np.dtype(values["dtype"])
    return np.array(
        [0.0, *values["query shape"], *values["key shape"], *values["value shape"], dtype.itemsize,
         ord(dtype.kind), values["is_causal"], LAYOUTS.index(values["layout"]),
         values["scale"] is None, values["scale"] or 0.0, values["dropout_p"]],
        dtype=np.float64,
    )  # fmt: skip

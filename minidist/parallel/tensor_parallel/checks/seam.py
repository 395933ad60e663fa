"""Where a tensor-parallel layer meets its checks, beside ``minidist/parallel/agreed.py``'s decorator.

``@agreed_arguments(check)`` (``parallel/agreed.py``) goes on every ``__init__`` and on the classmethods
that build a layer (``from_linear``, ``from_weight``); which check a layer uses is in ``layers.py`` and
``vocab.py`` beside this file. ``@checked_input`` goes on the linear layers' ``forward``: a wrong input
width raises before the f or g operator is reached.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


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

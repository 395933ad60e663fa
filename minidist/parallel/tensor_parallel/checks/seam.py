"""Where a tensor-parallel layer meets its checks: two decorators, so the layer's code reads as the layer.

``@agreed_arguments(check)`` goes on every ``__init__`` and on the classmethods that build a layer
(``from_linear``, ``from_weight``): the call's arguments are checked on this rank and agreed across the
group *before* the body runs (a mismatch raises the same error on every rank, before anything is
drawn, allocated or sent), and the body receives them normalised. ``@checked_input`` goes on the linear
layers' ``forward``: a wrong input width raises before the f or g operator is reached. Which check a
layer uses is in ``layers.py`` and ``vocab.py`` beside this file.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any


def agreed_arguments(check: Callable[..., dict[str, Any]]) -> Callable[[Callable], Callable]:
    """Decorate a layer's ``__init__`` (or a classmethod that builds one) so that its arguments are
    checked before its body runs.

    The call's arguments, defaults filled in, go to ``check(**arguments)``, which checks them on this
    rank, agrees on them across the group (collective: an error of any rank is raised on every rank)
    and returns them normalised (the group a Communicator, sizes ints, flags bools); the body then runs
    with those, and its result is returned. Costs a signature binding per call: construction only.
    """

    def decorate(body: Callable) -> Callable:
        signature = inspect.signature(body)
        first = next(iter(signature.parameters))  # self, or cls

        @functools.wraps(body)
        def checked(owner: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                call = signature.bind(owner, *args, **kwargs)
            except TypeError:  # arguments that do not fit the signature: Python's own error, from the body
                return body(owner, *args, **kwargs)
            call.apply_defaults()
            arguments = {name: value for name, value in call.arguments.items() if name != first}
            return body(owner, **check(**arguments))

        return checked

    return decorate


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

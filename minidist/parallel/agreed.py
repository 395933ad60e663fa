"""Where a parallel layer meets its argument checks: one decorator, so its ``__init__`` reads as the layer.

A parallel layer (DDP, ZeRO, a tensor-parallel linear, ...) is built by every rank of its group at
once, so a bad argument on one rank, or an argument that differs between ranks, must raise the same
error on every rank before anything is drawn, allocated or sent; a rank left alone would wait forever
in the next collective. ``@agreed_arguments(check)`` on a layer's ``__init__`` (or on a classmethod
that builds one: ``from_linear``, ``from_weight``) calls ``check`` with the call's arguments first:
it checks them on this rank, agrees on them across the group (collective), and returns them
normalised (``group=None`` the world, sizes ints, flags bools); the body then runs with those. The
checks themselves are in each folder's ``checks`` module.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any


def agreed_arguments(check: Callable[..., dict[str, Any]]) -> Callable[[Callable], Callable]:
    """Decorate ``body`` (an ``__init__`` or a building classmethod) so that ``check(**arguments)`` runs
    first, with the call's arguments (defaults filled in; not ``self``/``cls``), and the body with what it
    returns. Arguments that do not fit the signature raise Python's own ``TypeError``, from the body. A
    signature binding per call: construction only, never per step.
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
            call.arguments.update(check(**arguments))  # (a **kwargs parameter is one dict here)
            return body(*call.args, **call.kwargs)

        return checked

    return decorate

"""The wrapper the safety net puts around every public collective: number the call, tag it, check it.

``seam.py`` hands each collective that ``collectives.py`` marks to :func:`collective_call`, once, when
``minidist.distributed`` is imported. A collective of your own can wear it too:
``@dist.collective_call("my_collective")``.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from minidist import trace
from minidist.distributed.comm import Communicator
from minidist.distributed.safety import liveness
from minidist.distributed.safety.debug import call_site, checks_enabled, collective_scope, debug_enabled
from minidist.distributed.safety.tags import identity
from minidist.distributed.safety.traffic import collective_span
from minidist.distributed.world import group_or_world

F = TypeVar("F", bound=Callable[..., Any])


def collective_call(name: str, *, same_shape: bool = True) -> Callable[[F], F]:
    """Decorator for a public collective: number every call, tag its messages, run the checks asked for.

    Always (about 1 us per call: docs/performance.md, "The checks that are on by default"): it marks the
    call's start and end for the liveness watchdog and sets the tag of its messages from its name,
    ``op``, ``src``/``dst`` and the array's dtype (``liveness.enter``, ``tags.py``). Under
    ``trace.enable(collectives=True)``, a span with the bytes the call sent (``traffic.py``). With
    ``MINIDIST_DEBUG`` or ``MINIDIST_TIMEOUT`` set, it runs the call inside :func:`collective_scope`
    (fingerprints compared, a deadline set), described by the function's first parameter (the array;
    none if that parameter is ``group``), its parameters ``op``, ``src``, ``dst`` and ``algorithm``, and
    (debug mode) the user's line that made the call (:func:`call_site`); ``group`` (``None`` = the world)
    says which ranks compare. ``same_shape=False`` for collectives whose ranks may pass arrays of
    different shapes (``all_gather``): then only the dtype must agree.
    """

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)
        params = list(signature.parameters)
        first = params[0] if params else "group"
        root = "src" if "src" in params else "dst"
        # Where each argument sits, to read it without Signature.bind (~4 us: too slow for every call);
        # a parameter the function lacks sits "after the end" and reads as its default, None.
        where = {key: params.index(key) if key in params else sys.maxsize for key in ("group", "op", root)}
        default = {key: p.default for key, p in signature.parameters.items()}
        at_group, at_op, at_root = where["group"], where["op"], where[root]
        op_default, root_default = default.get("op"), default.get(root)
        idents: dict[tuple, int] = {}  # (op, src/dst, dtype) -> the tag bits identity() computes

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            n = len(args)
            group = group_or_world(args[at_group] if at_group < n else kwargs.get("group"))
            array = args[0] if n and first != "group" else kwargs.get(first)
            key = (
                args[at_op] if at_op < n else kwargs.get("op", op_default),
                args[at_root] if at_root < n else kwargs.get(root, root_default),
                array.dtype.num if hasattr(array, "dtype") else 0,  # a number hashes faster than a dtype
            )
            try:
                ident = idents[key]
            except KeyError:
                ident = idents[key] = identity(name, key[0], key[1], array.dtype if key[2] else None)
            except TypeError:  # an unhashable argument: the collective will reject it
                ident = identity(name)
            link = group.collective_channel
            previous = liveness.enter(link, ident)
            try:
                if trace.collectives_enabled():  # a span with its bytes (trace.enable(collectives=True))
                    with collective_span(name, group, array):
                        return run(group, args, kwargs)
                if not checks_enabled():  # the common case, without run's extra call
                    return fn(*args, **kwargs)
                return run(group, args, kwargs)
            finally:
                liveness.leave(link, previous)

        def run(group: Communicator, args: tuple, kwargs: dict[str, Any]) -> Any:
            if not checks_enabled():
                return fn(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            given = bound.arguments
            array = None if first == "group" else given.get(first)
            described = {key: given[key] for key in ("op", "src", "dst", "algorithm") if key in given}
            site = call_site() if debug_enabled() else None
            with collective_scope(group, name, array, same_shape=same_shape, site=site, **described):
                return fn(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return decorate

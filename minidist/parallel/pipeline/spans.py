"""The trace spans of a pipeline step, recorded only while ``minidist.trace`` is on.

A step has a span per forward, backward and message (the executor's module docstring), ~20 per rank on
2 stages. ``trace.span`` is a generator-based context manager, which costs microseconds per ``with``
even while tracing is off, and its name string would be built for nothing: a message's span took
6.0-8.7 us that way and takes 1.6-1.8 us through :func:`traced` (issue 16; benchmarks/README.md,
"Cuts: pipeline executor and data loader"). :func:`traced` enters the real span only while tracing
is on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from minidist import trace

_NO_SPAN = contextlib.nullcontext()  # reusable: entering and leaving it does nothing


def traced(category: str, name: Callable[..., str], *args: Any) -> Any:
    """``trace.span(name(*args), category)`` while tracing is on, else a shared no-op context manager;
    the span's name is built only when the span is recorded."""
    return trace.span(name(*args), category) if trace.is_enabled() else _NO_SPAN
